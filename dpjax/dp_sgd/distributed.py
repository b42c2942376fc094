r"""Data-parallel DP-SGD on the devices JAX already drives (``jax.shard_map``, sums gathered).

The batch is split along its leading axis over a 1-D device mesh; every device computes the
clipped sum of its shard, the shards' sums are gathered and added in device order (a
fixed-order double-float tree: the same value on every device), and the result is
replicated. Noise is then added ONCE to the global sum by the usual transforms
(:func:`dpjax.dp_sgd_optimizer`): a replicated key gives the same draw everywhere, so the
released update equals the single-device one (optax#148 is the bug this avoids: noising per
device and averaging shrinks the noise by √devices).

Example::

    mesh = jax.make_mesh((jax.device_count(),), ("batch",))
    grad_fn = dpjax.data_parallel(dpjax.clipped_grad(loss_fn, l2_clip_norm=C), mesh=mesh)
    clipped_sum, info = grad_fn(params, x, y, batch=padded)   # replicated sum
    updates, opt_state = tx.update(clipped_sum, opt_state, params)  # noise once

Several processes (``jax.distributed``: several hosts, or several processes on one machine):
the same code runs on every process over a global mesh. Each process loads only its rows
(:func:`process_rows`), :func:`global_batch` assembles them into one array sharded over the
job, :func:`replicate` places params and optimizer state (checking they are identical on every
process — the noise key above all), and the jitted step releases ONE Gaussian draw per step for
the whole job. ``examples/distributed_dp_sgd.py`` is a complete run (2 processes × 2 CPU devices
on one machine, or ``srun`` / a TPU pod with the same code).

Formal guarantees:
    Across processes the released update is the Gaussian mechanism on the global clipped sum
    (Abadi et al. 2016, Algorithm 1): every example's clipped
    gradient (norm ≤ C) enters the global sum exactly once, from the one device that holds its
    row, so the global sum has sensitivity C (add/remove-one; 2C replace-one) whatever the
    number of processes or devices. The noise N(0, σ²C²I) is drawn ONCE from the shared key
    (identical on every process, checked by :func:`replicate` and
    :func:`assert_same_on_every_process`) and added after the global sum; every process computes
    the same draw and the same update, so the job releases one noisy sum per step — not one
    per process (per-process draws would make the processes diverge, or, averaged, shrink the
    noise by √processes: the optax#148 bug). Each process holds only its shard of the batch;
    what it sees of the others is their per-device sums (gathered) — the trust model is that
    of one curator running the whole job: intermediate per-process sums are not released. The
    accountant therefore records ONE event per step (the same :mod:`dpjax.events` event as one
    process, with the sampling rate of the global batch), regardless of the number of
    processes.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from dpjax import _validate
from dpjax.dp_sgd import _certified, _rows
from dpjax.dp_sgd._frozen import ReadOnlyAfterInit
from dpjax.dp_sgd.clipping import ClippedGrad, ClippingInfo
from dpjax.dp_sgd.samplers import PaddedBatch
from dpjax.relation import ADD_OR_REMOVE_ONE, NeighbouringRelation

__all__ = [
    "DataParallelClippedGrad",
    "assert_same_on_every_process",
    "data_parallel",
    "global_batch",
    "process_rows",
    "replicate",
]


class DataParallelClippedGrad(ReadOnlyAfterInit):
    """A :class:`dpjax.dp_sgd.clipping.ClippedGrad` whose batch is sharded over a device mesh.

    Call it like the wrapped function: ``(params, *dataset, batch=padded)`` or
    ``(params, *rows, mask=None)`` ``-> (clipped_sum, info)``;
    ``clipped_sum`` is the sum over devices (replicated), ``info`` covers the whole batch.
    """

    _DERIVED = "noise and sensitivity were derived from it"
    _REBUILD_HINT = "build a new one with dpjax.data_parallel(...)"

    def __init__(self, grad_fn: ClippedGrad, mesh: Mesh, axis_name: str):
        self.grad_fn = grad_fn
        self.mesh = mesh
        self.axis_name = axis_name
        self.l2_clip_norm = grad_fn.l2_clip_norm
        self.l2_norm_bound = grad_fn.l2_norm_bound
        #: the wrapped function's non-finite rule (a DP optimizer refuses nan_safe=False)
        self.nan_safe = grad_fn.nan_safe
        self._freeze()

    @property
    def num_shards(self) -> int:
        """Number of devices along the batch axis."""
        return self.mesh.shape[self.axis_name]

    def sensitivity(self, relation: NeighbouringRelation | str = ADD_OR_REMOVE_ONE) -> float:
        """Same as the wrapped function: one example lives on one device, the sum adds ≤ C."""
        return self.grad_fn.sensitivity(relation)

    def _local(self, params: Any, batch: tuple, mask: jax.Array, *, global_rows: int):
        outer = (global_rows, self.num_shards)
        clipped_sum, info = self.grad_fn.call_in_release(params, *batch, mask=mask, outer=outer)
        total = jax.tree.map(self._ordered_sum, clipped_sum)
        bad = jax.lax.psum(info.num_nonfinite, self.axis_name)
        clipped = jax.lax.psum(info.num_clipped, self.axis_name)
        return total, ClippingInfo(info.per_example_norms, bad, clipped)

    def _ordered_sum(self, x: jax.Array) -> jax.Array:
        """The devices' sums added in device order (double-float tree, one rounding).

        A ``psum`` adds them in an order the backend picks, with error γ_devices·Σ‖S_d‖;
        gathering them and adding in a fixed order gives the same value on every device
        and the bound of :func:`dpjax.dp_sgd._certified.batch_sum_error` (stage 2).
        """
        gathered = jax.lax.all_gather(x, self.axis_name)
        return _certified.df_round(_certified.tree_sum(gathered), x.dtype)

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
            functools.partial(self._local, global_rows=n + pad),
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
        mesh: a mesh with an axis ``axis_name``; default: all devices on one axis (with
            several processes: every device of every process, ``jax.devices()``).
        axis_name: the mesh axis the batch is split over.

    Returns:
        A :class:`DataParallelClippedGrad` with the same call signature, ``l2_clip_norm`` and
        ``sensitivity`` as ``grad_fn``.

    Formal guarantees:
        Every device clips with C multiplied by the summation shrink of the GLOBAL batch for
        two roundings (its own sum, then the devices' sums gathered and added in device order
        by a double-float tree, rounded once; never a ``psum`` of unknown order), so adding or
        removing one example moves the released float sum by ≤ C (add/remove-one; 2C
        replace-one; Casacuberta et al. 2022, CCS, for the rounding). Add noise to the
        result, once — never per device.
    """
    if not isinstance(grad_fn, ClippedGrad):
        _validate.fail("grad_fn", grad_fn, "a function built by dpjax.clipped_grad")
    if mesh is None:
        auto = (jax.sharding.AxisType.Auto,)
        mesh = jax.make_mesh((jax.device_count(),), (axis_name,), axis_types=auto)
    _check_axis(mesh, axis_name)
    return DataParallelClippedGrad(grad_fn, mesh, axis_name)


