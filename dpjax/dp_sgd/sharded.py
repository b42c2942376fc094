r"""DP-SGD with parameters sharded over a device mesh (FSDP-style): a data axis and a model axis.

Each parameter leaf is laid out with a :class:`jax.sharding.PartitionSpec` over the MODEL axis
of a mesh (replicated over the data axis); the batch is split over the DATA axis. Everything
runs inside one ``jax.jit`` with JAX's own machinery — sharding constraints (GSPMD) for the
per-example gradients and ``jax.shard_map`` collectives for the reductions; there is no
communication layer of dpjax's own::

    per-example grads g_i  (jit + with_sharding_constraint: rows on "data", leaf on "model")
      -> one stored copy of g_i (an optimization barrier: the norms and the sum read it)
      -> per-shard ‖g_i‖² (certified upper bounds, on the device that holds the shard)
      -> all_gather over "model", added in device order: one U_i per example, the same on
         every device of the example's row            (norms summed ONCE, in a fixed order)
      -> clip factor min(1, f·C/(U_i(1+η)))  -> local double-float tree sum of the rows
      -> fixed-order reduce-scatter over "data" (all_to_all, then a tree in device order)
         + all_gather: the clipped sum, sharded like the parameters
      -> + σC·Z, Z drawn shard by shard (:func:`add_sharded_gaussian_noise`)

The shrink factor on a mesh. The released sum is formed in two roundings (each device's rows,
then the devices' rounded sums added in device order by a double-float tree), exactly the
:func:`dpjax.data_parallel` release: f = :func:`dpjax.dp_sgd._certified.summation_shrink` of
the global padded batch with ``stages=2`` and depth ⌈log2 B⌉ + 1 + ⌈log2 B⌉ + 1 + 2 — the depth
bound of ANY split of the B rows over the data axis, so f depends on B and the dtype only, not
on the mesh shape (:meth:`ShardedClippedGrad.summation_shrink`; float32, B = 256:
f = 0.99994). The model axis does not enter f: every coordinate of the sum lives on one model
shard and is summed over examples only. It enters the norm bound instead: the squared norm of
an example is a sum over its shards' partial sums, bounded with γ_n for the n = (leaves ×
model shards) partial sums whatever the order (Higham, Lemma 3.1); the order is fixed anyway
(device order), so every device of an example's row applies the same factor.

Noise where it lives. Leaf j's noise is the two-word Gaussian of :mod:`dpjax._random`
(U = (k + ½)·2⁻⁶³ from 63 random bits, |Z| = Φ̄⁻¹(U/2), the float64 normal's construction
evaluated in the noise dtype; support ±9.155, as for every dpjax Gaussian) of the words
``jax.random.bits(fold_in(key_t, j), (2, *leaf.shape))`` with JAX's partitionable threefry
(``jax.threefry_partitionable``): word (a, idx) is threefry2x32 of the step key and the
coordinate's global index, a function of (key, index) only. The words are constrained to the
leaf's sharding, so XLA generates on each device the words of its own shard (no device draws
a full-size leaf) and the released noise is bit-identical for every mesh shape and for one
device (tested on 1×1, 8×1, 4×2, 2×4 and 1×8 CPU meshes).

Formal guarantees:
    Neighbouring relation: add/remove-one (2C under replace-one). Every example's clipped
    gradient, rounding included, has ℓ2 norm ≤ f·C: its factor comes from a certified upper
    bound U of its whole norm (all shards, all leaves), and f covers the rounding of the
    two-stage fixed-order batch sum, so adding or removing one example moves the released
    float sum by ≤ C, on every mesh shape (per-example clipping: Abadi et al. 2016, "Deep
    Learning with Differential Privacy", §3.1, https://arxiv.org/abs/1607.00133; rounding:
    Casacuberta, Shoemate, Vadhan, Wagaman 2022, CCS, https://arxiv.org/abs/2207.10635,
    "bound the rounding and add it to the sensitivity"). :func:`add_sharded_gaussian_noise`
    with stddev σ·C makes each update the Gaussian mechanism of ℓ2 sensitivity C with noise
    multiplier σ (Dwork & Roth 2014, "The Algorithmic Foundations of Differential Privacy",
    Theorem A.1, https://www.cis.upenn.edu/~aaroth/Papers/privacybook.pdf): the noise is ONE
    draw of N(0, σ²C²I) over the whole parameter vector (coordinates i.i.d., the shards'
    words disjoint), added once, never per device. The trust model is one curator running the
    whole job (intermediate per-device sums are not released).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dpjax import _noise, _random, _validate
from dpjax.dp_sgd import _certified, _rows
from dpjax.dp_sgd import transforms as _tx
from dpjax.dp_sgd._finite_sums import refuse_concrete_nonfinite_sums
from dpjax.dp_sgd._frozen import ReadOnlyAfterInit
from dpjax.dp_sgd.clipping import ClippedGrad, ClippingInfo
from dpjax.dp_sgd.samplers import PaddedBatch
from dpjax.relation import ADD_OR_REMOVE_ONE, NeighbouringRelation

__all__ = [
    "MeshLayout",
    "ShardedClippedGrad",
    "add_sharded_gaussian_noise",
    "mesh_layout",
    "sharded_clipped_grad",
    "sharded_normal",
]


class MeshLayout(NamedTuple):
    """Where the parameters and the batch live: a mesh, one PartitionSpec per parameter leaf.

    Attributes:
        mesh: a :class:`jax.sharding.Mesh` with (at least) the axes ``data_axis`` and
            ``model_axis``, of axis type Auto.
        param_specs: a pytree like the params of ``PartitionSpec`` s that name only
            ``model_axis`` (or nothing: replicated); the params are replicated over the data axis.
        data_axis: the mesh axis the batch's rows are split over.
        model_axis: the mesh axis the parameters are split over.
    """

    mesh: Mesh
    param_specs: Any
    data_axis: str = "data"
    model_axis: str = "model"

    def sharding(self, spec: P) -> NamedSharding:
        return NamedSharding(self.mesh, spec)

    def param_shardings(self) -> Any:
        """The ``NamedSharding`` of every parameter leaf (``jax.device_put(params, ...)``)."""
        return jax.tree.map(self.sharding, self.param_specs, is_leaf=_is_spec)


def _is_spec(x: Any) -> bool:
    return isinstance(x, P)


def mesh_layout(
    mesh: Mesh, param_specs: Any, *, data_axis: str = "data", model_axis: str = "model"
) -> MeshLayout:
    """A checked :class:`MeshLayout`.

    Raises:
        ValueError: an axis missing from the mesh, an axis that is not of type Auto, a spec
            that is not a PartitionSpec or names the data axis (or an axis twice).
    """
    if not isinstance(mesh, Mesh):
        _validate.fail("mesh", mesh, "a jax.sharding.Mesh")
    types = dict(zip(mesh.axis_names, mesh.axis_types, strict=True))
    for name, axis in (("data_axis", data_axis), ("model_axis", model_axis)):
        if axis not in mesh.shape:
            _validate.fail(name, axis, f"one of the mesh axes {tuple(mesh.shape)}")
        if types[axis] != jax.sharding.AxisType.Auto:
            _validate.fail("mesh", f"axis {axis!r} of type {types[axis]}", "AxisType.Auto axes")
    if data_axis == model_axis:
        _validate.fail("model_axis", model_axis, f"an axis other than data_axis={data_axis!r}")
    for spec in jax.tree.leaves(param_specs, is_leaf=_is_spec):
        if not isinstance(spec, P):
            _validate.fail("param_specs", spec, "a pytree like params of PartitionSpec")
        named = [a for part in spec for a in (part if isinstance(part, tuple) else (part,))]
        if any(a not in (None, model_axis) for a in named) or named.count(model_axis) > 1:
            _validate.fail(
                "param_specs",
                spec,
                f"specs naming only the model axis {model_axis!r}, at most once (parameters "
                f"are replicated over the data axis {data_axis!r})",
            )
    return MeshLayout(mesh, param_specs, data_axis, model_axis)


def _is_sharded(spec: P, model_axis: str) -> bool:
    return any(
        part == model_axis or (isinstance(part, tuple) and model_axis in part) for part in spec
    )


def _specs_for(layout: MeshLayout, params: Any) -> list[P]:
    """The leaves' specs, in ``jax.tree.leaves(params)`` order (a ValueError if unlike)."""
    treedef = jax.tree.structure(params)
    try:
        specs = treedef.flatten_up_to(layout.param_specs)
    except (ValueError, TypeError):
        _validate.fail("param_specs", layout.param_specs, "a pytree like params")
    m = layout.mesh.shape[layout.model_axis]
    for spec, leaf in zip(specs, jax.tree.leaves(params), strict=True):
        shape = jnp.shape(leaf)
        if len(spec) > len(shape):
            _validate.fail("param_specs", spec, f"a spec of at most {len(shape)} entries")
        for dim, part in zip(shape, spec, strict=False):
            if part is not None and dim % m:
                _validate.fail(
                    "param_specs",
                    f"{spec} for a leaf of shape {shape}",
                    f"sharded dimensions divisible by the model axis size {m}",
                )
    return specs


