"""bounded_laplace must not round f(D) before the noise.

With x64 off the value was cast to float32 before the truncated-Laplace sample is drawn around
it: float64 q = 16 777 217 and q′ = 16 777 218 (Δ = 1) become centres 16 777 216 and
16 777 218, 2 apart, so the mechanism calibrated for ε = 1 on [16 777 200, 16 777 240] runs at
bounded_laplace_epsilon(Δ = 2) = 1.78. Measured on the event {y ≤ 16 777 214}:
ln P_q/P_q′ ≈ 1.23 > 1 (20 000 draws each). An eager call now samples a value that float32
cannot hold on the host in float64 (one rounding, after); inside a trace such a constant is
refused.
"""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from dpjax import mechanisms

# rounding claims of compiled code: run on the users' -O3 code (tests/conftest.py)
pytestmark = pytest.mark.codegen

LOWER, UPPER = 16_777_200.0, 16_777_240.0
EPSILON = 1.0
DRAWS = 60_000
Z = 5.0
THRESHOLD = 16_777_214.0


def _frequency_below(key, value):
    values = np.full(DRAWS, value, np.float64)
    with jax.enable_x64(False):
        y = mechanisms.bounded_laplace(
            key, values, sensitivity=1.0, epsilon=EPSILON, lower=LOWER, upper=UPPER
        )
    return float(np.mean(np.asarray(y, np.float64) <= THRESHOLD))


def _sd(p):
    return math.sqrt(max(p * (1 - p), 1.0 / DRAWS) / DRAWS)


def test_bounded_laplace_ratio_stays_within_epsilon():
    p = _frequency_below(jax.random.key(3), 16_777_217.0)
    p_prime = _frequency_below(jax.random.key(4), 16_777_218.0)
    lower_log_ratio = math.log(p - Z * _sd(p)) - math.log(p_prime + Z * _sd(p_prime))
    assert lower_log_ratio <= EPSILON, (p, p_prime, lower_log_ratio)


# ---------------------------------------------------------------- same-key (grey-box) checks

SAME_KEY_DRAWS = 2_000


def _same_key_release(value, dtype):
    values = np.full(SAME_KEY_DRAWS, value, dtype)
    with jax.enable_x64(False):
        y = mechanisms.bounded_laplace(
            jax.random.key(11), values, sensitivity=1.0, epsilon=EPSILON, lower=LOWER, upper=UPPER
        )
    return np.asarray(y, np.float64)


@pytest.mark.parametrize("dtype", [np.float64, np.int64])
def test_centres_one_apart_are_not_merged_by_a_cast(dtype):
    """16 777 216 and 16 777 217 (1 apart) were both sampled around 16 777 216 (the float32
    rounding of the second): with the same key every draw was identical. Sampled around their
    own centres, a shift of 1 moves most draws (the output rounding to float32 is after)."""
    a = _same_key_release(16_777_216, dtype)
    b = _same_key_release(16_777_217, dtype)
    moved = np.mean(a != b)
    assert moved > 0.3, moved
    assert np.all(b >= a)  # the quantile is nondecreasing in the centre at a fixed position


def test_inexact_float64_constant_refused_inside_jit():
    """Under jit the sample is traced, so a float64 constant closed over would be rounded
    before it: refused, naming value. Passed as an argument it arrives as float32 (the
    caller's query) and is accepted; a constant float32 holds exactly is accepted too."""

    def release(key, value):
        return mechanisms.bounded_laplace(
            key, value, sensitivity=1.0, epsilon=EPSILON, lower=LOWER, upper=UPPER
        )

    with jax.enable_x64(False):
        with pytest.raises(ValueError, match="value must be a value that float32 holds"):
            jax.jit(lambda k: release(k, np.float64(16_777_217.0)))(jax.random.key(0))
        y = jax.jit(release)(jax.random.key(0), np.float64(16_777_217.0))
        z = jax.jit(lambda k: release(k, 16_777_218.0))(jax.random.key(0))
    assert LOWER <= float(y) <= UPPER and LOWER <= float(z) <= UPPER
