import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from dpjax import mechanisms as M
from tests.helpers import assert_distribution

N_DRAWS = 50_000


def block_estimates_reference(data, estimator, k):
    size = len(data) // k
    return np.array([estimator(data[i * size : (i + 1) * size]) for i in range(k)])


def test_laplace_aggregate_distribution(key):
    rng = np.random.default_rng(0)
    data = rng.normal(1.0, 2.0, size=1000)
    k, lo, hi, eps = 20, -1.0, 3.0, 0.5
    center = np.clip(block_estimates_reference(data, np.median, k), lo, hi).mean()
    keys = jax.random.split(key, N_DRAWS)

    def release(kk):
        return M.subsample_and_aggregate(
            kk,
            jnp.asarray(data),
            jnp.median,
            num_blocks=k,
            lower=lo,
            upper=hi,
            epsilon=eps,
            shuffle=False,
        )

    draws = np.asarray(jax.jit(jax.vmap(release))(keys))
    b = (hi - lo) / (k * eps)

    def cdf(scale):
        return lambda x: stats.laplace.cdf(x, loc=center, scale=scale)

    assert_distribution(draws, cdf(b), wrong_cdfs=[cdf(1.5 * b), cdf(b / 1.5)])


def test_gaussian_aggregate_of_vector_estimates(key):
    rng = np.random.default_rng(1)
    data = rng.uniform(0, 1, size=(600, 3))
    k, eps, delta = 30, 1.0, 1e-5
    center = np.clip(block_estimates_reference(data, lambda b: b.mean(0), k), 0, 1).mean(0)
    keys = jax.random.split(key, N_DRAWS // 3)
    release = jax.jit(
        jax.vmap(
            lambda kk: M.subsample_and_aggregate(
                kk,
                jnp.asarray(data),
                functools.partial(jnp.mean, axis=0),
                num_blocks=k,
                lower=0.0,
                upper=1.0,
                epsilon=eps,
                delta=delta,
                noise="gaussian",
                shuffle=False,
            )
        )
    )
    draws = np.asarray(release(keys))
    sigma = M.analytic_gaussian_sigma(sensitivity=math.sqrt(3) / k, epsilon=eps, delta=delta)

    def cdf(scale):
        return lambda x: stats.norm.cdf(x, scale=scale)

    assert_distribution(
        (draws - center).ravel(), cdf(sigma), wrong_cdfs=[cdf(1.5 * sigma), cdf(sigma / 1.5)]
    )


def test_one_record_moves_the_aggregate_by_at_most_the_sensitivity(key):
    rng = np.random.default_rng(2)
    k, lo, hi = 10, 0.0, 1.0
    run = jax.jit(
        lambda kk, d: M.subsample_and_aggregate(
            kk, d, jnp.median, num_blocks=k, lower=lo, upper=hi, epsilon=1.0
        )
    )
    for trial in range(20):
        data = rng.uniform(-0.5, 1.5, size=205)
        other = data.copy()
        other[rng.integers(205)] = rng.choice([-10.0, 10.0])
        kk = jax.random.fold_in(key, trial)
        # same key → same partition and the same noise, so the difference is the exact change
        diff = abs(float(run(kk, jnp.asarray(data))) - float(run(kk, jnp.asarray(other))))
        assert diff <= (hi - lo) / k + 1e-12


def test_shuffled_estimate_is_accurate(key):
    # sorted input: without shuffling each block would see one slice of the distribution
    data = jnp.sort(jax.random.normal(key, (20_000,)))
    est = M.subsample_and_aggregate(
        jax.random.fold_in(key, 1),
        data,
        jnp.median,
        num_blocks=200,
        lower=-2.0,
        upper=2.0,
        epsilon=1.0,
    )
    # noise sd = sqrt(2) * 4 / 200; block-median sampling sd ≈ 1.25/sqrt(20000)
    assert abs(float(est)) < 0.15


def test_clipped_mean_sensitivity_formula():
    assert M.clipped_mean_sensitivity(num_values=4, dim=9, lower=0, upper=2, norm="l1") == 4.5
    assert M.clipped_mean_sensitivity(num_values=4, dim=9, lower=0, upper=2, norm="l2") == 1.5


def test_jit_matches_eager(key):
    data = jnp.linspace(0.0, 1.0, 100)

    def f(kk, d):
        return M.subsample_and_aggregate(
            kk, d, jnp.mean, num_blocks=10, lower=0.0, upper=1.0, epsilon=1.0
        )

    assert float(f(key, data)) == pytest.approx(float(jax.jit(f)(key, data)), rel=1e-12)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(num_blocks=0),
        dict(num_blocks=11),
        dict(epsilon=0.0),
        dict(lower=1.0, upper=0.0),
        dict(delta=1e-5),  # Laplace is pure ε
        dict(noise="gaussian", delta=0.0),
        dict(noise="cauchy"),
    ],
)
def test_bad_inputs_raise(key, kwargs):
    args = dict(num_blocks=2, lower=0.0, upper=1.0, epsilon=1.0) | kwargs
    with pytest.raises(ValueError, match="must be"):
        M.subsample_and_aggregate(key, jnp.zeros(10), jnp.mean, **args)


