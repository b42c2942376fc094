r"""DP optimisers built from the transforms: DP-SGD, gradient accumulation, Laplace DP-SGD.

The one place where σ, C and the normaliser meet is :func:`dp_sgd_optimizer`:

.. math::  \theta_{t+1} = \theta_t - \text{opt}\Big(\frac{1}{\bar B}\Big[\sum_{i \in B_t}
   \text{clip}_C(g_i) + N(0, \sigma^2 C^2 I)\Big]\Big)

with :math:`\bar B` a PUBLIC constant (the expected batch size q·n). σ and C are each stated
once. A training step is::

    sampler = dpjax.PoissonSampler(dataset_size=n, sampling_rate=q)
    grad_fn = dpjax.clipped_grad(loss_fn, l2_clip_norm=C)
    tx = dpjax.dp_sgd_optimizer(optimizer=optax.adam(1e-3), clipped_grad=grad_fn,
                                noise_multiplier=σ, normalizer=sampler.expected_batch_size,
                                key=jax.random.key(0))
    padded = sampler.sample(batch_key)
    clipped_sum, info = grad_fn(params, x, y, batch=padded)   # gathers rows, applies the mask
    updates, opt_state = tx.update(clipped_sum, opt_state, params)
    params = optax.apply_updates(params, updates)

and the privacy is accounted from :func:`event_for` ``(tx, sampler=sampler, state=opt_state)``
(σ read from ``tx``, T from the state's noise count). ``optax.MultiSteps`` around these
optimizers is refused: use :func:`accumulate_clipped_sums`.
"""

from __future__ import annotations

import math
import sys
import warnings
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dpjax import _noise, _validate
from dpjax._warnings import PrivacyLeakWarning
from dpjax.dp_sgd import _certified
from dpjax.dp_sgd._finite_sums import refuse_concrete_nonfinite_sums, refusing_nonfinite_sums
from dpjax.dp_sgd.transforms import (
    NoiseState,
    PublicNoiseState,
    add_gaussian_noise,
    add_laplace_dp_sgd_noise,
    laplace_dp_sgd_theta,
    laplace_dpsgd_step_size,
    normalize_by,
)
from dpjax.events import LaplaceDPSGDEvent, PrivacyEvent
from dpjax.relation import REPLACE_ONE, NeighbouringRelation

__all__ = [
    "DPSGDTransformation",
    "dp_sgd_optimizer",
    "event_for",
    "noise_releases",
    "AccumulationState",
    "accumulate_clipped_sums",
    "laplace_dp_sgd_optimizer",
    "laplace_dp_sgd_event",
]


class DPSGDTransformation(optax.GradientTransformation):
    """An ``optax.GradientTransformation`` that states the σ and C its noise was drawn with.

    Returned by :func:`dp_sgd_optimizer` and :func:`accumulate_clipped_sums`; use it wherever
    optax expects a transformation. :func:`event_for` reads ``noise_multiplier`` from it, so
    the accountant is told the σ the noise actually has.

    Attributes:
        noise_multiplier: σ, noise std in units of ``l2_clip_norm``.
        l2_clip_norm: C, the bound on one example's contribution (add/remove-one sensitivity).
        normalizer: the public constant the noisy sum is divided by.
    """

    noise_multiplier: float
    l2_clip_norm: float
    normalizer: float

    def __setattr__(self, name: str, value: Any) -> None:
        # read-only: σ, C and the normaliser were baked into the noise at construction, so a
        # new value here would change only what event_for tells the accountant
        raise AttributeError(
            f"{name} of a DP-SGD optimizer is read-only (the noise was built with the stated "
            "value): build a new one with dp_sgd_optimizer(...)"
        )


def _stating(tx: optax.GradientTransformation, like: Any = None, **fields: float):
    """``tx`` as a :class:`DPSGDTransformation` with the fields of ``like`` or ``fields``."""
    out = DPSGDTransformation(tx.init, tx.update)
    if like is not None:
        fields = {k: getattr(like, k) for k in ("noise_multiplier", "l2_clip_norm", "normalizer")}
    for name, value in fields.items():
        object.__setattr__(out, name, value)
    return out


