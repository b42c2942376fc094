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

Cost (issue 9 benchmark, 2-core CPU): the clipped sum without noise is about 1.1–1.5× a
non-private gradient for the MLP 784-512-512-10, the CNN and logistic regression d = 10⁴,
against 7–80× for the vmap path; memory stays near the non-private step.

This module is the ``backend="ghost"`` path of :func:`dpjax.clipped_grad`; the result equals the
vmap path up to float rounding (tested in ``tests/test_ghost.py``). Under overflow the two can
differ: an example whose float32 per-example gradient overflows is dropped by vmap (non-finite),
while ghost computes its norm from a and g in the wide dtype and keeps it, clipped; either way
its contribution is at most C.

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

Certified batch sum (issue 20; Casacuberta et al. 2022, CCS). The clipped sum over the batch
never goes through one matrix product of unknown order over B·T rows (error γ_{BT}·Σ, B²·u·C
in the worst case). T > 1 layers form each example's matrix; T = 1 layers contract groups of
32 examples in one matrix product each (γ_32 per row), add 4 such products in order in plain
float (γ_4) and merge them into a double-float accumulator in a scan (⌈B/128⌉ merges, added
to the summation depth); materialised layers and vmap leaves multiply per example and are
added by the fixed-order double-float tree of :func:`dpjax.dp_sgd._certified.tree_sum` (leaves
of ≤ 2¹⁶ entries per example share one tree over their concatenation: the same operations per
coordinate); everything is rounded once. Embedding tables scatter each
example's clipped segment sums (≤ one vector per example and table row, γ_m for m rows per
call). C is multiplied by the public factor f = 1/(1 + 2·rel) covering all of it
(:func:`dpjax.dp_sgd._certified.summation_shrink`, computed for the least precise output
dtype): float32, dense T = 1, B = 256: f = 0.9989, 1024: 0.995, 4096: 0.981, 32768: 0.856.
Cost (2-core CPU, loaded, CPU time, issue 24): the certified sum of a 784×512 layer at B = 1024
takes 21 ms against 8 ms for one plain matrix product (47 ms when the B/32 partial sums were
stacked in memory and added by a tree: their fresh pages cost more than the products); the
MLP 784-512-512-10's clipped sum at B = 1024, 62 ms against 29 ms for its non-private gradient
(124 ms before). Each merge's double-float carry is one packed complex array
(:func:`dpjax.dp_sgd._certified.df_pack`): the m products and the merge are one elementwise
pass instead of five (the same operations, bit for bit): the 784×512 layer's certified sum at
B = 1024, 12 ms CPU time against 19 ms with two float carries (6 ms for the plain product).

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
    zero.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from dpjax import _validate
from dpjax.dp_sgd import _certified, _ghost_policy
from dpjax.dp_sgd._certified import HIGHEST
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


_SMALL_LAYER = 8192  # K·N: per-example gradients of layers this small are cheap to materialise

# The fast bound may exceed the estimate by this factor (squared norms) before the accurate
# branch (exponent scaling, per-example materialisation) is taken: ≈1% on the norm.
_LOOSE = 1.0201
_ACCURATE_RETRY = True  # False only for timing experiments: keeps the (certified) fast bound


# book-keeping layers (per-example gradients formed once, for the norm and the sum) may hold up
# to this many entries (B·K·N) each; larger layers keep the Gram trick (B·T² memory)
_MATERIALISE_BUDGET = 2**23