# ----------------------------------------------------------------------------- the clipped sum


class ShardedClippedGrad(ReadOnlyAfterInit):
    """A :class:`~dpjax.dp_sgd.clipping.ClippedGrad` on a mesh (see the module docstring).

    Call it like the wrapped function: ``(params, *dataset, batch=padded)`` or
    ``(params, *rows, mask=None)`` ``-> (clipped_sum, info)``; ``clipped_sum`` is sharded
    like the parameters.
    """

    _DERIVED = "noise and sensitivity were derived from it"
    _REBUILD_HINT = "build a new one with dpjax.dp_sgd.sharded_clipped_grad(...)"

    def __init__(self, grad_fn: ClippedGrad, layout: MeshLayout):
        self.grad_fn = grad_fn
        self.layout = layout
        self.l2_clip_norm = grad_fn.l2_clip_norm
        self.l2_norm_bound = grad_fn.l2_norm_bound
        self.nan_safe = grad_fn.nan_safe
        self._freeze()

    @property
    def data_shards(self) -> int:
        return self.layout.mesh.shape[self.layout.data_axis]

    @property
    def model_shards(self) -> int:
        return self.layout.mesh.shape[self.layout.model_axis]

    def sensitivity(self, relation: NeighbouringRelation | str = ADD_OR_REMOVE_ONE) -> float:
        """C (add/remove-one) or 2C (replace-one): one example's contribution is ≤ C."""
        return self.grad_fn.sensitivity(relation)

    def release(self, rows: int) -> _certified.Release:
        """The mesh-independent release of ``rows`` padded rows (two stages, any split)."""
        depth = 2 * (_certified.tree_depth(rows) + 1) + 2
        return _certified.Release(rows, 2, depth, self.l2_norm_bound)

    def summation_shrink(self, batch_rows: int, dtype: Any = "float32") -> float:
        """The factor f by which C is multiplied for ``batch_rows`` rows, on ANY mesh shape.

        Example:
            >>> import jax, jax.numpy as jnp, dpjax
            >>> from dpjax.dp_sgd import sharded
            >>> mesh = jax.make_mesh((1, 1), ("data", "model"),
            ...     axis_types=(jax.sharding.AxisType.Auto,) * 2)
            >>> layout = sharded.mesh_layout(mesh, {"w": jax.P()})
            >>> grad_fn = sharded.sharded_clipped_grad(
            ...     dpjax.clipped_grad(lambda p, x: (p["w"] * x) ** 2, l2_clip_norm=1.0), layout)
            >>> round(grad_fn.summation_shrink(256), 5)
            0.99994
        """
        rows = _validate.positive_int("batch_rows", batch_rows)
        dt = jnp.dtype(dtype)
        return _certified.release_shrink(self.release(rows), [dt], [dt])[0]

    def __call__(
        self, params: Any, *data: Any, mask: Any = None, batch: PaddedBatch | None = None
    ) -> tuple[Any, ClippingInfo]:
        """Clipped sum over the whole batch (rows padded with masked rows to a multiple of
        the data axis), sharded like the parameters."""
        if batch is not None:
            if mask is not None:
                _validate.fail("mask", "given together with batch", "None when batch is passed")
            data, mask = _rows.gather_batch(batch, data)
        n = _rows.batch_size(data)
        mask = _rows.check_mask(mask, n)
        pad = -n % self.data_shards
        if pad:
            data, mask = _rows.pad_rows(data, pad), _rows.pad_rows(mask, pad)
        specs = _specs_for(self.layout, params)
        total, info = self._clipped(params, tuple(data), mask, specs, n + pad)
        return total, info._replace(per_example_norms=info.per_example_norms[:n])

    def _clipped(self, params, data, mask, specs, rows):
        lay = self.layout
        loss_fn = self.grad_fn.loss_fn
        grads = jax.vmap(jax.grad(loss_fn), in_axes=(None,) + (0,) * len(data))(params, *data)
        leaves, treedef = jax.tree.flatten(grads)
        row_specs = [P(lay.data_axis, *s) for s in specs]
        leaves = [
            jax.lax.with_sharding_constraint(x, lay.sharding(s))
            for x, s in zip(leaves, row_specs, strict=True)
        ]
        mask = jax.lax.with_sharding_constraint(mask, lay.sharding(P(lay.data_axis)))
        local = functools.partial(
            self._local, sharded=[_is_sharded(s, lay.model_axis) for s in specs], rows=rows
        )
        total, norms, bad, clipped = jax.shard_map(
            local,
            mesh=lay.mesh,
            in_specs=(row_specs, P(lay.data_axis)),
            out_specs=(list(specs), P(lay.data_axis), P(), P()),
            check_vma=False,
        )(leaves, mask)
        return jax.tree.unflatten(treedef, total), ClippingInfo(norms, bad, clipped)

    def _local(self, leaves, mask, *, sharded, rows):
        lay = self.layout
        # one stored value: the norms and the sum must read the same gradients (XLA may
        # recompute a producer inside each consumer's fusion with excess precision in
        # bf16/fp16, as in the vmap path); without it the norms and the sum saw different
        # bfloat16 gradients and one example moved the clipped sum by 1.00044·C (1×1 mesh)
        leaves = jax.lax.optimization_barrier(leaves)
        wide = _certified.wide_dtype()
        parts = [_certified.row_sq_norms(x, wide) for x in leaves]
        first = jax.lax.axis_index(lay.model_axis) == 0
        sq, upper = _model_sum(parts, sharded, first, lay.model_axis, wide)
        # γ for every partial sum that entered, in any order (Higham, Lemma 3.1)
        n_parts = len(leaves) * self.model_shards
        upper = _certified.sqrt_up(_certified.inflate(upper, _certified.gamma(n_parts, wide)))
        sum_dts = [_certified.sum_dtype(x.dtype) for x in leaves]
        out_dts = [_certified.output_dtype(x.dtype) for x in leaves]
        eta = _certified.shrink(wide, sum_dts, out_dts)
        f, _ = _certified.release_shrink(self.release(rows), sum_dts, out_dts)
        finite = jnp.isfinite(upper)
        keep = mask & finite if self.nan_safe else mask
        scale = _certified.certified_scale(upper, f * self.grad_fn.l2_clip_norm, eta)
        weight = jnp.where(keep, scale, jnp.zeros((), scale.dtype))
        totals = []
        for x, sd, od in zip(leaves, sum_dts, out_dts, strict=True):
            x = jnp.where(keep.reshape((-1,) + (1,) * (x.ndim - 1)), x, jnp.zeros((), x.dtype))
            w = weight.astype(sd).reshape((-1,) + (1,) * (x.ndim - 1))
            local_sum = _certified.df_round(_certified.tree_sum(x.astype(sd) * w), od)
            totals.append(_data_sum(local_sum, lay.data_axis, self.data_shards))
        norms = jnp.where(mask, jnp.sqrt(sq), jnp.zeros((), wide))
        bad = jax.lax.psum(jnp.sum(mask & ~finite, dtype=jnp.int32), lay.data_axis)
        over = jnp.isfinite(norms) & (norms > jnp.asarray(self.l2_norm_bound, wide))
        clipped = jax.lax.psum(jnp.sum(mask & over, dtype=jnp.int32), lay.data_axis)
        return totals, norms, bad, clipped


