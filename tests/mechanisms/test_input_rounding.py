"""A release never rounds its input before the noise.

With JAX's 64-bit mode off, a float64 value (or a wide integer) cast to float32 before the noise
moves two neighbouring inputs further apart than the stated sensitivity: float64 16 777 218 and
16 777 219 (1 apart) become 16 777 216 and 16 777 220 in float32 (4 apart with ties to even,
at least 2), so the Laplace release's true ε is a multiple of the claim. The release must be a
rounding of the exact sum v + noise (post-processing), or refuse.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from dpjax import mechanisms
from dpjax.auditing import estimators
from dpjax.mechanisms import discrete

# rounding claims of compiled code: run on the users' -O3 code (tests/conftest.py)
pytestmark = pytest.mark.codegen

PAIR = (np.float64(16_777_218.0), np.float64(16_777_219.0))


def _noise_of(key, **kw):
    """The float32 noise the release adds under ``key`` (the release of the exact value 0)."""
    return np.float64(np.asarray(mechanisms.laplace(key, np.float32(0.0), **kw)))


def test_float64_value_is_added_to_the_noise_unrounded():
    """laplace(f64 v) == fl32(v + w) for the noise w of the same key; the old code returned
    fl32(fl32(v) + w), whose input moved 16 777 219 → 16 777 220 before the noise."""
    with jax.enable_x64(False):
        for seed in range(20):
            key = jax.random.key(seed)
            w = _noise_of(key, sensitivity=1.0, epsilon=1.0)
            for v in PAIR:
                got = np.asarray(mechanisms.laplace(key, v, sensitivity=1.0, epsilon=1.0))
                assert got.dtype == np.float32
                assert got == np.float32(np.float64(v) + w), (seed, v)


@pytest.mark.parametrize(
    "value",
    [
        16_777_219.0,  # Python float
        16_777_219,  # Python int
        np.float64(16_777_219.0),
        np.int64(16_777_219),
        np.int32(16_777_219),
        np.array([16_777_219.0, -3.25], np.float64),
        np.array([16_777_219, 7], np.int64),
    ],
    ids=["py-float", "py-int", "np-f64", "np-i64", "np-i32", "f64-array", "i64-array"],
)
def test_every_wide_host_dtype_reaches_the_noise_exactly(value):
    """Gaussian and Laplace: every dtype float32 cannot hold exactly is added in float64."""
    with jax.enable_x64(False):
        key = jax.random.key(7)
        exact = np.asarray(value, np.float64)
        for release, kw in (
            (mechanisms.laplace, dict(sensitivity=1.0, epsilon=1.0)),
            (mechanisms.gaussian, dict(sensitivity=1.0, epsilon=0.5, delta=1e-5)),
        ):
            zero = np.zeros_like(exact, np.float32)
            w = np.asarray(release(key, zero, **kw), np.float64)
            got = np.asarray(release(key, value, **kw))
            np.testing.assert_array_equal(got, (exact + w).astype(np.float32))


@pytest.mark.parametrize(
    "dtype", [np.int8, np.int16, np.uint8, np.float16, ml_dtypes.bfloat16, np.float32]
)
def test_narrow_dtypes_keep_the_float32_path(dtype):
    """Values that float32 holds exactly are added in float32, as before (and equal the exact
    sum's rounding)."""
    with jax.enable_x64(False):
        key = jax.random.key(3)
        value = np.array([1, 2, 100], dtype)
        w = np.asarray(
            mechanisms.laplace(key, np.zeros(3, np.float32), sensitivity=1.0, epsilon=1.0),
            np.float64,
        )
        got = np.asarray(mechanisms.laplace(key, value, sensitivity=1.0, epsilon=1.0))
        expected = (np.asarray(value, np.float64) + w).astype(got.dtype)
        np.testing.assert_array_equal(got, expected)


def test_traced_wide_integers_are_clamped_into_the_exact_range():
    """Under jit an int32 value is clamped to ±2^24 (1-Lipschitz) before the float32 cast, so
    neighbours 2^24 + 1 and 2^24 + 2 are released at the same point (never further apart)."""
    with jax.enable_x64(False):
        key = jax.random.key(0)
        f = jax.jit(lambda k, v: mechanisms.laplace(k, v, sensitivity=1.0, epsilon=1.0))
        a = f(key, jnp.int32(2**24 + 1))
        b = f(key, jnp.int32(2**24 + 2))
        below = f(key, jnp.int32(2**24 - 1))
        w = _noise_of(key, sensitivity=1.0, epsilon=1.0)
        assert a == b == np.float32(2.0**24 + w)
        assert below == np.float32(2.0**24 - 1 + w)


def test_inexact_float64_constant_under_jit_is_refused():
    """A float64 constant closed over inside jit would be rounded before traced noise."""
    with jax.enable_x64(False):
        f = jax.jit(lambda k: mechanisms.laplace(k, PAIR[1], sensitivity=1.0, epsilon=1.0))
        with pytest.raises(ValueError, match="value"):
            f(jax.random.key(0))
        exact = jax.jit(lambda k: mechanisms.laplace(k, 3.0, sensitivity=1.0, epsilon=1.0))
        assert np.isfinite(float(exact(jax.random.key(0))))


def test_integers_beyond_float64_precision_are_refused():
    with jax.enable_x64(False), pytest.raises(ValueError, match="2\\*\\*53"):
        mechanisms.laplace(jax.random.key(0), 2**60 + 1, sensitivity=1.0, epsilon=1.0)


def _threshold_epsilon_lower_bound(rounded: bool, n: int = 200_000) -> float:
    """ε lower bound of a threshold test between the PAIR's Laplace releases (b = 1).

    The noise is the mechanism's own float32 noise (one draw per key); each release is
    fl32(v + w), the rounding the mechanism now performs (checked exactly above), or, with
    ``rounded``, fl32(fl32(v) + w), the old code's release."""
    with jax.enable_x64(False):
        keys = jax.random.split(jax.random.key(11), 2 * n)
        noise = jax.vmap(
            lambda k: mechanisms.laplace(k, np.float32(0.0), sensitivity=1.0, epsilon=1.0)
        )(keys)
    w = np.asarray(noise, np.float64)
    d, dprime = PAIR
    if rounded:
        d, dprime = np.float64(np.float32(d)), np.float64(np.float32(dprime))
    out_d = (d + w[:n]).astype(np.float32).astype(np.float64)
    out_dp = (dprime + w[n:]).astype(np.float32).astype(np.float64)
    return estimators.direct_epsilon_lower_bound(out_d, out_dp, confidence=0.95).epsilon


def test_threshold_attack_stays_within_the_claimed_epsilon():
    """Threshold audit, 2·10^5 releases a side: ε_LB ≤ 1 (the claim) for the exact sum; the
    same audit on the old pre-rounded release must exceed 1 (the test has power)."""
    assert _threshold_epsilon_lower_bound(rounded=False) <= 1.0
    assert _threshold_epsilon_lower_bound(rounded=True) > 1.2


def _grid_points(value, **kw):
    """The grid index the discrete Laplace release adds its noise to (noise forced to 0)."""
    import dpjax.mechanisms.discrete as mod

    original = mod.integer_noise
    mod.integer_noise = lambda key, shape, proposal: (jnp.zeros(shape, jnp.int32), None)
    try:
        return np.asarray(mechanisms.discrete_laplace(jax.random.key(0), value, **kw))
    finally:
        mod.integer_noise = original


def test_discrete_laplace_indexes_float64_values_without_rounding():
    """float64 2 097 153.4 and 2 097 152.6 (Δ₁ = 0.8, so Δ_g = ⌊0.8⌋ + 1 = 1 step) land on
    grid points at most 1 apart at g = 1 (the old float32 cast moved them to 2 097 153.5 and
    2 097 152.5: 2 steps, ε twice the claim)."""
    kw = dict(sensitivity=0.8, epsilon=1.0, bound=2.0**22, granularity=1.0)
    for cast in (float, np.float64, lambda v: np.array([v], np.float64)):
        with jax.enable_x64(False):
            a = _grid_points(cast(2_097_153.4), **kw)
            b = _grid_points(cast(2_097_152.6), **kw)
        steps = np.sum(np.abs(a - b))
        rate = discrete.discrete_laplace_rate(sensitivity=0.8, epsilon=1.0, granularity=1.0)
        assert float(rate) * steps <= 1.0 + 1e-12, (cast, a, b)


def test_integer_counts_pay_no_rounding_step():
    """An integer query on a grid g ≤ 1 is already on the grid: Δ_g = Δ₁ (not Δ₁ + d), so a
    count at ε = 1 gets rate 1, not 1/2 (twice the noise); float queries keep the +d."""
    rate_int = discrete.discrete_laplace_rate(
        sensitivity=1.0, epsilon=1.0, granularity=1.0, on_grid=True
    )
    rate_float = discrete.discrete_laplace_rate(sensitivity=1.0, epsilon=1.0, granularity=1.0)
    assert (float(rate_int), float(rate_float)) == (1.0, 0.5)
    assert discrete._is_integer_query(np.array([3, 4], np.int64))
    assert discrete._is_integer_query(jnp.int32(3))
    assert not discrete._is_integer_query(np.float64(3.0))
    # neighbouring counts 5 and 6 (Δ₁ = 1) are exactly 1 grid step apart at g = 1 and 2^-2
    for g in (1.0, 0.25):
        kw = dict(sensitivity=1.0, epsilon=1.0, bound=64.0, granularity=g)
        steps = np.abs(_grid_points(np.int64(6), **kw) - _grid_points(np.int64(5), **kw)) / g
        assert steps <= discrete.grid_sensitivity(1.0, g, on_grid=True) / g
