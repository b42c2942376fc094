"""Review 4 (adversarial): the ghost T = 1 bound ``‖a‖²·‖g‖²`` underflows to 0 for tiny C.

``_rank_one_from_sums`` multiplies the two certified sums of squares in the wide dtype. When
the exact product is below the smallest normal number, XLA:CPU flushes it to 0 (FTZ), the
bound U becomes 0 and the clip factor min(1, C/U) is 1: the example entered the sum UNCLIPPED
(5.4·C at C = 1e-20 in float32; present before the certified-clipping changes too). Its
contribution is then < √tiny·√(flushed terms) (2⁻⁶³ in float32), so only clip norms far
below any real use were affected. Fix: ``clipped_grad`` refuses C < 2⁻⁴⁰
(:data:`dpjax.dp_sgd.clipping.MIN_CLIP_NORM`), and the worst flush at C = 2⁻⁴⁰ stays ≤ C.

Each contribution is measured by differencing the released sums with and without the example
(mask), in float64.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dpjax
from dpjax.dp_sgd.clipping import MIN_CLIP_NORM


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


@pytest.mark.parametrize("clip", [1e-20, 1e-200, MIN_CLIP_NORM / 2])
@pytest.mark.parametrize("per_layer", [False, True])
def test_clip_norms_that_underflow_the_bounds_are_refused(clip, per_layer):
    norm = {"w": clip} if per_layer else clip
    with pytest.raises(ValueError, match="l2_clip_norm.*2\\^-40"):
        dpjax.clipped_grad(_loss, l2_clip_norm=norm, per_layer=per_layer)


def test_the_worst_flushed_example_stays_below_the_smallest_clip_norm():
    """float32: a = g = 2⁻³²·e₁ flushes ‖a‖²‖g‖² = 2⁻¹²⁸ to 0 (unclipped), contribution
    2⁻⁶⁴ ≤ C = 2⁻⁴⁰: the floor on C covers the flush."""
    with jax.enable_x64(False):
        got = _contribution("ghost", MIN_CLIP_NORM, np.float32, 2.0**-32)
        control = _contribution("vmap", MIN_CLIP_NORM, np.float32, 2.0**-32)
    assert 0.0 < got <= MIN_CLIP_NORM
    assert 0.0 < control <= MIN_CLIP_NORM
