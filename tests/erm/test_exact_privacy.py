"""Exact privacy of the finite-output / Gaussian ERM releases over adversarial neighbours.

* Grid exponential mechanism: the output set is finite, so both output laws are computed
  exactly from the release's own scores (:func:`grid_scores`, public N) and sensitivity, and the
  largest |ln P_D(w)/P_D′(w)| is compared with the claimed ε.
* 1-D sufficient-statistics regression: the release is a map fixed by public values applied to
  (S_xx, S_xy) + N(0, σ²I₂), so its privacy is that of a Gaussian mechanism with the ℓ2 shift
  s = ‖S(D) − S(D′)‖ of the release's own statistics; its exact δ(ε) is the closed-form
  Gaussian profile δ(ε) = Φ(s/(2σ) − εσ/s) − e^ε Φ(−s/(2σ) − εσ/s) (Balle & Wang 2018, Thm 8).

Both fail on the old code (it had no public size under add/remove: the grid's ε reached 2.17 at a
claimed 1, and a NaN record made the regression's shift NaN).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from dpjax import ADD_OR_REMOVE_ONE, REPLACE_ONE
from dpjax.erm import (
    exponential_mechanism_grid,
    linear_regression,
    losses,
    noisy_sufficient_statistics_regression,
)
from dpjax.erm import hypothesis_grid as grid_module
from dpjax.erm.hypothesis_grid import grid_score_sensitivity, hypothesis_grid

EPSILON = 1.0
N, MU, RADIUS, RESOLUTION = 20, 1.0, 5.0, 65

# d = 1 records (x, y): the extremes of the domain and an interior point, both labels.
CANDIDATES = [(x, y) for x in (-1.0, -0.3, 0.0, 0.3, 1.0) for y in (-1.0, 1.0)]


def base_data(n=N, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.choice([-1.0, -0.5, 0.5, 1.0], size=(n, 1))
    y = np.where(rng.random(n) < 0.7, 1.0, -1.0)
    return X, y


def with_record(X, y, record):
    """D with record 0 replaced by ``record`` = (x, y)."""
    X2, y2 = X.copy(), y.copy()
    X2[0], y2[0] = record
    return X2, y2


def neighbours(X, y, relation, candidates):
    """Adversarial neighbours: D vs D ∪ {r} and D vs D minus a record (add/remove), or
    D with record 0 = r₁ vs = r₂ for every pair of candidates (replace-one)."""
    if relation == REPLACE_ONE:
        return [
            (*with_record(X, y, r1), *with_record(X, y, r2))
            for i, r1 in enumerate(candidates)
            for r2 in candidates[i + 1 :]
        ]
    pairs = [(X, y, np.vstack([X, [[r[0]]]]), np.append(y, r[1])) for r in candidates]
    return pairs + [(X, y, np.delete(X, i, 0), np.delete(y, i)) for i in range(3)]


def grid_log_pmf(X, y, dataset_size, relation):
    """ln P(w) of the release: softmax(ε·u/(2Δ)) over the grid, u the release's own scores."""
    grid = hypothesis_grid(d=1, radius=RADIUS, resolution=RESOLUTION)
    sens = grid_score_sensitivity(
        loss=losses.logistic, n=dataset_size, d=1, radius=RADIUS, relation=relation
    )
    u = grid_module.grid_scores(X, y, grid, loss=losses.logistic, mu=MU, dataset_size=dataset_size)
    return np.asarray(jax.nn.log_softmax(EPSILON * u / (2.0 * sens)))


@pytest.mark.parametrize("relation", [ADD_OR_REMOVE_ONE, REPLACE_ONE])
def test_grid_exponential_mechanism_exact_epsilon(relation):
    X, y = base_data()
    worst = 0.0
    for X1, y1, X2, y2 in neighbours(X, y, relation, CANDIDATES):
        gap = np.abs(grid_log_pmf(X1, y1, N, relation) - grid_log_pmf(X2, y2, N, relation))
        worst = max(worst, float(gap.max()))
    assert worst <= EPSILON * (1 + 1e-9)
    assert worst >= 0.2 * EPSILON  # adversarial pairs: the check is not vacuous


