"""An integer that float64 cannot hold is refused, whatever Python type carries it.

The host path of ``exact_sum_with_noise`` adds a wide integer to the noise in float64 and refuses
integers beyond 2^53 in magnitude (float64 would round them before the noise). A Python int of
2^64 or more becomes a numpy OBJECT array, which the integer check did not look at: 2^64 + 2^11
and 2^64 + 2^11 + 1 (1 apart) were rounded to 2^64 and 2^64 + 2^12 (4096 apart) before the noise.
"""

from __future__ import annotations

import jax
import pytest

from dpjax import mechanisms

BIG_PAIR = (2**64 + 2**11, 2**64 + 2**11 + 1)


def test_the_pair_is_rounded_apart_by_float64():
    """The premise: float64 puts the neighbours 4096 apart (ties to even)."""
    a, b = (float(v) for v in BIG_PAIR)
    assert b - a == 4096.0


@pytest.mark.parametrize("value", [*BIG_PAIR, -(2**70) - 1, 2**100])
@pytest.mark.parametrize("mechanism", ["laplace", "gaussian"])
def test_python_int_beyond_2_53_is_refused(mechanism, value):
    kw = {"sensitivity": 1.0, "epsilon": 1.0}
    if mechanism == "gaussian":
        kw["delta"] = 1e-6
    with jax.enable_x64(False), pytest.raises(ValueError, match="value"):
        getattr(mechanisms, mechanism)(jax.random.key(0), value, **kw)