def _model_sum(parts, sharded, first, axis, wide):
    """Per-example Σ of the squared-norm parts over every leaf and model shard, in device order.

    A leaf sharded over the model axis contributes its shard's part on every device; a
    replicated leaf (the same part on every model device) only on model device 0. The
    devices' partial sums are gathered and added in device order: one value per example,
    the same on every device of its row.
    """

    def local(k):
        total = jnp.zeros_like(parts[0][k])
        for p, s in zip(parts, sharded, strict=True):
            total = total + (p[k] if s else jnp.where(first, p[k], jnp.zeros((), wide)))
        return total

    gathered = [jax.lax.all_gather(local(k), axis) for k in (0, 1)]  # (model, rows)
    return tuple(_in_order(g) for g in gathered)


def _in_order(x: jax.Array) -> jax.Array:
    """Σ over axis 0, sequentially in index order (elementwise adds: XLA keeps the order)."""
    total = x[0]
    for i in range(1, x.shape[0]):
        total = total + x[i]
    return total


def _data_sum(x: jax.Array, axis: str, shards: int) -> jax.Array:
    """Σ over the data axis of every device's rounded sum ``x``: a fixed-order reduce-scatter.

    Each device's flattened sum is cut into ``shards`` chunks; ``all_to_all`` hands device d
    chunk d of every device; they are added by the double-float tree of
    :func:`dpjax.dp_sgd._certified.tree_sum` in device order and rounded once; ``all_gather``
    reassembles the sum. No device holds more than its shard's size (no gathered copy per
    device).
    """
    if shards == 1:
        return x
    flat = x.reshape(-1)
    size = flat.shape[0]
    pad = -size % shards
    chunks = jnp.pad(flat, (0, pad)).reshape(shards, -1)
    mine = jax.lax.all_to_all(chunks, axis, 0, 0, tiled=False)  # (shards, chunk): row j from j
    summed = _certified.df_round(_certified.tree_sum(mine), x.dtype)
    whole = jax.lax.all_gather(summed, axis, tiled=True)
    return whole[:size].reshape(x.shape)


