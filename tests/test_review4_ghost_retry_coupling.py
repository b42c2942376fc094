"""Review 4 (adversarial): the accurate-retry cond couples every example's clip factor.

``_ghost_impl`` recomputes ALL rows' bounds with the accurate formulas when ANY kept row's fast
bound is non-finite or loose (``lax.cond(retry, ...)``). Since the certified-clipping changes,
the accurate T = 1 bounds of several layers are stacked and zero-padded to the widest width W
(``_rank_one_bounds_scaled``) and certified with γ_{W+2} and the floor 4(W+2)·tiny, so they
are LARGER than the fast bounds (γ_{K+2}) for every narrower part. One example whose fast
bound overflows (‖a‖² = inf, ‖a‖·‖g‖ finite) thus lowers the clip factor of every OTHER
clipped example by ≈ (W − K)·u: removing it moves the released sum by its own ≈ C plus
(B − 1)·δ·C. Before the change the accurate T = 1 bound was the fast one scaled by exact
powers of two (same bits), so the flip was harmless for T = 1 layers (this test passes on
eed4a2e: 0.9988·C in float32, 0.999999999998·C in float64). For T > 1 Gram taps the
same coupling is OLDER and larger (fast and accurate Gram bounds differ by up to 2 % for
rows that are not "loose"): ``test_retry_flip_gram_float32``, 1.58·C on eed4a2e too.

Attack: 2-layer linear MLP (K = 512 → 4 → 2, W1 = 0, W2 = 1), every example x = e₁, v = 10
(clipped, same direction); example 0 has x = −2⁶⁵·e₁ (float32; −2⁵¹⁵ in float64) and
v = 2⁻¹⁰: its fast bound overflows, its accurate bound is finite, and its clipped gradient
points against the others'. Its contribution is measured by differencing the released sums
with and without it (mask), in float64.

Fixed: the retry branch selects per row, so a row's bound depends on its own data only:
``cond(retry, lambda: where(loose, accurate_total, fast_total), lambda: fast_total)``
(row-wise where over sq/n2/u2; ``loose`` is per row). These tests failed before the fix.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import dpjax


def _loss(params, x, v):
    h = x @ params["w1"]
    return jnp.dot(h @ params["w2"], v)


def _contribution_of_first(batch: int, dtype, big: float) -> float:
    """ℓ2 change of the released sum when example 0 is removed (mask), C = 1."""
    k, h, n = 512, 4, 2
    params = {"w1": jnp.zeros((k, h), dtype), "w2": jnp.ones((h, n), dtype)}
    xs = np.zeros((batch, k), dtype)
    xs[:, 0] = 1.0
    xs[0, 0] = -big
    vs = np.full((batch, n), 10.0, dtype)
    vs[0] = 2.0**-10
    grad_fn = dpjax.clipped_grad(_loss, l2_clip_norm=1.0, backend="ghost")
    args = (params, jnp.asarray(xs), jnp.asarray(vs))
    full, info = grad_fn(*args, mask=jnp.ones(batch, bool))
    assert int(info.num_nonfinite) == 0  # example 0 is kept (clipped), not dropped
    drop = np.ones(batch, bool)
    drop[0] = False
    rest, _ = grad_fn(*args, mask=jnp.asarray(drop))
    diff = [np.asarray(full[p], np.float64) - np.asarray(rest[p], np.float64) for p in full]
    return float(np.sqrt(sum(np.sum(d * d) for d in diff)))


def test_retry_flip_float32():
    with jax.enable_x64(False):
        got = _contribution_of_first(64, np.float32, 2.0**65)
    assert got <= 1.0, f"removing example 0 moved the sum by {got!r} > C = 1"


def test_retry_flip_float64():
    got = _contribution_of_first(256, np.float64, 2.0**515)
    assert got <= 1.0, f"removing example 0 moved the sum by {got!r} > C = 1"


def _gram_loss(params, x, v):
    return jnp.sum((x @ params["w"]) * v)


def test_retry_flip_gram_float32():
    """T = 2 Gram tap (K = 2048, N = 8: not materialised), float32 without x64, B = 64.

    Every other example cancels: a_1 = a_2 = e₁, g_1 = 100·u, g_2 = −85·u (ε = 0.15), so its
    fast bound is 1.9 % above the accurate one yet not "loose" (n2 < 1.0201·sq): it is
    clipped 0.9 % harder when no retry happens. Example 0 (a = 2⁶⁵·e₁, g_1 = 2⁻¹²·u, the same
    direction) overflows the fast bound and triggers the retry for the whole batch: removing
    it moves the sum by its own C plus 63·0.009·C. Pre-existing (eed4a2e gives the same 1.58).
    """
    b, t, k, n = 64, 2, 2048, 8
    u = np.full(n, 0.5, np.float32)
    xs = np.zeros((b, t, k), np.float32)
    xs[:, :, 0] = 1.0
    xs[0, :, 0] = 2.0**65
    vs = np.zeros((b, t, n), np.float32)
    vs[:, 0] = 100.0 * u
    vs[:, 1] = -85.0 * u
    vs[0, 0] = 2.0**-12 * u
    vs[0, 1] = 0.0
    with jax.enable_x64(False):
        params = {"w": jnp.zeros((k, n), jnp.float32)}
        grad_fn = dpjax.clipped_grad(_gram_loss, l2_clip_norm=1.0, backend="ghost")
        full, info = grad_fn(params, jnp.asarray(xs), jnp.asarray(vs), mask=jnp.ones(b, bool))
        drop = np.ones(b, bool)
        drop[0] = False
        rest, _ = grad_fn(params, jnp.asarray(xs), jnp.asarray(vs), mask=jnp.asarray(drop))
    assert int(info.num_nonfinite) == 0
    got = float(np.linalg.norm(np.asarray(full["w"], np.float64) - np.asarray(rest["w"])))
    assert got <= 1.0, f"removing example 0 moved the sum by {got!r} > C = 1"
