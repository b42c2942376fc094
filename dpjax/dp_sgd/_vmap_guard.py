"""Refuse a noise update batched by a ``jax.vmap`` that its noise key is not batched by.

Inside ``jax.vmap(tx.update, in_axes=(0, None, None))`` over per-example gradients every row
looks like params, so the shape check passes, and the (unbatched) key draws ONE noise vector
that is added to every row: the rows' differences are noise-free (review finding). A vmap over
independent runs is legitimate: there the state, hence the key, is batched too.

The check is a :func:`jax.custom_batching.custom_vmap` identity on the key data whose vmap
rule sees, at every vmap level, which inputs that vmap batches (``in_batched``). It is a
primitive of the traced program, so it also fires when the vmap is applied outside a
``jax.jit`` / ``lax.scan`` / ``lax.cond`` that holds the update (their batching rules batch
the inner program and reach the rule), and each nested vmap is checked on its own: an outer
vmap over runs does not excuse an inner vmap over examples. Outside vmap (eager, ``jit``,
``scan``, ``shard_map``, ``pmap``) it is the identity and costs nothing. The inputs it reads
from the updates are zero-size slices behind ``stop_gradient``: no data flows through it and
``grad``/``jvp`` of an update are unchanged.

A vmap that batches updates (here or in a vmap inside it) AND keys is checked for repeated keys
among ALL the keys it holds, inner axes included (states broadcast from one
state give every row the same noise: the same attack): eagerly it raises; under ``jit`` the
rows' noisy updates are replaced by NaN (nothing computed from them is released).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap

from dpjax import _validate

__all__ = ["guard_key", "void_unless"]

_UNMATCHED = (
    "the clipped SUM of one run (shaped like params): these updates are batched by a jax.vmap "
    "that the noise state is not batched by (e.g. jax.vmap(tx.update, in_axes=(0, None, "
    "None)) over per-example gradients), so one noise draw would be added to every row and "
    "the rows' differences released noise-free; clip and sum first (dpjax.clipped_grad), or, "
    "to vmap over independent runs, batch the noise state too (one distinct key per run)"
)
_REPEATED = (
    "a batch of noise states with distinct keys (one per independent run): rows of this vmap "
    "share a key, so they get the same noise draw and their differences are released "
    "noise-free; build each run's state from its own key"
)


def _all_distinct(key_rows: jax.Array) -> jax.Array:
    """Whether the keys in ``key_rows`` (B, ..., words) are pairwise distinct (sort, compare).

    Every key of the array counts, not only the rows of this vmap's axis: under nested vmaps
    the inner axes are runs too (keys [[k1, k2], [k2, k1]] differ along each axis, yet two
    cells share k2).
    """
    words = jnp.reshape(key_rows, (-1, key_rows.shape[-1]))
    if words.shape[0] < 2:
        return jnp.bool_(True)
    columns = tuple(words[:, j] for j in range(words.shape[1]))
    ordered = jnp.stack(jax.lax.sort(columns, num_keys=len(columns)), axis=1)
    return ~jnp.any(jnp.all(ordered[1:] == ordered[:-1], axis=1))


@custom_vmap
def _guarded(key_data: jax.Array, markers: list) -> tuple[jax.Array, jax.Array]:
    del markers
    return key_data, jnp.bool_(True)


@_guarded.def_vmap
def _guarded_rule(axis_size: int, in_batched: list, key_data: jax.Array, markers: list):
    key_batched, marker_batched = in_batched
    del axis_size
    rows_batched = any(jax.tree.leaves(marker_batched))
    if rows_batched and not key_batched:
        _validate.fail("updates", "updates batched by a vmap the noise key is not", _UNMATCHED)
    # A rule's body is plain code to the vmaps OUTSIDE this one: re-enter the guard so that
    # each of them checks its own batching too (else jax.vmap over rows of a jax.vmap over
    # runs passed: only the innermost vmap was checked).
    key_data, ok = _guarded(key_data, markers)
    # rows batched by an inner vmap show as extra leading axes of the (1-D) markers
    inner_rows = any(
        jnp.ndim(m) > 1 + int(b)
        for m, b in zip(jax.tree.leaves(markers), jax.tree.leaves(marker_batched), strict=True)
    )
    if not (key_batched and (rows_batched or inner_rows)):
        return (key_data, ok), (key_batched, False)
    distinct = _all_distinct(key_data)
    if _validate.is_concrete(distinct) and not bool(distinct):
        _validate.fail("state", "a vmapped batch of noise states with repeated keys", _REPEATED)
    return (key_data, ok & distinct), (True, False)


def guard_key(updates: Any, key_data: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(key_data, ok)``: the key data unchanged, checked against the vmaps of ``updates``.

    Args:
        updates: the update tree of a noise transform.
        key_data: the noise state's raw key data.

    Returns:
        ``key_data`` unchanged and a bool scalar ``ok`` (False only under ``jit`` when a vmap
        batches ``updates`` and the keys with repeated keys: :func:`void_unless` then voids).

    Raises:
        ValueError: (naming ``updates``) a vmap batches ``updates`` but not the key;
            (naming ``state``) eagerly, a vmap batches both with a repeated key.
    """
    markers = [
        jax.lax.stop_gradient(jnp.reshape(leaf, (-1,))[:0]) for leaf in jax.tree.leaves(updates)
    ]
    return _guarded(key_data, markers)


def void_unless(ok: jax.Array, tree: Any) -> Any:
    """``tree`` with every inexact leaf NaN where ``ok`` is False (unchanged where True)."""

    def void(x: Any) -> Any:
        if not jnp.issubdtype(jnp.result_type(x), jnp.inexact):
            return x
        return jnp.where(ok, x, jnp.full(jnp.shape(x), jnp.nan, jnp.result_type(x)))

    return jax.tree.map(void, tree)
