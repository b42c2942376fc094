"""Refuse a noisy release batched by a ``jax.vmap`` that its noise key is not batched by.

Inside ``jax.vmap(lambda q: release(key, q))(queries)`` (``key`` closed over, or passed with
``in_axes=None``) every row looks like one query, so every check on shapes passes, and the
(unbatched) key draws ONE noise sample that is added to every row: the rows' differences are
released noise-free (review finding, first in DP-SGD's noise transforms, then in every
mechanism). A vmap over independent runs is legitimate: there the key is batched too, one
distinct key per run.

The check is a :func:`jax.custom_batching.custom_vmap` identity on the key data whose vmap
rule sees, at every vmap level, which inputs that vmap batches (``in_batched``). It is a
primitive of the traced program, so it also fires when the vmap is applied outside a
``jax.jit`` / ``lax.scan`` / ``lax.cond`` that holds the release (their batching rules batch
the inner program and reach the rule), and each nested vmap is checked on its own: an outer
vmap over runs does not excuse an inner vmap over rows. Outside vmap (eager, ``jit``,
``scan``, ``shard_map``, ``pmap``) it is the identity. The inputs it reads from the released
values are zero-size slices behind ``stop_gradient``: no data flows through it and
``grad``/``jvp`` of a release are unchanged.

A vmap that batches the values (here or in a vmap inside it) AND the keys is checked for
repeated keys among ALL the keys it holds, inner axes included (keys broadcast from one key
give every row the same noise: the same attack): eagerly it raises; under ``jit`` the check is
a traced bool ``ok`` and the caller voids the rows' release (:func:`void_unless`,
:func:`void_release`: nothing computed from them is released).

What no guard can see: a LOOP (``lax.map``, a Python loop, a sequential vmap rule) that
passes one key to every iteration is key reuse by the caller, not a batching.

:func:`key_guard` builds one guard per pair of messages: DP-SGD's noise transforms name their
``updates`` and noise ``state`` (:mod:`dpjax.dp_sgd._vmap_guard`), the mechanisms their
``key`` (:mod:`dpjax.mechanisms._vmap_guard`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_batching import custom_vmap

from dpjax import _validate

__all__ = ["Guard", "Refusal", "key_guard", "void_unless", "void_release", "void_value"]


class Refusal(NamedTuple):
    """The ``ValueError`` of one refusal: ``_validate.fail(name, value, valid)``."""

    name: str
    value: str
    valid: str


Guard = Callable[[Any, jax.Array], tuple[jax.Array, jax.Array]]


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


def key_guard(*, unmatched: Refusal, repeated: Refusal) -> Guard:
    """A guard ``(values, key_data) -> (key_data, ok)`` that raises with these messages.

    Args:
        unmatched: the refusal of a vmap that batches the values but not the key.
        repeated: the refusal (eager) of a vmap that batches both with a repeated key.

    Returns:
        ``guard(values, key_data)``: ``key_data`` unchanged and a bool scalar ``ok`` (False
        only under ``jit`` when a vmap batches the values and the keys with repeated keys).
    """

    @custom_vmap
    def guarded(key_data: jax.Array, markers: list) -> tuple[jax.Array, jax.Array]:
        del markers
        return key_data, jnp.bool_(True)

    @guarded.def_vmap
    def rule(axis_size: int, in_batched: list, key_data: jax.Array, markers: list):
        del axis_size
        key_batched, marker_batched = in_batched
        rows_batched = any(jax.tree.leaves(marker_batched))
        if rows_batched and not key_batched:
            _validate.fail(*unmatched)
        # A rule's body is plain code to the vmaps OUTSIDE this one: re-enter the guard so
        # that each of them checks its own batching too (else jax.vmap over rows of a
        # jax.vmap over runs passed: only the innermost vmap was checked).
        key_data, ok = guarded(key_data, markers)
        # rows batched by an inner vmap show as extra leading axes of the (1-D) markers
        inner_rows = any(
            jnp.ndim(m) > 1 + int(b)
            for m, b in zip(jax.tree.leaves(markers), jax.tree.leaves(marker_batched), strict=True)
        )
        if not (key_batched and (rows_batched or inner_rows)):
            return (key_data, ok), (key_batched, False)
        distinct = _all_distinct(key_data)
        if _validate.is_concrete(distinct) and not bool(distinct):
            _validate.fail(*repeated)
        return (key_data, ok & distinct), (True, False)

    def guard(values: Any, key_data: jax.Array) -> tuple[jax.Array, jax.Array]:
        markers = [
            jax.lax.stop_gradient(jnp.reshape(leaf, (-1,))[:0]) for leaf in jax.tree.leaves(values)
        ]
        return guarded(key_data, markers)

    return guard


def void_unless(ok: jax.Array, tree: Any) -> Any:
    """``tree`` with every inexact leaf NaN where ``ok`` is False (unchanged where True)."""

    def void(x: Any) -> Any:
        if not jnp.issubdtype(jnp.result_type(x), jnp.inexact):
            return x
        return jnp.where(ok, x, jnp.full(jnp.shape(x), jnp.nan, jnp.result_type(x)))

    return jax.tree.map(void, tree)


def void_value(dtype: Any) -> Any:
    """The value a voided release of ``dtype`` takes: NaN; for integers one no dpjax mechanism
    releases (the dtype's minimum if signed, its maximum if unsigned); False for bool."""
    dtype = np.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.inexact):
        return np.array(np.nan, dtype)
    if dtype == np.bool_:
        return np.False_
    info = jnp.iinfo(dtype)
    return np.array(info.min if info.min < 0 else info.max, dtype)


def void_release(ok: jax.Array, tree: Any) -> Any:
    """``tree`` with EVERY leaf replaced by :func:`void_value` where ``ok`` is False.

    A concrete ``ok`` (no vmap, or an eager vmap that passed the check) returns ``tree``
    untouched (NumPy leaves stay NumPy).
    """
    if _validate.is_concrete(ok) and bool(ok):
        return tree

    def void(x: Any) -> Any:
        dtype = jnp.result_type(x)
        return jnp.where(ok, x, jnp.full(jnp.shape(x), void_value(dtype), dtype))

    return jax.tree.map(void, tree)
