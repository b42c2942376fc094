"""The non-finite rule of the mechanisms: a NaN / ±inf / out-of-range record is released as its
public value in every float dtype, and no refusal prints the data."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpjax import mechanisms as M

# ------------------------------------------------------------------------------------------------
# the non-finite rule and of the clipped-mean sensitivity.
#
# What holds: under ``jit`` a NaN / ±inf / huge / −0.0 / out-of-range record is released exactly
# as its public value (NaN ↦ midpoint, clip) in float32, float16 and bfloat16 too (the existing
# tests cover float64 only), for ``smooth_median`` and ``bounded_laplace``.
#
# What breaks:
#
# * the eager ``ValueError`` of ``smooth_median`` prints the data's exact min and max (and the
#   refusal of non-finite values prints how many records are non-finite): a noiseless release
#   of private values through an exception message, which the ``jit`` path never makes;
# * ``refuse_non_finite`` crashes (``TracerBoolConversionError``) when concrete data are closed
#   over by a jitted function, so ``jax.jit(lambda k: smooth_median(k, data, ...))`` fails;
# * ``clipped_mean`` in float32 sums k clipped values in float32: when the range [l, u] is narrow
#   compared with |l| the mean of neighbours moves by up to 12.5× the declared (u − l)/k
#   (Casacuberta et al. 2022), so the Laplace noise calibrated to (u − l)/k is too small.
# ------------------------------------------------------------------------------------------------

BASE = [0.1, 0.4, 0.6, 0.9, 0.3]
ADVERSARIAL = [
    (math.nan, 0.5),
    (math.inf, 1.0),
    (-math.inf, 0.0),
    (1e30, 1.0),
    (-0.0, 0.0),
    (-5.0, 0.0),
]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("bad, public", ADVERSARIAL)
def test_non_finite_record_is_its_public_value_in_low_precision(key, dtype, bad, public):
    """Catches a NaN / inf record in float32/16/bf16 not released as its public value."""
    release = jax.jit(lambda k, d: M.smooth_median(k, d, upper=1.0, epsilon=1.0))
    with_bad = release(key, jnp.asarray(np.r_[BASE, bad], dtype))
    with_public = release(key, jnp.asarray(np.r_[BASE, public], dtype))
    assert bool(jnp.isfinite(with_bad))
    assert float(with_bad) == float(with_public)

    noisy = jax.jit(
        lambda k, v: M.bounded_laplace(k, v, sensitivity=0.1, epsilon=1.0, lower=0.0, upper=1.0)
    )
    out_bad, out_public = (
        noisy(key, jnp.asarray(bad, dtype)),
        noisy(key, jnp.asarray(public, dtype)),
    )
    assert 0.0 <= float(out_bad) <= 1.0
    assert float(out_bad) == float(out_public)


@pytest.mark.parametrize("secret", [3.7, -0.25, 1.123456789])
def test_eager_refusal_does_not_print_the_data(key, secret):
    # Fails on the reviewed code: "data must be inside [0, upper=1.0] (min, max shown); got
    # (0.1, 3.7)" releases a record exactly. A jit call on the same data releases only noise.
    """Catches an eager refusal message that prints private data values."""
    data = jnp.asarray([0.1, 0.4, 0.6, 0.9, secret])
    with pytest.raises(ValueError) as info:
        M.smooth_median(key, data, upper=1.0, epsilon=1.0)
    message = str(info.value)
    for value in np.asarray(data).tolist():
        assert repr(value) not in message and f"{value:g}" not in message, message


def test_smooth_median_under_jit_with_closed_over_data(key):
    # Fails on the reviewed code: refuse_non_finite sees a concrete array, but inside the trace
    # jnp.isfinite(x) is a tracer, and bool() of it raises TracerBoolConversionError.
    """Catches smooth_median crashing under jit when the data are closed over."""
    data = jnp.asarray(BASE)
    direct = M.smooth_median(key, data, upper=1.0, epsilon=1.0)
    closed = jax.jit(lambda k: M.smooth_median(k, data, upper=1.0, epsilon=1.0))(key)
    assert float(closed) == pytest.approx(float(direct), rel=1e-12)
