import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from dpjax import mechanisms as M
from tests.helpers import assert_distribution

N = 100_000


def exact_gaussian_delta(sigma_over_sens, eps):
    """Independent δ(ε) of N(0, σ²) vs N(Δ, σ²) via the privacy-loss variable L ~ N(μ, 2μ)."""
    mu = 1.0 / (2 * sigma_over_sens**2)
    sd = math.sqrt(2 * mu)
    return stats.norm.sf(eps, loc=mu, scale=sd) - math.exp(eps) * stats.norm.cdf(
        -eps, loc=mu, scale=sd
    )


def test_threshold_is_theorem_10():
    assert M.mixed_noise_threshold(epsilon=0.5, delta=1e-3) == pytest.approx(
        math.sqrt(math.pi) * 1e-3 * 0.5 / 2, rel=1e-14
    )


def test_theorem_10_sigma_is_not_eps_delta_dp():
    # The lecture's Theorem 10 (mixed noise) claims N(0, 2(Δ/ε)²) is (ε, δ)-DP once
    # Δ ≤ √π δε/2. The exact δ at ε
    # depends on σ/Δ = √2/ε only, so the threshold cannot help: at ε = 1 it is ≈ 0.0396.
    eps, delta = 1.0, 1e-5
    ref = exact_gaussian_delta(math.sqrt(2.0) / eps, eps)
    assert ref == pytest.approx(0.0396, abs=1e-4)
    assert M.mixed_noise_lecture_delta(epsilon=eps) == pytest.approx(ref, rel=1e-9)
    assert ref > 1000 * delta
    # scale invariance: the same δ for two sensitivities below the threshold
    t0 = M.mixed_noise_threshold(epsilon=eps, delta=delta)
    for sens in (t0, t0 / 100):
        d = M.gaussian_delta(sigma=math.sqrt(2) * sens / eps, sensitivity=sens, epsilon=eps)
        assert d == pytest.approx(ref, rel=1e-6)


def test_gaussian_branch_is_calibrated_exactly(key):
    eps, delta = 1.0, 1e-5
    sens = 0.5 * M.mixed_noise_threshold(epsilon=eps, delta=delta)
    choice = M.mixed_noise_scale(sensitivity=sens, epsilon=eps, delta=delta)
    assert choice.distribution == "gaussian"
    # the σ used meets the exact condition, by the independent privacy-loss formula
    assert exact_gaussian_delta(choice.scale / sens, eps) <= delta * (1 + 1e-6)
    assert exact_gaussian_delta(0.99 * choice.scale / sens, eps) > delta
    y = M.mixed_noise(key, jnp.zeros(N), sensitivity=sens, epsilon=eps, delta=delta)
    s = choice.scale

    def cdf(scale):
        return lambda x: stats.norm.cdf(x, scale=scale)

    assert_distribution(y, cdf(s), wrong_cdfs=[cdf(1.5 * s), cdf(s / 1.5)])


def test_laplace_branch_above_threshold(key):
    eps, delta, sens = 0.5, 1e-5, 2.0
    choice = M.mixed_noise_scale(sensitivity=sens, epsilon=eps, delta=delta)
    assert choice == ("laplace", sens / eps)
    y = M.mixed_noise(key, jnp.full(N, 3.0), sensitivity=sens, epsilon=eps, delta=delta)
    b = sens / eps

    def cdf(scale):
        return lambda x: stats.laplace.cdf(x, loc=3.0, scale=scale)

    assert_distribution(y, cdf(b), wrong_cdfs=[cdf(1.5 * b), cdf(b / 1.5)])


def test_gaussian_branch_within_lecture_sigma_when_delta_is_large():
    # when δ ≥ δ*(ε) the exact σ is at most the lecture's √2Δ/ε
    eps = 1.0
    delta = 0.05
    assert delta > M.mixed_noise_lecture_delta(epsilon=eps)
    choice = M.mixed_noise_scale(sensitivity=1e-3, epsilon=eps, delta=delta, threshold=1.0)
    assert choice.distribution == "gaussian"
    assert choice.scale <= math.sqrt(2) * 1e-3 / eps


def test_jit_and_vmap_match_eager(key):
    def f(k, v):
        return M.mixed_noise(k, v, sensitivity=1.0, epsilon=1.0, delta=1e-5)

    v = jnp.arange(4.0)
    np.testing.assert_array_equal(f(key, v), jax.jit(f)(key, v))
    keys = jax.random.split(key, 3)
    batched = jax.vmap(f, in_axes=(0, None))(keys, v)
    for i in range(3):
        np.testing.assert_array_equal(batched[i], f(keys[i], v))


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(sensitivity=1.0, epsilon=0.0, delta=1e-5),
        dict(sensitivity=1.0, epsilon=1.0, delta=0.0),
        dict(sensitivity=1.0, epsilon=1.0, delta=1.0),
        dict(sensitivity=-1.0, epsilon=1.0, delta=1e-5),
        dict(sensitivity=1.0, epsilon=1.0, delta=1e-5, threshold=0.0),
    ],
)
def test_bad_inputs_raise(kwargs):
    with pytest.raises(ValueError, match="must be"):
        M.mixed_noise_scale(**kwargs)
