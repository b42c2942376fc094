r"""Ghost clipping: per-example clipped gradient sums without per-example weight gradients.

For a dense layer ``out = a · W`` the gradient of one example's loss is ``∇W = aᵀ g``, where
``g`` is the gradient of the loss at the layer's output. Its norm follows from ``a`` and ``g``
alone (Goodfellow 2015; Li et al. 2022, "ghost clipping"):

.. math::  \|∇W\|_F^2 = \|a\|^2 \|g\|^2 \quad\text{or, for sequences,}\quad
           \sum_{t,s} (a_t·a_s)(g_t·g_s),

and the clipped sum is one re-weighted contraction over the batch axis (book-keeping, Bu et
al. 2023): ``Σ_i s_i a_iᵀ g_i = einsum('bk,bn,b->kn', a, g, s)`` with
``s_i = min(1, C / ‖∇ℓ_i‖)``. The layers are found by tracing the per-example loss
(:mod:`dpjax.dp_sgd._ghost_trace`), so flax linen/nnx models and plain pytrees (``x @ W + b``) work
alike. Recognised: a parameter used once as an operand of ``dot_general`` (Dense, ``x @ W``,
einsum; attention projections over sequences), ungrouped convolution kernels (as a dense layer
on im2col patches, T = output positions) and embedding tables (a row-lookup ``gather``:
``E[tokens]``, ``jnp.take``, flax ``Embed``). For T > 1 a small layer's per-example gradients
(K·N ≤ 8192) are formed and reused for the sum; a large one uses the Gram trick. An embedding's
per-example gradient ``Σ_t e_{tok_t} g_tᵀ`` is kept in compact form: the segment sums
``Σ_{s: tok_s = tok_t} g_s`` (a ``(T, T)`` token-equality matrix times g, ``B·T²·D`` flops
and ``B·T²`` entries of memory in the wide dtype: 145 MB at B = 4, T = 2048 under x64; for very
long sequences pass ``microbatch_size`` to bound it),
one row per distinct token, so ``‖∇E‖² = Σ_{t,t'} [tok_t = tok_t'] g_t·g_t'`` has no Gram
cancellation and the ``(V, D)`` table is never formed per example; the clipped sum scatters the
clipped segment sums into the table (Li et al. 2022, "Large language models can be strong
differentially private learners", ghost clipping for embeddings). Everything else (biases,
layer-norm scales, grouped convolutions, tied weights, weights inside
``scan``/``remat``/``custom_jvp``) gets per-example gradients by ``jax.vmap``, in the same
backward pass; they are usually small.

Cost (benchmarks/, 2-core CPU): the clipped sum without noise is about 1.1–1.5× a
non-private gradient for the MLP 784-512-512-10, the CNN and logistic regression d = 10⁴,
against 7–80× for the vmap path; memory stays near the non-private step.

This module is the ``backend="ghost"`` path of :func:`dpjax.clipped_grad`; the result equals the
vmap path up to float rounding (tested in ``tests/dp_sgd/test_ghost.py``). Under overflow the
two can differ: an example whose float32 per-example gradient overflows is dropped by vmap
(non-finite), while ghost computes its norm from a and g in the wide dtype and keeps it,
clipped; either way its contribution is at most C.

Certified norms. The clip factor is ``min(1, C/(U·(1+η)))`` with U an upper bound of the norm
of what the sum receives, computed in the wide dtype (float64 under x64, else float32; integer
and low-precision activations are converted first — never a dtype picked by itemsize):

* T = 1: ‖a‖²‖g‖², each a sum of squares with relative error ≤ γ_{K+2}, γ_{N+2};
* T > 1, Gram trick: |computed − exact| ≤ γ_G·P², P = Σ_t ‖a_t‖‖g_t‖ (from the Gram
  diagonals), γ_G = (1+γ_{K+2})(1+γ_{N+2})(1+u)(1+γ_{T²}) − 1; the bound is sq + γ_G·P²;
* T > 1, materialised: the norm of the formed per-example layer gradient (what is summed);
* embedding: the norm of the formed segment sums (what is scattered, in the wide dtype): each
  table row then receives at most one term per example, as in the vmap path's sum;
* the matrix an example adds, Σ_t a_tᵀ(s·g_t) formed on its own for T > 1 (a batched
  contraction over its T positions), is within γ_{T+3}·s·P of the exact one; γ_4·s·‖a‖‖g‖
  when T = 1 (sum dtype).

Certified batch sum (Casacuberta et al. 2022, "Widespread underestimation of sensitivity in
differentially private libraries and how to fix it", CCS, https://arxiv.org/abs/2207.10635). The
clipped sum over the batch never goes through one matrix product of unknown order over B·T rows
(error γ_{BT}·Σ, B²·u·C in the worst case). T > 1 layers form each example's matrix; T = 1
layers contract groups of 32 examples in one matrix product each (γ_32 per row), add 4 such
products in order in plain float (γ_4) and merge them into a double-float accumulator in a scan
(⌈B/128⌉ merges, added to the summation depth); materialised layers and vmap leaves multiply per
example and are added by the fixed-order double-float tree of
:func:`dpjax.dp_sgd._certified.tree_sum` (leaves of ≤ 2¹⁶ entries per example share one tree
over their concatenation: the same operations per coordinate); everything is rounded once.
Embedding tables scatter each example's clipped segment sums (≤ one vector per example and table
row, γ_m for m rows per call). C is multiplied by the public factor f = 1/(1 + 2·rel) covering
all of it (:func:`dpjax.dp_sgd._certified.summation_shrink`, computed for the least precise
output dtype): float32, dense T = 1, B = 256: f = 0.9989, 1024: 0.995, 4096: 0.981, 32768:
0.856. Cost (2-core CPU, loaded, CPU time): the certified sum of a 784×512 layer at B = 1024
takes 21 ms against 8 ms for one plain matrix product (47 ms when the B/32 partial sums were
stacked in memory and added by a tree: their fresh pages cost more than the products); the MLP
784-512-512-10's clipped sum at B = 1024, 62 ms against 29 ms for its non-private gradient (124
ms before). Each merge's double-float carry is one packed complex array
(:func:`dpjax.dp_sgd._certified.df_pack`): the m products and the merge are one elementwise pass
instead of five (the same operations, bit for bit): the 784×512 layer's certified sum at B =
1024, 12 ms CPU time against 19 ms with two float carries (6 ms for the plain product).

Mixed ghost clipping (Bu, Mao, Xu 2022, "Scalable and efficient training of large
convolutional neural networks with differential privacy"): each T > 1 layer picks, from its
static shapes at trace time, the Gram trick (B·T²·(K+N) flops) or per-example gradients
(B·T·K·N, reused for the sum: book-keeping, Bu et al. 2023), whichever is cheaper
(:func:`_materialise`); T = 1 layers need neither (‖a‖‖g‖).

Where this fast bound is loose by more than 1% on an example that is clipped (Gram cancellation:
Σ_t a_t ≈ 0 with large a_t), or not finite, one batch-level ``lax.cond`` takes the accurate
branch, and the examples whose own fast bound is loose (only those: each example's bound depends
on its own data alone) take its bounds: a and g scaled by powers of two per example (no
intermediate overflow or underflow: ‖a‖² = inf with ‖aᵀg‖ finite no longer drops an example that
vmap keeps), and Gram layers materialised one example at a time (``lax.map``, K·N memory). The
sums are compiled once (dropped rows are zeroed before every contraction instead of retrying
non-finite sums in a second branch). Both branches give certified bounds; the reported norms are
the estimates (not U).

Formal guarantees:
    Same as the vmap path (:mod:`dpjax.dp_sgd.clipping`): every example's contribution to the
    sum, as computed (rounding of norms, factor and its own contraction included), has ℓ2 norm
    ≤ f·``l2_clip_norm``, and the released float sum is within f·C·rel of the exact sum of the
    contributions (f = 1/(1 + 2·rel)), so adding or removing one example moves the released
    sum by ≤ ``C``: ℓ2 sensitivity ``C`` under add-or-remove-one and ``2C`` under
    replace-one (Abadi et al. 2016, "Deep Learning with Differential Privacy", §3.1; error
    bounds: Higham, "Accuracy and Stability of Numerical Algorithms", Lemma 3.1 and §4;
    rounding of the batch sum: Casacuberta et al. 2022, CCS). An example
    whose certified bound is NaN/inf (``nan_safe``) or with ``mask=False`` contributes exactly
    zero. Per-layer clipping (``per_layer=True``): each parameter leaf's part (a dense,
    convolution or embedding tap, or a vmap leaf) is scaled from the certified bound of that
    part alone with f·c_l, so it contributes ≤ f·c_l and the example ≤ f·sqrt(Σ_l c_l²)
    (He et al. 2022, https://arxiv.org/abs/2212.01539, §3). Automatic clipping (``gamma``):
    the factor is f·R/D with D ≥ U·(1+η) + γ rounded upward
    (:func:`dpjax.dp_sgd._certified.automatic_scale`), so the contribution is ≤ f·R (Bu et al.
    2023, https://arxiv.org/abs/2206.07136).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from dpjax import _validate
from dpjax.dp_sgd import _certified, _ghost_policy
from dpjax.dp_sgd._ghost_bounds import (
    _Bound,
    _dot,
    _gram_bound,
    _materialised_gram_bound,
    _rank_one_bound,
    _scaled,
    _totals,
)
from dpjax.dp_sgd._ghost_sums import (
    _dense_clipped_sum,
    _embedding_clipped_sum,
    _materialise,
    _pre_rel,
    _row_where,
    _segment_sums,
    _stream_steps,
    _to_weight_layout,
    _tree_sums,
    _weighted_rows,
)
from dpjax.dp_sgd._ghost_trace import (
    DenseTap,
    EmbeddingTap,
    GhostPlan,
    evaluate_tapped,
    make_plan,
)

__all__ = ["supports", "ghost_clipped_sum", "ghost_clipped_pairs", "plan"]


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
    """Whether the ghost path can speed up ``loss_fn``: a dense weight or an embedding table.

    Args:
        loss_fn: ``loss_fn(params, *example) -> scalar``, the loss of ONE example.
        params: the parameter pytree.
        *batch: the batched arguments (leading axis = examples).

    Returns:
        ``True`` iff tracing found a parameter used once as an operand of a matrix product,
        a convolution kernel or a table looked up by rows (``E[tokens]``). Functions that
        cannot be traced for one example give ``False`` (the vmap path then reports the error).

    Example:
        >>> import jax.numpy as jnp
        >>> loss = lambda w, x, y: (x @ w - y) ** 2
        >>> supports(loss, jnp.zeros(3), jnp.ones((4, 3)), jnp.ones(4))
        True
        >>> supports(lambda w, x: jnp.sum((w - x) ** 2), jnp.zeros(3), jnp.ones((4, 3)))
        False
        >>> supports(lambda e, t: jnp.sum(e[t] ** 2), jnp.zeros((10, 3)), jnp.zeros((4, 5), int))
        True
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
    """Per-example activations ``(B, T, K)`` and output gradients ``(B, T, N)``, dtypes kept."""
    b = act.shape[0]
    a = jnp.transpose(act, (0,) + tuple(d + 1 for d in tap.act_perm)).reshape(b, tap.t, tap.k)
    g = jnp.transpose(g, (0,) + tuple(d + 1 for d in tap.out_perm)).reshape(b, tap.t, tap.n)
    return a, g


