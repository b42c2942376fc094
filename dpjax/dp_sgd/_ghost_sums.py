"""Ghost clipping's certified clipped batch sum: which layers are formed, how rows are added.

Dense layers with T > 1 are formed per example (``_materialise``: book-keeping, Bu et al.
2023) or streamed in chunks under a memory budget; T = 1 layers contract groups of examples
and merge them in double-float; embeddings scatter their clipped segment sums. ``_pre_rel``
and ``_stream_steps`` give the relative error and the depth that the release's shrink factor
covers (:mod:`dpjax.dp_sgd.ghost` states the bounds).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dpjax.dp_sgd import _certified, _ghost_policy
from dpjax.dp_sgd._certified import HIGHEST
from dpjax.dp_sgd._ghost_bounds import _dot
from dpjax.dp_sgd._ghost_trace import DenseTap, EmbeddingTap

_SMALL_LAYER = 8192  # K·N: per-example gradients of layers this small are cheap to materialise


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
