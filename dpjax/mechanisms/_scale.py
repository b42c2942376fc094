"""Refuse a noise scale whose release overflows the value's dtype (the Gaussian and Laplace rule).

``value + σ·Z`` is formed in the noise dtype (at least float32) and cast to the value's float
dtype. When σ·|Z| (or |value| + σ·|Z|) exceeds that dtype's largest finite number, the release is
±inf: it carries no information about the noise any more, and ``gaussian(sensitivity=1e300)`` on
a float32 value returned ±inf for every coordinate without a word. The rule: for every leaf, the
largest noise the sampler can draw (its support bound times the scale) plus the largest |value|
(when the value is concrete) must be finite in the leaf's OUTPUT dtype; otherwise ValueError
naming the argument and the largest admissible sensitivity. Traced values are checked on the
noise alone (their entries are unknown at trace time).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dpjax import _validate
from dpjax._noise import float_dtype_of

__all__ = ["GAUSSIAN_SUPPORT", "LAPLACE_SUPPORT", "refuse_overflowing_noise"]

GAUSSIAN_SUPPORT = 9.2
"""An upper bound of |Z| for dpjax's Gaussian sampler (Φ̄⁻¹(2⁻⁶⁵) = 9.155, see dpjax._random)."""

LAPLACE_SUPPORT = 44.4
"""An upper bound of |L| for dpjax's Laplace sampler (64·ln 2 = 44.36, see dpjax._random)."""


def _largest_scale(leaf: Any, support: float) -> float:
    """The largest scale for which |leaf| + scale·support is finite in the leaf's output dtype."""
    top = float(jnp.finfo(float_dtype_of(leaf)).max)
    reach = 0.0
    if _validate.is_concrete(leaf) and np.size(leaf):
        reach = float(np.max(np.abs(np.asarray(leaf, dtype=np.float64))))
    return max(top - reach, 0.0) / support


def refuse_overflowing_noise(
    value: Any, scale: float, *, support: float, sensitivity: float, context: str
) -> None:
    """Raise ValueError if ``value + scale·noise`` can be non-finite in some leaf's dtype.

    Args:
        value: the query answer (a pytree; concrete leaves are checked with their values).
        scale: the noise scale σ (Gaussian) or b (Laplace), a host float.
        support: an upper bound of the sampler's |noise| at scale 1.
        sensitivity: the sensitivity σ was calibrated for (named in the message).
        context: the other calibration arguments, e.g. "epsilon=1.0, delta=1e-05".

    Raises:
        ValueError: naming ``sensitivity`` and the largest value that keeps the release finite.
    """
    leaves = jax.tree.leaves(value)
    if not leaves:
        return
    limits = [(_largest_scale(leaf, support), leaf) for leaf in leaves]
    limit, leaf = min(limits, key=lambda t: t[0])
    if float(scale) <= limit:
        return
    dtype = jnp.dtype(float_dtype_of(leaf)).name
    _validate.fail(
        "sensitivity",
        sensitivity,
        f"at most {limit / (float(scale) / float(sensitivity)):.3g} for {context} and a {dtype} "
        f"value (the noise scale {float(scale):.3g} would make value + noise overflow "
        f"{dtype} to ±inf; rescale the statistic or release it in a wider dtype)",
    )