def sharded_clipped_grad(grad_fn: ClippedGrad, layout: MeshLayout) -> ShardedClippedGrad:
    """Run a clipped-gradient function with params sharded on ``layout``'s mesh.

    Args:
        grad_fn: from :func:`dpjax.clipped_grad` (not per-layer; micro-batching and the ghost
            backend are not used on a mesh: the per-example gradients are materialised, sharded).
        layout: from :func:`mesh_layout`.

    Returns:
        A :class:`ShardedClippedGrad` with the call signature, ``l2_clip_norm`` and
        ``sensitivity`` of ``grad_fn``.

    Raises:
        ValueError: ``grad_fn`` not from ``clipped_grad``, per-layer or automatic clipping,
            or built with ``rows_per_release`` (a mesh call's sum is released as it is: its
            shrink does not cover adding several calls' sums).

    Formal guarantees:
        See the module docstring: sensitivity C under add/remove-one (2C replace-one) on every
        mesh shape, the per-example norm certified over all shards and the batch sum's
        rounding covered by the mesh-independent shrink f (Abadi et al. 2016, §3.1;
        Casacuberta et al. 2022).
    """
    if not isinstance(grad_fn, ClippedGrad):
        _validate.fail("grad_fn", grad_fn, "a function built by dpjax.clipped_grad")
    if grad_fn.per_layer or grad_fn.gamma is not None:
        _validate.fail(
            "grad_fn", grad_fn, "a clipped_grad with flat clipping (no per_layer, no automatic)"
        )
    if grad_fn.rows_per_release is not None:  # its shrink would not cover the extra rounding
        _validate.fail(
            "grad_fn",
            f"a clipped_grad with rows_per_release={grad_fn.rows_per_release}",
            "a clipped_grad without rows_per_release on a mesh (each call is one released sum)",
        )
    if not isinstance(layout, MeshLayout):
        _validate.fail("layout", layout, "a MeshLayout from dpjax.dp_sgd.mesh_layout")
    return ShardedClippedGrad(grad_fn, layout)