def replicate(tree: Any, mesh: Mesh) -> Any:
    """Place ``tree`` replicated on every device of ``mesh`` (params, optimizer state).

    With several processes (``jax.process_count() > 1``) every process must call it with the
    same values: it first checks that every leaf is identical on every process
    (:func:`assert_same_on_every_process`), then places each process's copy on its own devices.
    A differing leaf — typically a noise key derived from the process index — is a
    ``ValueError``: replicated arrays that silently differ per process would add a different
    noise draw on every process (and let the processes' parameters drift apart).

    Args:
        tree: a pytree of arrays (typed PRNG keys allowed), identical on every process.
        mesh: the (global) mesh.

    Returns:
        The same pytree of ``jax.Array`` s, replicated over every device of ``mesh``.

    Raises:
        ValueError: (several processes) a leaf differs between processes.

    Example:
        >>> mesh = jax.make_mesh((jax.device_count(),), ("batch",))
        >>> state = replicate({"w": jnp.zeros(3), "key": jax.random.key(0)}, mesh)
        >>> state["w"].sharding.is_fully_replicated
        True
    """
    sharding = jax.sharding.NamedSharding(mesh, P())
    if jax.process_count() == 1:
        return jax.tree.map(lambda x: jax.device_put(jnp.asarray(x), sharding), tree)
    assert_same_on_every_process("tree", tree)
    return jax.tree.map(lambda x: _put_replicated(x, sharding), tree)


def _put_replicated(x: Any, sharding: jax.sharding.NamedSharding) -> jax.Array:
    """This process's copy -> a global replicated array, without gathering it from the others.

    (``jax.device_put`` refuses a ``jax.Array`` across processes, all-gathers a numpy value to
    compare it, and — jax 0.10 with x64 off — compares float64 input with its float32 copy and
    fails; equality was checked above by digest.)
    """
    if isinstance(x, jax.Array) and x.sharding.is_equivalent_to(sharding, x.ndim):
        return x
    if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        data = _put_replicated(jax.random.key_data(x), sharding)
        return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
    host = np.asarray(x)
    host = host.astype(jax.dtypes.canonicalize_dtype(host.dtype), copy=False)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def _leaf_fingerprint(name: str, x: Any) -> np.ndarray:
    """A 128-bit digest of a leaf's dtype, shape and bytes, as 4 uint32 (keys: their data)."""
    if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        if not x.is_fully_replicated:
            _validate.fail(name, f"a leaf sharded as {x.sharding}", "replicated or host-local")
        x = x.addressable_data(0)
    host = np.ascontiguousarray(np.asarray(x))
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{host.dtype.str}{host.shape}".encode())
    digest.update(host.tobytes())
    return np.frombuffer(digest.digest(), dtype=np.uint32)