def _embedding_rows(tap: EmbeddingTap, idx: jax.Array, g: jax.Array):
    """Per-example table rows ``(B, T)`` (int), their validity, and ``g`` ``(B, T, D)``.

    ``"clip"`` lookups read row ``clamp(idx, 0, V − 1)``; every other mode drops an index
    outside ``[0, V)`` (its ``g`` row is zeroed and it meets no other row). The rows returned
    are always in ``[0, V)``, so the scatter that forms the sum never relies on a drop rule.
    Narrow ids (int8 / uint8 with V above their range) compare against ``min(V − 1, max id)``.
    """
    b = idx.shape[0]
    idx = idx.reshape(b, tap.t)
    g = g.reshape(b, tap.t, tap.dim)
    top = min(tap.vocab - 1, int(jnp.iinfo(idx.dtype).max))
    zero, last = jnp.zeros((), idx.dtype), jnp.asarray(top, idx.dtype)
    if tap.mode == "clip":
        return jnp.clip(idx, zero, last), jnp.ones(idx.shape, bool), g
    valid = (idx >= zero) & (idx <= last)
    rows = jnp.where(valid, idx, zero)
    return rows, valid, jnp.where(valid[..., None], g, jnp.zeros((), g.dtype))


def _same_row(rows: jax.Array, valid: jax.Array, dtype: Any) -> jax.Array:
    """``[row_t = row_s, both valid]`` as a 0/1 ``(B, T, T)`` matrix of ``dtype``."""
    same = (rows[:, :, None] == rows[:, None, :]) & valid[:, :, None] & valid[:, None, :]
    return same.astype(dtype)