# ----------------------------------------------------------------------------- the noise


def sharded_normal(key: jax.Array, shape: tuple[int, ...], sharding: Any = None, dtype=np.float32):
    """N(0, 1) of ``shape`` whose value at every index is a function of (key, index) only.

    The two-word Gaussian of :mod:`dpjax._random` on ``jax.random.bits(key, (2, *shape))``
    drawn with partitionable threefry; with ``sharding`` (a ``NamedSharding`` of the leaf)
    the words are generated shard by shard. Bit-identical for every sharding. Jitted, so that
    an eager call runs the same compiled arithmetic as a traced one (op-by-op evaluation of
    the quantile rounds differently in the last bit: measured).
    """
    return _sharded_normal(key, tuple(shape), sharding, np.dtype(_random.noise_dtype(dtype)))


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _sharded_normal(key: jax.Array, shape: tuple[int, ...], sharding: Any, dtype: Any):
    with jax.threefry_partitionable(True):
        words = jax.random.bits(key, (2, *shape), jnp.uint32)
    if sharding is not None:
        spec = P(None, *sharding.spec)
        words = jax.lax.with_sharding_constraint(words, NamedSharding(sharding.mesh, spec))
    return _random._normal_of_words(words[0], words[1], dtype)


def add_sharded_gaussian_noise(
    stddev: float, *, key: jax.Array, layout: MeshLayout
) -> optax.GradientTransformation:
    """Add N(0, stddev²) to every coordinate, each device drawing its own shard's noise.

    Leaf j (in ``jax.tree.leaves`` order) gets :func:`sharded_normal` of
    ``fold_in(key_t, j)``, laid out like the parameter; ``key_t`` is split from the state's
    key at every update (state :class:`~dpjax.dp_sgd.transforms.NoiseState`, as
    :func:`dpjax.add_gaussian_noise`). The released noise is bit-identical on every mesh
    shape and on one device.

    Args:
        stddev: σ·C ≥ 0.
        key: a threefry JAX key (``jax.random.key(seed)``; partitionable generation needs it).
        layout: the :class:`MeshLayout` of the parameters.

    Raises:
        TypeError: no key. ValueError: negative stddev; a key that is not threefry2x32; (at
            update) a nonzero stddev below the smallest normal number of the noise dtype.

    Formal guarantees:
        With stddev = σ·Δ₂ each update is the Gaussian mechanism (Dwork & Roth 2014,
        Theorem A.1): i.i.d. N(0, stddev²) coordinates, support ±9.155·stddev (the δ floor of
        :func:`dpjax.accounting.noise_truncation_delta`), one draw for the whole job.
    """
    _validate.non_negative("stddev", stddev)
    key = _tx._check_key(key)
    impl = _tx._key_impl(key)
    if "threefry" not in str(jax.random.key_impl(key)):
        _validate.fail("key", jax.random.key_impl(key), "a threefry2x32 key (partitionable)")
    shapes = _tx._ParamShapes()

    def init_fn(params: Any) -> _tx.NoiseState:
        shapes.record(params)
        return _tx._init_noise_state(key)

    def update_fn(updates: Any, state: _tx.NoiseState, params: Any = None):
        shapes.check(updates, params)
        refuse_concrete_nonfinite_sums(updates)
        _tx._refuse_noise_beyond_dtype(updates, stddev)
        next_key, noise_key, release = _tx._checked_next_keys(updates, state, impl)
        leaves, treedef = jax.tree.flatten(updates)
        specs = _specs_for(layout, updates)
        noisy = []
        for j, (x, spec) in enumerate(zip(leaves, specs, strict=True)):
            sharding = layout.sharding(spec)
            z = sharded_normal(
                jax.random.fold_in(noise_key, j), jnp.shape(x), sharding, _noise.float_dtype_of(x)
            )
            out = _noise.exact_sum_with_noise(x, z, stddev)
            noisy.append(jax.lax.with_sharding_constraint(out, sharding))
        count = optax.safe_increment(state.count)
        return release(jax.tree.unflatten(treedef, noisy)), _tx.NoiseState(next_key, count)

    return optax.GradientTransformation(init_fn, update_fn)
