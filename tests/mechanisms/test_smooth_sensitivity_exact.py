"""Exact privacy of smooth-sensitivity releases with heavy-tailed noise h ∝ 1/(1 + |z|^γ).

For the release f(x) + (S(x)/α)·Z with S β-smooth and neighbours x, y, write
t = ln(S(y)/S(x)) ∈ [−β, β] and s = α(f(y) − f(x))/S(x); since |f(y) − f(x)| is at most both
LS(x) ≤ S(x) and LS(y) ≤ S(y), |s| ≤ α and |s e^{−t}| ≤ α. In the units z = α(v − f(x))/S(x),

    ln p_x(v)/p_y(v) = φ((z − s)e^{−t}) − φ(z) + t,   φ(w) = ln(1 + |w|^γ).

``worst_log_ratio`` takes the supremum of its absolute value over a grid in (s, t) (the two
ends included) and a log-spaced grid in z, then refines the best points with a local optimiser:
an independent numerical value of the mechanism's true worst-case privacy loss.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import optimize

from dpjax import mechanisms as M
from dpjax.mechanisms import smooth_sensitivity

Z_GRID = np.r_[-np.logspace(4, -4, 1601), 0.0, np.logspace(-4, 4, 1601)]


def phi(w, gamma):
    return np.log1p(np.abs(w) ** gamma)


def log_ratio(z, s, t, gamma):
    return phi((z - s) * np.exp(-t), gamma) - phi(z, gamma) + t


def worst_log_ratio(alpha, beta, gamma, points=25):
    best, best_arg = -1.0, None
    for t in np.linspace(-beta, beta, points):
        s_max = alpha * min(1.0, math.exp(t))
        for s in np.linspace(-s_max, s_max, points):
            values = np.abs(log_ratio(Z_GRID, s, t, gamma))
            i = int(np.argmax(values))
            if values[i] > best:
                best, best_arg = float(values[i]), (Z_GRID[i], s, t)

    # Local refinement inside the feasible set (s, t parametrised to stay feasible).
    def negative(params):
        z, s_unit, t_unit = params
        t = beta * math.tanh(t_unit)
        s = alpha * min(1.0, math.exp(t)) * math.tanh(s_unit)
        return -abs(float(log_ratio(np.array(z), s, t, gamma)))

    z0, s0, t0 = best_arg
    s_cap = alpha * min(1.0, math.exp(t0))
    start = [
        z0,
        math.atanh(np.clip(s0 / s_cap, -0.999, 0.999)) if s_cap > 0 else 0.0,
        math.atanh(np.clip(t0 / beta, -0.999, 0.999)) if beta > 0 else 0.0,
    ]
    refined = optimize.minimize(negative, start, method="Nelder-Mead", options={"xatol": 1e-10})
    return max(best, -float(refined.fun))


@pytest.mark.parametrize("gamma", [2.0, 3.0, 4.0])
@pytest.mark.parametrize("eps", [0.1, 1.0, 6.0])
def test_tight_recipe_worst_case_log_ratio_is_at_most_epsilon(gamma, eps):
    p = M.smooth_noise_parameters(epsilon=eps, noise="heavy_tailed", gamma=gamma)
    worst = worst_log_ratio(1.0 / p.multiplier, p.beta, gamma)
    assert worst <= eps * (1 + 1e-9)


@pytest.mark.parametrize("gamma", [2.0, 4.0])
def test_default_recipe_uses_most_of_the_budget(gamma):
    # Finding: the lecture's recipe (the old default) reaches only 0.25ε (γ = 2) / 0.48ε (γ = 4).
    eps = 1.0
    p = M.smooth_noise_parameters(epsilon=eps, noise="heavy_tailed", gamma=gamma)
    worst = worst_log_ratio(1.0 / p.multiplier, p.beta, gamma)
    assert 0.8 * eps <= worst <= eps * (1 + 1e-9)


@pytest.mark.parametrize("gamma, low, high", [(2.0, 0.2, 0.3), (4.0, 0.4, 0.5)])
def test_lecture_recipe_is_private_but_loose(gamma, low, high):
    eps = 1.0
    p = M.smooth_noise_parameters(epsilon=eps, noise="heavy_tailed", gamma=gamma, recipe="lecture")
    assert p.multiplier == pytest.approx(2 * (gamma + 1) / eps)
    worst = worst_log_ratio(1.0 / p.multiplier, p.beta, gamma)
    assert low * eps <= worst <= high * eps
    tight = M.smooth_noise_parameters(epsilon=eps, noise="heavy_tailed", gamma=gamma)
    assert tight.multiplier < p.multiplier / 2 and tight.beta > 2 * p.beta


@pytest.mark.parametrize(
    "alpha, beta, gamma",
    [
        (0.05, 0.05, 2.0),
        (0.5, 0.2, 2.0),
        (0.3, 1.0, 3.0),
        (1.5, 2.0, 4.0),
        (0.1, 0.4, 1.5),
        (0.02, 0.01, 8.0),
    ],
)
def test_proven_bound_dominates_the_true_worst_case(alpha, beta, gamma):
    bound = smooth_sensitivity.heavy_tailed_privacy_loss(shift=alpha, dilation=beta, gamma=gamma)
    assert worst_log_ratio(alpha, beta, gamma) <= bound
    # The bound is the sup over p ∈ [0, 1] of αγ p^{1−1/γ}(1−p)^{1/γ} + β|1 − γp|: a dense
    # grid gives a value just below it.
    p = np.linspace(0.0, 1.0, 1_000_001)
    a = 1.0 - 1.0 / gamma
    dense = np.max(alpha * gamma * p**a * (1 - p) ** (1 - a) + beta * np.abs(1 - gamma * p))
    assert dense <= bound <= dense * (1 + 1e-6)


def test_cauchy_bound_has_the_closed_form():
    for alpha, beta in [(0.3, 0.4), (1.0, 1.0), (0.01, 2.0), (5.0, 0.0)]:
        got = smooth_sensitivity.heavy_tailed_privacy_loss(shift=alpha, dilation=beta, gamma=2.0)
        assert got == pytest.approx(math.hypot(alpha, beta), rel=1e-10)
        assert got >= math.hypot(alpha, beta)


def test_bound_is_sharp_for_small_parameters():
    # First-order: the true worst case over (s, t) approaches the bound as α, β → 0.
    for gamma in (2.0, 4.0):
        bound = smooth_sensitivity.heavy_tailed_privacy_loss(shift=1e-3, dilation=1e-3, gamma=gamma)
        assert worst_log_ratio(1e-3, 1e-3, gamma, points=9) >= 0.99 * bound


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(shift=-0.1, dilation=0.1, gamma=2.0),
        dict(shift=0.1, dilation=2.5, gamma=2.0),
        dict(shift=0.1, dilation=0.1, gamma=1.0),
    ],
)
def test_bound_bad_inputs_raise(kwargs):
    with pytest.raises(ValueError, match="must be"):
        smooth_sensitivity.heavy_tailed_privacy_loss(**kwargs)


def test_unknown_recipe_raises():
    with pytest.raises(ValueError, match="recipe must be"):
        M.smooth_noise_parameters(epsilon=1.0, recipe="nrs")


# --- NaN / ±inf records in smooth_median -------------------------------------------------


def smooth_sensitivity_reference(x, upper, beta):
    """Equation (4) with plain loops (x_(i) = 0 for i <= 0, Λ for i > n)."""
    x = np.sort(np.asarray(x, dtype=np.float64))
    n, m = x.size, (x.size + 1) // 2

    def order(i):
        return 0.0 if i <= 0 else (upper if i > n else x[i - 1])

    return max(
        math.exp(-k * beta) * max(order(m + t) - order(m + t - k - 1) for t in range(k + 2))
        for k in range(n + 1)
    )


@jax.jit
def _smooth_medians(keys, data):
    return jax.vmap(lambda k: M.smooth_median(k, data, upper=1.0, epsilon=1.0, gamma=3.0))(keys)


@pytest.mark.parametrize("bad, public", [(math.nan, 0.5), (math.inf, 1.0), (-math.inf, 0.0)])
def test_non_finite_record_is_released_as_its_public_value(key, bad, public):
    # Fails on the original code for NaN: the release is NaN on D, finite on D′ (δ = 1).
    rng = np.random.default_rng(7)
    x = rng.uniform(0.0, 1.0, size=11)
    keys = jax.random.split(key, 500)
    with_bad = np.asarray(_smooth_medians(keys, jnp.asarray(np.r_[x, bad])))
    with_public = np.asarray(_smooth_medians(keys, jnp.asarray(np.r_[x, public])))
    assert np.all(np.isfinite(with_bad))
    np.testing.assert_array_equal(with_bad, with_public)


def test_exact_log_ratio_with_a_nan_record_is_at_most_epsilon():
    # D has a NaN record (released as the record Λ/2); D′ replaces it by 0, Λ or a middle value.
    eps, gamma, upper = 1.0, 3.0, 1.0
    p = M.smooth_noise_parameters(epsilon=eps, noise="heavy_tailed", gamma=gamma)
    rng = np.random.default_rng(8)
    v = np.unique(
        np.r_[-np.logspace(6, -6, 2000), np.logspace(-6, 6, 2000), np.linspace(-3, 4, 20_001)]
    )

    def law(data):
        s = smooth_sensitivity_reference(data, upper, p.beta)
        return np.sort(data)[(len(data) + 1) // 2 - 1], p.multiplier * s

    def log_density(mu, c):
        return -np.log1p(np.abs((v - mu) / c) ** gamma) - np.log(c)

    worst = 0.0
    for _ in range(20):
        x = rng.uniform(0.0, upper, size=10)
        d = np.r_[x, 0.5 * upper]  # the NaN record, after the non-finite rule
        for replacement in (0.0, upper, rng.uniform(0.0, upper)):
            (mu1, c1), (mu2, c2) = law(d), law(np.r_[x, replacement])
            worst = max(worst, np.max(np.abs(log_density(mu1, c1) - log_density(mu2, c2))))
    assert worst <= eps


def test_concrete_nan_record_is_refused(key):
    # The original range check was NaN-blind (min/max of data with NaN compare false).
    with pytest.raises(ValueError, match="data must be finite"):
        M.smooth_median(key, jnp.array([0.2, jnp.nan, 0.7]), upper=1.0, epsilon=1.0)
    with pytest.raises(ValueError, match="data must be finite"):
        M.smooth_sensitivity_median(jnp.array([0.2, jnp.nan, 0.7]), upper=1.0, beta=0.1)