def test_empty_values_raise(key):
    with pytest.raises(ValueError, match="must be"):
        M.clipped_mean(key, jnp.zeros((0,)), lower=0.0, upper=1.0, epsilon=1.0)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_exact_log_ratio_with_a_non_finite_record(key, bad):
    # Fails on the original code for NaN: the release is NaN on D and finite on D′ (δ = 1).
    # Laplace(m, b) vs Laplace(m′, b): sup_v |ln p − ln p′| = |m − m′|/b exactly, and with the
    # same key the two releases differ by exactly m − m′ (same partition, same noise).
    rng = np.random.default_rng(5)
    k, lo, hi, eps = 10, 0.0, 1.0, 1.0
    b = (hi - lo) / k / eps
    for trial in range(10):
        data = rng.uniform(-0.5, 1.5, size=205)
        other = data.copy()
        other[rng.integers(205)] = bad
        kk = jax.random.fold_in(key, trial)
        outs = [
            float(
                M.subsample_and_aggregate(
                    kk, jnp.asarray(d), jnp.mean, num_blocks=k, lower=lo, upper=hi, epsilon=eps
                )
            )
            for d in (data, other)
        ]
        assert np.all(np.isfinite(outs))
        assert abs(outs[0] - outs[1]) / b <= eps * (1 + 1e-9)


def test_degenerate_block_estimates_are_mapped_not_refused(key):
    # An estimator may return NaN on a block; the estimate becomes the midpoint (no error).
    data = jnp.array([0.0, 0.0, 1.0, 1.0, 2.0, 2.0])

    def estimator(block):  # NaN on the block of zeros (e.g. a degenerate fit), else the mean
        return jnp.where(block[0] == 0.0, jnp.nan, jnp.mean(block))

    def run(est, kk):
        return M.subsample_and_aggregate(
            kk, data, est, num_blocks=3, lower=0.0, upper=1.0, epsilon=1.0, shuffle=False
        )

    def public(block):  # the same estimates with the NaN replaced by the midpoint 0.5
        return jnp.where(block[0] == 0.0, 0.5, jnp.mean(block))

    assert np.isfinite(float(run(estimator, key)))
    assert float(run(estimator, key)) == float(run(public, key))


@jax.jit
def _clipped_means(keys, values):
    return jax.vmap(lambda kk: M.clipped_mean(kk, values, lower=-1.0, upper=3.0, epsilon=0.5))(keys)


@pytest.mark.parametrize("bad, public", [(np.nan, 1.0), (np.inf, 3.0), (-np.inf, -1.0)])
def test_clipped_mean_non_finite_row_under_jit(key, bad, public):
    # Fails on the original code for NaN: NaN row → NaN release.
    rows = np.array([[0.5, 2.0], [bad, 0.0], [2.5, bad]])
    mapped = np.where(np.isnan(rows) | np.isinf(rows), public, rows)
    keys = jax.random.split(key, 200)
    got = np.asarray(_clipped_means(keys, jnp.asarray(rows)))
    assert np.all(np.isfinite(got))
    np.testing.assert_array_equal(got, np.asarray(_clipped_means(keys, jnp.asarray(mapped))))


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_clipped_mean_refuses_concrete_non_finite_rows(key, bad):
    with pytest.raises(ValueError, match="values must be finite"):
        M.clipped_mean(key, jnp.array([0.2, bad]), lower=0.0, upper=1.0, epsilon=1.0)


def _run_without_x64(code):
    import os
    import subprocess
    import sys

    env = dict(os.environ, JAX_ENABLE_X64="0", PYTHONPATH=os.getcwd())
    run = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout.strip().splitlines()[-1]


def test_float32_sum_moves_the_mean_at_most_the_calibrated_sensitivity_without_x64():
    # x64 off: everything is float32. The pre-noise mean t (captured where it meets the Laplace
    # mechanism) of neighbours must move by at most the sensitivity the noise is calibrated
    # to. Fails on the old code: the unshifted float32 mean moved by 12.5 (u − l)/k at
    # [1e6, 1e6 + 1], k = 100, and the sensitivity used was exactly (u − l)/k.
    code = """
import itertools
import jax, jax.numpy as jnp, numpy as np
import dpjax.mechanisms.subsample_aggregate as sa
assert not jax.config.jax_enable_x64
seen = []
def capture(key, mean, *, sensitivity, epsilon):
    seen.append((float(mean), float(sensitivity)))
    return mean
sa.laplace = capture
worst = 0.0
for lower, upper, k, seed in [(1e6, 1e6 + 1.0, 100, 0), (1000.0, 1001.0, 1000, 25),
                              (0.0, 1.0, 4096, 3)]:
    values = np.random.default_rng(seed).uniform(lower, upper, k).astype(np.float32)
    def mean(v):
        seen.clear()
        sa.clipped_mean(jax.random.key(0), jnp.asarray(v), lower=lower, upper=upper,
                        epsilon=1.0)
        return seen[0]
    t, sens = mean(values)
    for i, r in itertools.product(range(3), (lower, upper)):
        v = values.copy(); v[i] = np.float32(r)
        worst = max(worst, abs(mean(v)[0] - t) / sens)
print(worst)
"""
    assert float(_run_without_x64(code)) <= 1.0


def test_summation_error_bound_values():
    # Hand-computed: u = 2⁻²⁴ (float32), k = 1000: γ = 999u/(1 − 999u); 2γw + 2uw(1 + γ).
    u = 2.0**-24
    gamma = 999 * u / (1 - 999 * u)
    want = 2 * gamma + 2 * u * (1 + gamma)
    got = M.subsample_aggregate.summation_error_bound(num_values=1000, width=1.0, dtype=np.float32)
    assert got == pytest.approx(want, rel=1e-12)
    assert M.subsample_aggregate.summation_error_bound(
        num_values=1, width=1.0, dtype=np.float64
    ) == pytest.approx(2.0**-52, rel=1e-12)
    with pytest.raises(ValueError, match="num_values"):
        M.subsample_aggregate.summation_error_bound(
            num_values=2**23 + 2, width=1.0, dtype=np.float32
        )