def _inside_multisteps() -> bool:
    """Whether a caller up the Python stack is an ``optax.MultiSteps`` method (init or update).

    ``optax.MultiSteps`` calls the inner ``init``/``update`` from its own methods, directly or
    through a traced ``lax.cond`` branch, so one of its frames is on the stack at trace time.
    Frames are recognised by code name and module (no access to their locals).
    """
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_qualname
        if name.startswith("MultiSteps.") and frame.f_globals.get("__name__", "").startswith(
            "optax"
        ):
            return True
        frame = frame.f_back
    return False


def _refuse_multisteps() -> None:
    if _inside_multisteps():
        _validate.fail(
            "optimizer",
            "a DP-SGD optimizer wrapped in optax.MultiSteps",
            "accumulated with dpjax.accumulate_clipped_sums(tx, every_k=k) instead (MultiSteps "
            "averages the k clipped sums, so the normaliser is off by k, and runs the noise "
            "transform on every micro-batch)",
        )


def _has_masked_node(tree: Any) -> bool:
    """Whether ``tree`` holds an ``optax.MaskedNode`` (the placeholder ``optax.masked`` and
    ``optax.multi_transform`` put where the wrapped transformation does not see a leaf)."""
    is_masked = lambda x: isinstance(x, optax.MaskedNode)  # noqa: E731
    return any(is_masked(leaf) for leaf in jax.tree.leaves(tree, is_leaf=is_masked))


def _refuse_masking(*trees: Any) -> None:
    if any(_has_masked_node(t) for t in trees):
        _validate.fail(
            "optimizer",
            "a DP-SGD optimizer wrapped in optax.masked or optax.multi_transform",
            "applied to the WHOLE clipped sum (the leaves it does not see would be updated "
            "with the clipped sum WITHOUT noise): put the per-leaf choice inside it, "
            "dp_sgd_optimizer(optimizer=optax.multi_transform(...), ...), where it is "
            "post-processing of the noisy sum",
        )


