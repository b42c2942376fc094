r"""Per-example clipping: the SUM of per-example gradients, each clipped to ℓ2 norm ≤ C.

``clipped_grad(loss_fn, l2_clip_norm=C)`` is ``jax.grad`` for DP-SGD: ``loss_fn(params, *example)``
is the loss of ONE example, and the returned function maps ``(params, *batch)`` to

.. math::  S(D) = \sum_{i \in \text{batch}} \text{clip}_C(\nabla \ell(\theta; x_i)),
   \qquad \text{clip}_C(g) = g \cdot \min(1, C / \|g\|_2),

together with a :class:`ClippingInfo` (pre-clipping norms, counters). It is a **sum**, never a
mean: divide by a public constant afterwards (:func:`dpjax.normalize_by`), never by the realised
batch size (it differs between neighbours; opacus#571).

Edge cases (per example; U is a certified upper bound of ‖g‖, see below):

==========================  ===========================================================
per-example gradient        contribution to the sum
==========================  ===========================================================
U·(1+η) ≤ C                 g unchanged
U·(1+η) > C                 g · C/(U·(1+η)) (norm ≤ C, within ≈ η + rounding of C)
‖g‖ = 0                     0
U not finite                0 and counted in ``num_nonfinite`` (``nan_safe=True``)
mask False (padding row)    exactly 0, not counted anywhere, norm reported as 0
==========================  ===========================================================

Certified clip factors. The factor applied to example i is ``min(1, C/(U_i·(1+η)))`` where
U_i bounds from above the norm of what the sum actually adds for i before scaling: the
per-example gradient as stored, and in the ghost path the exact ``Σ_t a_tᵀg_t`` plus the
rounding of its contraction over the T positions. Norms are sums of squares with a rigorous
relative error γ_n = n·u/(1 − n·u) for any summation order (long rows in two levels, see
:func:`dpjax.dp_sgd._certified.row_sq_norms`);
η covers the rounding of the factor (C/(U(1+η)) in the
wide dtype), of its cast and product in the sum dtype, and of the cast of the finished sum to a
narrower output dtype: η = 3u_wide + 3u_sum + u_out (u_out only where the output is narrower
than the sum dtype, e.g. float32 weights with float64 activations). η ≈ 2·10⁻⁷ in float32 and
≈ 10⁻¹⁵ in float64; with the γ's of the norms the factor is ≤ 0.1% below C/‖g‖ for the
benchmark models in float32 (a conservative shrink we accept for a certified bound).

Dtype rule. Norms, bounds and clip factors are computed in the wide dtype (float64 when JAX runs
with x64, else float32), never in the inputs' dtype and never chosen by itemsize; integer and
low-precision operands are converted first. The clipped sum is formed in the sum dtype (the
widest float among the operands, at least float32) with ``Precision.HIGHEST`` and cast once,
after the sum, to the parameter's dtype widened to at least float32: the sum of bfloat16/float16
parameters is returned in float32 (two neighbouring sums rounded to 8 bits separately differ by
≈ 2⁻⁹·‖S‖ more than their exact difference); add the noise, then cast (post-processing).

Non-finite rule (both paths). An example is dropped (contribution exactly 0) and counted in
``num_nonfinite`` iff its certified bound U is NaN or ±inf in the wide dtype: a NaN/inf entry
in its gradient, or ‖g‖² overflowing the wide dtype. Intermediate overflow that the exact
gradient does not have (‖a‖² = inf with ‖aᵀg‖ finite in ghost) is not "non-finite": ghost
recomputes such norms with exponent scaling. ``per_example_norms`` reports the best estimate of
the pre-clipping norm (not U).

Certified batch sum. The examples' contributions are added over the batch axis in a fixed
order (a pairwise tree in double-float arithmetic, :func:`dpjax.dp_sgd._certified.tree_sum`)
and rounded once to the output dtype; its error is at most rel·C_eff with
rel ≈ B·(u + ⌈log2 B⌉·7u²) (float32, u = 2⁻²⁴), because every contribution has norm ≤ C_eff.
Each clip norm is therefore multiplied by the public factor f = 1/(1 + 2·rel) (rel for the
rows of the released sum, B and the dtype being public): float32, one rounding, B = 256:
f = 0.99997, 4096: 0.9995, 32768: 0.996, 2²⁰: 0.89 (:meth:`ClippedGrad.summation_shrink`;
f < 1/4, B ≳ 2.5·10⁷ rows in float32, is refused). ``microbatch_size`` keeps one rounding
(the chunks' double-float sums are added before it); a sum that is added up once more
(``rows_per_release``, :func:`dpjax.data_parallel`) is certified for two (2²⁰: f = 0.80).
The ghost path contracts groups of 32 examples inside one matrix product for T = 1 layers (4
such products added in plain float per double-float merge) and
scatters embedding rows in an unknown order; it adds ≈ γ_{32 + 4} resp. γ_m per row to
rel, m the rows of one call (or of one micro-batch): float32, dense T = 1: B = 256:
f = 0.9989, 4096: 0.981, 32768: 0.856; with an embedding table and m = 256 rows per micro-batch,
B = 4096: f ≈ 0.89 (pass ``microbatch_size`` to keep m small; f < 1/4 is refused).

Formal guarantees:
    For every example, the vector that the computed sum receives from it, rounding included,
    has ℓ2 norm ≤ f·C (per-layer: ≤ f·sqrt(Σ_l c_l²)) for dense, convolution, sequence (T > 1)
    and weight-shared layers and for int, bf16, fp16, f32 and f64 inputs and parameters, and
    the released sum (a fixed-order double-float sum rounded once) is within rel·f·C of the
    exact sum of those vectors, f = 1/(1 + 2·rel). So adding or removing one example moves
    the RELEASED float sum by at most f·C·(1 + 2·rel) ≤ C (the tests allow C·(1 + 1e-6) for
    the rounding of C itself), for every batch size accepted (f ≥ 1/4): ℓ2 sensitivity C under
    add/remove-one and 2C under replace-one (triangle inequality;
    per-example clipping as in Abadi et al. 2016, "Deep Learning with
    Differential Privacy", §3.1; the rounding of the sum: Casacuberta, Shoemate, Vadhan,
    Wagaman 2022, "Widespread Underestimation of Sensitivity in Differentially Private
    Libraries and How to Fix It", CCS; pairwise and compensated summation: Higham, "Accuracy
    and Stability of Numerical Algorithms", §4). This assumes each example's gradient is
    computed the same way whatever the other rows (its per-example rounding does not depend
    on its neighbours in the batch), and neighbours that differ in one row's mask or content.
    ``grad_fn.sensitivity(relation)`` returns C or 2C; the Gaussian noise of
    :func:`dpjax.add_gaussian_noise` must be calibrated to it.

    Automatic clipping (``clip_rule="automatic"``, AUTO-S; Bu et al. 2023, "Automatic
    clipping: differentially private deep learning made easier and stronger",
    https://arxiv.org/abs/2206.07136, §4, and normalised DP-SGD, Yang et al. 2022,
    https://arxiv.org/abs/2206.13033, the same map): example i is scaled by
    f·R/D_i with D_i ≥ U_i·(1+η) + γ rounded upward, so every statement above holds with
    C = R: the computed contribution has norm ≤ f·R for any gradient (‖g‖ = 0: contribution
    0; U_i not finite: dropped), and the sensitivity is R (add/remove-one), 2R (replace-one).
    Per-layer (group-wise) clipping (He et al. 2022, "Exploring the limits of differentially
    private deep learning with group-wise clipping", https://arxiv.org/abs/2212.01539, §3):
    leaf l is scaled from the certified bound of its own part with f·c_l, so leaf l
    contributes ≤ f·c_l and the example ≤ f·sqrt(Σ_l c_l²): the sensitivity is sqrt(Σ_l c_l²).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from dpjax import _validate
from dpjax.dp_sgd import _certified, _rows
from dpjax.dp_sgd._frozen import ReadOnlyAfterInit
from dpjax.dp_sgd._microbatch import _microbatched, _pairs_to_trees
from dpjax.dp_sgd.samplers import PaddedBatch
from dpjax.relation import (
    ADD_OR_REMOVE_ONE,
    NeighbouringRelation,
    sensitivity_factor,
)

__all__ = ["ClippingInfo", "ClippedGrad", "clipped_grad", "clip_pytree"]

BACKENDS = ("auto", "vmap", "ghost")
CLIP_RULES = ("flat", "automatic")
#: γ of automatic clipping (AUTO-S) by default, Bu et al. 2023's choice.
DEFAULT_GAMMA = 0.01


class ClippingInfo(NamedTuple):
    """Auxiliary (NOT privatised) output of a clipped-gradient call.

    Attributes:
        per_example_norms: (B,) estimated pre-clipping ℓ2 norms of the per-example gradients in
            the wide dtype (0 for masked rows; non-finite where the gradient was non-finite).
        num_nonfinite: int32 scalar, real examples zeroed because their gradient was NaN/inf.
        num_clipped: int32 scalar, real finite examples whose norm exceeded the clip norm.
    """

    per_example_norms: jax.Array
    num_nonfinite: jax.Array
    num_clipped: jax.Array


# ----------------------------------------------------------------------------- tree helpers


def clip_pytree(tree: Any, l2_clip_norm: float) -> tuple[Any, jax.Array]:
    """Clip a whole pytree to global ℓ2 norm ≤ ``l2_clip_norm`` (certified, rounding included).

    Args:
        tree: a pytree of arrays (one example's gradient).
        l2_clip_norm: C > 0.

    Returns:
        ``(clipped_tree, norm)``: ``tree · min(1, C/(U·(1+η)))`` with U a certified upper bound
        of ‖tree‖ (so the returned tree, as stored in its own dtypes, has norm ≤ C), and the
        estimated pre-clip norm in the wide dtype (float32, or float64 under x64).

    Example:
        >>> import jax.numpy as jnp
        >>> clipped, norm = clip_pytree({"w": jnp.array([3.0, 4.0])}, 1.0)
        >>> float(norm), [round(float(v), 3) for v in clipped["w"]]
        (5.0, [0.6, 0.8])
    """
    _validate.positive("l2_clip_norm", l2_clip_norm)
    leaves, treedef = jax.tree.flatten(tree)
    leaves = [jnp.asarray(x) for x in leaves]
    rows = [x.reshape((1,) + x.shape) for x in leaves]
    wide = _certified.wide_dtype()
    sq, upper = _norms_and_bound(rows, wide)
    sds = [_certified.sum_dtype(x.dtype) for x in leaves]
    outs = [_out_dtype(x.dtype, sd) for x, sd in zip(leaves, sds, strict=True)]
    eta = _certified.shrink(wide, sds, outs)
    scale = _certified.certified_scale(upper, l2_clip_norm, eta)[0]
    clipped = [
        (x.astype(sd) * scale.astype(sd)).astype(o)
        for x, sd, o in zip(leaves, sds, outs, strict=True)
    ]
    return jax.tree.unflatten(treedef, clipped), jnp.sqrt(sq)[0]


def _out_dtype(dtype: Any, sum_dt: Any) -> Any:
    """A clipped leaf keeps a float dtype; integer leaves come back in the sum dtype."""
    return jnp.dtype(dtype) if jnp.issubdtype(dtype, jnp.floating) else jnp.dtype(sum_dt)


def _norms_and_bound(rows: list[jax.Array], wide: Any) -> tuple[jax.Array, jax.Array]:
    """Per-example squared-norm estimate (B,) and certified norm upper bound (B,) of row leaves."""
    parts = [_certified.row_sq_norms(x, wide) for x in rows]
    sq = sum((p[0] for p in parts[1:]), parts[0][0])
    return sq, _certified.combine_norms([p[1] for p in parts])


# ----------------------------------------------------------------------------- validation


_LOSS_CONVENTIONS = (
    "a loss in the form of the function you call: clipped_grad calls loss_fn(params, *example), "
    "one positional argument per data array given to grad_fn (loss_fn(params, x, y) for "
    "grad_fn(params, X, Y)); make_private calls loss_fn(params, example[, rng]), the example "
    "as ONE pytree (loss_fn(params, ex) reading ex['x'], ex['y'] for data={'x': X, 'y': Y})"
)


def _is_call_mismatch(err: TypeError) -> bool:
    """Whether a TypeError is Python's arity/keyword error for a call (not one from inside)."""
    text = str(err)
    return any(
        s in text
        for s in ("positional argument", "required keyword", "unexpected keyword argument")
    )


def _check_scalar_loss(loss_fn: Callable, params: Any, batch: tuple[Any, ...]) -> None:
    """loss_fn on ONE example must return a scalar (a per-batch / per-example-vector loss fails)."""

    def one_row(x: Any) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(jnp.shape(x)[1:], jnp.result_type(x))

    example = jax.tree.map(one_row, batch)
    try:
        out = jax.eval_shape(loss_fn, params, *example)
    except TypeError as err:
        if not _is_call_mismatch(err):
            raise
        _validate.fail(
            "loss_fn",
            f"a function Python cannot call that way ({err})",
            _LOSS_CONVENTIONS,
        )
    if not hasattr(out, "shape") or out.shape != ():
        _validate.fail(
            "loss_fn",
            f"a function returning {out} for one example",
            "a function of (params, *example) returning the scalar loss of ONE example "
            "(dpjax vmaps it over the batch; do not average over a batch inside it)",
        )


# ----------------------------------------------------------------------------- the vmap core


def _per_example_grads(loss_fn: Callable, params: Any, batch: tuple[Any, ...]) -> Any:
    grad = jax.grad(loss_fn)
    return jax.vmap(grad, in_axes=(None,) + (0,) * len(batch))(params, *batch)


def _zero_rows(tree: Any, keep: jax.Array) -> Any:
    """Replace rows with keep=False by exact zeros (0·NaN would be NaN, so use where)."""

    def zero(x: jax.Array) -> jax.Array:
        k = keep.reshape(keep.shape + (1,) * (x.ndim - 1))
        return jnp.where(k, x, jnp.zeros((), x.dtype))

    return jax.tree.map(zero, tree)


def _weighted_row_sum(leaves: list, weights: list, sum_dts: list) -> list:
    """Σ_i w_i g_i per leaf in the sum dtype: a double-float pair ``(hi, lo)`` per leaf.

    Each product w_i·g_i is formed per example (its rounding is part of the certified
    contribution, see η); the rows are then added by the fixed-order pairwise tree of
    :func:`dpjax.dp_sgd._certified.tree_sum`, whose error :func:`~dpjax.dp_sgd._certified.
    batch_sum_error` bounds (a ``tensordot`` has an unknown order: γ_B·Σ|x_i|, B²·u·C).
    """
    out = []
    for x, w, sd in zip(leaves, weights, sum_dts, strict=True):
        w = w.astype(sd).reshape(w.shape + (1,) * (x.ndim - 1))
        out.append(_certified.tree_sum(x.astype(sd) * w))
    return out


def _vmap_clipped_sum(
    loss_fn: Callable,
    params: Any,
    batch: tuple[Any, ...],
    *,
    l2_clip_norm: Any,
    mask: jax.Array,
    nan_safe: bool,
    release: _certified.Release,
    per_layer: bool = False,
    gamma: float | None = None,
) -> tuple[Any, jax.Array, jax.Array]:
    """Materialise per-example gradients with vmap, clip (certified), zero bad rows, sum.

    Every clip norm is multiplied by the summation shrink f of ``release`` (the rounding of
    the batch sum, :func:`dpjax.dp_sgd._certified.summation_shrink`).

    Returns:
        ``((hi, lo), per_example_norms, num_nonfinite, f)``: the clipped sum as two pytrees
        whose sum (rounded once to the output dtypes) is the released sum, and the shrink.
    """
    grads = _per_example_grads(loss_fn, params, batch)
    # one stored value: the norms and the sum must read the same gradients (XLA may recompute
    # a producer in each consumer's fusion with excess precision in bf16/fp16)
    grads = jax.lax.optimization_barrier(grads)
    wide = _certified.wide_dtype()
    leaves, treedef = jax.tree.flatten(grads)
    parts = [_certified.row_sq_norms(x, wide) for x in leaves]
    norms = jnp.sqrt(sum((p[0] for p in parts[1:]), parts[0][0]))
    upper = _certified.combine_norms([p[1] for p in parts])
    sum_dts = [_certified.sum_dtype(x.dtype) for x in leaves]
    out_dts = [_certified.output_dtype(x.dtype) for x in leaves]
    eta = _certified.shrink(wide, sum_dts, out_dts)
    f, _ = _certified.release_shrink(release, sum_dts, out_dts)
    finite = jnp.isfinite(upper)
    keep = mask & finite if nan_safe else mask
    leaves = jax.tree.leaves(_zero_rows(grads, keep))
    if per_layer:
        clip_norms = treedef.flatten_up_to(l2_clip_norm)
        scales = [
            _certified.clip_factor(_certified.sqrt_up(p[1]), f * c, eta, gamma)
            for p, c in zip(parts, clip_norms, strict=True)
        ]
    else:
        scales = [_certified.clip_factor(upper, f * l2_clip_norm, eta, gamma)] * len(leaves)
    weights = [jnp.where(keep, s, jnp.zeros((), s.dtype)) for s in scales]
    clipped_sum = _pairs_to_trees(treedef, _weighted_row_sum(leaves, weights, sum_dts))
    norms = jnp.where(mask, norms, jnp.zeros((), wide))
    num_nonfinite = jnp.sum(mask & ~finite, dtype=jnp.int32)
    return clipped_sum, norms, num_nonfinite, f


# ----------------------------------------------------------------------------- dispatch


def _ghost_module() -> Any:
    """dpjax.dp_sgd.ghost if it exists (written in parallel), else None."""
    try:
        return importlib.import_module("dpjax.dp_sgd.ghost")
    except ImportError:
        return None


def _clipped_sum_dispatch(
    backend: str,
    loss_fn: Callable,
    params: Any,
    batch: tuple[Any, ...],
    *,
    l2_clip_norm: Any,
    mask: jax.Array,
    nan_safe: bool,
    per_layer: bool,
    release: _certified.Release,
    gamma: float | None = None,
) -> tuple[Any, jax.Array, jax.Array]:
    """Choose the per-example core: "vmap", "ghost", or "auto" (ghost when it supports the loss)."""
    kwargs = dict(
        l2_clip_norm=l2_clip_norm,
        mask=mask,
        nan_safe=nan_safe,
        release=release,
        per_layer=per_layer,
        gamma=gamma,
    )
    if backend == "vmap":
        return _vmap_clipped_sum(loss_fn, params, batch, **kwargs)
    ghost = _ghost_module()
    if backend == "ghost":
        if ghost is None:
            _validate.fail(
                "backend", backend, "'vmap' or 'auto' (dpjax.dp_sgd.ghost is not available)"
            )
        return ghost.ghost_clipped_pairs(loss_fn, params, batch, **kwargs)
    if ghost is not None and ghost.supports(loss_fn, params, *batch):
        return ghost.ghost_clipped_pairs(loss_fn, params, batch, **kwargs)
    return _vmap_clipped_sum(loss_fn, params, batch, **kwargs)


# ----------------------------------------------------------------------------- public API


class ClippedGrad(ReadOnlyAfterInit):
    """A clipped-gradient function bound to the sensitivity of what it returns.

    Built by :func:`clipped_grad`; call it as ``grad_fn(params, *dataset, batch=padded)`` with
    a sampler's :class:`~dpjax.dp_sgd.samplers.PaddedBatch` (rows gathered and masked here), or
    as ``grad_fn(params, *rows, mask=None)`` on rows already gathered.

    Attributes:
        l2_clip_norm: C as given (a float, or a pytree of per-leaf norms for per-layer clipping).
        l2_norm_bound: the bound on one example's contribution (C, or sqrt(Σ c_l²) per-layer;
            R for automatic clipping).
        clip_rule: "flat" or "automatic".
        gamma: γ of automatic clipping, None for flat clipping.
    """

    _DERIVED = "noise and sensitivity were derived from it"
    _REBUILD_HINT = "build a new one with dpjax.clipped_grad(...)"

    def __init__(
        self,
        loss_fn,
        *,
        l2_clip_norm,
        per_layer,
        microbatch_size,
        backend,
        nan_safe,
        rows_per_release=None,
        clip_rule="flat",
        gamma=None,
    ):
        self.loss_fn = loss_fn
        self.clip_rule = clip_rule
        self.gamma = gamma
        self.l2_clip_norm = l2_clip_norm
        self.per_layer = per_layer
        self.microbatch_size = microbatch_size
        self.backend = backend
        self.nan_safe = nan_safe
        self.l2_norm_bound = _norm_bound(l2_clip_norm, per_layer)
        self.rows_per_release = rows_per_release
        # trace-time record of the summation shrink used per (release, signature): read by
        # the accumulating callers (make_private's micro-batches) to certify their own sum
        self._shrinks: dict = {}
        self._jitted = jax.jit(self._call_impl, static_argnums=3)
        self._freeze()

    def sensitivity(self, relation: NeighbouringRelation | str = ADD_OR_REMOVE_ONE) -> float:
        """ℓ2 sensitivity of the clipped sum: C under add/remove-one, 2C under replace-one.

        Args:
            relation: the neighbouring relation of the guarantee you will claim.

        Returns:
            The ℓ2 sensitivity (a Python float).
        """
        return sensitivity_factor(relation) * self.l2_norm_bound

    def _clip_norms_for(self, params: Any) -> Any:
        if not self.per_layer:
            return self.l2_clip_norm
        treedef = jax.tree.structure(params)
        if isinstance(self.l2_clip_norm, int | float):
            c = self.l2_clip_norm / math.sqrt(treedef.num_leaves)
            return jax.tree.unflatten(treedef, [c] * treedef.num_leaves)
        try:
            treedef.flatten_up_to(self.l2_clip_norm)
        except (ValueError, TypeError):
            _validate.fail("l2_clip_norm", self.l2_clip_norm, "a float or a pytree like params")
        return self.l2_clip_norm

    def release_for(self, call_rows: int, outer: tuple[int, int] | None = None):
        """The :class:`~dpjax.dp_sgd._certified.Release` of a call on ``call_rows`` rows.

        ``outer = (rows, parts)``: the call's rounded sum is one of ``parts`` sums added
        (double-float, fixed order) into a released sum of ``rows`` rows (data_parallel).
        """
        rows, stages, depth = call_rows, 1, _certified.tree_depth(call_rows) + 1
        m = self.microbatch_size
        if m is not None and m < call_rows:
            depth += -(-call_rows // m)
        if self.rows_per_release is not None:
            rows, stages = max(rows, self.rows_per_release), 2
            depth += -(-self.rows_per_release // call_rows)
        if outer is not None:
            rows, stages = max(rows, outer[0]), 2
            depth += _certified.tree_depth(outer[1]) + 1
        return _certified.Release(rows, stages, depth + 2, self.l2_norm_bound)

    def summation_shrink(self, batch_rows: int, dtype: Any = "float32") -> float:
        """The factor f by which C is multiplied for a ``batch_rows``-row call (vmap path).

        f = 1/(1 + 2·rel), rel the certified rounding bound of the released sum in units of
        C·f (:func:`dpjax.dp_sgd._certified.batch_sum_error`): adding or removing one example
        then moves the released sum by ≤ C. The ghost path multiplies rel by a little more
        where it contracts a few examples inside a matrix product (see
        :mod:`dpjax.dp_sgd.ghost`). float32, C = 1, as built (``rows_per_release``,
        ``microbatch_size``): B = 256: 0.99997; 4096: 0.9995; 32768: 0.996; 2²⁰: 0.89.

        Args:
            batch_rows: rows of the call (padding included).
            dtype: the dtype of the sums (float32 unless the model computes in float64).

        Returns:
            The factor f in (1/4, 1].
        """
        rows = _validate.positive_int("batch_rows", batch_rows)
        dt = jnp.dtype(dtype)
        return _certified.release_shrink(self.release_for(rows), [dt], [dt])[0]

    def recorded_shrink(self, release: _certified.Release) -> float:
        """The shrink f the last traced call with ``release`` used (KeyError if none)."""
        return self._shrinks[release]

    def _core(self, clip_norms: Any, release: _certified.Release) -> Callable:
        def core(p, batch, mask):
            *out, f = _clipped_sum_dispatch(
                self.backend,
                self.loss_fn,
                p,
                batch,
                l2_clip_norm=clip_norms,
                mask=mask,
                nan_safe=self.nan_safe,
                per_layer=self.per_layer,
                release=release,
                gamma=self.gamma,
            )
            self._shrinks[release] = f
            return tuple(out)

        return core

    def __call__(
        self, params: Any, *data: Any, mask: Any = None, batch: PaddedBatch | None = None
    ) -> tuple[Any, ClippingInfo]:
        """Clipped per-example gradient sum (rows with mask False excluded).

        Two ways to call it:

        * ``grad_fn(params, x, y, batch=padded)`` (the DP-SGD path): ``x, y`` are the WHOLE data
          set (leading axis n) and ``padded`` a :class:`~dpjax.dp_sgd.samplers.PaddedBatch`
          from a sampler; the rows at ``padded.indices`` are gathered here and
          ``padded.mask`` applied, so padding slots (which hold index 0) count nothing.
        * ``grad_fn(params, x_b, y_b, mask=None)``: the rows of one batch, all real unless
          ``mask`` says otherwise (full-batch DP-GD, or rows you gathered yourself).

        A batch of zero rows returns a zero sum (same structure as ``params``).

        Raises:
            ValueError: ``batch`` together with ``mask`` (the batch carries its mask), a
                PaddedBatch passed as a data argument, or a real index outside the data.
        """
        return self.call_in_release(params, *data, mask=mask, batch=batch)

    def call_in_release(
        self,
        params: Any,
        *data: Any,
        mask: Any = None,
        batch: PaddedBatch | None = None,
        outer: tuple[int, int] | None = None,
    ) -> tuple[Any, ClippingInfo]:
        """``__call__`` for a call whose rounded sum is one of ``outer = (rows, parts)``.

        The clip norm is shrunk for the whole released sum of ``rows`` rows (two roundings);
        :func:`dpjax.data_parallel` calls it on every device with the global batch.
        """
        if batch is not None:
            if mask is not None:
                _validate.fail("mask", "given together with batch", "None when batch is passed")
            data, mask = _rows.gather_batch(batch, data)
        batch_size = _rows.batch_size(data)
        mask = _rows.check_mask(mask, batch_size)
        if batch_size == 0:
            zeros = jax.tree.map(_zeros_sum, params)
            norms = jnp.zeros((0,), _certified.wide_dtype())
            zero = jnp.zeros((), jnp.int32)
            return zeros, ClippingInfo(norms, zero, zero)
        _check_scalar_loss(self.loss_fn, params, data)
        return self._jitted(params, data, mask, self.release_for(batch_size, outer))

    def _call_impl(
        self, params: Any, batch: tuple, mask: jax.Array, release: _certified.Release
    ) -> tuple[Any, ClippingInfo]:
        """The traced body of ``__call__`` (jitted once per instance: eager calls reuse it)."""
        batch_size = mask.shape[0]
        core = self._core(self._clip_norms_for(params), release)
        if self.microbatch_size is None or self.microbatch_size >= batch_size:
            (hi, lo), norms, bad = core(params, batch, mask)
        else:
            (hi, lo), norms, bad = _microbatched(core, params, batch, mask, self.microbatch_size)
        clipped_sum = jax.tree.map(
            lambda h, lo_, p: _certified.df_round(
                (h, lo_), _certified.output_dtype(jnp.result_type(p))
            ),
            hi,
            lo,
            params,
        )
        return clipped_sum, ClippingInfo(norms, bad, self._num_clipped(norms, mask))

    def _num_clipped(self, norms: jax.Array, mask: jax.Array) -> jax.Array:
        if self.gamma is not None:  # automatic clipping rescales every real finite example
            return jnp.sum(mask & jnp.isfinite(norms), dtype=jnp.int32)
        # per-layer: counts examples whose global norm exceeds the total bound (an indicator only)
        over = jnp.isfinite(norms) & (norms > jnp.asarray(self.l2_norm_bound, norms.dtype))
        return jnp.sum(mask & over, dtype=jnp.int32)

    def __repr__(self) -> str:
        return (
            f"ClippedGrad(l2_clip_norm={self.l2_clip_norm!r}, per_layer={self.per_layer}, "
            f"microbatch_size={self.microbatch_size}, backend={self.backend!r}, "
            f"rows_per_release={self.rows_per_release}, clip_rule={self.clip_rule!r}, "
            f"gamma={self.gamma})"
        )


def _zeros_sum(p: Any) -> jax.Array:
    """The clipped sum of an empty batch for parameter ``p``."""
    return jnp.zeros(jnp.shape(p), _certified.output_dtype(jnp.result_type(p)))


#: The smallest clip norm ``clipped_grad`` accepts, 2⁻⁴⁰ ≈ 9.1e-13. The certified norm bounds
#: are products of sums of squares in a float dtype ≥ float32; below its smallest normal number
#: (2⁻¹²⁶) XLA:CPU flushes a product to 0, and a bound of 0 leaves an example unclipped. Such
#: an example's norm is < 2⁻⁶³·√(number of flushed terms) (review finding: 5.4·C at C = 1e-20),
#: far below 2⁻⁴⁰ for any layer count and sequence length a computer holds.
MIN_CLIP_NORM = 2.0**-40


def _check_clip_norm(name: str, value: Any) -> None:
    _validate.positive(name, value)
    if float(value) < MIN_CLIP_NORM:
        _validate.fail(
            name,
            value,
            f"≥ 2^-40 ≈ {MIN_CLIP_NORM:.2g} (a smaller clip norm underflows the certified "
            "per-example norm bounds in float32: an example could be summed unclipped); "
            "rescale the loss instead (clip at C·s the loss × s, then divide the sum by s)",
        )


def _norm_bound(l2_clip_norm: Any, per_layer: bool) -> float:
    if isinstance(l2_clip_norm, int | float) and not isinstance(l2_clip_norm, bool):
        _check_clip_norm("l2_clip_norm", l2_clip_norm)
        return float(l2_clip_norm)
    if not per_layer:
        valid = "a positive float (a pytree needs per_layer=True)"
        _validate.fail("l2_clip_norm", l2_clip_norm, valid)
    leaves = jax.tree.leaves(l2_clip_norm)
    if not leaves:
        _validate.fail("l2_clip_norm", l2_clip_norm, "a non-empty pytree of positive floats")
    for c in leaves:
        _check_clip_norm("l2_clip_norm leaf", c)
    return math.sqrt(sum(float(c) ** 2 for c in leaves))


def clipped_grad(
    loss_fn: Callable[..., jax.Array],
    *,
    l2_clip_norm: float | Any = None,
    per_layer: bool = False,
    microbatch_size: int | None = None,
    backend: str = "auto",
    nan_safe: bool = True,
    rows_per_release: int | None = None,
    clip_rule: str = "flat",
    gamma: float = DEFAULT_GAMMA,
) -> ClippedGrad:
    r"""Per-example clipped gradient SUM of ``loss_fn`` (like ``jax.grad``, for DP-SGD).

    .. math::  S = \sum_i m_i \, g_i \min(1, C/\|g_i\|_2), \quad g_i = \nabla_\theta
       \ell(\theta; x_i), \ m_i \in \{0, 1\} \text{ the mask}.

    With ``clip_rule="automatic"`` (automatic clipping, AUTO-S) every example is rescaled
    instead: :math:`S = \sum_i m_i \, R \, g_i / (\|g_i\|_2 + γ)`, each term of norm < R
    (R = ``l2_clip_norm``, default 1). This is also normalised DP-SGD (DP-NSGD: Yang et al.
    2022, "Normalized/clipped SGD with perturbation for differentially private non-convex
    optimization", https://arxiv.org/abs/2206.13033, per-example g/(‖g‖ + r) with r = γ):
    the same map, R = 1. R multiplies the released sum and its noise σ·R alike, so for
    plain SGD a change of R is a change of the learning rate by the same factor (Bu et al.
    2023, Theorem 1), and adaptive optimizers such as Adam are unaffected by it (Theorem 2):
    keep R = 1 and tune the learning rate. Small γ weights examples with small gradients
    (near the optimum) like large ones; γ = 0.01 is the paper's default.

    Args:
        loss_fn: ``loss_fn(params, *example) -> scalar``, the loss of ONE example (no batch axis).
        l2_clip_norm: C ≥ 2⁻⁴⁰ (:data:`MIN_CLIP_NORM`). With ``per_layer=True``: a float C
            (each of the L leaves is clipped to C/sqrt(L), so one example's total norm is
            ≤ C) or a pytree like params of per-leaf norms c_l (total bound sqrt(Σ c_l²)).
        per_layer: clip each leaf separately instead of the whole pytree (He et al. 2022,
            group-wise clipping; vmap, or ghost where it supports the loss).
        microbatch_size: process the batch in chunks of this many rows (``lax.scan``) to bound
            memory; the result is the same sum. ``None``: one chunk.
        backend: the per-example engine: "vmap" (materialise per-example grads), "ghost"
            (``dpjax.dp_sgd.ghost``: norms without per-example grads, for supported dense
            models), "auto" (ghost if it supports the loss, else vmap).
        nan_safe: zero (and count) examples whose certified norm bound is NaN/inf (a NaN/inf
            gradient entry, or a squared norm overflowing the wide dtype); never release them.
        rows_per_release: the PUBLIC number of rows (padding included) whose clipped sums are
            added into ONE released sum when you add several calls' results yourself
            (:func:`dpjax.accumulate_clipped_sums` over k calls of B rows: k·B). The clip
            norm is then shrunk for that many rows and two roundings. ``None``: each call's
            result is released as it is (``make_private`` and ``data_parallel`` handle their
            own accumulation).
        clip_rule: "flat" (clip to ≤ C, Abadi et al. 2016) or "automatic" (AUTO-S,
            Bu et al. 2023: every example scaled by R/(‖g‖ + γ); not with ``per_layer``).
            ``l2_clip_norm`` is then R (None: 1.0), the sensitivity of the sum.
        gamma: γ > 0 (finite), the stability constant of automatic clipping (default 0.01;
            ignored by flat clipping).

    Returns:
        A :class:`ClippedGrad` ``grad_fn`` returning ``(clipped_sum, ClippingInfo)``. With a
        sampler: ``grad_fn(params, *dataset, batch=padded)`` gathers the rows of the
        :class:`~dpjax.dp_sgd.samplers.PaddedBatch` ``padded`` from the whole data set and
        applies its mask (padding slots count nothing). On rows already in hand:
        ``grad_fn(params, *rows, mask=None)``, every argument having leading axis B and
        ``mask`` an optional bool (B,) marking real rows. A batch of B = 0 rows gives a zero
        sum. ``grad_fn.sensitivity(relation)`` is the ℓ2 sensitivity of ``clipped_sum``; give
        ``grad_fn`` itself to :func:`dpjax.dp_sgd_optimizer` so C is stated once.

    Raises:
        ValueError: C (or a per-leaf norm) below 2⁻⁴⁰ or not finite, a missing C with flat
            clipping, an unknown ``clip_rule``, ``gamma`` ≤ 0 or not finite (automatic),
            ``per_layer`` with automatic clipping, unknown backend, batch arguments
            without a shared leading axis, a loss that is not a scalar for one example, a
            mask of the wrong shape, a loss Python cannot call as
            ``loss_fn(params, *example)`` (the message names :func:`dpjax.make_private`'s
            other form, ``loss_fn(params, example[, rng])``).

    Formal guarantees:
        One example changes the released float ``clipped_sum`` by at most C in ℓ2
        (add/remove-one; 2C replace-one), whatever its data, including NaN-producing data
        (zeroed when ``nan_safe``), with the clip factor taken from a certified upper bound of
        its norm (rounding included) and C multiplied by the summation shrink f of the batch
        (the rounding of the batch sum, other rows included; Casacuberta et al. 2022, CCS).
        Padding rows (mask False) contribute exactly 0. See the module docstring (per-example
        clipping: Abadi et al. 2016, §3.1).
        Automatic clipping: example i contributes g_i·R·f/D_i with D_i ≥ U_i·(1+η) + γ
        rounded upward (:func:`dpjax.dp_sgd._certified.automatic_scale`), U_i the certified
        bound of ‖g_i‖, so its computed contribution has norm ≤ f·R (also for ‖g_i‖ = 0,
        subnormal or overflowing norms; a non-finite U_i drops the example): the released
        sum has ℓ2 sensitivity R under add/remove-one and 2R under replace-one, and the
        accountant of DP-SGD applies unchanged with noise σ·R (Bu et al. 2023, "Automatic
        clipping: differentially private deep learning made easier and stronger",
        https://arxiv.org/abs/2206.07136, §4: AUTO-S is as private as clipping at R). Per-layer:
        leaf l's part of each example is clipped to f·c_l from its own certified bound, so the
        example's contribution has norm ≤ f·sqrt(Σ_l c_l²) and the sensitivity is
        sqrt(Σ_l c_l²) (He et al. 2022, "Exploring the limits of differentially private deep
        learning with group-wise clipping", https://arxiv.org/abs/2212.01539, §3).

    Example:
        >>> import jax.numpy as jnp
        >>> loss = lambda w, x, y: 0.5 * (jnp.dot(w, x) - y) ** 2
        >>> grad_fn = clipped_grad(loss, l2_clip_norm=1.0)
        >>> s, info = grad_fn(jnp.zeros(2), jnp.array([[3.0, 4.0], [0.1, 0.0]]), jnp.ones(2))
        >>> [round(float(v), 3) for v in s], int(info.num_clipped), grad_fn.sensitivity()
        ([-0.7, -0.8], 1, 1.0)
        >>> from dpjax.dp_sgd.samplers import PaddedBatch
        >>> padded = PaddedBatch(jnp.array([1, 0, 0]), jnp.array([True, False, False]))
        >>> x, y = jnp.array([[3.0, 4.0], [0.1, 0.0]]), jnp.ones(2)
        >>> s, info = grad_fn(jnp.zeros(2), x, y, batch=padded)  # row 1 only; slots 1, 2 padding
        >>> [round(float(v), 3) for v in s]
        [-0.1, 0.0]
    """
    _validate.one_of("backend", backend, BACKENDS)
    _validate.one_of("clip_rule", clip_rule, CLIP_RULES)
    gamma_used = None
    if clip_rule == "automatic":
        gamma_used = _validate.positive("gamma", gamma)
        if per_layer:
            _validate.fail("per_layer", per_layer, "False with clip_rule='automatic'")
        l2_clip_norm = 1.0 if l2_clip_norm is None else l2_clip_norm
    elif l2_clip_norm is None:
        _validate.fail("l2_clip_norm", l2_clip_norm, "a positive float C (flat clipping)")
    if microbatch_size is not None:
        microbatch_size = _validate.positive_int("microbatch_size", microbatch_size)
    if rows_per_release is not None:
        rows_per_release = _validate.positive_int("rows_per_release", rows_per_release)
    if not callable(loss_fn):
        _validate.fail("loss_fn", loss_fn, "a callable loss_fn(params, *example) -> scalar")
    return ClippedGrad(
        loss_fn,
        l2_clip_norm=l2_clip_norm,
        per_layer=bool(per_layer),
        microbatch_size=microbatch_size,
        backend=backend,
        nan_safe=bool(nan_safe),
        rows_per_release=rows_per_release,
        clip_rule=clip_rule,
        gamma=gamma_used,
    )
