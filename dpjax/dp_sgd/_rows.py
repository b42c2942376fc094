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

    The mask is ``batch.mask`` AND "index in [0, n)" AND "first real slot of its index":
    padding slots (which hold index 0), any index outside the data given and any repeat of a
    record contribute nothing. Concrete out-of-range or repeated indices of real slots raise
    (the sampler was built for a larger data set than the one passed; a batch drawn with
    replacement would count a record several times).
    """
    if not isinstance(batch, PaddedBatch):
        _validate.fail("batch", type(batch).__name__, "a dpjax.dp_sgd.PaddedBatch from a sampler")
    n = batch_size(data)
    indices = jnp.asarray(batch.indices)
    if indices.ndim != 1 or not jnp.issubdtype(indices.dtype, jnp.integer):
        _validate.fail("batch.indices", f"{indices.dtype}{indices.shape}", "an int (B,) array")
    mask = check_mask(batch.mask, indices.shape[0])
    in_range = index_in_range(indices, n)
    if _validate.is_concrete(indices) and _validate.is_concrete(mask):
        bad = np.asarray(mask) & ~np.asarray(in_range)
        if bad.any():
            _validate.fail(
                "batch.indices",
                f"index {int(np.asarray(indices)[bad][0])} of a real example",
                f"in [0, {n}) (the data passed has {n} rows; build the sampler with "
                "dataset_size equal to it)",
            )
        real = np.asarray(indices)[np.asarray(mask)]
        values, counts = np.unique(real, return_counts=True)
        if (counts > 1).any():
            _validate.fail(
                "batch.indices",
                f"index {int(values[counts > 1][0])} in {int(counts.max())} real slots",
                "distinct for the real slots (a record counted k times moves the sum by k·C, "
                "not C): sample with PoissonSampler or without replacement",
            )
    real = mask & in_range
    # in-range indices are < n: gather and deduplicate in int32 (uint8 index 255 would
    # collide with the dtype's max, the sort sentinel of _repeated)
    wide = jnp.int32 if n <= jnp.iinfo(jnp.int32).max else indices.dtype
    safe = jnp.where(in_range, indices, jnp.zeros((), indices.dtype)).astype(wide)
    rows = jax.tree.map(lambda a: jnp.asarray(a)[safe], data)
    return rows, real & ~_repeated(safe, real)


def index_in_range(indices: jax.Array, n: int) -> jax.Array:
    """``0 <= indices < n`` elementwise, exact for EVERY integer dtype of ``indices``.

    ``indices < n`` would cast n to the indices' dtype: 300 wraps to 44 in uint8 (real
    records silently masked under ``jit``) and raises OverflowError in int8. Here each bound
    is only compared where it is representable: n above the dtype's max means "always below n",
    and an unsigned dtype is never negative.
    """
    info = jnp.iinfo(indices.dtype)
    if n > int(info.max):
        below = jnp.ones(indices.shape, bool)
    else:
        below = indices < jnp.asarray(n, indices.dtype)
    if int(info.min) < 0:
        return below & (indices >= jnp.zeros((), indices.dtype))
    return below


def _repeated(indices: jax.Array, real: jax.Array) -> jax.Array:
    """True at every real slot whose index already occurs in an EARLIER real slot (traced
    batches: a record then counts once, so the sum keeps sensitivity C)."""
    size = indices.shape[0]
    if size < 2:
        return jnp.zeros((size,), bool)
    slots = jnp.arange(size, dtype=jnp.int32)
    # sort real slots by (index, slot); padding and out-of-range slots go last
    sentinel = jnp.iinfo(indices.dtype).max
    sort_key = jnp.where(real, indices, jnp.asarray(sentinel, indices.dtype))
    sorted_key, sorted_slot = jax.lax.sort((sort_key, slots), num_keys=2)
    sorted_real = sorted_key != sentinel
    same = jnp.concatenate([jnp.zeros((1,), bool), sorted_key[1:] == sorted_key[:-1]])
    return jnp.zeros((size,), bool).at[sorted_slot].set(same & sorted_real)
