"""Slope fitting, bootstrap and bound checks of the rate experiments, on synthetic power laws."""

import math

import numpy as np
import pytest
from scipy import stats

from experiments import fitting, instances


def _power_law_cells(slope, xs, k=5, s=200, cv=1.0, seed=0):
    """(K, S) cells with mean 3·x^slope: Gamma noise (shape 1/cv²) times a dataset effect."""
    rng = np.random.default_rng(seed)
    shape = 1.0 / cv**2
    cells = []
    for x in xs:
        mean = 3.0 * x**slope
        dataset = rng.gamma(50.0, 1.0 / 50.0, size=(k, 1))  # mean-1 dataset effect
        cells.append(mean * dataset * rng.gamma(shape, 1.0 / shape, size=(k, s)))
    return cells


def test_ols_slope_matches_polyfit():
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=20), rng.normal(size=20)
    slope, intercept = fitting.ols_slope(x, y)
    ref = np.polyfit(x, y, 1)
    assert slope == pytest.approx(ref[0], rel=1e-12)
    assert intercept == pytest.approx(ref[1], rel=1e-12)


def test_log_log_slope_and_local_slopes_exact_on_a_power_law():
    xs = [2.0**k for k in range(8, 14)]
    means = [5.0 * x**-0.5 for x in xs]
    assert fitting.log_log_slope(xs, means)[0] == pytest.approx(-0.5, abs=1e-12)
    assert fitting.local_slopes(xs, means) == pytest.approx([-0.5] * 5, abs=1e-12)
    curved = [x**-1 + 1e-3 for x in xs]  # flattens: local slopes increase towards 0
    assert np.all(np.diff(fitting.local_slopes(xs, curved)) > 0)


@pytest.mark.parametrize("true_slope", [-2.0, -1.0, -0.5])
def test_bootstrap_ci_covers_the_true_slope_and_rejects_a_wrong_one(true_slope):
    xs = [2.0**k for k in range(8, 14)]
    cells = _power_law_cells(true_slope, xs, seed=int(-10 * true_slope))
    fit = fitting.slope_with_ci(xs, cells, n_boot=1000, seed=3)
    assert fit["ci_low"] <= true_slope <= fit["ci_high"]
    # s.e. of the slope here is about 0.02: the CI is narrow enough to exclude ±0.15.
    assert fit["ci_high"] - fit["ci_low"] < 0.15
    assert not fit["ci_low"] <= true_slope + 0.15 <= fit["ci_high"]


def test_hierarchical_bootstrap_sees_the_dataset_effect():
    """A strong dataset effect must widen the CI compared with resampling runs only."""
    xs = [2.0**k for k in range(8, 12)]
    rng = np.random.default_rng(5)
    cells = [x**-1.0 * rng.lognormal(0.0, 0.5, size=(4, 1)) * np.ones((4, 100)) for x in xs]
    boot = fitting.hierarchical_bootstrap_slopes(xs, cells, n_boot=500, rng=rng)
    assert boot.std() > 0.05  # all spread comes from the 4 datasets; seed resampling adds none


def test_upper_confidence_bound_is_the_student_t_bound():
    rng = np.random.default_rng(2)
    x = rng.exponential(size=(4, 50))
    ref = stats.t.interval(0.98, x.size - 1, loc=x.mean(), scale=stats.sem(x.ravel()))[1]
    assert fitting.upper_confidence_bound(x, level=0.99) == pytest.approx(ref, rel=1e-10)


def test_holm_bound_held_passes_clear_cells_and_fails_violations():
    rng = np.random.default_rng(3)
    below = rng.exponential(1.0, size=(4, 100))
    above = rng.exponential(1.0, size=(4, 100))
    borderline = rng.exponential(1.0, size=(4, 100))
    held = fitting.holm_bound_held([below, above, borderline], [2.0, 0.8, below.mean()])
    assert held == [True, False, False]


def test_unit_sphere_and_bst_instance_are_exact():
    rng = np.random.default_rng(4)
    X = instances.unit_sphere(rng, 100, 7)
    assert np.allclose(np.linalg.norm(X, axis=1), 1.0, atol=1e-14)
    inst = instances.bst_linear_instance(rng, 64, 4, imbalance=6)
    zbar = inst.X.mean(axis=0)
    assert np.linalg.norm(zbar) == pytest.approx(6 / 64, rel=1e-12)
    assert set(np.unique(np.abs(inst.X))) == {0.5}
    assert inst.j_star == pytest.approx(-np.linalg.norm(zbar))