def assert_same_on_every_process(name: str, tree: Any) -> None:
    """Raise unless every leaf of ``tree`` is bit-identical on every process.

    Call it on the noise key before building the optimizer (``dp_sgd_optimizer(key=...)``)
    when the key is only closed over (e.g. ``tx.init`` inside ``jax.jit``): a per-process key
    such as ``jax.random.key(jax.process_index())`` would make every process add its own noise.
    Every process must call it (it is a collective); with one process it returns at once.

    Args:
        name: the argument name for the error message.
        tree: a pytree of arrays / PRNG keys (host-local, or replicated global arrays).

    Raises:
        ValueError: naming the leaves that differ.

    Example:
        >>> key = jax.random.key(0)  # not jax.random.key(jax.process_index())
        >>> assert_same_on_every_process("noise_key", key)  # every process calls it
    """
    paths_and_leaves = jax.tree_util.tree_leaves_with_path(tree)
    if jax.process_count() == 1 or not paths_and_leaves:
        return
    local = np.stack([_leaf_fingerprint(name, x) for _, x in paths_and_leaves])
    everyone = np.asarray(multihost_utils.process_allgather(local))  # (processes, leaves, 4)
    differs = np.any(everyone != everyone[:1], axis=(0, 2))
    if np.any(differs):
        paths = [
            jax.tree_util.keystr(p) or "<root>"
            for (p, _), d in zip(paths_and_leaves, differs, strict=True)
            if d
        ]
        _validate.fail(
            name,
            f"the leaves {paths} differing between the {jax.process_count()} processes",
            "identical on every process (one noise key for the whole job: the update is ONE "
            "Gaussian mechanism on the global clipped sum, not one per process)",
        )


def process_rows(mesh: Mesh, global_batch_size: int, axis_name: str = "batch") -> slice:
    """The rows of a global batch that THIS process holds when it is sharded along ``axis_name``.

    Load (or sample) only these rows on this process, then call :func:`global_batch`.

    Args:
        mesh: the global mesh.
        global_batch_size: rows of the global batch, a multiple of the axis size.
        axis_name: the mesh axis the batch is split over.

    Returns:
        ``slice(start, stop)``: one contiguous block of rows.

    Raises:
        ValueError: the size is not a positive multiple of the axis size, or this process's
            devices hold rows that are not contiguous (reorder the mesh's devices by process).
    """
    _check_axis(mesh, axis_name)
    size = _validate.positive_int("global_batch_size", global_batch_size)
    shards = mesh.shape[axis_name]
    if size % shards:
        _validate.fail("global_batch_size", size, f"a multiple of the {shards} shards")
    sharding = jax.sharding.NamedSharding(mesh, P(axis_name))
    blocks = {(s[0].start or 0, s[0].stop or size) for s in _local_indices(sharding, size)}
    start, stop = min(b[0] for b in blocks), max(b[1] for b in blocks)
    if sum(b[1] - b[0] for b in blocks) != stop - start:
        _validate.fail("mesh", mesh, "a mesh whose devices hold contiguous rows per process")
    return slice(start, stop)


def _local_indices(sharding: jax.sharding.NamedSharding, size: int) -> list:
    return list(sharding.addressable_devices_indices_map((size,)).values())


def global_batch(local_batch: Any, mesh: Mesh, axis_name: str = "batch") -> Any:
    """Assemble every process's rows into global arrays sharded along ``axis_name``.

    Every process calls it with its own rows (those of :func:`process_rows`), the same number
    of rows on every process (padded samplers give fixed shapes; pad with ``mask=False`` rows
    otherwise) and the mask among the leaves. With one process it shards the batch over the
    local devices.

    Args:
        local_batch: a pytree of host arrays with a common leading axis: this process's rows.
        mesh: the global mesh.
        axis_name: the mesh axis the batch is split over.

    Returns:
        The same pytree of global ``jax.Array`` s, rows of process 0 first (in mesh order).

    Raises:
        ValueError: leaves without a common leading axis, or a row count that is not a
            multiple of this process's devices along ``axis_name``.

    Example:
        >>> import numpy as np
        >>> mesh = jax.make_mesh((jax.device_count(),), ("batch",))
        >>> size = 4 * jax.device_count()
        >>> rows = process_rows(mesh, size)   # one process: every row
        >>> x, mask = global_batch((np.ones((size, 3))[rows], np.ones(size, bool)[rows]), mesh)
        >>> x.shape == (size, 3), len(x.sharding.device_set) == jax.device_count()
        (True, True)
    """
    _check_axis(mesh, axis_name)
    rows = _rows.batch_size((local_batch,))
    sharding = jax.sharding.NamedSharding(mesh, P(axis_name))
    shards = mesh.shape[axis_name]
    local_blocks = len({s[0].start for s in _local_indices(sharding, shards)})
    if rows % local_blocks:
        _validate.fail(
            "local_batch",
            f"{rows} rows",
            f"a multiple of this process's {local_blocks} devices along {axis_name!r} "
            "(pad with mask=False rows)",
        )
    global_rows = rows * shards // local_blocks

    def assemble(x: Any) -> jax.Array:
        host = np.asarray(x)
        return jax.make_array_from_process_local_data(
            sharding, host, (global_rows,) + host.shape[1:]
        )

    return jax.tree.map(assemble, local_batch)


def _check_axis(mesh: Mesh, axis_name: str) -> None:
    if axis_name not in mesh.shape:
        _validate.fail("axis_name", axis_name, f"one of the mesh axes {tuple(mesh.shape)}")
