"""Jaxpr surgery for ghost clipping: find dense weights and embedding tables and tap them.

The per-example loss is traced to a jaxpr with every ``jit`` call inlined. A parameter leaf is a
*dense weight* when it is used exactly once, as one operand of a ``dot_general`` without batch
dimensions, or as the kernel of an ungrouped ``conv_general_dilated`` (a dense layer on the
input's im2col patches). For such a weight ``W`` the per-example gradient is a contraction of
the layer input ``a`` (the other operand) with the gradient ``g`` of the loss at the layer
output, so its norm and the clipped sum can be formed from ``a`` and ``g`` without
materialising it. A weight cast (single use) before its product is followed through the cast.

A 2-D parameter used once as the operand of a row-lookup ``gather`` (``jnp.take(E, tokens,
axis=0)``, ``E[tokens]``, flax ``Embed``) is an *embedding table* (:class:`EmbeddingTap`): its
per-example gradient scatters the rows ``g_t`` of the output gradient into the looked-up rows,
so it too follows from the token ids and ``g``.

:func:`evaluate_tapped` re-evaluates the jaxpr, adds a zero *perturbation* to every tapped output
and returns the captured inputs (activations, or token ids for an embedding): the gradient with
respect to a perturbation is ``g``. Every other parameter is left to the per-example (vmap)
fallback.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np

__all__ = ["DenseTap", "EmbeddingTap", "GhostPlan", "make_plan", "evaluate_tapped"]

_INLINED = ("jit", "pjit")


@dataclasses.dataclass(frozen=True)
class DenseTap:
    """One tapped ``dot_general`` whose operand ``weight_pos`` is the parameter leaf ``leaf``.

    The canonical per-example layout is ``A: (T, K)`` (activations), ``G: (T, N)`` (output
    gradients) and ``∇W = Aᵀ G: (K, N)``; the fields hold the permutations that reach it.
    """

    eqn_index: int
    leaf: int
    weight_pos: int
    act_perm: tuple[int, ...]  # activation dims -> (free..., contracting...)
    out_perm: tuple[int, ...]  # output dims -> (act free..., weight free...)
    weight_perm: tuple[int, ...]  # weight dims -> (contracting..., free...)
    t: int
    k: int
    n: int
    out_shape: tuple[int, ...]
    out_dtype: Any
    weight_shape: tuple[int, ...]
    patches: tuple[tuple[str, Any], ...] | None = None  # conv: im2col of the input, kwargs


@dataclasses.dataclass(frozen=True)
class EmbeddingTap:
    """One tapped row-lookup ``gather`` of the parameter leaf ``leaf``, a table ``(V, D)``.

    Per example the lookup reads rows ``idx: (T,)`` and outputs ``(T, D)``; with ``g: (T, D)``
    the gradient at the output, ``∇E = Σ_t e_{idx_t} g_tᵀ`` (a scatter-add of the rows ``g_t``).
    ``mode`` is the gather's out-of-bounds rule: ``"clip"`` clamps an index into ``[0, V)``,
    every other mode drops it (what the scatter-add transpose of the gather does in XLA).
    """

    eqn_index: int
    leaf: int
    t: int
    vocab: int
    dim: int
    mode: str
    out_shape: tuple[int, ...]
    out_dtype: Any
    weight_shape: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class GhostPlan:
    """The inlined per-example jaxpr and the dense weights found in it."""

    jaxpr: Any  # jex.ClosedJaxpr with invars = param leaves + example leaves
    num_params: int
    taps: tuple[DenseTap | EmbeddingTap, ...]

    @property
    def tapped_leaves(self) -> frozenset[int]:
        return frozenset(t.leaf for t in self.taps)


def _read(env: dict, v: Any) -> Any:
    return v.val if isinstance(v, jex.Literal) else env[v]


def _bind(eqn: Any, invals: Sequence[Any]) -> list[Any]:
    bind_params = eqn.primitive.get_bind_params(eqn.params)
    with eqn.ctx.manager:
        out = eqn.primitive.bind(*invals, **bind_params)
    return list(out) if eqn.primitive.multiple_results else [out]


def _eval_inlined(jaxpr: Any, consts: Sequence[Any], args: Sequence[Any]) -> list[Any]:
    """Evaluate ``jaxpr`` binding every primitive, with ``jit`` calls evaluated inline."""
    env: dict = {}
    env.update(zip(jaxpr.constvars, consts, strict=True))
    env.update(zip(jaxpr.invars, args, strict=True))
    for eqn in jaxpr.eqns:
        invals = [_read(env, v) for v in eqn.invars]
        if eqn.primitive.name in _INLINED:
            inner = eqn.params["jaxpr"]
            outs = _eval_inlined(inner.jaxpr, inner.consts, invals)
        else:
            outs = _bind(eqn, invals)
        env.update(zip(eqn.outvars, outs, strict=True))
    return [_read(env, v) for v in jaxpr.outvars]


def _inlined_jaxpr(flat_fn: Callable, avals: Sequence[Any]) -> Any:
    closed = jax.make_jaxpr(flat_fn)(*avals)
    return jax.make_jaxpr(lambda *a: _eval_inlined(closed.jaxpr, closed.consts, a))(*avals)


def _dense_tap(eqn_index: int, eqn: Any, leaf: int, weight_pos: int) -> DenseTap | None:
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    if lb or rb:
        return None
    w_contract, a_contract = (lc, rc) if weight_pos == 0 else (rc, lc)
    w_aval = eqn.invars[weight_pos].aval
    a_aval = eqn.invars[1 - weight_pos].aval
    out_aval = eqn.outvars[0].aval
    w_free = [d for d in range(w_aval.ndim) if d not in w_contract]
    a_free = [d for d in range(a_aval.ndim) if d not in a_contract]
    n_w_free = len(w_free)
    # dot_general output dims: (lhs free..., rhs free...).
    if weight_pos == 0:
        out_perm = tuple(range(n_w_free, out_aval.ndim)) + tuple(range(n_w_free))
    else:
        out_perm = tuple(range(out_aval.ndim))
    return DenseTap(
        eqn_index=eqn_index,
        leaf=leaf,
        weight_pos=weight_pos,
        act_perm=tuple(a_free) + tuple(a_contract),
        out_perm=out_perm,
        weight_perm=tuple(w_contract) + tuple(w_free),
        t=int(np.prod([a_aval.shape[d] for d in a_free], dtype=np.int64)),
        k=int(np.prod([w_aval.shape[d] for d in w_contract], dtype=np.int64)),
        n=int(np.prod([w_aval.shape[d] for d in w_free], dtype=np.int64)),
        out_shape=tuple(out_aval.shape),
        out_dtype=out_aval.dtype,
        weight_shape=tuple(w_aval.shape),
    )


def _conv_tap(eqn_index: int, eqn: Any, leaf: int) -> DenseTap | None:
    """A convolution whose kernel is a parameter is a dense layer on im2col patches.

    The patches (:func:`im2col`) have layout ``(N, *out_spatial, prod(filter)·C)`` with feature
    order ``(*filter_spatial, C)``; the kernel is rearranged to ``(*spatial, I, O)`` to match.
    """
    p = eqn.params
    if p["feature_group_count"] != 1 or p["batch_group_count"] != 1:
        return None
    lhs_spec, rhs_spec, out_spec = p["dimension_numbers"]
    lhs, rhs, out = eqn.invars[0].aval, eqn.invars[1].aval, eqn.outvars[0].aval
    canonical = (out_spec[0], *out_spec[2:], out_spec[1])
    filter_shape = tuple(rhs.shape[d] for d in rhs_spec[2:])
    patches = {
        "filter_shape": filter_shape,
        "window_strides": tuple(p["window_strides"]),
        "padding": tuple(tuple(pad) for pad in p["padding"]),
        "lhs_dilation": tuple(p["lhs_dilation"]),
        "rhs_dilation": tuple(p["rhs_dilation"]),
        "dimension_numbers": p["dimension_numbers"],
        "out_spatial": tuple(out.shape[d] for d in out_spec[2:]),
    }
    return DenseTap(
        eqn_index=eqn_index,
        leaf=leaf,
        weight_pos=1,
        act_perm=tuple(range(out.ndim)),  # im2col returns the canonical layout
        out_perm=canonical,
        weight_perm=(*rhs_spec[2:], rhs_spec[1], rhs_spec[0]),
        t=int(np.prod([out.shape[d] for d in canonical[:-1]], dtype=np.int64)),
        k=int(lhs.shape[lhs_spec[1]] * np.prod(filter_shape, dtype=np.int64)),
        n=int(out.shape[out_spec[1]]),
        out_shape=tuple(out.shape),
        out_dtype=out.dtype,
        weight_shape=tuple(rhs.shape),
        patches=tuple(patches.items()),
    )


def im2col(lhs: jax.Array, patches: dict) -> jax.Array:
    """Patches ``(N, *out_spatial, prod(filter)·C)`` of a convolution's input, order ``(*f, C)``.

    Strided slices of the padded input (cheap on CPU), taken one spatial dimension at a time:
    the ``f_d`` slices along dimension d are stacked next to it, so the array grows to
    ``(N, O_1, f_1, …, O_k, f_k, C)``, and one transpose then moves the filter axes inward,
    next to the channels. Stacking all ``prod(f)`` slices of a 2-D filter at once instead (one
    concatenate of 64 operands for an 8×8 filter) was measured ~1.5× slower in the
    tempered-sigmoid CNN's ghost step (2-core CPU; its first layer has C = 1, so each
    operand wrote one entry at a time). With ``lhs_dilation`` it falls back to
    ``lax.conv_general_dilated_patches`` (a grouped convolution; its (C, *f) features are
    reordered).
    """
    lhs_spec, _, out_spec = patches["dimension_numbers"]
    if any(d != 1 for d in patches["lhs_dilation"]):
        keys = ("filter_shape", "window_strides", "padding", "lhs_dilation", "rhs_dilation")
        out = jax.lax.conv_general_dilated_patches(
            lhs, **{k: patches[k] for k in keys}, dimension_numbers=patches["dimension_numbers"]
        )
        out = jnp.transpose(out, (out_spec[0], *out_spec[2:], out_spec[1]))
        c = lhs.shape[lhs_spec[1]]
        out = out.reshape(out.shape[:-1] + (c, -1))  # (N, *So, C, F) -> (N, *So, F, C)
        return jnp.swapaxes(out, -1, -2).reshape(out.shape[:-2] + (-1,))
    x = jnp.transpose(lhs, (lhs_spec[0], *lhs_spec[2:], lhs_spec[1]))  # (N, *S, C)
    pads = [(0, 0, 0), *((lo, hi, 0) for lo, hi in patches["padding"]), (0, 0, 0)]
    x = jax.lax.pad(x, jnp.zeros((), x.dtype), pads)
    spatial = zip(
        patches["filter_shape"],
        patches["window_strides"],
        patches["rhs_dilation"],
        patches["out_spatial"],
        strict=True,
    )
    for d, (size, stride, dilation, n) in enumerate(spatial):
        axis = 1 + 2 * d  # x: (N, O_1, f_1, ..., O_d-1, f_d-1, S_d, ..., S_k, C)
        cols = []
        for offset in range(size):
            start = offset * dilation
            cols.append(
                jax.lax.slice_in_dim(x, start, start + stride * (n - 1) + 1, stride, axis=axis)
            )
        x = jnp.stack(cols, axis=axis + 1)
    k = len(patches["filter_shape"])
    x = jnp.transpose(x, (0, *range(1, 2 * k, 2), *range(2, 2 * k + 1, 2), 2 * k + 1))
    return x.reshape(x.shape[: k + 1] + (-1,))


def _embedding_tap(eqn_index: int, eqn: Any, leaf: int) -> EmbeddingTap | None:
    """A ``gather`` that looks up whole rows of a 2-D table: ``out[..., :] = E[idx[..., 0], :]``.

    Anything else (several index columns, partial slices, batching dims) is left to vmap.
    """
    p = eqn.params
    table, idx = eqn.invars[0].aval, eqn.invars[1].aval
    dn = p["dimension_numbers"]
    if table.ndim != 2 or idx.ndim < 1 or idx.shape[-1] != 1:
        return None
    if not jnp.issubdtype(idx.dtype, np.integer):
        return None
    expected = dict(
        offset_dims=(idx.ndim - 1,),
        collapsed_slice_dims=(0,),
        start_index_map=(0,),
        operand_batching_dims=(),
        start_indices_batching_dims=(),
    )
    if any(tuple(getattr(dn, name, ())) != want for name, want in expected.items()):
        return None
    if tuple(p["slice_sizes"]) != (1, table.shape[1]):
        return None
    out = eqn.outvars[0].aval
    mode = "clip" if p["mode"] == jax.lax.GatherScatterMode.CLIP else "drop"
    return EmbeddingTap(
        eqn_index=eqn_index,
        leaf=leaf,
        t=int(np.prod(idx.shape[:-1], dtype=np.int64)),
        vocab=int(table.shape[0]),
        dim=int(table.shape[1]),
        mode=mode,
        out_shape=tuple(out.shape),
        out_dtype=out.dtype,
        weight_shape=tuple(table.shape),
    )


def _through_casts(jaxpr: Any, uses: dict, outvars: set, var: Any) -> Any:
    """Follow a parameter through single-use dtype casts (``promote_dtype``, mixed precision)."""
    while var not in outvars and len(uses[var]) == 1:
        eqn = jaxpr.eqns[uses[var][0][0]]
        if eqn.primitive.name != "convert_element_type":
            break
        var = eqn.outvars[0]
    return var


def _find_taps(jaxpr: Any, num_params: int) -> tuple[DenseTap | EmbeddingTap, ...]:
    uses: dict[Any, list[tuple[int, int]]] = defaultdict(list)
    for i, eqn in enumerate(jaxpr.eqns):
        for j, v in enumerate(eqn.invars):
            if isinstance(v, jex.Var):
                uses[v].append((i, j))
    outvars = {v for v in jaxpr.outvars if isinstance(v, jex.Var)}
    taps, tapped_eqns = [], set()
    for leaf, var in enumerate(jaxpr.invars[:num_params]):
        var = _through_casts(jaxpr, uses, outvars, var)
        if var in outvars or len(uses[var]) != 1:
            continue
        i, pos = uses[var][0]
        eqn = jaxpr.eqns[i]
        if len(eqn.invars) != 2 or eqn.invars[1 - pos] is var or i in tapped_eqns:
            continue  # one tap per product (of two parameters, the second uses vmap)
        if not jnp.issubdtype(var.aval.dtype, np.floating):
            continue
        if eqn.primitive.name == "dot_general":
            tap = _dense_tap(i, eqn, leaf, pos)
        elif eqn.primitive.name == "conv_general_dilated" and pos == 1:
            tap = _conv_tap(i, eqn, leaf)
        elif eqn.primitive.name == "gather" and pos == 0:
            tap = _embedding_tap(i, eqn, leaf)
        else:
            tap = None
        if tap is not None:
            taps.append(tap)
            tapped_eqns.add(i)
    return tuple(taps)


def make_plan(flat_fn: Callable, param_avals: Sequence[Any], example_avals: Sequence[Any]):
    """Trace ``flat_fn(*param_leaves, *example_leaves)`` (one example) and find dense weights."""
    closed = _inlined_jaxpr(flat_fn, list(param_avals) + list(example_avals))
    out = closed.jaxpr.outvars
    if (
        len(out) != 1
        or out[0].aval.shape != ()
        or not jnp.issubdtype(out[0].aval.dtype, np.floating)
    ):
        raise ValueError("loss_fn must return a floating scalar for one example")
    return GhostPlan(closed, len(param_avals), _find_taps(closed.jaxpr, len(param_avals)))


def evaluate_tapped(plan: GhostPlan, args: Sequence[Any], perturbations: Sequence[Any]):
    """Evaluate the plan's jaxpr with ``perturbations[j]`` added to the output of tap ``j``.

    Returns:
        ``(loss, activations)`` where ``activations[j]`` is tap ``j``'s non-weight operand (the
        im2col patches for a convolution, the ``(..., 1)`` indices for an embedding lookup).
    """
    jaxpr = plan.jaxpr.jaxpr
    tap_of = {t.eqn_index: j for j, t in enumerate(plan.taps)}
    activations: list[Any] = [None] * len(plan.taps)
    env: dict = {}
    env.update(zip(jaxpr.constvars, plan.jaxpr.consts, strict=True))
    env.update(zip(jaxpr.invars, args, strict=True))
    for i, eqn in enumerate(jaxpr.eqns):
        invals = [_read(env, v) for v in eqn.invars]
        outs = _bind(eqn, invals)
        j = tap_of.get(i)
        if j is not None:
            tap = plan.taps[j]
            if isinstance(tap, EmbeddingTap):
                activations[j] = invals[1]
            else:
                activations[j] = invals[1 - tap.weight_pos]
            if isinstance(tap, DenseTap) and tap.patches is not None:
                activations[j] = im2col(activations[j], dict(tap.patches))
            outs = [outs[0] + perturbations[j]]
        env.update(zip(eqn.outvars, outs, strict=True))
    return _read(env, jaxpr.outvars[0]), activations