def test_sharp_instance_optimum_is_certified_by_a_subgradient():
    rng = np.random.default_rng(6)
    mu = 0.05
    inst = instances.sharp_l1_instance(rng, 400, 5, mu=mu)
    # Independent check: J(w0 + t u) ≥ J(w0) along random directions (J convex, w0 optimal).
    W = inst.w_star + 1e-3 * rng.normal(size=(200, 5))
    assert np.all(np.asarray(instances.sharp_l1_excess(W, inst.X, inst.y, inst.w_star, mu)) > 0)
    with pytest.raises(ValueError, match="mu"):
        instances.sharp_l1_instance(rng, 400, 5, mu=2.0)


def test_logistic_optimum_matches_scipy():
    from scipy import optimize

    rng = np.random.default_rng(7)
    mu = 0.05
    inst = instances.logistic_instance(rng, 300, 3, mu=mu)

    def j(w):
        return np.mean(np.logaddexp(0.0, -inst.y * (inst.X @ w))) + 0.5 * mu * w @ w

    ref = optimize.minimize(j, np.zeros(3), method="BFGS", options={"gtol": 1e-10})
    assert np.allclose(inst.w_star, ref.x, atol=1e-6)
    assert inst.j_star == pytest.approx(ref.fun, abs=1e-12)
    assert inst.certificate < 1e-20
    assert inst.zero_excess == pytest.approx(math.log(2.0) - ref.fun, abs=1e-12)


def test_holm_bound_violated_flags_only_clear_excess():
    rng = np.random.default_rng(8)
    clear = rng.exponential(1.0, size=(4, 100))
    slightly_above = rng.exponential(1.0, size=(4, 100))
    held = fitting.holm_bound_violated([clear, slightly_above], [0.5, slightly_above.mean() * 0.99])
    assert held == [True, False]
    assert fitting.holm_bound_violated([clear], [2.0]) == [False]


def test_quadratic_and_ridge_instances_have_exact_optima():
    from scipy import optimize

    rng = np.random.default_rng(9)
    mu = 1.0
    inst = instances.quadratic_instance(rng, 200, 3, mu=mu)

    def j(w):
        return 0.5 * np.mean((inst.X @ w - inst.y) ** 2) + 0.5 * mu * w @ w

    ref = optimize.minimize(j, np.zeros(3), method="BFGS", options={"gtol": 1e-12})
    assert np.allclose(inst.w_star, ref.x, atol=1e-7)
    W = inst.w_star + rng.normal(size=(5, 3))
    direct = np.array([j(w) for w in W]) - j(inst.w_star)
    assert np.allclose(instances.quadratic_excess(W, inst.X, inst.w_star, mu), direct, rtol=1e-10)

    ridge = instances.linear_ridge_instance(rng, 100, 2, mu=2.0)

    def jr(w):
        return -np.mean(ridge.X @ w) + w @ w  # μ/2 = 1

    assert jr(ridge.w_star) == pytest.approx(ridge.j_star, abs=1e-14)
    direct = np.array([jr(w) for w in W[:, :2]]) - ridge.j_star
    assert np.allclose(instances.ridge_excess(W[:, :2], ridge.w_star, 2.0), direct, rtol=1e-10)


def test_mean_ci_covers_the_true_mean_at_its_level():
    """The plots' error bars: the hierarchical 95% CI covers the true mean in ~95% of cells.

    200 independent (5, 200) cells with a dataset effect: coverage is Binomial(200, 0.95), whose
    99.9% two-sided range is about [0.89, 0.99] (the bootstrap runs a little narrow at K = 5).
    """
    covered = 0
    for seed in range(200):
        cell = _power_law_cells(-1.0, [1.0], seed=seed)[0]
        mean, low, high = fitting.mean_with_ci(cell, n_boot=300, seed=seed)
        assert low <= mean <= high
        covered += low <= 3.0 <= high
    assert 0.85 <= covered / 200 <= 0.995, covered


def test_mean_ci_rejects_a_flat_array():
    with pytest.raises(ValueError, match="samples must be a"):
        fitting.mean_with_ci(np.ones(5))
