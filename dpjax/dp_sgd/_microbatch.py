"""Micro-batched clipped sums: a ``lax.scan`` over chunks, the double-float sums added exactly.

Used by :class:`dpjax.dp_sgd.ClippedGrad` when ``microbatch_size`` is smaller than the batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from dpjax.dp_sgd import _certified, _rows


def _pairs_to_trees(treedef: Any, pairs: list) -> tuple[Any, Any]:
    """A list of ``(hi, lo)`` leaves as two pytrees ``(hi_tree, lo_tree)``."""
    return (
        jax.tree.unflatten(treedef, [p[0] for p in pairs]),
        jax.tree.unflatten(treedef, [p[1] for p in pairs]),
    )


def _microbatched(core: Callable, params: Any, batch: tuple, mask: jax.Array, size: int):
    """Run ``core`` on chunks of ``size`` rows with lax.scan, adding the double-float sums.

    The chunks' ``(hi, lo)`` sums are added in double-float (no rounding per chunk), so the
    call still rounds once; the scan adds ⌈B/size⌉ sequential levels to the summation depth.
    """
    n = mask.shape[0]
    num_chunks = -(-n // size)
    pad = num_chunks * size - n
    if pad:
        batch, mask = (
            _rows.pad_rows(batch, pad),
            _rows.pad_rows(mask, pad),
        )  # padded rows have mask False
    chunk = lambda x: x.reshape((num_chunks, size) + x.shape[1:])  # noqa: E731
    batch_c, mask_c = jax.tree.map(chunk, batch), chunk(mask)

    def body(acc, xs):
        b, m = xs
        s, norms, bad = core(params, b, m)
        acc_sum, acc_bad = acc
        return (_df_add_trees(acc_sum, s), acc_bad + bad), norms

    s0, _, _ = jax.eval_shape(core, params, jax.tree.map(lambda x: x[0], batch_c), mask_c[0])
    # the low parts take the high parts' shapes (a core may return a scalar 0 as a low part)
    zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), s0[0])
    lows = jax.tree.map(lambda z, x: jnp.zeros(z.shape, x.dtype), zeros, s0[1])
    init = ((zeros, lows), jnp.zeros((), jnp.int32))
    (total, bad), norms = jax.lax.scan(body, init, (batch_c, mask_c))
    return total, norms.reshape(-1)[:n], bad


def _df_add_trees(x: tuple[Any, Any], y: tuple[Any, Any]) -> tuple[Any, Any]:
    """Double-float sum of two ``(hi_tree, lo_tree)`` sums, leaf by leaf."""
    xh, treedef = jax.tree.flatten(x[0])
    pairs = [
        _certified.df_add((a, b), (c, d))
        for a, b, c, d in zip(
            xh, jax.tree.leaves(x[1]), jax.tree.leaves(y[0]), jax.tree.leaves(y[1]), strict=True
        )
    ]
    return _pairs_to_trees(treedef, pairs)
