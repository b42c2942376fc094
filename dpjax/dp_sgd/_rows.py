"""Batch rows shared by the clipped-gradient functions: shape checks, masks, padding, gathering.

Private to :mod:`dpjax.dp_sgd` (used by :mod:`~dpjax.dp_sgd.clipping` and
:mod:`~dpjax.dp_sgd.distributed`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dpjax import _validate
from dpjax.dp_sgd.samplers import PaddedBatch


def batch_size(batch: tuple[Any, ...]) -> int:
    """Common leading axis of every batch leaf; a ValueError otherwise (mean-vs-sum guard)."""
    refuse_padded_batch_as_data(batch)
    leaves = jax.tree.leaves(batch)
    if not leaves:
        _validate.fail("batch", batch, "at least one array with a leading batch axis")
    sizes = set()
    for leaf in leaves:
        shape = jnp.shape(leaf)
        if len(shape) == 0:
            _validate.fail(
                "batch",
                f"a leaf of shape {shape}",
                "arrays with a leading batch axis (B, ...): one row per example",
            )
        sizes.add(shape[0])
    if len(sizes) != 1:
        _validate.fail(
            "batch", f"leading axes {sorted(sizes)}", "arrays sharing one leading batch axis B"
        )
    return sizes.pop()


def check_mask(mask: Any, batch_size: int) -> jax.Array:
    """``mask`` as a bool (B,) array (all True when None); a ValueError for any other shape."""
    if mask is None:
        return jnp.ones((batch_size,), dtype=bool)
    mask = jnp.asarray(mask)
    if mask.shape != (batch_size,) or mask.dtype != jnp.bool_:
        _validate.fail(
            "mask",
            f"array of shape {mask.shape} and dtype {mask.dtype}",
            f"bool of shape ({batch_size},)",
        )
    return mask


def pad_rows(tree: Any, pad: int) -> Any:
    """Append ``pad`` zero rows to every leaf (the caller masks them out)."""

    def pad_leaf(x: jax.Array) -> jax.Array:
        x = jnp.asarray(x)
        return jnp.concatenate([x, jnp.zeros((pad,) + x.shape[1:], x.dtype)], axis=0)

    return jax.tree.map(pad_leaf, tree)


def refuse_padded_batch_as_data(data: tuple[Any, ...]) -> None:
    """A :class:`PaddedBatch` among the data arguments would be clipped as features: refuse."""
    if any(isinstance(d, PaddedBatch) for d in data):
        _validate.fail(
            "batch",
            "a PaddedBatch passed as a data argument",
            "passed by keyword: grad_fn(params, *dataset, batch=padded) gathers its rows and "
            "applies its mask",
        )


def gather_batch(batch: PaddedBatch, data: tuple[Any, ...]) -> tuple[tuple[Any, ...], jax.Array]:
    """The rows of ``data`` (whole data set, leading axis n) at ``batch.indices``, and the mask.

    The mask is ``batch.mask`` AND "index in [0, n)": padding slots (which hold index 0) and any
    index outside the data given contribute nothing. Concrete out-of-range indices of real
    slots raise (the sampler was built for a larger data set than the one passed).
    """
    if not isinstance(batch, PaddedBatch):
        _validate.fail("batch", type(batch).__name__, "a dpjax.dp_sgd.PaddedBatch from a sampler")
    n = batch_size(data)
    indices = jnp.asarray(batch.indices)
    if indices.ndim != 1 or not jnp.issubdtype(indices.dtype, jnp.integer):
        _validate.fail("batch.indices", f"{indices.dtype}{indices.shape}", "an int (B,) array")
    mask = check_mask(batch.mask, indices.shape[0])
    in_range = (indices >= 0) & (indices < n)
    if _validate.is_concrete(indices) and _validate.is_concrete(mask):
        bad = np.asarray(mask) & ~np.asarray(in_range)
        if bad.any():
            _validate.fail(
                "batch.indices",
                f"index {int(np.asarray(indices)[bad][0])} of a real example",
                f"in [0, {n}) (the data passed has {n} rows; build the sampler with "
                "dataset_size equal to it)",
            )
    rows = jax.tree.map(lambda a: jnp.asarray(a)[jnp.where(in_range, indices, 0)], data)
    return rows, mask & in_range
