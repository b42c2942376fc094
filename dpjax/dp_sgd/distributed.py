r"""Data-parallel DP-SGD on the devices JAX already drives (``jax.shard_map`` + ``psum``).

The batch is split along its leading axis over a 1-D device mesh; every device computes the
clipped sum of its shard, the shards' sums are added with ``psum``, and the result is
replicated. Noise is then added ONCE to the global sum by the usual transforms
(:func:`dpjax.dp_sgd_optimizer`): a replicated key gives the same draw everywhere, so the
released update equals the single-device one (optax#148 is the bug this avoids: noising per
device and averaging shrinks the noise by √devices).

Example::

    mesh = jax.make_mesh((jax.device_count(),), ("batch",))
    grad_fn = dpjax.data_parallel(dpjax.clipped_grad(loss_fn, l2_clip_norm=C), mesh=mesh)
    clipped_sum, info = grad_fn(params, x, y, batch=padded)   # replicated sum
    updates, opt_state = tx.update(clipped_sum, opt_state, params)  # noise once
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from dpjax import _validate
from dpjax.dp_sgd import _rows
from dpjax.dp_sgd.clipping import ClippedGrad, ClippingInfo
from dpjax.dp_sgd.samplers import PaddedBatch
from dpjax.relation import ADD_OR_REMOVE_ONE, NeighbouringRelation

__all__ = ["DataParallelClippedGrad", "data_parallel", "replicate"]


class DataParallelClippedGrad:
    """A :class:`dpjax.dp_sgd.clipping.ClippedGrad` whose batch is sharded over a device mesh.

    Call it like the wrapped function: ``(params, *dataset, batch=padded)`` or
    ``(params, *rows, mask=None)`` ``-> (clipped_sum, info)``;
    ``clipped_sum`` is the psum over devices (replicated), ``info`` covers the whole batch.
    """

    def __init__(self, grad_fn: ClippedGrad, mesh: Mesh, axis_name: str):
        self.grad_fn = grad_fn
        self.mesh = mesh
        self.axis_name = axis_name
        self.l2_clip_norm = grad_fn.l2_clip_norm
        self.l2_norm_bound = grad_fn.l2_norm_bound

    @property
    def num_shards(self) -> int:
        """Number of devices along the batch axis."""
        return self.mesh.shape[self.axis_name]

    def sensitivity(self, relation: NeighbouringRelation | str = ADD_OR_REMOVE_ONE) -> float:
        """Same as the wrapped function: one example lives on one device, psum adds ≤ C."""
        return self.grad_fn.sensitivity(relation)

    def _local(self, params: Any, batch: tuple, mask: jax.Array):
        clipped_sum, info = self.grad_fn(params, *batch, mask=mask)
        total = jax.lax.psum(clipped_sum, self.axis_name)
        bad = jax.lax.psum(info.num_nonfinite, self.axis_name)
        clipped = jax.lax.psum(info.num_clipped, self.axis_name)
        return total, ClippingInfo(info.per_example_norms, bad, clipped)

    def __call__(
        self, params: Any, *data: Any, mask: Any = None, batch: PaddedBatch | None = None
    ) -> tuple[Any, ClippingInfo]:
        """Clipped sum over the whole (sharded) batch; pads with masked rows to a multiple.

        ``batch=padded`` (a sampler's PaddedBatch, ``data`` the whole data set) gathers and
        masks the rows first, as :meth:`ClippedGrad.__call__` does.
        """
        if batch is not None:
            if mask is not None:
                _validate.fail("mask", "given together with batch", "None when batch is passed")
            data, mask = _rows.gather_batch(batch, data)
        batch = data
        n = _rows.batch_size(batch)
        mask = _rows.check_mask(mask, n)
        pad = -n % self.num_shards
        if pad:
            batch, mask = _rows.pad_rows(batch, pad), _rows.pad_rows(mask, pad)
        row = P(self.axis_name)
        sharded = jax.shard_map(
            self._local,
            mesh=self.mesh,
            in_specs=(P(), jax.tree.map(lambda _: row, batch), row),
            out_specs=(P(), ClippingInfo(row, P(), P())),
            # the psum'd outputs are replicated by construction; the ghost path re-binds
            # primitives from a jaxpr, which the varying-axes checker does not follow
            check_vma=False,
        )
        if _is_explicit(self.mesh, self.axis_name):
            batch = jax.tree.map(lambda x: jax.reshard(x, row), batch)
            mask = jax.reshard(mask, row)
            params = jax.tree.map(lambda x: jax.reshard(x, P()), params)
        total, info = sharded(params, batch, mask)
        norms = info.per_example_norms
        if pad and _is_explicit(self.mesh, self.axis_name):
            norms = jax.reshard(norms, P())
        return total, info._replace(per_example_norms=norms[:n])


def _is_explicit(mesh: Mesh, axis_name: str) -> bool:
    types = dict(zip(mesh.axis_names, mesh.axis_types, strict=True))
    return types[axis_name] == jax.sharding.AxisType.Explicit


def data_parallel(
    grad_fn: ClippedGrad, *, mesh: Mesh | None = None, axis_name: str = "batch"
) -> DataParallelClippedGrad:
    """Shard a clipped-gradient function's batch over devices; psum the clipped sums.

    Args:
        grad_fn: from :func:`dpjax.clipped_grad`.
        mesh: a mesh with an axis ``axis_name``; default: all devices on one axis.
        axis_name: the mesh axis the batch is split over.

    Returns:
        A :class:`DataParallelClippedGrad` with the same call signature, ``l2_clip_norm`` and
        ``sensitivity`` as ``grad_fn``.

    Formal guarantees:
        The returned sum is the same function of the data as ``grad_fn``'s (a sum is invariant
        to how its terms are split over devices; padding rows are masked), so its sensitivity
        is unchanged: C (add/remove-one), 2C (replace-one). Add noise to the psum'd result,
        once — never per device.
    """
    if not isinstance(grad_fn, ClippedGrad):
        _validate.fail("grad_fn", grad_fn, "a function built by dpjax.clipped_grad")
    if mesh is None:
        auto = (jax.sharding.AxisType.Auto,)
        mesh = jax.make_mesh((jax.device_count(),), (axis_name,), axis_types=auto)
    if axis_name not in mesh.shape:
        _validate.fail("axis_name", axis_name, f"one of the mesh axes {tuple(mesh.shape)}")
    return DataParallelClippedGrad(grad_fn, mesh, axis_name)


def replicate(tree: Any, mesh: Mesh) -> Any:
    """Place ``tree`` replicated on every device of ``mesh`` (params, optimizer state)."""
    sharding = jax.sharding.NamedSharding(mesh, P())
    return jax.tree.map(lambda x: jax.device_put(jnp.asarray(x), sharding), tree)