def _materialise(tap: DenseTap, b: int = 1) -> bool:
    """Form per-example layer gradients (B, K, N) instead of ghost norms (mixed ghost clipping).

    T > 1 only. The clipped sum forms every example's ``aᵀ(s·g)`` anyway (B·T·K·N flops), so
    forming them once and reusing them for the norms (book-keeping, Bu et al. 2023) saves the
    Gram norms' B·T²·(K+N) flops and their cancellation retry, at B·K·N memory. Taken when
    K·N is small (≤ 8192, or ≤ T·(K+N)), or when the Gram norms would cost at least half the
    formation (2·T·(K+N) ≥ K·N: the transformer's attention and MLP kernels at T = 128) and
    B·K·N ≤ :data:`_MATERIALISE_BUDGET` (Bu, Mao, Xu 2022 choose per layer from the shapes).
    """
    if not isinstance(tap, DenseTap) or tap.t <= 1:
        return False
    kn, gram = tap.k * tap.n, tap.t * (tap.k + tap.n)
    if kn <= gram or kn <= _SMALL_LAYER:
        return True
    budget = _ghost_policy.budget(_ghost_policy.current().materialise_budget, _MATERIALISE_BUDGET)
    return 2 * gram >= kn and b * kn <= budget


class _Bound(NamedTuple):
    """Per-example norm information of one part of the gradient (all (B,), wide dtype).

    ``sq``: the estimate of the squared norm (reported). ``n2``: an upper bound of the exact
    squared norm of the part's gradient (for the looseness test). ``u2``: an upper bound of the
    squared norm of what the clipped sum adds for this part before scaling, contraction rounding
    included (the clip factor comes from it).
    """

    sq: jax.Array
    n2: jax.Array
    u2: jax.Array


