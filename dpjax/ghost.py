r"""Ghost clipping: per-example clipped gradient sums without per-example weight gradients.

For a dense layer ``out = a · W`` the gradient of one example's loss is ``∇W = aᵀ g``, where
``g`` is the gradient of the loss at the layer's output. Its norm follows from ``a`` and ``g``
alone (Goodfellow 2015; Li et al. 2022, "ghost clipping"):

.. math::  \|∇W\|_F^2 = \|a\|^2 \|g\|^2 \quad\text{or, for sequences,}\quad
           \sum_{t,s} (a_t·a_s)(g_t·g_s),

and the clipped sum is one re-weighted contraction over the batch axis (book-keeping, Bu et
al. 2023): ``Σ_i s_i a_iᵀ g_i = einsum('bk,bn,b->kn', a, g, s)`` with
``s_i = min(1, C / ‖∇ℓ_i‖)``. The layers are found by tracing the per-example loss
(:mod:`dpjax._ghost_trace`), so flax linen/nnx models and plain pytrees (``x @ W + b``) work
alike. Recognised: a parameter used once as an operand of ``dot_general`` (Dense, ``x @ W``,
einsum) and ungrouped convolution kernels (as a dense layer on im2col patches, T = output
positions). For T > 1 a small layer's per-example gradients (K·N ≤ 8192) are formed and reused
for the sum; a large one uses the Gram trick. Everything else (biases, norms, embeddings,
grouped convolutions, tied weights, weights inside ``scan``/``remat``/``custom_jvp``) gets
per-example gradients by ``jax.vmap``, in the same backward pass; they are usually small.

Cost (issue 9 benchmark, 2-core CPU): the clipped sum without noise is about 1.1–1.5× a
non-private gradient for the MLP 784-512-512-10, the CNN and logistic regression d = 10⁴,
against 7–80× for the vmap path; memory stays near the non-private step.

This module is the ``method="ghost"`` path of :func:`dpjax.clipped_grad`; the result equals the
vmap path up to float rounding (tested in ``tests/test_ghost.py``).

Formal guarantees:
    Same as the vmap path: every example's gradient over the whole parameter pytree is
    scaled to ℓ2 norm ≤ ``l2_clip_norm`` before summation (the norms are exact, not bounds),
    so the sum has ℓ2 sensitivity ``C`` under add-or-remove-one and ``2C`` under replace-one
    (Abadi et al. 2016, "Deep Learning with Differential Privacy", §3.1). Examples with
    ``mask=False`` or (``nan_safe``) a non-finite gradient norm contribute exactly zero.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dpjax import _validate
from dpjax._ghost_trace import DenseTap, GhostPlan, evaluate_tapped, make_plan

__all__ = ["supports", "ghost_clipped_sum", "plan"]


def _as_batch(batch: Any) -> tuple[Any, ...]:
    return tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)


def _aval(x: Any, *, drop_batch: bool = False) -> jax.ShapeDtypeStruct:
    shape = jnp.shape(x)[1:] if drop_batch else jnp.shape(x)
    return jax.ShapeDtypeStruct(shape, jnp.result_type(x))


def plan(loss_fn: Callable, params: Any, *batch: Any) -> tuple[GhostPlan, Callable]:
    """Trace ``loss_fn`` for one example and find its dense weights.

    Args:
        loss_fn: ``loss_fn(params, *example) -> scalar``, the loss of ONE example.
        params: the parameter pytree.
        *batch: the batched arguments (leading axis = examples).

    Returns:
        ``(plan, flat_fn)``: the traced plan and ``flat_fn(*param_leaves, *example_leaves)``.
    """
    p_leaves, p_tree = jax.tree.flatten(params)
    e_leaves, e_tree = jax.tree.flatten(batch)
    n = len(p_leaves)

    def flat_fn(*leaves: Any) -> Any:
        p = jax.tree.unflatten(p_tree, leaves[:n])
        example = jax.tree.unflatten(e_tree, leaves[n:])
        return loss_fn(p, *example)

    p_avals = [_aval(x) for x in p_leaves]
    e_avals = [_aval(x, drop_batch=True) for x in e_leaves]
    return make_plan(flat_fn, p_avals, e_avals), flat_fn


def supports(loss_fn: Callable, params: Any, *batch: Any) -> bool:
    """Whether the ghost path can speed up ``loss_fn``: it has at least one dense weight.

    Args:
        loss_fn: ``loss_fn(params, *example) -> scalar``, the loss of ONE example.
        params: the parameter pytree.
        *batch: the batched arguments (leading axis = examples).

    Returns:
        ``True`` iff tracing found a parameter used once as an operand of a matrix product.
        Functions that cannot be traced for one example give ``False`` (the vmap path then
        reports the error).

    Example:
        >>> import jax.numpy as jnp
        >>> loss = lambda w, x, y: (x @ w - y) ** 2
        >>> supports(loss, jnp.zeros(3), jnp.ones((4, 3)), jnp.ones(4))
        True
        >>> supports(lambda w, x: jnp.sum((w - x) ** 2), jnp.zeros(3), jnp.ones((4, 3)))
        False
    """
    try:
        ghost_plan, _ = plan(loss_fn, params, *batch)
    except Exception:  # noqa: BLE001 - any tracing failure means "not supported"
        return False
    return len(ghost_plan.taps) > 0


def _per_example_parts(ghost_plan: GhostPlan, p_leaves: list, e_leaves: list):
    """vmap over examples: per-example grads of untapped leaves, tap output grads, activations."""
    tapped = ghost_plan.tapped_leaves
    other = [i for i in range(len(p_leaves)) if i not in tapped]

    def one(example: list) -> tuple:
        perts = [jnp.zeros(t.out_shape, t.out_dtype) for t in ghost_plan.taps]

        def f(other_vals: list, perts: list):
            leaves = list(p_leaves)
            for i, v in zip(other, other_vals, strict=True):
                leaves[i] = v
            return evaluate_tapped(ghost_plan, leaves + list(example), perts)

        loss, vjp, acts = jax.vjp(f, [p_leaves[i] for i in other], perts, has_aux=True)
        g_other, g_perts = vjp(jnp.ones_like(loss))
        return g_other, g_perts, acts

    g_other, g_perts, acts = jax.vmap(one)(e_leaves)
    return other, g_other, g_perts, acts


def _canonical(tap: DenseTap, act: jax.Array, g: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per-example activations ``(B, T, K)`` and output gradients ``(B, T, N)``."""
    b = act.shape[0]
    a = jnp.transpose(act, (0,) + tuple(d + 1 for d in tap.act_perm)).reshape(b, tap.t, tap.k)
    g = jnp.transpose(g, (0,) + tuple(d + 1 for d in tap.out_perm)).reshape(b, tap.t, tap.n)
    # the wider of the two (e.g. bf16 inputs with f32 accumulation); explicit under strict mode
    dtype = max(a.dtype, g.dtype, key=lambda d: jnp.dtype(d).itemsize)
    return a.astype(dtype), g.astype(dtype)