def _refusing_multisteps(tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """``tx`` whose init and update raise when called from inside ``optax.MultiSteps``, or on
    a tree masked by ``optax.masked`` / ``optax.multi_transform`` (a noise-free bypass)."""

    def init_fn(params: Any) -> Any:
        _refuse_multisteps()
        _refuse_masking(params)
        return tx.init(params)

    def update_fn(updates: Any, state: Any, params: Any = None) -> Any:
        _refuse_multisteps()
        _refuse_masking(updates, params)
        return tx.update(updates, state, params)

    return optax.GradientTransformation(init_fn, update_fn)


def _clip_norm_of(clipped_grad: Any, l2_clip_norm: float | None) -> float:
    """C stated once: from the clipped-gradient function, or given; both must agree exactly."""
    if clipped_grad is None:
        if l2_clip_norm is None:
            _validate.fail(
                "clipped_grad", None, "the function from dpjax.clipped_grad (or give l2_clip_norm)"
            )
        return float(_validate.positive("l2_clip_norm", l2_clip_norm))
    bound = getattr(clipped_grad, "l2_norm_bound", None)
    if not isinstance(bound, float) or not callable(getattr(clipped_grad, "sensitivity", None)):
        _validate.fail("clipped_grad", clipped_grad, "a function built by dpjax.clipped_grad")
    if getattr(clipped_grad, "nan_safe", True) is False:
        _validate.fail(
            "nan_safe",
            False,
            "True in the clipped_grad given to a DP optimizer: with nan_safe=False one example "
            "with a NaN/inf gradient makes the noisy sum NaN, which reveals that the example "
            "was in the batch with certainty while the run is accounted as usual "
            "(nan_safe=False is for inspecting clipped sums, never for releasing them)",
        )
    if l2_clip_norm is not None and float(l2_clip_norm) != bound:
        _validate.fail(
            "l2_clip_norm",
            l2_clip_norm,
            f"the clip norm of clipped_grad ({bound!r}) or omitted: the noise is σ times the "
            "bound on one example's contribution, which clipped_grad fixes",
        )
    return bound


def dp_sgd_optimizer(
    *,
    optimizer: optax.GradientTransformation,
    noise_multiplier: float,
    normalizer: float,
    key: jax.Array,
    clipped_grad: Any = None,
    l2_clip_norm: float | None = None,
) -> DPSGDTransformation:
    r"""DP-SGD (or DP-Adam, …): Gaussian noise on the clipped sum, public normalisation, optimizer.

    ``chain(add_gaussian_noise(σ·C), normalize_by(normalizer), optimizer)`` with C read from
    ``clipped_grad`` (the function whose clipped SUM you feed it): σ and C are stated once, and
    :func:`event_for` builds the privacy event from the same σ.

    Args:
        optimizer: any optax optimizer (``optax.sgd``, ``optax.adam``, …); post-processing.
        noise_multiplier: σ ≥ 0, noise std in units of C (σ = 0: non-private, for debugging).
        normalizer: a PUBLIC positive constant, typically the expected batch size q·n.
        key: a JAX PRNG key (required; stored in the noise state and split every step).
        clipped_grad: the function from :func:`dpjax.clipped_grad` (or
            :func:`dpjax.data_parallel`) that produces the sums; C is its ``l2_norm_bound``.
        l2_clip_norm: only for clipped sums not built by dpjax (then ``clipped_grad`` is
            omitted and you own the wire). Given together with ``clipped_grad``, it must equal
            that function's C exactly. Own sums must be finite: a NaN/inf coordinate is
            refused before any noise is drawn (see Raises), since no map of a summed value
            restores the sensitivity that a per-example map (``clipped_grad``'s
            ``nan_safe``) keeps. Under ``jit`` that check is one host callback per step
            (``clipped_grad`` sums, finite by construction, have none).

    Returns:
        A :class:`DPSGDTransformation` (an ``optax.GradientTransformation`` stating σ, C and the
        normaliser). Wrapping it in ``optax.MultiSteps`` raises at ``init``: accumulate with
        :func:`accumulate_clipped_sums`. Wrapping it in ``optax.masked`` or
        ``optax.multi_transform`` raises too (the leaves it would not see get the clipped sum
        with no noise): pass ``optimizer=optax.multi_transform(...)`` instead.

    Raises:
        ValueError: negative σ, non-positive normaliser, neither ``clipped_grad`` nor
            ``l2_clip_norm``, an ``l2_clip_norm`` different from ``clipped_grad``'s, a
            ``clipped_grad`` built with ``nan_safe=False`` (named ``nan_safe``), or (at
            init/update) a wrapping ``optax.MultiSteps``, ``optax.masked`` or
            ``optax.multi_transform``; at update, a tree or shapes other than ``params``'
            (with ``params`` omitted: other than those given to ``init`` in this process; and
            omitted with no ``init``: refused) — per-example gradients are never noised; with
            own sums (``l2_clip_norm`` without ``clipped_grad``), a sum with a NaN/inf entry
            (named ``updates``): eagerly before the noise; under ``jit`` a host callback
            raises it and JAX fails the step (as this ValueError or a ``JaxRuntimeError``
            carrying it), so no update is released. Do not continue a run from that state.

    Formal guarantees:
        One update is the Gaussian mechanism with noise multiplier σ = stddev/C on a sum of
        ℓ2 sensitivity C (add/remove-one; 2C replace-one — the accountant doubles it, see
        :mod:`dpjax.events`). With Poisson sampling at rate q for T steps the run is
        accounted by ``PoissonSampledGaussianEvent(σ, q, T)`` (Abadi et al. 2016,
        DP-SGD with amplification by subsampling), which
        :func:`event_for` returns. The normaliser and the optimizer are post-processing.

    Example:
        >>> import jax, jax.numpy as jnp, optax, dpjax
        >>> grad_fn = dpjax.clipped_grad(lambda w, x: jnp.dot(w, x), l2_clip_norm=1.0)
        >>> tx = dp_sgd_optimizer(optimizer=optax.sgd(0.1), clipped_grad=grad_fn,
        ...     noise_multiplier=1.0, normalizer=32.0, key=jax.random.key(0))
        >>> params = jnp.zeros(3)
        >>> clipped_sum, _ = grad_fn(params, jnp.ones((4, 3)))
        >>> updates, state = tx.update(clipped_sum, tx.init(params), params)
        >>> updates.shape, tx.l2_clip_norm
        ((3,), 1.0)
    """
    if _validate.non_negative("noise_multiplier", noise_multiplier) == 0.0:
        warnings.warn(
            "dp_sgd_optimizer: noise_multiplier=0 is NOT PRIVATE (clip-only baseline: the "
            "clipped sums are released without noise; ε = inf, event_for refuses it)",
            PrivacyLeakWarning,
            stacklevel=2,
        )
    _validate.positive("normalizer", normalizer)
    clip = _clip_norm_of(clipped_grad, l2_clip_norm)
    if not isinstance(optimizer, optax.GradientTransformation):
        _validate.fail("optimizer", optimizer, "an optax.GradientTransformation")
    noise = add_gaussian_noise(noise_multiplier * clip, key=key)
    if clipped_grad is None:  # own sums: nothing guarantees that they are finite
        noise = refusing_nonfinite_sums(noise)
    chain = optax.chain(
        noise,
        normalize_by(normalizer),
        optimizer,
    )
    return _stating(
        _refusing_multisteps(chain),
        noise_multiplier=float(noise_multiplier),
        l2_clip_norm=clip,
        normalizer=float(normalizer),
    )


def noise_releases(state: Any) -> int:
    """How many noisy sums the optimizer whose state is ``state`` has released (host-side).

    Reads the count of the one Gaussian :class:`~dpjax.dp_sgd.transforms.NoiseState` in the
    state (or its published form, :class:`~dpjax.dp_sgd.transforms.PublicNoiseState`, from
    :func:`~dpjax.dp_sgd.public_opt_state`): with :func:`accumulate_clipped_sums` that is the
    number of logical batches, never the number of micro-batches.

    Raises:
        ValueError: the state holds no noise state, or more than one.
    """
    kinds = (NoiseState, PublicNoiseState)
    is_noise = lambda x: isinstance(x, kinds)  # noqa: E731
    found = [s for s in jax.tree.leaves(state, is_leaf=is_noise) if is_noise(s)]
    if len(found) != 1:
        _validate.fail("state", f"{len(found)} noise states", "the state of one DP-SGD optimizer")
    return int(found[0].count)


def event_for(
    optimizer: DPSGDTransformation,
    *,
    sampler: Any,
    steps: int | None = None,
    state: Any = None,
    relation: NeighbouringRelation | str | None = None,
) -> PrivacyEvent:
    """The privacy event of a DP-SGD run: σ from the optimizer, the rate from the sampler.

    σ is stated once (to :func:`dp_sgd_optimizer`) and read back here, so the accountant cannot
    be told another σ; the number of releases can be read from the optimizer state.

    Args:
        optimizer: from :func:`dp_sgd_optimizer` (or :func:`accumulate_clipped_sums` of it).
        sampler: the sampler whose batches the clipped sums were computed on (a
            :class:`~dpjax.dp_sgd.samplers.PoissonSampler`, ``UniformBatchSampler`` or
            ``ShuffledBatchSampler``): it supplies the sampling rate / batch size.
        steps: T, the number of noisy releases; or
        state: the optimizer state, whose noise count is T (:func:`noise_releases`). Exactly
            one of ``steps`` and ``state``.
        relation: the neighbouring relation; default: the sampler's (add/remove-one for
            Poisson, replace-one for fixed-size batches).

    Returns:
        ``sampler.event(noise_multiplier=optimizer.noise_multiplier, steps=T, ...)``. For a
        :class:`~dpjax.dp_sgd.PoissonSampler` the event carries its cap
        (``dataset_size``, ``max_batch_size``), and every accountant of
        :mod:`dpjax.accounting` adds the truncation slack (1 + e^ε)·T·p̄ to δ: the (ε, δ) is
        the one ``make_private`` reports for the same run.

    Raises:
        ValueError: an optimizer not built by :func:`dp_sgd_optimizer`, both or neither of
            ``steps``/``state``, a state with no release yet, or σ = 0 (not private: no
            event; ε = inf).

    Formal guarantees:
        The event describes exactly the noise the optimizer adds (σ·C on a sum of add/remove-one
        sensitivity C) composed over T releases under the sampler's subsampling (Abadi et al.
        2016, amplification by subsampling), including the padded
        sampler's truncation, paid by the coupling slack of
        :func:`dpjax.accounting.tight.truncation_slack`.

    Example:
        >>> import jax, jax.numpy as jnp, optax, dpjax
        >>> sampler = dpjax.PoissonSampler(dataset_size=100, sampling_rate=0.1)
        >>> grad_fn = dpjax.clipped_grad(lambda w, x: jnp.dot(w, x), l2_clip_norm=1.0)
        >>> tx = dpjax.dp_sgd_optimizer(optimizer=optax.sgd(0.1), clipped_grad=grad_fn,
        ...     noise_multiplier=1.1, normalizer=sampler.expected_batch_size,
        ...     key=jax.random.key(0))
        >>> event_for(tx, sampler=sampler, steps=50).noise_multiplier
        1.1
    """
    if not isinstance(optimizer, DPSGDTransformation):
        _validate.fail("optimizer", optimizer, "a transformation built by dpjax.dp_sgd_optimizer")
    if (steps is None) == (state is None):
        _validate.fail("steps", steps, "given, or state given instead (exactly one of them)")
    if state is not None:
        steps = noise_releases(state)
        if steps == 0:
            _validate.fail("state", "a state with 0 releases", "a state after ≥ 1 update")
    _warn_if_normalizer_is_not_the_batch(optimizer, sampler)
    kwargs = {} if relation is None else {"relation": relation}
    return sampler.event(noise_multiplier=optimizer.noise_multiplier, steps=steps, **kwargs)


def _warn_if_normalizer_is_not_the_batch(optimizer: DPSGDTransformation, sampler: Any) -> None:
    """Warn when the normaliser is not the sampler's expected batch: the usual sign of k
    independent micro-batch draws accumulated into one release, which the sampler's event
    (rate of ONE draw, T/k releases) under-states — split one logical batch instead."""
    expected = getattr(sampler, "expected_batch_size", None)
    if expected is None or math.isclose(optimizer.normalizer, expected, rel_tol=1e-9):
        return
    warnings.warn(
        f"event_for: the optimizer divides by normalizer={optimizer.normalizer!r}, but the "
        f"sampler's expected batch is {expected!r}. If each release accumulates several "
        "independent draws of this sampler, its event under-states ε: draw ONE logical batch "
        "and split it with batch.micro_batches(m) (or pass the logical batch's sampler).",
        UserWarning,
        stacklevel=3,
    )


class AccumulationState(NamedTuple):
    """State of :func:`accumulate_clipped_sums`.

    Attributes:
        micro_step: int32 in [0, every_k): micro-batches accumulated so far in this logical batch.
        clipped_sum: running sum of the clipped sums of this logical batch (high part).
        inner_state: state of the private optimizer (noise key, optimizer moments).
        clipped_sum_low: the low part of the running sum (double-float: ``clipped_sum +
            clipped_sum_low`` carries it to ≈ u², rounded once when released).
    """

    micro_step: jax.Array
    clipped_sum: Any
    inner_state: Any
    clipped_sum_low: Any = None


def accumulate_clipped_sums(
    private_optimizer: optax.GradientTransformation, *, every_k: int
) -> optax.GradientTransformation:
    r"""Gradient accumulation for DP: sum clipped sums of k micro-batches, noise ONCE, then step.

    The wrapped ``private_optimizer`` (e.g. :func:`dp_sgd_optimizer`) sees only the total
    :math:`\sum_{m=1}^{k} S_m` of a logical batch, so its noise is drawn once per logical batch
    (not per micro-batch, optax#527) and its key is split once per release. On the first
    k − 1 calls the emitted update is zero.

    Args:
        private_optimizer: the noise + normaliser + optimizer chain to run on the total. Its
            normaliser must be the expected size of the LOGICAL batch (k micro-batches).
        every_k: k ≥ 1 micro-batches per logical batch.

    Returns:
        An ``optax.GradientTransformation`` with state :class:`AccumulationState` (a
        :class:`DPSGDTransformation` stating the inner σ and C when ``private_optimizer`` is
        one, so :func:`event_for` works on it: T is the number of logical batches).

    Raises:
        ValueError: at update, a concrete micro-batch sum with a NaN/inf entry (named
            ``updates``): its total could only be released non-finite. Under ``jit`` the
            inner optimizer decides (``dp_sgd_optimizer`` with own sums refuses it).

    Formal guarantees:
        The released quantity per logical batch is the Gaussian mechanism on the clipped sum
        of the logical batch, so the accountant counts T = (#calls)/k releases with the
        logical batch's sampling rate — never #calls. The k sums are added in double-float
        (TwoSum, in call order) and rounded once, so the total is within
        (k·7u² + u)·Σ_m‖S_m‖ of their exact sum; its sensitivity is C (add/remove-one)
        when the clipped-gradient function was built with ``rows_per_release`` = the rows
        of the k calls together (its clip norm then covers this second rounding:
        Casacuberta et al. 2022, "Widespread underestimation of sensitivity in DP
        libraries"); otherwise C plus ≈ 2u·k·B·C.

    Example:
        >>> import jax, jax.numpy as jnp, optax
        >>> inner = dp_sgd_optimizer(optimizer=optax.sgd(1.0), noise_multiplier=0.0,
        ...     l2_clip_norm=1.0, normalizer=1.0, key=jax.random.key(0))  # C given: own sums
        >>> tx = accumulate_clipped_sums(inner, every_k=2)
        >>> state = tx.init(jnp.zeros(1))
        >>> u1, state = tx.update(jnp.ones(1), state)
        >>> u2, state = tx.update(jnp.ones(1), state)
        >>> float(u1[0]), float(u2[0])
        (0.0, -2.0)
    """
    every_k = _validate.positive_int("every_k", every_k)

    def init_fn(params: Any) -> AccumulationState:
        # the running total is kept in at least float32: a bfloat16 total rounds differently
        # with and without one example's contribution (2C at 258 micro-batch sums of C)
        zeros = jax.tree.map(lambda p: jnp.zeros(jnp.shape(p), _noise.noise_dtype_of(p)), params)
        return AccumulationState(
            jnp.zeros([], jnp.int32), zeros, private_optimizer.init(params), zeros
        )

    def update_fn(updates: Any, state: AccumulationState, params: Any = None):
        refuse_concrete_nonfinite_sums(updates)  # traced: the inner optimizer's check runs
        low = state.clipped_sum_low
        if low is None:  # a state from before the low part existed
            low = jax.tree.map(jnp.zeros_like, state.clipped_sum)

        def add(hi, lo, u):
            s, e = _certified.two_sum(hi, u.astype(hi.dtype))
            return _certified.two_sum(s, e + lo)

        his, treedef = jax.tree.flatten(state.clipped_sum)
        pairs = [
            add(h, x, u)
            for h, x, u in zip(
                his, treedef.flatten_up_to(low), treedef.flatten_up_to(updates), strict=True
            )
        ]
        hi = jax.tree.unflatten(treedef, [p[0] for p in pairs])
        lo = jax.tree.unflatten(treedef, [p[1] for p in pairs])

        def release(_):
            total = jax.tree.map(lambda h, x: _certified.df_round((h, x), h.dtype), hi, lo)
            out, inner = private_optimizer.update(total, state.inner_state, params)
            zeros = jax.tree.map(jnp.zeros_like, hi)
            return out, inner, zeros, zeros

        out_shape = jax.eval_shape(release, None)[0]

        def hold(_):
            zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), out_shape)
            return zeros, state.inner_state, hi, lo

        is_last = state.micro_step == every_k - 1
        out, inner, acc, acc_low = jax.lax.cond(is_last, release, hold, None)
        micro = jnp.where(is_last, 0, state.micro_step + 1).astype(jnp.int32)
        return out, AccumulationState(micro, acc, inner, acc_low)

    tx = optax.GradientTransformation(init_fn, update_fn)
    if isinstance(private_optimizer, DPSGDTransformation):
        return _stating(tx, like=private_optimizer)
    return tx


