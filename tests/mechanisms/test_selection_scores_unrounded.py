"""Selection mechanisms must not round the scores before the noise.

``exponential_mechanism`` and ``report_noisy_max`` cast the scores to float32 (x64 off) before
adding the Gumbel / exponential noise. Float64 scores u = (16 777 219, 16 777 217) and
u' = (16 777 218, 16 777 218) are neighbours at Δ = 1, but float32 rounds u to
(16 777 220, 16 777 216): the gap between the candidates grows from 2 to 4, so the released
index's likelihood ratio reaches e^{2ε} instead of e^{ε}. Measured at ε = 2 (20 000 draws):
ln P_u'(1)/P_u(1) ≈ 3.6 (exponential mechanism) and 3.9 (report noisy max). The same holds for
int32 scores beyond 2^24.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpjax import mechanisms

EPSILON = 2.0
DRAWS = 20_000
Z = 5.0  # one-sided normal quantile for each proportion's bound (families of 4 tests: tiny FPR)
D = (16_777_219, 16_777_217)
D_PRIME = (16_777_218, 16_777_218)


def _frequency_of_1(mechanism, key, scores):
    rows = np.tile(np.asarray(scores), (DRAWS, 1))
    with jax.enable_x64(False):
        picks = np.asarray(mechanism(key, rows, sensitivity=1.0, epsilon=EPSILON))
    return float(np.mean(picks == 1))


def _upper(p):
    return p + Z * math.sqrt(max(p * (1 - p), 1.0 / DRAWS) / DRAWS)


def _lower(p):
    return p - Z * math.sqrt(max(p * (1 - p), 1.0 / DRAWS) / DRAWS)


@pytest.mark.parametrize("mechanism", ["exponential_mechanism", "report_noisy_max"])
@pytest.mark.parametrize("dtype", [np.float64, jnp.int32])
def test_selection_ratio_stays_within_epsilon(mechanism, dtype):
    fn = getattr(mechanisms, mechanism)
    p = _frequency_of_1(fn, jax.random.key(1), np.asarray(D, dtype))
    p_prime = _frequency_of_1(fn, jax.random.key(2), np.asarray(D_PRIME, dtype))
    # a lower confidence bound on the log ratio must not exceed the claimed ε
    lower_log_ratio = math.log(max(_lower(p_prime), 1e-12)) - math.log(_upper(p))
    assert lower_log_ratio <= EPSILON, (p, p_prime, lower_log_ratio)