def test_grid_exact_check_catches_a_private_normaliser():
    """The same exact computation with N = len(X) on each side (the old code's behaviour)
    exceeds the claim: the detector has power against the bug it guards."""
    X, y = base_data()
    worst = 0.0
    for X1, y1, X2, y2 in neighbours(X, y, ADD_OR_REMOVE_ONE, CANDIDATES):
        p1 = grid_log_pmf(X1, y1, len(X1), ADD_OR_REMOVE_ONE)
        p2 = grid_log_pmf(X2, y2, len(X2), ADD_OR_REMOVE_ONE)
        worst = max(worst, float(np.abs(p1 - p2).max()))
    assert worst > EPSILON


def test_grid_release_samples_the_exact_law():
    """The release under add/remove with a public N draws from softmax(εu/(2Δ)) (chi-square),
    and a law built with the realised len(X) ≠ N is rejected."""
    X, y = base_data(n=18)
    res = jax.jit(
        jax.vmap(
            lambda k: exponential_mechanism_grid(
                k,
                X,
                y,
                loss=losses.logistic,
                epsilon=EPSILON,
                radius=RADIUS,
                mu=MU,
                resolution=9,
                relation=ADD_OR_REMOVE_ONE,
                dataset_size=N,
            )
        )
    )(jax.random.split(jax.random.key(0), 4000))
    grid = np.asarray(hypothesis_grid(d=1, radius=RADIUS, resolution=9))[:, 0]
    counts = np.bincount(np.argmin(np.abs(np.asarray(res.params) - grid), axis=1), minlength=9)

    def pvalue(size):
        sens = grid_score_sensitivity(
            loss=losses.logistic, n=size, d=1, radius=RADIUS, relation=ADD_OR_REMOVE_ONE
        )
        u = grid_module.grid_scores(X, y, jnp.asarray(grid)[:, None], loss=losses.logistic, mu=MU,
                        dataset_size=size)  # fmt: skip
        p = np.asarray(jax.nn.softmax(EPSILON * u / (2.0 * sens)))
        keep = p * counts.sum() >= 5
        expected = p[keep] / p[keep].sum() * counts[keep].sum()
        return stats.chisquare(counts[keep], expected).pvalue

    assert pvalue(N) > 1e-4
    assert pvalue(len(X)) < 1e-4


def gaussian_delta(epsilon, shift, sigma):
    """Exact δ(ε) of N(0, σ²) vs N(s, σ²) (Balle & Wang 2018, Theorem 8)."""
    if shift == 0.0:
        return 0.0
    a, b = shift / (2.0 * sigma), epsilon * sigma / shift
    return stats.norm.cdf(a - b) - math.exp(epsilon) * stats.norm.cdf(-a - b)


REGRESSION_RECORDS = [
    (1.0, 1.0),
    (-1.0, 1.0),
    (1e6, -1e6),
    (0.0, 0.0),
    (np.nan, 0.5),
    (0.5, np.nan),
    (np.inf, -np.inf),
    (-np.inf, np.nan),
]


@pytest.mark.parametrize("relation", [ADD_OR_REMOVE_ONE, REPLACE_ONE])
@pytest.mark.parametrize("n, mu, delta", [(50, 1.0, 1e-5), (20, 20.0, 1e-5)])
def test_regression_exact_epsilon(relation, n, mu, delta):
    rng = np.random.default_rng(n)
    X = rng.uniform(-1, 1, size=(n, 1))
    y = np.clip(0.5 * X[:, 0] + 0.1 * rng.normal(size=n), -1, 1)
    res = noisy_sufficient_statistics_regression(
        jax.random.key(0), X, y, mu=mu, epsilon=EPSILON, delta=delta, relation=relation,
        dataset_size=n,
    )  # fmt: skip
    sigma = res.noise_scale
    assert res.event.noise_multiplier == pytest.approx(sigma / res.sensitivity)

    def statistics(X, y):
        sxx, sxy = linear_regression.sufficient_statistics(X, y, label_bound=1.0)
        return np.array([float(sxx[0, 0]), float(sxy[0])])

    worst_delta, worst_shift = 0.0, 0.0
    for X1, y1, X2, y2 in neighbours(X, y, relation, REGRESSION_RECORDS):
        shift = float(np.linalg.norm(statistics(X1, y1) - statistics(X2, y2)))
        assert math.isfinite(shift)
        worst_shift = max(worst_shift, shift)
        worst_delta = max(worst_delta, gaussian_delta(EPSILON, shift, sigma))
    assert worst_delta <= delta * (1 + 1e-9)
    assert worst_shift >= 0.5 * res.sensitivity  # adversarial records: not vacuous