# ----------------------------------------------------------------------------- Laplace DP-SGD


def laplace_dp_sgd_optimizer(
    *, l1_sensitivity: float, epsilon: float, rho: float, kappa: float, key: jax.Array
) -> optax.GradientTransformation:
    r"""The Laplace-noise batch-1 DP-SGD (no published source located).

    .. math::  \beta^{(h)} = \beta^{(h-1)} - \gamma_{h-1}\big(\nabla L_{\Omega_h}(\beta^{(h-1)})
       + \theta_h Z_h\big),\quad \gamma_j = (1+j)^{-\rho},\ Z_h \sim \text{Laplace}(0, I),

    θ_h from :func:`dpjax.dp_sgd.transforms.laplace_dp_sgd_theta` with a_h = h^κ. Feed it the
    (clipped)
    gradient of ONE uniformly drawn example per step.

    Args:
        l1_sensitivity: Δ₁ = Δ(∇L), replace-one ℓ1 sensitivity of the per-step gradient.
        epsilon: ε of the privacy theorem.
        rho: step-size exponent ρ ∈ (0, 1).
        kappa: privacy-weight exponent κ ≥ 0 (the noise term of the utility theorem vanishes iff
            2κ + ρ > 2; ρ = 1/2 needs κ > 3/4).
        key: required JAX PRNG key.

    Returns:
        An ``optax.GradientTransformation``; account with :func:`laplace_dp_sgd_event`.

    Raises:
        ValueError: at update, a gradient with a NaN/inf entry (named ``updates``), before
            the noise: eagerly, or under ``jit`` from a host callback that fails the step (see
            :func:`dp_sgd_optimizer`); NaN + noise would reveal the example.

    Formal guarantees:
        See :func:`dpjax.dp_sgd.transforms.add_laplace_dp_sgd_noise`: step h is (Δ₁/θ_h)-DP
        (replace-one), the run of T steps (Σ_{h≤T} Δ₁/θ_h, 0)-DP by basic composition
        (:func:`laplace_dp_sgd_event`); the stated analysis gives ε·a_h-DP for the h-th
        iterate.
    """
    return laplace_dp_sgd_chain(
        l1_sensitivity=l1_sensitivity,
        epsilon=epsilon,
        rho=rho,
        kappa=kappa,
        key=key,
        gradients_finite_by_construction=False,
    )