# The fast bound may exceed the estimate by this factor (squared norms) before the accurate
# branch (exponent scaling, per-example materialisation) is taken: ≈1% on the norm.
_LOOSE = 1.0201
_ACCURATE_RETRY = True  # False only for timing experiments: keeps the (certified) fast bound


def _summation_shrink(taps: Sequence, params: Any, b: int, release: _certified.Release) -> float:
    """The clip-norm factor of :func:`dpjax.dp_sgd._certified.summation_shrink` for ghost.

    Every leaf's sum dtype is at least as precise as its output dtype (the parameter's,
    widened to float32), so the least precise output dtype bounds every stage.
    """
    outs = [_out(p) for p in jax.tree.leaves(params)]
    dt = max(outs, key=_certified.unit_roundoff, default=jnp.dtype(jnp.float32))
    return _certified.release_shrink(release, [dt], [dt], _pre_rel(taps, b, dt))[0]


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

    .. math::  \sum_i \min\bigl(1, C/(U_i(1+η))\bigr)\, ∇ℓ(θ; x_i), \qquad
               U_i \ge \|∇ℓ(θ; x_i)\| \text{ certified}

    Args:
        loss_fn: ``loss_fn(params, *example) -> scalar``, the loss of ONE example.
        params: the parameter pytree.
        batch: tuple of the batched arguments of ``loss_fn`` (leading axis = examples).
        l2_clip_norm: the clip norm ``C > 0`` over the whole pytree.
        mask: optional boolean ``(B,)``; rows with ``False`` contribute zero.
        nan_safe: zero (and count) examples whose certified norm bound is not finite.

    Returns:
        ``(clipped_sum, per_example_norms, num_nonfinite)``: the sum (structure of ``params``,
        each leaf in its parameter's dtype widened to at least float32), the estimated
        unclipped per-example gradient norms ``(B,)`` (0 for masked rows) and the number of
        unmasked examples with a non-finite norm bound.

    Formal guarantees:
        Each example's contribution, as computed (rounding of the norms, of the factor and of
        the contraction over its T positions included), has ℓ2 norm ≤ f·``l2_clip_norm``, f
        the summation shrink of a B-row batch, so adding or removing one example moves the
        returned float sum by ≤ ``l2_clip_norm`` (see the module docstring).

    Example:
        >>> import jax.numpy as jnp
        >>> loss = lambda w, x, y: 0.5 * (x @ w - y) ** 2
        >>> x, y = jnp.array([[3.0, 4.0], [0.3, 0.4]]), jnp.zeros(2)
        >>> total, norms, bad = ghost_clipped_sum(loss, jnp.ones(2), (x, y), l2_clip_norm=1.0)
        >>> [round(float(v), 3) for v in total], [round(float(v), 3) for v in norms]
        ([0.81, 1.08], [35.0, 0.35])
    """
    (hi, lo), norms, bad, _ = ghost_clipped_pairs(
        loss_fn, params, batch, l2_clip_norm=l2_clip_norm, mask=mask, nan_safe=nan_safe
    )
    total = jax.tree.map(lambda h, lo_, p: _certified.df_round((h, lo_), _out(p)), hi, lo, params)
    return total, norms, bad


def ghost_clipped_pairs(
    loss_fn: Callable,
    params: Any,
    batch: Any,
    *,
    l2_clip_norm: Any,
    mask: jax.Array | None = None,
    nan_safe: bool = True,
    release: _certified.Release | None = None,
    per_layer: bool = False,
    gamma: float | None = None,
) -> tuple[tuple[Any, Any], jax.Array, jax.Array, float]:
    """:func:`ghost_clipped_sum` before its final rounding: ``((hi, lo), norms, bad, f)``.

    ``hi + lo`` (two pytrees in the sum dtypes) is the double-float clipped sum and f the
    factor applied to C (:func:`dpjax.dp_sgd._certified.summation_shrink` for ``release``;
    default: this call's rows, released as they are). ``per_layer``: ``l2_clip_norm`` is a
    pytree like ``params`` of per-leaf norms c_l (or a float C, split as C/√L), each leaf's
    part of an example clipped to f·c_l from its own certified bound. ``gamma``: automatic
    clipping (AUTO-S), each example scaled by C·f/(U·(1+η) + γ) (see
    :func:`dpjax.dp_sgd.clipped_grad`).
    """
    clips = _leaf_clip_norms(l2_clip_norm, params, per_layer)
    batch = _as_batch(batch)
    leaves = jax.tree.leaves(batch)
    n = jnp.shape(leaves[0])[0] if leaves else 0
    keep = jnp.ones((n,), bool) if mask is None else jnp.asarray(mask, bool)
    if n == 0:
        zeros = jax.tree.map(
            lambda p: jnp.zeros(jnp.shape(p), _certified.output_dtype(jnp.result_type(p))), params
        )
        norms = jnp.zeros((0,), _certified.wide_dtype())
        return (zeros, zeros), norms, jnp.zeros((), jnp.int32), 1.0
    total = math.sqrt(sum(c * c for c in clips)) if per_layer else clips[0]
    if release is None:
        release = _certified.Release(n, 1, _certified.tree_depth(n) + 3, total)
    taps = plan(loss_fn, params, *batch)[0].taps
    release = release._replace(depth=release.depth + _stream_steps(taps, n))
    f = _summation_shrink(taps, params, n, release)
    wide = _certified.wide_dtype()
    clip = jnp.asarray([f * c for c in clips] if per_layer else f * clips[0], wide)
    if gamma is not None:
        gamma = jnp.asarray(_validate.positive("gamma", gamma), wide)
    return (*_ghost_jitted(loss_fn, bool(nan_safe), params, batch, clip, keep, gamma), f)


def _leaf_clip_norms(l2_clip_norm: Any, params: Any, per_layer: bool) -> list[float]:
    """``[C]``, or per-layer the norm c_l of every parameter leaf (a float C: C/√L each)."""
    if not per_layer:
        return [_validate.positive("l2_clip_norm", l2_clip_norm)]
    treedef = jax.tree.structure(params)
    if isinstance(l2_clip_norm, int | float):
        c = _validate.positive("l2_clip_norm", l2_clip_norm) / math.sqrt(treedef.num_leaves)
        return [c] * treedef.num_leaves
    try:
        clips = treedef.flatten_up_to(l2_clip_norm)
    except (ValueError, TypeError):
        _validate.fail("l2_clip_norm", l2_clip_norm, "a float or a pytree like params")
    return [_validate.positive("l2_clip_norm leaf", c) for c in clips]


def _tap_bounds(
    taps: Sequence[DenseTap | EmbeddingTap], dense: list, sum_dts: list, accurate: bool
) -> list:
    """One :class:`_Bound` per non-materialised tap (fast or accurate formulas)."""
    out = []
    for tap, (a, g), sd in zip(taps, dense, sum_dts, strict=True):
        if tap.t == 1:
            fn = _rank_one_bound
        else:
            fn = _materialised_gram_bound if accurate else _gram_bound
        out.append(_scaled(fn, a, g, sd) if accurate else fn(a, g, sd))
    return out


def _leaf_factors(p_leaves, parts, part_leaf, clip, eta, gamma, total_upper):
    """The clip factor of every parameter leaf, (B,) each, wide dtype.

    ``clip`` a scalar: one factor from the whole gradient's bound ``total_upper``. ``clip`` of
    shape (L,) (per-layer): leaf l's factor from the bound of its own part(s) and f·c_l.
    """
    if clip.ndim == 0:
        return [_certified.clip_factor(total_upper, clip, eta, gamma)] * len(p_leaves)
    by_leaf: dict[int, list[_Bound]] = {}
    for bound, leaf in zip(parts, part_leaf, strict=True):
        by_leaf.setdefault(leaf, []).append(bound)
    factors = []
    for i in range(len(p_leaves)):
        upper = _certified.sqrt_up(_totals(by_leaf[i]).u2)
        factors.append(_certified.clip_factor(upper, clip[i], eta, gamma))
    return factors


def _ghost_impl(loss_fn, nan_safe, params, batch, clip, mask, gamma):
    ghost_plan, _ = plan(loss_fn, params, *batch)
    p_leaves, p_tree = jax.tree.flatten(params)
    e_leaves = jax.tree.leaves(batch)
    other, g_other, g_perts, acts = _per_example_parts(ghost_plan, p_leaves, e_leaves)
    # one stored value for each: XLA may otherwise recompute a producer inside each consumer's
    # fusion with excess precision (bf16 math in f32), so the norms and the sum would see
    # different activations (measured: 1.2e-4 relative in bf16, contribution 1.00009 C)
    g_other, g_perts, acts = jax.lax.optimization_barrier((g_other, g_perts, acts))
    wide = _certified.wide_dtype()
    taps = ghost_plan.taps
    # dense taps: (activations (B, T, K), g (B, T, N)); embeddings: (rows (B, T) int, g (B, T, D))
    raw, wide_ag, segs = [], [], {}
    for j, (t, a, g) in enumerate(zip(taps, acts, g_perts, strict=True)):
        if isinstance(t, EmbeddingTap):
            rows, valid, g = _embedding_rows(t, a, g)
            raw.append((rows, g))
            wide_ag.append((rows, g))
            segs[j] = _segment_sums(_same_row(rows, valid, wide), g.astype(wide))
        else:
            a, g = _canonical(t, a, g)
            raw.append((a, g))
            wide_ag.append((a.astype(wide), g.astype(wide)))
    out_dts = [_certified.output_dtype(p_leaves[t.leaf].dtype) for t in taps]
    # dtype of each tap's clipped sum: widest float operand (token ids ignored), at least float32
    tap_sd = [
        _certified.sum_dtype(a.dtype, g.dtype, o) for (a, g), o in zip(raw, out_dts, strict=True)
    ]
    # embeddings: norms and sum read one stored copy of the segment sums, in the wide dtype
    segs = jax.lax.optimization_barrier(segs)
    tap_sd = [wide if j in segs else sd for j, sd in enumerate(tap_sd)]
    layer = {
        j: _dot("btk,btn->bkn", *wide_ag[j])
        for j, tap in enumerate(taps)
        if _materialise(tap, mask.shape[0])
    }
    ghost_js = [j for j in range(len(taps)) if j not in layer and j not in segs]

    fixed: list[_Bound] = []
    for materialised in (*layer.values(), *segs.values()):
        sq, up = _certified.row_sq_norms(materialised, wide)
        fixed.append(_Bound(sq, up, up))
    for g in g_other:
        sq, up = _certified.row_sq_norms(g, wide)
        fixed.append(_Bound(sq, up, up))

    def ghost_bounds(accurate: bool) -> list:
        return _tap_bounds(
            [taps[j] for j in ghost_js],
            [wide_ag[j] for j in ghost_js],
            [tap_sd[j] for j in ghost_js],
            accurate,
        )

    bounds = ghost_bounds(False)
    if bounds and _ACCURATE_RETRY:
        fast_total = _totals(bounds + fixed)
        # automatic clipping scales every example: its factor always reads the bound
        scaled = True if gamma is not None else fast_total.u2 > jnp.sum(jnp.square(clip))
        loose = (~jnp.isfinite(fast_total.u2)) | (scaled & (fast_total.n2 > _LOOSE * fast_total.sq))
        retry = jnp.any(mask & loose)
        fast = bounds

        def accurate_where_loose() -> list:
            # Per example: the accurate bounds only where THAT example's fast bound is loose.
            # The batch-level cond only decides whether to compute them; every example's bound
            # (hence its clip factor) depends on its own data alone. Taking the accurate
            # bounds for the whole batch let one example (an overflowing ‖a‖²) change how
            # hard every other example was clipped (review finding: 1.58·C with Gram layers).
            return [
                _Bound(*(jnp.where(loose, x, y) for x, y in zip(acc, fst, strict=True)))
                for acc, fst in zip(ghost_bounds(True), fast, strict=True)
            ]

        bounds = jax.lax.cond(retry, accurate_where_loose, lambda: fast)
    total = _totals(bounds + fixed)
    norms = jnp.sqrt(total.sq)
    upper = _certified.sqrt_up(total.u2)

    other_sd = [_certified.sum_dtype(g.dtype) for g in g_other]
    eta = _certified.shrink(
        wide,
        tap_sd + [wide] * len(layer) + other_sd,
        out_dts + [out_dts[j] for j in layer] + [_out(p_leaves[i]) for i in other],
    )
    finite = jnp.isfinite(upper)
    num_nonfinite = jnp.sum(jnp.logical_and(mask, ~finite), dtype=jnp.int32)
    keep = jnp.logical_and(mask, finite) if nan_safe else mask
    part_leaf = (
        [taps[j].leaf for j in ghost_js]
        + [taps[j].leaf for j in layer]
        + [taps[j].leaf for j in segs]
        + list(other)
    )
    scales = _leaf_factors(p_leaves, bounds + fixed, part_leaf, clip, eta, gamma, upper)
    weights = [jnp.where(keep, s, jnp.zeros((), wide)) for s in scales]

    def clipped_sums(sanitize: bool) -> list:
        sums: list[Any] = [None] * len(p_leaves)
        # materialised layers and vmap leaves: weighted rows, added by shared trees below
        tree_rows = [_weighted_rows(layer[j], weights[taps[j].leaf], keep) for j in layer]
        tree_rows += [
            _weighted_rows(g, weights[i].astype(sd), keep)
            for g, sd, i in zip(g_other, other_sd, other, strict=True)
        ]
        trees = _tree_sums(tree_rows)
        layer_total = dict(zip(layer, trees[: len(layer)], strict=True))
        for i, total in zip(other, trees[len(layer) :], strict=True):
            sums[i] = total
        for j, tap in enumerate(taps):
            if j in layer:
                total = layer_total[j]
            elif j in segs:
                seg_scaled = _row_where(keep, segs[j] * weights[tap.leaf][:, None, None])
                table = _embedding_clipped_sum(tap, raw[j][0], seg_scaled)
                # a plain sum, rounded once to the output dtype here (the table in the wide
                # dtype never leaves the branch); its low part is a scalar 0 (df_round)
                table = table.astype(out_dts[j])
                sums[tap.leaf] = (table, jnp.zeros((), table.dtype))
                continue
            else:
                sd = tap_sd[j]
                a, g = raw[j]
                s = scales[tap.leaf].astype(sd)
                g_scaled = _row_where(keep, g.astype(sd) * s[:, None, None])
                total = _dense_clipped_sum(a.astype(sd), g_scaled, keep, sanitize)
            sums[tap.leaf] = _to_weight_layout(tap, total)
        return sums

    # dropped rows (mask False, non-finite example) have weight 0, but their activations may
    # hold NaN/inf and NaN·0 is NaN: they are zeroed before every contraction (one select,
    # fused into the product's operand; a cond that retried only when the fast sums were not
    # finite compiled every sum twice)
    sums = clipped_sums(True)
    reported = jnp.where(mask, norms, jnp.zeros((), wide))
    pairs = (
        jax.tree.unflatten(p_tree, [x[0] for x in sums]),
        jax.tree.unflatten(p_tree, [x[1] for x in sums]),
    )
    return pairs, reported, num_nonfinite


def _out(param: Any) -> Any:
    return _certified.output_dtype(jnp.result_type(param))


# the backend policy (budgets, see _ghost_policy) is part of the jit key and of the trace
_ghost_jitted = _ghost_policy.keyed_jit(_ghost_impl, static_argnums=(0, 1))