_SMALL_LAYER = 8192  # K·N: per-example gradients of layers this small are cheap to materialise


def _materialise(tap: DenseTap) -> bool:
    """Form per-example layer gradients (B, K, N) instead of ghost norms: T > 1 and K·N small.

    Then the norms cost B·T·K·N flops and the clipped sum reuses them (B·K·N); the Gram trick
    costs B·T²·(K+N) plus a second B·T·K·N contraction for the sum.
    """
    return tap.t > 1 and (tap.k * tap.n <= tap.t * (tap.k + tap.n) or tap.k * tap.n <= _SMALL_LAYER)


def _dense_sq_norms(a: jax.Array, g: jax.Array) -> jax.Array:
    r"""Per-example ``‖aᵢᵀ gᵢ‖²_F``: ``‖a‖²‖g‖²`` when T = 1, else the Gram trick."""
    if a.shape[1] == 1:
        return jnp.einsum("btk,btk->b", a, a) * jnp.einsum("btn,btn->b", g, g)
    # Σ_{t,s} (a_t·a_s)(g_t·g_s): B·T²·(K+N) flops, no B·K·N buffer
    return jnp.einsum(
        "bts,bts->b", jnp.einsum("btk,bsk->bts", a, a), jnp.einsum("btn,bsn->bts", g, g)
    )