def laplace_dp_sgd_chain(
    *,
    l1_sensitivity: float,
    epsilon: float,
    rho: float,
    kappa: float,
    key: jax.Array,
    gradients_finite_by_construction: bool,
) -> optax.GradientTransformation:
    """:func:`laplace_dp_sgd_optimizer`; with ``gradients_finite_by_construction`` (the caller
    feeds ``dpjax.clipped_grad`` output, whose ``nan_safe`` map keeps it finite) the non-finite
    check, a host callback per step under ``jit``, is left out."""
    noise = add_laplace_dp_sgd_noise(
        l1_sensitivity=l1_sensitivity, epsilon=epsilon, rho=rho, kappa=kappa, key=key
    )
    if not gradients_finite_by_construction:
        noise = refusing_nonfinite_sums(noise)

    def step_size(count: jax.Array) -> jax.Array:  # γ_{h-1} at iteration h = count + 1
        return -laplace_dpsgd_step_size((count + 1).astype(jnp.result_type(float)), rho)

    step = optax.scale_by_schedule(step_size)
    return _refusing_multisteps(optax.chain(noise, step))


def laplace_dp_sgd_event(
    *, l1_sensitivity: float, epsilon: float, rho: float, kappa: float, steps: int
) -> LaplaceDPSGDEvent:
    """The privacy event of ``steps`` iterations of :func:`laplace_dp_sgd_optimizer` (replace-one).

    Args:
        l1_sensitivity, epsilon, rho, kappa: as given to :func:`laplace_dp_sgd_optimizer`.
        steps: T ≥ 1 iterations run (= noisy releases).

    Returns:
        ``LaplaceDPSGDEvent(epsilons=(Δ₁/θ_1, …, Δ₁/θ_T))``: per-release pure-DP budgets;
        the run is (Σ_h ε_h, 0)-DP by basic composition.

    Example:
        >>> ev = laplace_dp_sgd_event(l1_sensitivity=1.0, epsilon=1.0, rho=0.5, kappa=0.0, steps=2)
        >>> [round(e, 4) for e in ev.epsilons]  # θ_2 = (1/2^-0.5 + 1)/1 = 1 + √2
        [1.0, 0.4142]
    """
    _validate.positive("l1_sensitivity", l1_sensitivity)
    _validate.epsilon("epsilon", epsilon)
    _validate.in_range("rho", rho, 0.0, 1.0, low_inclusive=False)
    _validate.non_negative("kappa", kappa)
    steps = _validate.positive_int("steps", steps)
    h = np.arange(1, steps + 1, dtype=np.float64)
    theta = laplace_dp_sgd_theta(
        h, l1_sensitivity=l1_sensitivity, epsilon=epsilon, rho=rho, kappa=kappa
    )
    return LaplaceDPSGDEvent(epsilons=tuple(l1_sensitivity / theta), relation=REPLACE_ONE)