def _dot(spec: str, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.einsum(spec, x, y, precision=HIGHEST)


def _rank_one_bound(a: jax.Array, g: jax.Array, sum_dt: Any) -> _Bound:
    """T = 1: ``‖aᵀg‖ = ‖a‖‖g‖``; bound from the two sums of squares (γ_{K+2}, γ_{N+2})."""
    sa, sa_up = _certified.row_sq_norms(a, a.dtype)
    sg, sg_up = _certified.row_sq_norms(g, g.dtype)
    n2 = _certified.inflate(sa_up * sg_up, 0.0)
    nup = _certified.sqrt_up(n2)
    upper = _certified.inflate(nup, _certified.gamma(a.shape[1] + 3, sum_dt))
    return _Bound(sa * sg, n2, _certified.inflate(upper * upper, 0.0))


def _row_norms_up(x: jax.Array) -> jax.Array:
    """Upper bounds of ``‖x_{b,t}‖`` over the last axis, (B, T)."""
    b, t, k = x.shape
    _, up = _certified.row_sq_norms(x.reshape(b * t, k), x.dtype)
    return _certified.sqrt_up(up).reshape(b, t)


def _contraction_bound(nup: jax.Array, p_up: jax.Array, rows: int, sum_dt: Any) -> jax.Array:
    """u2 from a norm bound ``nup`` and ``P = Σ_t ‖a_t‖‖g_t‖``: (nup + γ_{rows+3}·P)².

    ``rows`` = T: the clipped sum forms each example's ``Σ_t a_tᵀ(s·g_t)`` on its own (a
    batched contraction over its T positions only), so the matrix it adds is within
    γ_{T+3}·s·P of the exact one; the batch sum over examples is a fixed-order tree.
    """
    err = _certified.gamma(rows + 3, sum_dt)
    err = _certified.inflate(p_up * jnp.asarray(err, p_up.dtype), 0.0)
    upper = _certified.inflate(nup + err, 0.0)
    return _certified.inflate(upper * upper, 0.0)


def _gram_bound(a: jax.Array, g: jax.Array, sum_dt: Any) -> _Bound:
    r"""T > 1, Gram trick: ``Σ_{t,s}(a_t·a_s)(g_t·g_s)`` and its evaluation error.

    |computed − exact| ≤ γ_G·P² with P = Σ_t ‖a_t‖‖g_t‖ and
    γ_G = (1+γ_{K+2})(1+γ_{N+2})(1+u)(1+γ_{T²}) − 1 (each Gram entry, the product, the T² sum).
    """
    _, t, k = a.shape
    n, wide = g.shape[2], a.dtype
    gram_a, gram_g = _dot("btk,bsk->bts", a, a), _dot("btn,bsn->bts", g, g)
    sq = jnp.einsum("bts,bts->b", gram_a, gram_g, precision=HIGHEST)
    u = _certified.unit_roundoff(wide)
    at = _certified.sqrt_up(
        _certified.sq_upper_from(jnp.diagonal(gram_a, axis1=1, axis2=2), _gk(k, wide), k)
    )
    gt = _certified.sqrt_up(
        _certified.sq_upper_from(jnp.diagonal(gram_g, axis1=1, axis2=2), _gk(n, wide), n)
    )
    rel_t = _certified.compose(_certified.gamma(t, wide), u)
    p_up = _certified.inflate(jnp.sum(at * gt, axis=1), rel_t)
    s_a = _certified.inflate(jnp.sum(at, axis=1), rel_t)
    s_g = _certified.inflate(jnp.sum(gt, axis=1), rel_t)
    gamma_g = _certified.compose(_gk(k, wide), _gk(n, wide), u, _certified.gamma(t * t, wide))
    err = _certified.inflate(jnp.asarray(gamma_g, wide) * _certified.inflate(p_up * p_up, 0.0), 0.0)
    tiny = _certified.tiny(wide)
    floor = (
        jnp.asarray(4 * tiny * (k + 2), wide) * _certified.inflate(s_g * s_g, 0.0)
        + jnp.asarray(4 * tiny * (n + 2), wide) * _certified.inflate(s_a * s_a, 0.0)
        + jnp.asarray(4 * tiny * (t * t + 1), wide)
    )
    n2 = _certified.inflate(jnp.maximum(sq + err + floor, jnp.zeros((), wide)), 8 * u)
    return _Bound(sq, n2, _contraction_bound(_certified.sqrt_up(n2), p_up, t, sum_dt))


def _gk(k: int, dtype: Any) -> float:
    """Relative error of one dot product of length k of converted entries (γ_{k+2})."""
    return _certified.gamma(k + 2, dtype)


def _materialised_gram_bound(a: jax.Array, g: jax.Array, sum_dt: Any) -> _Bound:
    """T > 1, accurate: each example's ``aᵀg`` formed one at a time (``lax.map``), no Gram.

    ‖W* − M‖ ≤ γ_T·P for the formed M (an entry is a T-term dot product), so
    ‖W*‖ ≤ ‖M‖ + γ_{T+2}·P: no cancellation beyond float rounding of T-term sums.
    """
    t, wide = a.shape[1], a.dtype

    def one(ag: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        m = _dot("tk,tn->kn", ag[0], ag[1])
        sq, up = _certified.row_sq_norms(m[None], wide)
        return sq[0], up[0]

    sq, sq_up = jax.lax.map(one, (a, g), batch_size=_ghost_policy.current().map_batch)
    p_up = _certified.inflate(
        jnp.sum(_row_norms_up(a) * _row_norms_up(g), axis=1),
        _certified.compose(_certified.gamma(t, wide), _certified.unit_roundoff(wide)),
    )
    err = _certified.inflate(p_up * jnp.asarray(_certified.gamma(t + 2, wide), wide), 0.0)
    nup = _certified.inflate(_certified.sqrt_up(sq_up) + err, 0.0)
    u2 = _contraction_bound(nup, p_up, t, sum_dt)
    return _Bound(sq, _certified.inflate(nup * nup, 0.0), u2)


def _segment_sums(same: jax.Array, g: jax.Array) -> jax.Array:
    r"""Per-example table gradient in compact form: ``(B, T, D)``, one row per distinct token.

    ``S = same · g`` (``(T, T)·(T, D)`` per example) puts in row t the sum of the ``g_s`` that
    hit t's table row; rows that are not the first occurrence of their table row (and invalid
    ones) are zeroed. Scattering the remaining rows into the table gives exactly the per-example
    gradient ``Σ_t e_{row_t} g_tᵀ`` (each table row receives one vector), so ``‖S‖_F`` is its
    norm, ``Σ_v ‖Σ_{t: row_t = v} g_t‖²``, with no Gram cancellation (Li et al. 2022, "Large
    language models can be strong differentially private learners", ghost clipping of
    embeddings; the token-equality matrix plays the part of their ``a_tᵀa_s``).
    """
    t = g.shape[1]
    seg = _dot("bts,bsd->btd", same, g)
    earlier = jnp.tril(jnp.ones((t, t), bool), -1)  # s < t
    repeated = jnp.any((same > 0) & earlier[None], axis=2)
    first = (jnp.diagonal(same, axis1=1, axis2=2) > 0) & ~repeated
    return jnp.where(first[..., None], seg, jnp.zeros((), seg.dtype))


def _embedding_clipped_sum(tap: EmbeddingTap, rows: jax.Array, seg_scaled: jax.Array):
    """``Σ_i s_i ∇E_i`` as the ``(V, D)`` table: one scatter-add of the clipped segment sums.

    Each example adds at most one (already summed, already clipped) vector to a table row, so
    a table row sums ≤ B terms of norm ≤ C, as the vmap path's sum over examples does; the
    example's own T positions are never rounded against the other examples' partial sums.
    """
    table = jnp.zeros((tap.vocab, tap.dim), seg_scaled.dtype)
    # rows ∈ [0, V): int32 holds them (an int8 id array cannot hold the V that ``.at`` adds to
    # negative indices, so indexing with it raises for V > 128)
    ids = rows.reshape(-1).astype(np.int32 if tap.vocab <= np.iinfo(np.int32).max else rows.dtype)
    return table.at[ids].add(seg_scaled.reshape(-1, tap.dim), mode="drop")


def _scaled(bound_fn: Callable, a: jax.Array, g: jax.Array, sum_dt: Any) -> _Bound:
    """``bound_fn`` on a and g scaled by powers of two per example, then unscaled.

    No intermediate ‖a‖² or ‖g‖² overflows or underflows unless the gradient norm itself does.
    The scaling is exact for normal entries with normal results; a backend that flushes
    subnormals (XLA:CPU) zeroes subnormal entries here exactly as in the clipped sum's own
    products, so the bound is of what that sum adds (:func:`dpjax.dp_sgd._certified.ldexp_rows`).
    An entry below 2^-126 of its row's maximum, dropped by the scaling but kept by the sum, moves
    the norm by < √K·2^-126·‖a‖‖g‖, far inside the bounds' rounding terms (≥ u·‖a‖‖g‖).
    """
    ea, eg = _certified.scale_exponent(a), _certified.scale_exponent(g)
    inner = bound_fn(_certified.ldexp_rows(a, -ea), _certified.ldexp_rows(g, -eg), sum_dt)
    e2 = 2 * (ea + eg)
    return _Bound(*(jnp.ldexp(x, e2) for x in inner))


def _weighted_rows(per_example: jax.Array, weights: jax.Array, keep: jax.Array) -> jax.Array:
    """``wᵢ xᵢ`` per example over materialised per-example gradients ``(B, ...)``.

    In weights' dtype, dropped rows zeroed (their entries may be NaN); the caller adds the
    rows with :func:`_tree_sums`.
    """
    x = _row_where(keep, per_example).astype(weights.dtype)
    return x * weights.reshape((-1,) + (1,) * (x.ndim - 1))


# per-example sizes up to this many entries share one double-float tree (see _tree_sums)
_MERGE_SIZE = 2**16


def _tree_sums(rows: list[jax.Array]) -> list[tuple[jax.Array, jax.Array]]:
    """:func:`dpjax.dp_sgd._certified.tree_sum` of each ``(B, ...)`` array, as ``(hi, lo)``.

    Small arrays of one dtype are concatenated along their flattened feature axis and summed by
    ONE tree: every level of the tree is elementwise, so each coordinate sees exactly the
    operations of its own tree (same values, same error bound), while the compiled program has
    one fusion per level instead of one per level and leaf (bias and scale leaves: a third of
    the ghost step's compile time on the MLP).
    """
    out: list[Any] = [None] * len(rows)
    groups: dict[Any, list[int]] = {}
    for i, x in enumerate(rows):
        if math.prod(x.shape[1:]) <= _MERGE_SIZE:
            groups.setdefault(jnp.dtype(x.dtype), []).append(i)
        else:
            out[i] = _certified.tree_sum(x)
    for idx in groups.values():
        b = rows[idx[0]].shape[0]
        hi, lo = _certified.tree_sum(jnp.concatenate([rows[i].reshape(b, -1) for i in idx], 1))
        start = 0
        for i in idx:
            shape = rows[i].shape[1:]
            stop = start + math.prod(shape)
            out[i] = (hi[start:stop].reshape(shape), lo[start:stop].reshape(shape))
            start = stop
    return out


# T = 1 layers: Σ_i a_i (s_i g_i)ᵀ is contracted over groups of this many examples, one matrix
# product per group (error ≤ γ_c·Σ_i s_i‖a_i‖‖g_i‖, counted in the summation shrink), and the
# groups' products are added one after the other in double-float (a scan: no (B/c, K, N) stack
# of partial sums in memory, whose fresh pages cost more than the products at B = 1024; the
# ⌈B/c⌉ sequential merges are added to the summation depth, see _stream_steps). 32 keeps the
# shrink at ≈ 2·(32 + log2 B)·u·B (float32: 1.1·10⁻³ at B = 256, 1.9·10⁻² at B = 4096).
_T1_GROUP = 32


_T1_MERGE = 4


def _group_size(b: int) -> int:
    return min(_T1_GROUP, b)


def _merge_size(b: int) -> int:
    """Groups whose products are added in plain float before each double-float merge."""
    return max(1, min(_T1_MERGE, b // _group_size(b)))


def _dense_clipped_sum(a: jax.Array, g_scaled: jax.Array, keep: jax.Array, sanitize: bool):
    """``Σ_i aᵢᵀ (sᵢ gᵢ)`` as a ``(K, N)`` double-float pair, in a controlled order.

    T = 1: groups of :data:`_T1_GROUP` examples, one product each, added in a double-float
    scan. T > 1: every example's ``aᵢᵀ(sᵢgᵢ)`` formed on its own (a contraction over its T
    positions, whose rounding the certified factor covers), then the tree.
    """
    b, t, k = a.shape
    if t > 1:
        return _per_example_stream(_row_where(keep, a) if sanitize else a, g_scaled)
    c, m = _group_size(b), _merge_size(b)
    pad = -b % (c * m)
    a2, g2, keep2 = a.reshape(b, k), g_scaled.reshape(b, -1), keep
    if pad:
        a2 = jnp.pad(a2, ((0, pad), (0, 0)))
        g2 = jnp.pad(g2, ((0, pad), (0, 0)))
        keep2 = jnp.pad(keep, (0, pad))
    steps = (b + pad) // (c * m)
    n = g2.shape[1]

    def body(carry, chunk):
        a_c, g_c, keep_c = chunk
        if sanitize:  # per chunk: no full copy of the activations
            a_c = jnp.where(keep_c[..., None], a_c, jnp.zeros((), a_c.dtype))
        # m products of c examples each (γ_c), added in order in plain float (γ_m): _pre_rel
        part = jnp.dot(a_c[0].T, g_c[0], precision=HIGHEST)
        for j in range(1, m):
            part = part + jnp.dot(a_c[j].T, g_c[j], precision=HIGHEST)
        # the carry is one packed pair: the m sums and the merge are one elementwise pass
        return _certified.df_add_packed(carry, part), None

    dt = jnp.result_type(a2.dtype, g2.dtype)
    xs = (a2.reshape(steps, m, c, k), g2.reshape(steps, m, c, n), keep2.reshape(steps, m, c))
    out, _ = jax.lax.scan(body, _certified.df_pack(*_certified.df_zeros((k, n), dt)), xs)
    return _certified.df_unpack(out)


# T > 1: examples whose (K, N) matrices are formed at once (≤ this many entries in memory); the
# chunks' double-float sums are added sequentially in a scan (extra depth, see _stream_steps)
_STREAM_BUDGET = 2**24


def _stream_rows(b: int, k: int, n: int) -> int:
    budget = _ghost_policy.budget(_ghost_policy.current().stream_budget, _STREAM_BUDGET)
    return max(1, min(b, budget // max(k * n, 1)))


def _stream_steps(taps: Sequence, b: int) -> int:
    """Sequential double-float merges of the dense taps' sums (added to the summation depth).

    T > 1: one per chunk of :func:`_stream_rows` examples; T = 1: one per group of
    :func:`_group_size` examples.
    """
    steps = [
        -(-b // (_stream_rows(b, t.k, t.n) if t.t > 1 else _group_size(b) * _merge_size(b)))
        for t in taps
        if isinstance(t, DenseTap) and not _materialise(t, b)
    ]
    return max(steps, default=0)


def _per_example_stream(a: jax.Array, g_scaled: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Σ_i a_iᵀ(s_i g_i) for T > 1: each example's matrix formed alone, fixed-order sums.

    Chunks of :func:`_stream_rows` examples are formed and added by the double-float tree,
    the chunks' sums then added in a scan (double-float), so memory stays ≤ the budget.
    """
    b, t, k = a.shape
    n = g_scaled.shape[2]
    per = _stream_rows(b, k, n)
    if per >= b:
        return _certified.tree_sum(jnp.einsum("btk,btn->bkn", a, g_scaled, precision=HIGHEST))
    steps = -(-b // per)
    pad = steps * per - b
    if pad:
        a = jnp.pad(a, ((0, pad), (0, 0), (0, 0)))
        g_scaled = jnp.pad(g_scaled, ((0, pad), (0, 0), (0, 0)))
    xs = (a.reshape(steps, per, t, k), g_scaled.reshape(steps, per, t, n))

    def body(carry, chunk):
        part = jnp.einsum("btk,btn->bkn", *chunk, precision=HIGHEST)
        return _certified.df_add_packed(carry, *_certified.tree_sum(part)), None

    dt = jnp.result_type(a.dtype, g_scaled.dtype)
    out, _ = jax.lax.scan(body, _certified.df_pack(*_certified.df_zeros((k, n), dt)), xs)
    return _certified.df_unpack(out)


def _pre_rel(taps: Sequence[DenseTap | EmbeddingTap], b: int, dtype: Any) -> float:
    """Relative error (per coordinate, against Σ_i|x_i|) made before the double-float sums.

    T = 1 dense taps: γ_c of one group's product (the groups are then added in double-float,
    counted in the depth). Embedding tables: the scatter-add adds at most one vector per
    example to a table row in an unknown order, γ_B.
    """
    rel = 0.0
    for tap in taps:
        if isinstance(tap, EmbeddingTap):
            rel = max(rel, _certified.gamma(b, dtype))
        elif tap.t == 1 and not _materialise(tap, b):
            group = _certified.gamma(_group_size(b), dtype)
            rel = max(rel, _certified.compose(group, _certified.gamma(_merge_size(b), dtype)))
    return rel


def _summation_shrink(taps: Sequence, params: Any, b: int, release: _certified.Release) -> float:
    """The clip-norm factor of :func:`dpjax.dp_sgd._certified.summation_shrink` for ghost.

    Every leaf's sum dtype is at least as precise as its output dtype (the parameter's,
    widened to float32), so the least precise output dtype bounds every stage.
    """
    outs = [_out(p) for p in jax.tree.leaves(params)]
    dt = max(outs, key=_certified.unit_roundoff, default=jnp.dtype(jnp.float32))
    return _certified.release_shrink(release, [dt], [dt], _pre_rel(taps, b, dt))[0]


def _to_weight_layout(tap: DenseTap, total: tuple[jax.Array, jax.Array]) -> tuple:
    """A canonical ``(K, N)`` double-float gradient back in the weight's own shape."""

    def one(x: jax.Array) -> jax.Array:
        if x.ndim == 0:  # the exact zero low part of a plain sum (see df_round)
            return x
        x = x.reshape([tap.weight_shape[d] for d in tap.weight_perm])
        return jnp.transpose(x, np.argsort(tap.weight_perm))

    return one(total[0]), one(total[1])


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
    l2_clip_norm: float,
    mask: jax.Array | None = None,
    nan_safe: bool = True,
    release: _certified.Release | None = None,
) -> tuple[tuple[Any, Any], jax.Array, jax.Array, float]:
    """:func:`ghost_clipped_sum` before its final rounding: ``((hi, lo), norms, bad, f)``.

    ``hi + lo`` (two pytrees in the sum dtypes) is the double-float clipped sum and f the
    factor applied to C (:func:`dpjax.dp_sgd._certified.summation_shrink` for ``release``;
    default: this call's rows, released as they are).
    """
    _validate.positive("l2_clip_norm", l2_clip_norm)
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
    if release is None:
        release = _certified.Release(n, 1, _certified.tree_depth(n) + 3, float(l2_clip_norm))
    taps = plan(loss_fn, params, *batch)[0].taps
    release = release._replace(depth=release.depth + _stream_steps(taps, n))
    f = _summation_shrink(taps, params, n, release)
    clip = jnp.asarray(f * l2_clip_norm, _certified.wide_dtype())
    return (*_ghost_jitted(loss_fn, bool(nan_safe), params, batch, clip, keep), f)


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


def _ghost_impl(loss_fn, nan_safe, params, batch, clip, mask):
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
        loose = (~jnp.isfinite(fast_total.u2)) | (
            (fast_total.u2 > jnp.square(clip)) & (fast_total.n2 > _LOOSE * fast_total.sq)
        )
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
    scale = _certified.certified_scale(upper, clip, eta)
    weights = jnp.where(keep, scale, jnp.zeros((), wide))

    def clipped_sums(sanitize: bool) -> list:
        sums: list[Any] = [None] * len(p_leaves)
        # materialised layers and vmap leaves: weighted rows, added by shared trees below
        tree_rows = [_weighted_rows(layer[j], weights, keep) for j in layer]
        tree_rows += [
            _weighted_rows(g, weights.astype(sd), keep)
            for g, sd in zip(g_other, other_sd, strict=True)
        ]
        trees = _tree_sums(tree_rows)
        layer_total = dict(zip(layer, trees[: len(layer)], strict=True))
        for i, total in zip(other, trees[len(layer) :], strict=True):
            sums[i] = total
        for j, tap in enumerate(taps):
            if j in layer:
                total = layer_total[j]
            elif j in segs:
                seg_scaled = _row_where(keep, segs[j] * weights[:, None, None])
                table = _embedding_clipped_sum(tap, raw[j][0], seg_scaled)
                # a plain sum, rounded once to the output dtype here (the table in the wide
                # dtype never leaves the branch); its low part is a scalar 0 (df_round)
                table = table.astype(out_dts[j])
                sums[tap.leaf] = (table, jnp.zeros((), table.dtype))
                continue
            else:
                sd = tap_sd[j]
                a, g = raw[j]
                g_scaled = _row_where(keep, g.astype(sd) * scale.astype(sd)[:, None, None])
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


def _totals(parts: list[_Bound]) -> _Bound:
    """Whole-gradient estimate and bounds from the parts' (sums of L terms, γ_L)."""
    n = len(parts)
    rel = _certified.gamma(n, parts[0].sq.dtype)

    def add(xs: list[jax.Array]) -> jax.Array:
        return sum(xs[1:], xs[0])

    sq = add([p.sq for p in parts])
    n2 = _certified.inflate(add([p.n2 for p in parts]), rel)
    u2 = _certified.inflate(add([p.u2 for p in parts]), rel)
    return _Bound(sq, n2, u2)


# the backend policy (budgets, see _ghost_policy) is part of the jit key and of the trace
_ghost_jitted = _ghost_policy.keyed_jit(_ghost_impl, static_argnums=(0, 1))