def _flat_sq_norms(per_example: jax.Array) -> jax.Array:
    flat = per_example.reshape(per_example.shape[0], -1)
    return jnp.einsum("bi,bi->b", flat, flat)


def _to_weight_layout(tap: DenseTap, total: jax.Array, dtype: Any) -> jax.Array:
    """A canonical ``(K, N)`` gradient back in the weight's own shape and dtype."""
    total = total.reshape([tap.weight_shape[d] for d in tap.weight_perm])
    return jnp.transpose(total, np.argsort(tap.weight_perm)).astype(dtype)


def _dense_clipped_sum(a: jax.Array, g_scaled: jax.Array, keep: jax.Array, sanitize: bool):
    """``Σ_i aᵢᵀ (sᵢ gᵢ)`` as ``(K, N)``: one contraction over batch and T."""
    b, t, k = a.shape  # one contracting axis (B·T): no transposed copy of the activations
    if sanitize:
        a = _row_where(keep, a)
    return jnp.einsum("mk,mn->kn", a.reshape(b * t, k), g_scaled.reshape(b * t, -1))


def _weighted_rows(per_example: jax.Array, weights: jax.Array, keep: jax.Array, sanitize: bool):
    """``Σ_i wᵢ xᵢ`` over materialised per-example gradients ``(B, ...)``."""
    if sanitize:
        per_example = _row_where(keep, per_example)
    flat = per_example.reshape(per_example.shape[0], -1)
    total = jnp.einsum("bi,b->i", flat, weights.astype(flat.dtype))
    return total.reshape(per_example.shape[1:])


def _nan_proof(sums_fn: Callable[[bool], list]) -> list:
    """``sums_fn(False)``, or ``sums_fn(True)`` if any entry is not finite.

    Dropped rows (mask False, non-finite example) have weight 0, but their activations may hold
    NaN/inf and ``NaN · 0`` is NaN. Zeroing them (``sanitize``) writes a copy of every
    activation each step, so contract directly and recompute with zeroed rows only when the
    result is not finite (kept rows are finite, so only a dropped row can cause that). Both
    branches are exact; one ``cond`` for all layers.
    """
    fast = sums_fn(False)
    ok = jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in fast]))
    return jax.lax.cond(ok, lambda: fast, lambda: sums_fn(True))


def _norm_dtype(leaves: Sequence[Any]) -> Any:
    """float64 if any leaf is float64, else float32 (the rule of the vmap path)."""
    return jnp.float64 if any(jnp.result_type(x) == jnp.float64 for x in leaves) else jnp.float32


def _row_where(keep: jax.Array, x: jax.Array) -> jax.Array:
    return jnp.where(keep.reshape((-1,) + (1,) * (x.ndim - 1)), x, jnp.zeros((), x.dtype))


