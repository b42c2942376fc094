"""Input checks of :func:`~dpjax.make_private` that need more than a range: σ the accountant can
handle, a noise std the float32 noise can hold, and which argument a slack failure is due to."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from dpjax import _validate
from dpjax.dp_sgd import adaptive_clip

__all__ = ["MAX_NOISE_STD", "MIN_NOISE_MULTIPLIER", "TAIL_FLOOR"]

#: The smallest positive σ make_private accepts. Below about 1e-151 the accountants' float64
#: arithmetic breaks (σ² underflows: the PLD grid divided by 0; the RDP bound overflowed to a
#: NaN read as ε = 0); σ = 1e-100 already gives ε ≈ 1e200, so nothing usable is refused.
MIN_NOISE_MULTIPLIER = 1e-100
#: The largest noise std σ·C make_private accepts: the noise is drawn in (at least) float32,
#: whose largest finite value this is (above it every update was NaN).
MAX_NOISE_STD = float(jnp.finfo(jnp.float32).max)
#: Overflow tails below this (per step) come from e^ε, not from the batch: a calibrated ε this
#: large leaves no room for the truncation slack whatever the cap.
TAIL_FLOOR = 1e-250


def refuse_vanishing_noise(sigma: float, given: Any) -> None:
    """Refuse 0 < σ < :data:`MIN_NOISE_MULTIPLIER` (named ``noise_multiplier``)."""
    if 0.0 < sigma < MIN_NOISE_MULTIPLIER:
        _validate.fail(
            "noise_multiplier",
            given,
            f"0 (the clip-only baseline, NOT private) or ≥ {MIN_NOISE_MULTIPLIER:g} (a smaller "
            "σ overflows the accountant's float64 arithmetic; its ε would exceed 1e190)",
        )


def refuse_overflowing_noise_std(l2_clip_norm: Any, sigma: float) -> None:
    """Refuse a fixed C whose noise std σ·C overflows float32 (every update would be NaN)."""
    if isinstance(l2_clip_norm, adaptive_clip.AdaptiveClip):
        return
    if sigma * float(l2_clip_norm) > MAX_NOISE_STD:
        _validate.fail(
            "l2_clip_norm",
            l2_clip_norm,
            f"small enough that the noise std noise_multiplier·l2_clip_norm = "
            f"{sigma:g}·{float(l2_clip_norm):g} is at most {MAX_NOISE_STD:.4g} (float32's "
            "largest value: a larger std overflows and every update is NaN)",
        )


def refuse_epsilon_beyond_any_cap(epsilon: float, tail: float) -> None:
    """A calibrated ε so large that the per-step overflow bound (∝ e^-ε) is below what any cap
    reaches: the failure is the target's (named ``target_epsilon``), not the batch's."""
    if tail < TAIL_FLOOR:
        _validate.fail(
            "target_epsilon",
            epsilon,
            f"small enough that the sampler's truncation slack (1 + e^ε)·T·p̄ can fit in δ: "
            f"at ε = {epsilon:g} a padded batch may overflow with probability at most "
            f"{tail:.3g} per step, below what any cap of n rows reaches",
        )


def _check_key(key: Any) -> jax.Array:
    """A typed JAX PRNG key (or raw uint32[2] threefry data); no default, no int seed."""
    if key is None:
        raise TypeError("key is required: pass key=jax.random.key(<seed>) (no default key)")
    if not isinstance(key, jax.Array):
        raise TypeError(f"key must be a JAX PRNG key (jax.random.key(seed)); got {key!r}")
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) and key.shape == ():
        return key
    if key.dtype == jnp.uint32 and key.shape == (2,):
        return jax.random.wrap_key_data(key)
    raise TypeError(f"key must be one JAX PRNG key; got an array of {key.dtype}{key.shape}")
