"""bounded_laplace must not round f(D) before the noise.

With x64 off the value is cast to float32 before the truncated-Laplace sample is drawn around
it: float64 q = 16 777 217 and q′ = 16 777 218 (Δ = 1) become centres 16 777 216 and
16 777 218, 2 apart, so the mechanism calibrated for ε = 1 on [16 777 200, 16 777 240] runs at
bounded_laplace_epsilon(Δ = 2) = 1.78. Measured on the event {y ≤ 16 777 214}:
ln P_q/P_q′ ≈ 1.23 > 1 (20 000 draws each).
"""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from dpjax import mechanisms

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


@pytest.mark.xfail(
    strict=True,
    reason="the float64 value is rounded to float32 before the noise: centres 2 apart at "
    "Δ = 1 (measured ln-ratio ≈ 1.23 at claimed ε = 1)",
)
def test_bounded_laplace_ratio_stays_within_epsilon():
    p = _frequency_below(jax.random.key(3), 16_777_217.0)
    p_prime = _frequency_below(jax.random.key(4), 16_777_218.0)
    lower_log_ratio = math.log(p - Z * _sd(p)) - math.log(p_prime + Z * _sd(p_prime))
    assert lower_log_ratio <= EPSILON, (p, p_prime, lower_log_ratio)