def ghost_clipped_sum(
    loss_fn: Callable,
    params: Any,
    batch: Any,
    *,
    l2_clip_norm: float,
    mask: jax.Array | None = None,
    nan_safe: bool = True,
) -> tuple[Any, jax.Array, jax.Array]:
    r"""Sum of per-example gradients clipped to ℓ2 ≤ C, by ghost norms and book-keeping.

    .. math::  \sum_i \min(1, C/\|∇ℓ(θ; x_i)\|)\, ∇ℓ(θ; x_i)

    Args:
        loss_fn: ``loss_fn(params, *example) -> scalar``, the loss of ONE example.
        params: the parameter pytree.
        batch: tuple of the batched arguments of ``loss_fn`` (leading axis = examples).
        l2_clip_norm: the clip norm ``C > 0`` over the whole pytree.
        mask: optional boolean ``(B,)``; rows with ``False`` contribute zero.
        nan_safe: zero (and count) examples whose gradient norm is not finite.

    Returns:
        ``(clipped_sum, per_example_norms, num_nonfinite)``: the sum (same structure as
        ``params``), the unclipped per-example gradient norms ``(B,)`` (0 for masked rows) and
        the number of unmasked examples with a non-finite norm.

    Formal guarantees:
        Each example's contribution has ℓ2 norm ≤ ``l2_clip_norm`` (see the module docstring).

    Example:
        >>> import jax.numpy as jnp
        >>> loss = lambda w, x, y: 0.5 * (x @ w - y) ** 2
        >>> x, y = jnp.array([[3.0, 4.0], [0.3, 0.4]]), jnp.zeros(2)
        >>> total, norms, bad = ghost_clipped_sum(loss, jnp.ones(2), (x, y), l2_clip_norm=1.0)
        >>> [round(float(v), 3) for v in total], [round(float(v), 3) for v in norms]
        ([0.81, 1.08], [35.0, 0.35])
    """
    _validate.positive("l2_clip_norm", l2_clip_norm)
    batch = _as_batch(batch)
    ghost_plan, _ = plan(loss_fn, params, *batch)
    p_leaves, p_tree = jax.tree.flatten(params)
    e_leaves = jax.tree.leaves(batch)
    other, g_other, g_perts, acts = _per_example_parts(ghost_plan, p_leaves, e_leaves)
    dtype = _norm_dtype(p_leaves)

    dense = [_canonical(t, a, g) for t, a, g in zip(ghost_plan.taps, acts, g_perts, strict=True)]
    layer = {
        j: jnp.einsum("btk,btn->bkn", a, g)
        for j, (tap, (a, g)) in enumerate(zip(ghost_plan.taps, dense, strict=True))
        if _materialise(tap)
    }
    sq = [
        _flat_sq_norms(layer[j]) if j in layer else _dense_sq_norms(a, g)
        for j, (a, g) in enumerate(dense)
    ]
    sq = [x.astype(dtype) for x in sq] + [_flat_sq_norms(g).astype(dtype) for g in g_other]
    norms = jnp.sqrt(sum(sq[1:], sq[0]))

    finite = jnp.isfinite(norms)
    keep = jnp.ones(norms.shape, bool) if mask is None else jnp.asarray(mask, bool)
    num_nonfinite = jnp.sum(jnp.logical_and(keep, ~finite), dtype=jnp.int32)
    if nan_safe:
        keep = jnp.logical_and(keep, finite)
    clip = jnp.asarray(l2_clip_norm, dtype)
    scale = clip / jnp.maximum(norms, clip)  # min(1, C/‖g‖), 1 at ‖g‖ = 0
    weights = jnp.where(keep, scale, jnp.zeros((), dtype))

    def clipped_sums(sanitize: bool) -> list:
        sums: list[Any] = [None] * len(p_leaves)
        for j, (tap, (a, g)) in enumerate(zip(ghost_plan.taps, dense, strict=True)):
            if j in layer:
                total = _weighted_rows(layer[j], weights, keep, sanitize)
            else:
                g_scaled = _row_where(keep, g * scale.astype(g.dtype)[:, None, None])
                total = _dense_clipped_sum(a, g_scaled, keep, sanitize)
            sums[tap.leaf] = _to_weight_layout(tap, total, p_leaves[tap.leaf].dtype)
        for i, g in zip(other, g_other, strict=True):
            sums[i] = _weighted_rows(g, weights, keep, sanitize).astype(p_leaves[i].dtype)
        return sums

    sums = _nan_proof(clipped_sums)
    reported = norms if mask is None else jnp.where(mask, norms, jnp.zeros((), dtype))
    return jax.tree.unflatten(p_tree, sums), reported, num_nonfinite
