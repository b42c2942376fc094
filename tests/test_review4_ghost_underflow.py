"""Review 4 (adversarial): the ghost T = 1 bound ``‖a‖²·‖g‖²`` underflows to 0 for tiny C.

``_rank_one_from_sums`` multiplies the two certified sums of squares (each ≥ its floor
4(n+2)·tiny) in the wide dtype. When the exact product is below the smallest normal number,
XLA:CPU flushes it to 0 (FTZ), the bound U becomes 0 and the clip factor min(1, C/U) is 1:
the example enters the sum UNCLIPPED. Its contribution is then < √tiny (2⁻⁶³ ≈ 1.1e-19 in
float32, 2⁻⁵¹¹ in float64), so only clip norms below that are affected; but the guarantee is
stated for every C > 0 (``clipped_grad`` accepts any positive C, and the summation shrink
accepts C down to ~1e-27 in float32). The vmap backend clips the same example correctly.
Present before the certified-clipping changes too (eed4a2e): not new.

Each contribution is measured by differencing the released sums with and without the example
(mask), in float64.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dpjax


def _loss(params, x, v):
    return jnp.dot(x @ params["w"], v)


def _contribution(backend: str, clip: float, dtype, tiny_scale: float) -> float:
    """ℓ2 change of the released sum when example 0 (a = g = tiny_scale·e₁) is removed."""
    b, k, n = 4, 3, 2
    xs = np.zeros((b, k), dtype)
    vs = np.zeros((b, n), dtype)
    xs[0, 0] = tiny_scale
    vs[0, 0] = tiny_scale
    params = {"w": jnp.zeros((k, n), dtype)}
    grad_fn = dpjax.clipped_grad(_loss, l2_clip_norm=clip, backend=backend)
    full, _ = grad_fn(params, jnp.asarray(xs), jnp.asarray(vs), mask=jnp.ones(b, bool))
    drop = np.ones(b, bool)
    drop[0] = False
    rest, _ = grad_fn(params, jnp.asarray(xs), jnp.asarray(vs), mask=jnp.asarray(drop))
    diff = np.asarray(full["w"], np.float64) - np.asarray(rest["w"], np.float64)
    return float(np.linalg.norm(diff))


def test_vmap_clips_tiny_clip_norm_float32():
    """Control: the vmap backend keeps the same example's contribution ≤ C."""
    with jax.enable_x64(False):
        got = _contribution("vmap", 1e-20, np.float32, 2.0**-32)
    assert 0.0 < got <= 1e-20


@pytest.mark.xfail(
    strict=True,
    reason="ghost T = 1 bound ‖a‖²‖g‖² flushes to 0 below tiny (FTZ): unclipped, 5.4·C",
)
def test_ghost_tiny_clip_norm_float32():
    """float32 (no x64): a = g = 2⁻³²·e₁, so ‖a‖²‖g‖² = 2⁻¹²⁸ < tiny; contribution 2⁻⁶⁴."""
    with jax.enable_x64(False):
        got = _contribution("ghost", 1e-20, np.float32, 2.0**-32)
    assert got <= 1e-20, f"contribution {got:.3g} > C = 1e-20"


@pytest.mark.xfail(
    strict=True,
    reason="ghost T = 1 bound ‖a‖²‖g‖² flushes to 0 below tiny (FTZ): unclipped",
)
def test_ghost_tiny_clip_norm_float64():
    """float64: a = g = 2⁻²⁶⁰·e₁, ‖a‖²‖g‖² = 2⁻¹⁰⁴⁰ < tiny; contribution 2⁻⁵²⁰ ≫ C = 1e-200."""
    got = _contribution("ghost", 1e-200, np.float64, 2.0**-260)
    assert got <= 1e-200, f"contribution {got:.3g} > C = 1e-200"
