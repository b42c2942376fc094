r"""``make_private``: DP-SGD in one call — σ, C, the batch and the accountant stated once.

Opacus' ``make_private`` for JAX: from the loss of ONE example, an optax optimizer, the clip norm,
the data set size, the expected batch size and the length of training, :func:`make_private`
builds the whole pipeline of :mod:`dpjax.dp_sgd` and returns a :class:`PrivateTraining`::

    sampler (Poisson, padded, cap sized for δ)  ->  gather  ->  clipped_grad (mask applied)  ->
    [k micro-batches, sums accumulated]  ->  N(0, (σC)²) once  ->  ÷ q·n  ->  optimizer

with a jit-able ``step``, a host-side ``epsilon(state)`` read from the step count, and ``fit``
(a training loop with a tqdm progress bar showing loss and ε spent). The parts stay public.

Secret and public: the :class:`PrivateState` (keys, optimizer state, step, plan ledger) is the
SECRET checkpoint that resumes a run; :meth:`PrivateTraining.public_state` is what may be
published with the parameters (no key data). A state is bound to its plan: another plan's
``step``/``fit`` refuse it, and :meth:`PrivateTraining.continue_from` continues it under a new
plan with ε composed over both phases.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import warnings
from collections.abc import Callable
from fractions import Fraction
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from dpjax import _validate
from dpjax._warnings import PrivacyLeakWarning
from dpjax.accounting.dp_sgd import (
    cached_dp_sgd_epsilon,
    calibrate_noise_multiplier,
    warn_if_delta_reveals_records,
)
from dpjax.accounting.tight import (
    TRUNCATION_DELTA_SHARES,
    PLDGridCoarsenedWarning,
    PLDGridTooLargeError,
    TruncationSlackError,
    tight_epsilon,
    truncation_slack,
)
from dpjax.dp_sgd import _plan, adaptive_clip
from dpjax.dp_sgd._frozen import ReadOnlyAfterInit
from dpjax.dp_sgd._vmap_guard import void_unless as _void_unless
from dpjax.dp_sgd.clipping import BACKENDS as CLIPPING_BACKENDS
from dpjax.dp_sgd.clipping import clipped_grad
from dpjax.dp_sgd.matrix_factorization import row_order as _row_order
from dpjax.dp_sgd.samplers import (
    PaddedBatch,
    PoissonSampler,
    _binomial_cap,
    realised_sampling_rate,
)
from dpjax.dp_sgd.transforms import (
    add_gaussian_noise,
    normalize_by,
    public_opt_state,
    rekeyed_noise_states,
)
from dpjax.events import PoissonSampledGaussianEvent
from dpjax.relation import ADD_OR_REMOVE_ONE

__all__ = [
    "PrivateState",
    "PublicState",
    "PrivateTraining",
    "make_private",
    "nnx_loss",
    "poisson_schedule",
]

#: Share of δ set aside for the padded sampler's truncation slack: ε is accounted at
#: δ·(1 − SLACK_FRACTION) and the cap ``max_batch_size`` is chosen so the slack of the planned
#: run is ≤ SLACK_FRACTION·δ.
SLACK_FRACTION = TRUNCATION_DELTA_SHARES[0]
ACCOUNTING_METHODS = ("pld", "rdp")


# ----------------------------------------------------------------------------- schedule


def poisson_schedule(dataset_size: int, batch_size: int, epochs: float) -> tuple[float, int]:
    """Sampling rate q and number of steps T of Poisson DP-SGD from epochs and batch size.

    q = b/n (each example joins a batch with probability q, so the EXPECTED batch size is b)
    and T = ⌈epochs · n/b⌉ = ⌈epochs/q⌉ (one epoch = n/b expected batches), computed exactly
    in rationals.

    Args:
        dataset_size: n ≥ 1.
        batch_size: the expected (logical) batch size b in [1, n].
        epochs: E > 0 passes over the data in expectation.

    Returns:
        ``(q, T)``.

    Example:
        >>> poisson_schedule(dataset_size=60_000, batch_size=256, epochs=3)
        (0.004266666666666667, 704)
    """
    n = _validate.positive_int("dataset_size", dataset_size)
    b = _validate.positive_int("batch_size", batch_size)
    if b > n:
        _validate.fail("batch_size", batch_size, f"in [1, dataset_size={n}]")
    epochs = _validate.positive("epochs", epochs)
    steps = math.ceil(Fraction(epochs) * n / b)
    return b / n, max(1, steps)


# ----------------------------------------------------------------------------- nnx models


def nnx_loss(model: Any, loss: Callable[[Any, Any], jax.Array]) -> tuple[Callable, Any]:
    """A ``loss_fn(params, example, rng)`` for :func:`make_private` from a flax nnx Module.

    The module is split once (``nnx.split(model, nnx.Param, nnx.RngKey, ...)``): the
    ``nnx.Param`` state is what DP-SGD differentiates and updates; RNG keys, RNG counters and
    other variables (e.g. batch statistics) are NOT differentiated. Inside ``loss_fn`` a fresh
    module is merged in the current trace (so no ``TraceContextError``), and every RNG stream
    (e.g. Dropout's) is reseeded from the per-example ``rng``, so each example of each step gets
    its own dropout mask. No uint32/key leaf reaches ``jax.grad`` (no float0 errors).

    After training, ``nnx.update(model, params)`` writes the parameters back; call
    ``model.eval()`` for deterministic evaluation. Non-parameter variables are constants here
    (batch statistics are not updated): use LayerNorm/GroupNorm — BatchNorm mixes the examples
    of a batch, which per-example clipping cannot bound, and on the ONE example the loss sees
    it outputs 0, so a BatchNorm in training mode is refused (``ValueError``).

    Args:
        model: an ``nnx.Module`` (in training mode: Dropout not deterministic).
        loss: ``loss(module, example) -> scalar``, the loss of ONE example.

    Returns:
        ``(loss_fn, params)``: the per-example loss for :func:`make_private` and the initial
        ``nnx.Param`` state.

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> model = nnx.Sequential(nnx.Linear(3, 2, rngs=nnx.Rngs(0)), nnx.Dropout(0.5,
        ...     rngs=nnx.Rngs(1)))
        >>> loss_fn, params = nnx_loss(model, lambda m, ex: jnp.sum(m(ex)))
        >>> loss_fn(params, jnp.ones(3, jnp.float32), jax.random.key(0)).shape
        ()
    """
    from flax import nnx  # lazy: flax is optional

    if not isinstance(model, nnx.Module):
        _validate.fail("model", type(model).__name__, "an nnx.Module")
    if not callable(loss):
        _validate.fail("loss", loss, "a callable loss(module, example) -> scalar")
    _refuse_batch_norm(model)
    graphdef, params, rng_keys, rest = nnx.split(model, nnx.Param, nnx.RngKey, ...)
    key_leaves, key_tree = jax.tree.flatten(nnx.to_pure_dict(rng_keys))

    def loss_fn(params: Any, example: Any, rng: jax.Array) -> jax.Array:
        # fresh Variables in this trace: mutating the originals (created outside) would raise
        keys = jax.tree.map(lambda v: v, rng_keys)
        fresh = [jax.random.fold_in(rng, i) for i in range(len(key_leaves))]
        nnx.replace_by_pure_dict(keys, jax.tree.unflatten(key_tree, fresh))
        module = nnx.merge(graphdef, params, keys, jax.tree.map(lambda v: v, rest))
        return loss(module, example)

    return loss_fn, params


def _refuse_batch_norm(model: Any) -> None:
    """A BatchNorm in training mode normalises ONE example by its own statistics (its output
    is then 0: nothing is learnt through it), and its batch statistics would mix examples."""
    from flax import nnx

    for _, node in nnx.iter_graph(model):
        if isinstance(node, nnx.BatchNorm) and not node.use_running_average:
            _validate.fail(
                "model",
                "a module with an nnx.BatchNorm in training mode",
                "one without batch statistics: nnx.LayerNorm / nnx.GroupNorm (per-example "
                "clipping runs the model on ONE example, where BatchNorm outputs 0)",
            )


# ----------------------------------------------------------------------------- state


class PrivateState(NamedTuple):
    """Training state of :class:`PrivateTraining`: a SECRET checkpoint (a pytree of arrays).

    It holds the key data from which every later batch and noise draw is derived: given it,
    one later model reveals a noise-free clipped sum (issue 20). Save it to resume a run and
    keep it private; publish :meth:`PrivateTraining.public_state` instead.

    Attributes:
        step: int32 scalar, noisy updates applied so far (what ``epsilon`` reads).
        key: uint32 raw key data for sampling and dropout, split at every step (SECRET).
        opt_state: the optax state of noise (its own key data, SECRET) → ÷ q·n → optimizer.
            With ``noise=BandMF(b)`` the noise state also holds the past noise and the keyed
            digest of the data's row order (both SECRET; see
            :mod:`~dpjax.dp_sgd.matrix_factorization.row_order`).
        plan: uint32[k, 29] ledger of the run's phases (exact σ, q, C, normaliser, n, cap,
            relation, start step, adaptive clipping's (γ, η, σ_b), the privacy unit and the
            correlated noise (bands, strategy digest) of each; public): ``step``/``fit``
            refuse a state whose current phase is another plan, ``epsilon`` composes every
            phase
            (:meth:`PrivateTraining.continue_from` opens a new one).
    """

    step: jax.Array
    key: jax.Array
    opt_state: Any
    plan: jax.Array


class PublicState(NamedTuple):
    """What may be published of a run besides its parameters (no key data, no randomness).

    Built by :meth:`PrivateTraining.public_state`.

    Attributes:
        step: noisy updates applied so far.
        opt_state: the optimizer state with every noise state reduced to its count
            (:func:`~dpjax.dp_sgd.public_opt_state`): moments are post-processing.
        plan: the phase ledger (see :class:`PrivateState`).
        epsilon: ε of the whole run at ``delta`` (every phase composed, slack included).
        delta: δ of that guarantee.
    """

    step: jax.Array
    opt_state: Any
    plan: jax.Array
    epsilon: float
    delta: float


def _check_key(key: Any) -> jax.Array:
    """A typed JAX PRNG key (or raw uint32[2] threefry data); no default, no int seed."""
    if key is None:
        raise TypeError("key is required: pass key=jax.random.key(<seed>) (no default key)")
    if not isinstance(key, jax.Array):
        raise TypeError(f"key must be a JAX PRNG key (jax.random.key(seed)); got {key!r}")
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) and key.shape == ():
        return key
    if key.dtype == jnp.uint32 and key.shape == (2,):
        return jax.random.wrap_key_data(key)
    raise TypeError(f"key must be one JAX PRNG key; got an array of {key.dtype}{key.shape}")


def _wants_rng(loss_fn: Callable) -> bool:
    """Whether ``loss_fn`` takes a parameter named ``rng`` (then it gets per-example keys)."""
    try:
        return "rng" in inspect.signature(loss_fn).parameters
    except (TypeError, ValueError):
        return False


# ----------------------------------------------------------------------------- training


class PrivateTraining(ReadOnlyAfterInit):
    """DP-SGD with Poisson sampling, built by :func:`make_private` (see its guarantees).

    One run per object: :meth:`init` (or ``fit`` without ``state``) issues its keys once;
    the :class:`PrivateState` it returns is a SECRET checkpoint, :meth:`public_state` its
    publishable form; :meth:`continue_from` continues another plan's state under this one.

    Attributes:
        noise_multiplier: σ (noise std σ·C on the clipped sum of each logical batch).
        sampling_rate: q, the rate the sampler realises (⌊q·2⁶⁴⌋/2⁶⁴; what is accounted).
        steps: T, the planned number of noisy updates (``fit`` runs them).
        l2_clip_norm: C, or the :class:`~dpjax.dp_sgd.AdaptiveClip` (C_t: :meth:`clip_norm`).
        expected_batch_size: q·n, the PUBLIC normaliser.
        max_batch_size: the padded batch length (cap sized so the truncation slack is
            ≤ ``SLACK_FRACTION``·δ over ``steps`` steps).
        physical_batch_size: rows per micro-batch (None: the whole padded batch at once).
        delta: δ of the guarantee ``epsilon`` reports (slack included).
        accounting: "pld" or "rdp".
        sampler: the :class:`~dpjax.dp_sgd.PoissonSampler`.
        grad_fn: the :class:`~dpjax.dp_sgd.ClippedGrad`.
    """

    _DERIVED = "the step was built with it"
    _REBUILD_HINT = "call make_private(...) again"

    def __init__(
        self,
        *,
        loss_fn: Callable,
        optimizer: optax.GradientTransformation,
        sampler: PoissonSampler,
        noise_multiplier: float,
        l2_clip_norm: float | adaptive_clip.AdaptiveClip,
        steps: int,
        delta: float,
        key: jax.Array,
        physical_batch_size: int | None,
        clipping: str,
        accounting: str,
        noise: Any = None,
    ):
        self.loss_fn = loss_fn
        #: the resolved correlated noise (``make_private(noise=BandMF(b))``), or None: DP-SGD
        self.noise = noise
        self.sampler = sampler
        self.noise_multiplier = noise_multiplier
        self.sampling_rate = sampler.sampling_rate
        self.steps = steps
        self.l2_clip_norm = l2_clip_norm
        self.expected_batch_size = sampler.expected_batch_size
        self.max_batch_size = sampler.max_batch_size
        self.delta = delta
        self.accounting = accounting
        self.relation = ADD_OR_REMOVE_ONE
        if physical_batch_size is not None and physical_batch_size >= sampler.max_batch_size:
            physical_batch_size = None
        self.physical_batch_size = physical_batch_size
        self._uses_rng = _wants_rng(loss_fn)
        self._impl = jax.random.key_impl(key)
        noise_key, self._train_key = jax.random.split(key)
        #: banded MF: the record of the data's row order a new state starts with (SECRET)
        self._row_record = None if noise is None else _row_order.init_row_order(key)
        self._row_check = None if noise is None else _row_order.HostCheck()
        self._adaptive = isinstance(l2_clip_norm, adaptive_clip.AdaptiveClip)
        if self._adaptive:  # clip at 1 the loss ÷ C_t; noise σ_Δ; × C_t after the noise
            self._tx = adaptive_clip.AdaptiveUpdate(
                l2_clip_norm,
                noise_multiplier=noise_multiplier,
                key=noise_key,
                normalizer=self.expected_batch_size,
                optimizer=optimizer,
            )
            loss, c = self._loss_over_clip_norm, 1.0
        else:
            self._tx = optax.chain(
                add_gaussian_noise(noise_multiplier * l2_clip_norm, key=noise_key)
                if noise is None
                else noise.transform(noise_multiplier, l2_clip_norm, key=noise_key),
                normalize_by(self.expected_batch_size),
                optimizer,
            )
            loss, c = self._example_loss, l2_clip_norm
        self.grad_fn = clipped_grad(loss, l2_clip_norm=c, backend=clipping)
        self._plan = _plan.Plan(
            noise_multiplier=float(noise_multiplier),
            sampling_rate=float(self.sampling_rate),
            **adaptive_clip.plan_fields(l2_clip_norm),
            normalizer=float(self.expected_batch_size),
            dataset_size=sampler.dataset_size,
            max_batch_size=sampler.max_batch_size,
            relation=self.relation,
            **self._plan_unit(),
            bands=0 if noise is None else noise.bands,
            strategy_digest=0 if noise is None else noise.digest,
        )
        self._epsilons: dict[tuple[int, float], float] = {}
        self._composed: dict[tuple[Any, float], float] = {}
        # host-side bookkeeping (mutable contents of a frozen attribute): whether this object
        # has issued a run's keys (init / continue_from), and the last plan leaf checked
        self._host: dict[str, Any] = {"started": False, "verified": None}
        self._jitted_step = jax.jit(self._step_impl)
        self._freeze()

    def _plan_unit(self) -> dict[str, int]:
        """The privacy unit's fields of the plan (none: example level; see user_level)."""
        return {}

    # ---- the per-example loss, with or without its dropout key

    def _example_loss(self, params: Any, example: Any, *key_data: jax.Array) -> jax.Array:
        if not self._uses_rng:
            return self.loss_fn(params, example)
        rng = jax.random.wrap_key_data(key_data[0], impl=self._impl)
        return self.loss_fn(params, example, rng=rng)

    def _loss_over_clip_norm(self, params: Any, example: Any, clip_norm: Any, *key_data: Any):
        """The loss ÷ C_t (adaptive clipping: clipping its gradient at 1 clips at C_t)."""
        loss = self._example_loss(params, example, *key_data)
        return loss / clip_norm.astype(jnp.result_type(loss))

    def clip_norm(self, state: PrivateState | PublicState) -> float:
        """The clip norm C_t of the next step (public; fixed C: ``l2_clip_norm``).

        Raises:
            ValueError: ``state`` has no adaptive clipping state and this object has.
        """
        current = adaptive_clip.clip_norm_of(state.opt_state)
        if current is None:
            adaptive_clip.check_continuable(state.opt_state, self.l2_clip_norm)
            return float(self.l2_clip_norm)
        return current

    def event(self, steps: int | None = None) -> PoissonSampledGaussianEvent:
        """The privacy event of ``steps`` (default: the planned T) noisy updates."""
        steps = self.steps if steps is None else _validate.positive_int("steps", steps)
        rounds = self._plan.accounted_steps(steps)  # ⌈T/b⌉ rounds for banded MF
        event = self.sampler.event(noise_multiplier=self.noise_multiplier, steps=rounds)
        return dataclasses.replace(event, privacy_unit=_privacy_unit(self._plan))

    def init(self, params: Any) -> PrivateState:
        """The initial :class:`PrivateState` (step 0; keys derived from ``make_private``'s key).

        Only once per :class:`PrivateTraining`: a second ``init`` would return the same keys,
        so a second run would replay the first one's batches and noise (the difference of the
        two runs' updates is then noise-free). Resume a run from its saved state
        (``fit(params, data, state=state)``); for a checkpoint template use
        :meth:`state_template`; for a new run call ``make_private`` with a new key.

        Raises:
            ValueError: ``init`` or :meth:`continue_from` was already called on this object.
        """
        self._start("init")
        return self._fresh_state(params)

    def _start(self, what: str) -> None:
        if self._host["started"]:
            _validate.fail(
                what,
                "a second run on one PrivateTraining",
                "at most one init/continue_from per PrivateTraining (its keys are fixed: a "
                "second run would replay the first one's batches and noise); resume with "
                "fit(params, data, state=state) or step(params, state, data), or build a new "
                "make_private(..., key=<new key>) for a new run",
            )
        self._host["started"] = True

    def _fresh_state(self, params: Any) -> PrivateState:
        opt_state = self._tx.init(params)
        if self._row_record is not None:  # banded MF: the data's row order, set at step 0
            opt_state = _row_order.attach(opt_state, self._row_record)
        return PrivateState(
            step=jnp.zeros((), jnp.int32),
            key=jax.random.key_data(self._train_key),
            opt_state=opt_state,
            plan=jnp.asarray(_plan.ledger_row(self._plan, 0)[None, :]),
        )

    def state_template(self, params: Any) -> PrivateState:
        """A :class:`PrivateState` of the right structure to restore a checkpoint into.

        E.g. ``flax.serialization.from_bytes(private.state_template(params), blob)``. Its key
        data and plan are zeros: ``step``, ``fit`` and ``epsilon`` refuse it until restored.
        It does not count as a run (see :meth:`init`).
        """
        zeros = lambda x: jnp.zeros(jnp.shape(x), jnp.result_type(x))  # noqa: E731
        return jax.tree.map(zeros, self._fresh_state(params))

    def continue_from(self, state: PrivateState, *, key: jax.Array | None = None) -> PrivateState:
        """Continue a run made under ANOTHER plan (σ, q, C, n, …) with this one, or re-key it.

        The keys of ``state`` continue (nothing is replayed), and a new phase is recorded in
        its ledger from the current step on, so :meth:`epsilon` reports the composition of
        every phase (not the cost of this plan's steps alone). A state already in this plan
        is returned unchanged (re-keyed with ``key``). Counts as this object's run (see
        :meth:`init`).

        Re-running from one checkpoint (e.g. again after deleting a record, to "unlearn" it)
        must pass a NEW ``key``: without it, the re-run draws the same batches and the same
        noise as the first continuation, so the difference of the two runs' parameters is
        the noise-free difference of their clipped sums (it shows whether, and how, the
        deleted record moved the model whenever it was sampled). With ``key`` every later
        batch, dropout mask and noise draw comes from ``key`` (the sampling key and every
        noise state's key data are replaced; counts, optimizer moments and correlated-noise
        buffers are kept). Releasing both runs still costs the steps after the checkpoint
        twice: ``epsilon`` of each state counts one run only.

        Args:
            state: the :class:`PrivateState` of the earlier phase(s) (the optimizer state must
                have this object's structure: same optimizer transformations).
            key: None (continue the state's key streams: a plain resume), or a NEW JAX PRNG
                key of this object's implementation (e.g. ``dpjax.os_key()``; never one used
                before) from which the rest of the run is drawn.

        Returns:
            The state to pass to ``step``/``fit`` of this object.

        Raises:
            ValueError: ``state`` has no valid ledger, a phase of another privacy unit
                (example level vs user level, or another grouping of users), a change from
                or to a correlated-noise plan (``noise=BandMF``), an optimizer state of
                another structure than this object's optimizer (e.g. an ``optax.sgd`` run
                continued under ``optax.adam``), or this object already ran; ``key`` of
                another PRNG implementation.
            TypeError: ``key`` is not a JAX PRNG key.
        """
        state = _as_private_state(state)
        step = _steps_of(state)
        phases = _plan.read_ledger(state.plan, step)
        self._refuse_another_unit(phases)
        adaptive_clip.check_continuable(state.opt_state, self.l2_clip_norm)
        self._refuse_another_optimizer(state.opt_state)
        new_key = None if key is None else self._check_new_key(key)
        self._start("continue_from")
        if new_key is not None:
            state = _rekeyed(state, new_key)
        if phases[-1][0] == self._plan:
            return state
        if phases[-1][0].bands or self._plan.bands:
            _validate.fail(
                "state",
                "a phase change from or to correlated noise (make_private(noise=BandMF(...)))",
                "a state of this plan: the noise buffers would carry one strategy's past noise "
                "into another's rows, so the phases would not be the independent mechanisms "
                "that ε composes; start a new run",
            )
        ledger = _plan.append_phase(state.plan, self._plan, step)
        return state._replace(plan=jnp.asarray(ledger))

    def _check_new_key(self, key: Any) -> jax.Array:
        key = _check_key(key)
        if jax.random.key_impl(key) != self._impl:
            _validate.fail(
                "key",
                f"a key of PRNG implementation {jax.random.key_impl(key)}",
                f"a key of this run's implementation ({self._impl}): the state's key data is "
                "wrapped with it at every step",
            )
        return key

    def _refuse_another_optimizer(self, opt_state: Any) -> None:
        """Refuse an optimizer state whose transformations are not this object's (compared by
        the types of its optax/dpjax state nodes, not by the parameters' shapes): it would
        fail inside the first step (e.g. ``EmptyState`` has no ``mu`` for an sgd run
        continued under adam)."""
        try:
            template = jax.eval_shape(
                lambda p: self._fresh_state(p).opt_state, jnp.zeros((), jnp.float32)
            )
        except Exception:  # an optimizer whose init needs the real parameters: step checks
            return
        have, want = _state_skeleton(opt_state), _state_skeleton(template)
        if have != want:
            _validate.fail(
                "state",
                f"an optimizer state of other transformations ({_skeleton_names(have)})",
                f"a state of this object's optimizer ({_skeleton_names(want)}): continue a "
                "run with the optimizer it was trained with (its moments are part of the "
                "state), or start a new run",
            )

    def _refuse_another_unit(self, phases: list[tuple[_plan.Plan, int]]) -> None:
        """Phases protect one unit (examples, or users of one grouping) or do not compose:
        a user-level (ε, δ) is not an example-level one (removing one row of a user replaces
        that user's vector) and an example-level one bounds a user only by group privacy."""
        unit = (self._plan.examples_per_user, self._plan.grouping)
        for plan, _ in phases:
            if (plan.examples_per_user, plan.grouping) != unit:
                _validate.fail(
                    "state",
                    f"a state with a phase of another privacy unit ({plan.describe()})",
                    "a state whose phases all protect the same unit as this plan (examples, "
                    "or users of the same grouping): their ε do not compose otherwise",
                )

    def public_state(self, state: PrivateState, delta: float | None = None) -> PublicState:
        """What may be published of ``state`` with the parameters: no key data.

        Keeps the step count, the optimizer's moments (noise states reduced to their counts),
        the phase ledger and (ε, δ) of the whole run; drops the sampling/dropout key and the
        noise key, from which every later batch and noise draw is derived.

        Args:
            state: the (secret) :class:`PrivateState`.
            delta: δ of the reported ε; default: ``make_private``'s δ.

        Returns:
            A :class:`PublicState` (a pytree; ``epsilon(public)`` recomputes its ε).

        Raises:
            ValueError: ``state`` is not a valid :class:`PrivateState`, its optimizer state
                holds other key data (e.g. ``optax.add_noise``'s key), or ``delta`` cannot
                hold the truncation slack of the steps taken.

        Example:
            >>> import jax, jax.numpy as jnp, optax, dpjax
            >>> private = dpjax.make_private(lambda w, ex: ex @ w, optimizer=optax.sgd(0.1),
            ...     l2_clip_norm=1.0, dataset_size=100, batch_size=10, steps=3,
            ...     noise_multiplier=1.0, delta=1e-5, key=jax.random.key(0))
            >>> w, state, _ = private.fit(jnp.zeros(2), jnp.ones((100, 2)), progress=False)
            >>> public = private.public_state(state)
            >>> int(public.step), public.epsilon == private.epsilon(state), public.delta
            (3, True, 1e-05)
        """
        state = _as_private_state(state)
        delta = self._delta_or_default(delta)
        eps = self.epsilon(state, delta)
        return PublicState(
            step=state.step,
            opt_state=public_opt_state(state.opt_state),
            plan=state.plan,
            epsilon=eps,
            delta=delta,
        )

    # ---- one step

    def _check_params(self, params: Any) -> None:
        """Parameters are floating-point arrays (``jax.grad`` differentiates them)."""
        leaves = jax.tree.leaves(params)
        if not leaves:
            _validate.fail("params", params, "a pytree of floating-point arrays (none found)")
        for path, leaf in jax.tree_util.tree_leaves_with_path(params):
            if not jnp.issubdtype(jnp.result_type(leaf), jnp.floating):
                _validate.fail(
                    "params",
                    f"a leaf of dtype {jnp.result_type(leaf)} at {jax.tree_util.keystr(path)}",
                    "floating-point leaves only (they are differentiated and updated; keep "
                    "integer or boolean state out of params)",
                )

    def _check_data(self, data: Any) -> None:
        leaves = jax.tree.leaves(data)
        if not leaves:
            _validate.fail("data", data, "an array or a pytree of arrays with leading axis n")
        n = self.sampler.dataset_size
        for leaf in leaves:
            shape = jnp.shape(leaf)
            if not shape or shape[0] != n:
                _validate.fail(
                    "data", f"a leaf of shape {shape}", f"arrays with leading axis dataset_size={n}"
                )

    def step(self, params: Any, state: PrivateState, data: Any) -> tuple[Any, PrivateState, dict]:
        """One DP-SGD update (jit-compiled; also traceable inside your own ``jax.jit``).

        Samples a Poisson batch, gathers its rows of ``data``, clips per example with the mask
        (padding contributes exactly 0), accumulates the micro-batches' clipped sums, adds
        N(0, (σC)²) once, divides by q·n and applies the optimizer.

        Args:
            params: the parameters (any pytree).
            state: the :class:`PrivateState` from ``init`` or the previous step.
            data: an array or a pytree of arrays, every leaf with leading axis n; ``loss_fn``
                receives one row of it (same structure, leading axis removed).

        Returns:
            ``(params, state, metrics)``; ``metrics`` (loss: mean loss over the batch, one
            extra forward pass; batch_size; num_clipped; num_nonfinite) are NOT private: for
            monitoring only.

        Raises:
            ValueError: ``state``'s current phase is another plan (σ, q, C, normaliser, n,
                cap or relation; use :meth:`continue_from`), or a template/invalid ledger.
                Checked on the host once per plan array (the ledger is passed through
                unchanged, so a run syncs once). When ``state`` is traced by your own
                ``jax.jit`` / ``lax.scan`` it cannot raise: a state whose current phase is
                not this plan (a template's zero key data, whose noise is public; another
                plan, which ``epsilon`` would charge at the wrong σ, q) returns NaN
                parameters and optimizer state instead, so nothing computed from it is
                released. With ``noise=BandMF(b)``: ``data`` other than the rows of the
                run's first step in the same order (a record's part is its row index mod b;
                a keyed digest in the secret state records them; NaN under your own
                ``jax.jit``), or a state without that record.
        """
        self._check_plan(state)
        self._check_params(params)
        self._check_data(data)
        digest = None
        if self.noise is not None:  # banded MF: the rows must keep the first step's order
            record = _row_order.record_of(state.opt_state)
            digest = self._row_check.digest(record, data, lambda: _steps_of(state))
        params, (count, key, opt_state), metrics = self._jitted_step(
            params, state.step, state.key, state.opt_state, data, digest
        )
        if digest is not None and _validate.is_concrete(digest):  # checked on the host: keep
            opt_state = _row_order.attach(opt_state, _row_order.RowOrder(record.key, digest))
        if not _validate.is_concrete(state.plan):
            params, opt_state = self._void_unless_this_plan(state.plan, (params, opt_state))
        return params, PrivateState(count, key, opt_state, state.plan), metrics

    def _void_unless_this_plan(self, ledger: jax.Array, released: Any) -> Any:
        """``released`` with every float leaf NaN unless the traced ``ledger``'s current row
        is this plan (every word but the row count and the phase's start step, which vary)."""
        word = _plan.RELATION_WORD  # relation (low 8 bits) and row count (varies)
        row = _plan.ledger_row(self._plan, 0)
        ext = _plan.EXTENSION  # adaptive clipping's config
        ok = jnp.all(ledger[-1, :word] == jnp.asarray(row[:word])) & (
            (ledger[-1, word] & 0xFF) == int(row[word] & 0xFF)
        )
        # adaptive clipping's config and the privacy unit (user level: k and grouping);
        # legacy rows (fixed C, example level) read as zeros
        tail = ledger[-1, ext:] if ledger.shape[1] > ext else jnp.zeros_like(row[ext:])
        ok = ok & jnp.all(tail == jnp.asarray(row[ext:]))

        return _void_unless(ok, released)

    def _check_plan(self, state: Any) -> None:
        """Refuse a state whose current phase is not this object's plan (host-side).

        An object that steps a state counts as having run (see :meth:`init`): rebuilt with
        the key of the run it resumes (a restart of the same script), a fresh ``init`` /
        ``fit`` without ``state`` would replay that run's batches and noise."""
        state = _as_private_state(state)
        ledger = state.plan
        if ledger is self._host["verified"] or not _validate.is_concrete(ledger):
            self._host["started"] = True
            return
        current = _plan.current_plan(ledger)
        if current != self._plan:
            _validate.fail(
                "state",
                f"a state whose current phase is another plan ({current.describe()})",
                f"a state of this plan ({self._plan.describe()}): continue it under this "
                "plan with state = private.continue_from(state) (ε then composes both "
                "phases), or step it with the PrivateTraining that made it",
            )
        self._host["verified"] = ledger
        self._host["started"] = True

    def _step_impl(
        self,
        params: Any,
        count: jax.Array,
        key_data: jax.Array,
        opt: Any,
        data: Any,
        digest: jax.Array | None = None,
    ):
        key = jax.random.wrap_key_data(key_data, impl=self._impl)
        next_key, sample_key, dropout_key = jax.random.split(key, 3)
        if self.noise is None:
            batch = self.sampler.sample(sample_key)
        else:  # cyclic Poisson: the part of this step
            batch = self.sampler.sample_at(sample_key, count)
        clip = opt[0].clip_norm if self._adaptive else None
        if self.physical_batch_size is None:
            clipped_sum, stats = self._clipped_part(params, data, batch, dropout_key, clip)
        else:
            clipped_sum, stats = self._accumulate(params, data, batch, dropout_key, clip)
        loss_sum, size, num_clipped, num_nonfinite, centred = stats
        if self._adaptive:
            updates, opt_state = self._tx.update(clipped_sum, opt, params, centred_count=centred)
        else:
            updates, opt_state = self._tx.update(clipped_sum, opt, params)
        params = optax.apply_updates(params, updates)
        if digest is not None:  # banded MF: another row order voids the step (NaN)
            record = _row_order.record_of(opt)
            opt_state, ok = _row_order.checked_in_graph(count, opt_state, record, digest)
            params, opt_state = _void_unless(ok, (params, opt_state))
        metrics = {
            "loss": loss_sum / jnp.maximum(size, 1).astype(loss_sum.dtype),
            "batch_size": size,
            "num_clipped": num_clipped,
            "num_nonfinite": num_nonfinite,
        }
        return params, (count + 1, jax.random.key_data(next_key), opt_state), metrics

    def _clipped_part(
        self, params: Any, data: Any, batch: PaddedBatch, dropout_key: jax.Array, clip: Any
    ):
        """Clipped sum and (loss sum, size, #clipped, #non-finite, centred #unclipped) of one
        (micro-)batch; ``clip``: C_t of adaptive clipping (the loss is divided by it), or None."""
        examples = jax.tree.map(lambda x: jnp.take(x, batch.indices, axis=0), data)
        extra: tuple[jax.Array, ...] = ()
        if self._uses_rng:  # one stream per (step, dataset index): fold the index in
            fold = lambda i: jax.random.key_data(jax.random.fold_in(dropout_key, i))  # noqa: E731
            extra = (jax.vmap(fold)(batch.indices),)
        scaled = () if clip is None else (jnp.full(batch.mask.shape, clip, jnp.float32),)
        clipped_sum, info = self.grad_fn(params, examples, *scaled, *extra, mask=batch.mask)
        centred = adaptive_clip.centred_unclipped_count(
            info.per_example_norms, batch.mask, self.grad_fn.l2_norm_bound
        )
        in_axes = (None, 0) + (0,) * len(extra)
        losses = jax.vmap(self._example_loss, in_axes=in_axes)(params, examples, *extra)
        loss_sum = jnp.sum(jnp.where(batch.mask, losses, jnp.zeros((), losses.dtype)))
        size = jnp.sum(batch.mask, dtype=jnp.int32)
        return clipped_sum, (loss_sum, size, info.num_clipped, info.num_nonfinite, centred)

    def _accumulate(
        self, params: Any, data: Any, batch: PaddedBatch, dropout_key: jax.Array, clip: Any
    ):
        """Sum the clipped sums of the batch's micro-batches (each record in exactly one).

        The k micro-batch sums are added in double-float (TwoSum, micro-batch order) and
        rounded once, then multiplied by the public ρ ≤ 1 of
        :func:`dpjax.dp_sgd._certified.accumulation_scale`: each micro-batch's sum is
        certified for its own m rows, ρ covers the rounding of the k·m-row total, so adding
        or removing one record moves the released sum by ≤ C (Casacuberta et al. 2022).
        """
        from dpjax.dp_sgd import _certified  # noqa: PLC0415 (issue 20: this method only)

        micro = batch.micro_batches(self.physical_batch_size)
        calls, rows = micro.mask.shape

        def body(total, mb):
            s, stats = self._clipped_part(params, data, PaddedBatch(*mb), dropout_key, clip)
            (hi, lo), total_stats = total
            add = lambda a, b: a + b.astype(a.dtype)  # noqa: E731
            pairs = [
                _certified.df_add((h, x), (y.astype(h.dtype), jnp.zeros_like(h)))
                for h, x, y in zip(
                    jax.tree.leaves(hi), jax.tree.leaves(lo), jax.tree.leaves(s), strict=True
                )
            ]
            treedef = jax.tree.structure(hi)
            hi = jax.tree.unflatten(treedef, [p[0] for p in pairs])
            lo = jax.tree.unflatten(treedef, [p[1] for p in pairs])
            return ((hi, lo), jax.tree.map(add, total_stats, stats)), None

        first = PaddedBatch(micro.indices[0], micro.mask[0])
        shapes = jax.eval_shape(self._clipped_part, params, data, first, dropout_key, clip)
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
        init = ((zeros[0], zeros[0]), zeros[1])
        ((hi, lo), stats), _ = jax.lax.scan(body, init, (micro.indices, micro.mask))
        clipped_sum = jax.tree.map(lambda h, x: _certified.df_round((h, x), h.dtype), hi, lo)
        # ρ from the shrink the micro-batch calls used (recorded when they were traced above)
        f = self.grad_fn.recorded_shrink(self.grad_fn.release_for(rows))
        dt = max((x.dtype for x in jax.tree.leaves(clipped_sum)), key=_certified.unit_roundoff)
        rho = _certified.accumulation_scale(f, rows, calls, dt, self.grad_fn.l2_norm_bound)
        if rho < 1.0:
            clipped_sum = jax.tree.map(lambda x: x * jnp.asarray(rho, x.dtype), clipped_sum)
        return clipped_sum, stats

    # ---- privacy spent

    def epsilon(self, state: PrivateState | PublicState | int, delta: float | None = None) -> float:
        """ε spent so far: the run that produced ``state`` is (ε, δ)-DP (add/remove-one).

        For a state, every phase of its ledger is accounted: a run of t steps under this
        object's plan is one ``PoissonSampledGaussianEvent(σ, q, count=t)`` (cached per
        (t, δ)); a run with phases under other plans (:meth:`continue_from`) is the
        composition of one such event per phase. Accounted at δ·(1 − ``SLACK_FRACTION``); the
        padded sampler's truncation slack (1 + e^ε)·Σ tᵢ·p̄ᵢ must fit in the rest of δ, so the
        returned ε holds at ``delta`` with the slack INCLUDED. Steps beyond the planned
        ``steps`` are counted (one warning per call): ε reflects the actual count.

        Args:
            state: a :class:`PrivateState` or :class:`PublicState` (step and ledger read on the
                host), or a step count t of this plan.
            delta: δ in (0, 1); default: ``make_private``'s δ.

        Returns:
            ε (0.0 before the first step).

        Raises:
            ValueError: ``delta`` too small to hold the truncation slack; an invalid ledger.
        """
        delta = self._delta_or_default(delta)
        phases = self._phases(state)
        self._warn_past_plan(phases)
        return self._epsilon_of_phases(phases, delta)

    def _delta_or_default(self, delta: Any) -> float:
        if delta is None:
            return self.delta
        return _validate.in_range("delta", delta, 0.0, 1.0, low_inclusive=False)

    def _phases(self, state: Any) -> list[tuple[_plan.Plan, int]]:
        """``[(plan, steps)]`` of every phase of ``state`` (a step count: this plan only)."""
        if isinstance(state, (PrivateState, PublicState)):
            return _plan.read_ledger(state.plan, _steps_of(state))
        return [(self._plan, _steps_of(state))]

    def _steps_in_this_plan(self, phases: list[tuple[_plan.Plan, int]]) -> int:
        return sum(t for p, t in phases if p == self._plan)

    def _warn_past_plan(self, phases: list[tuple[_plan.Plan, int]]) -> None:
        t = self._steps_in_this_plan(phases)
        if t > self.steps:
            warnings.warn(
                f"{t} steps run, beyond the planned steps={self.steps}: ε counts all of them",
                stacklevel=3,
            )

    def _epsilon_of_phases(self, phases: list[tuple[_plan.Plan, int]], delta: float) -> float:
        ran = tuple((p, t) for p, t in phases if t > 0)
        if not ran:
            return 0.0
        if all(p == self._plan for p, _ in ran):
            t = sum(t for _, t in ran)
            cached = self._epsilons.get((t, delta))
            if cached is None:
                cached = self._epsilons[(t, delta)] = self._epsilon_uncached(t, delta)
            return cached
        cached = self._composed.get((ran, delta))
        if cached is None:
            cached = self._composed[(ran, delta)] = self._epsilon_composed(ran, delta)
        return cached

    def _epsilon_composed(self, phases: tuple[tuple[_plan.Plan, int], ...], delta: float) -> float:
        """ε of phases under different plans (see :meth:`continue_from`): the smaller of

        * the tight composition of one event per phase, valid when the truncation slack
          (1 + e^ε)·Σᵢ tᵢ·p̄ᵢ fits: the coupling argument of
          :class:`~dpjax.dp_sgd.PoissonSampler` holds for the whole run (the truncated and
          untruncated runs differ only if some step overflows, probability ≤ Σᵢ tᵢ·p̄ᵢ on D
          and on D′);
        * the sum of the phases' own ε, each at δ·(1 − 2k·``SLACK_FRACTION``)/k (k phases)
          and paying its slack at its own ε (basic composition of (εᵢ, δᵢ)-DP phases,
          Dwork–Roth 2014, Theorem 3.16) — the bound that holds when a later phase's cap was
          sized for its own, smaller ε (each phase's cap spends up to ``SLACK_FRACTION``·δ).

        Raises:
            ValueError: neither bound holds at ``delta``.
        """
        if any(p.noise_multiplier == 0.0 for p, _ in phases):
            return math.inf
        accounted = delta * (1.0 - SLACK_FRACTION)
        events = [_event_of(p, t) for p, t in phases]
        eps = tight_epsilon(events, accounted, method=self.accounting)
        slack = _slack(eps, sum(p.accounted_steps(t) * _overflow(p) for p, t in phases))
        bounds = [eps] if accounted + slack <= delta else []
        k, slacks = len(phases), [math.inf]
        if 2 * k * SLACK_FRACTION < 1.0:
            share = delta * (1.0 - 2 * k * SLACK_FRACTION) / k
            parts = [tight_epsilon([e], share, method=self.accounting) for e in events]
            slacks = [
                _slack(e, p.accounted_steps(t) * _overflow(p))
                for e, (p, t) in zip(parts, phases, strict=True)
            ]
            if k * share + sum(slacks) <= delta:
                bounds.append(math.fsum(parts))
        if not bounds:
            _validate.fail(
                "delta",
                delta,
                f"large enough to hold the truncation slack of the run's {len(phases)} phases "
                f"({sum(t for _, t in phases)} steps; {slack:.3g} at the composed ε = "
                f"{eps:.4g}, {math.fsum(slacks):.3g} phase by phase)",
            )
        return min(bounds)

    def _epsilon_uncached(self, t: int, delta: float) -> float:
        """ε of t steps at δ, the truncation slack included: what ``tight_epsilon`` gives for
        ``sampler.event(σ, t)`` (first share δ·10⁻³ for the slack, larger shares if it does
        not fit), through the cache the calibration filled. σ = 0, ε ≥ 700, or a slack that
        fits in no share within the planned steps and δ: inf (no finite ε is claimed)."""
        if self.noise_multiplier == 0.0:
            return math.inf
        accounted = delta * (1.0 - SLACK_FRACTION)
        within_plan = t <= self.steps and delta == self.delta
        if within_plan and _plan_is_not_private(self, accounted):
            return math.inf  # not private (warned at construction): claim nothing
        t = self._plan.accounted_steps(t)  # banded MF: ⌈t/b⌉ rounds of its part
        try:
            eps = cached_dp_sgd_epsilon(
                noise_multiplier=self.noise_multiplier,
                sampling_rate=self.sampling_rate,
                steps=t,
                delta=accounted,
                accounting=self.accounting,
            )
            method = self.accounting
        except PLDGridTooLargeError:
            eps = _rdp_fallback(self.noise_multiplier, self.sampling_rate, t, accounted)
            method = "rdp"
        if self.sampler.delta_slack(t, min(eps, 1e300)) <= SLACK_FRACTION * delta:
            return eps
        event = self.sampler.event(noise_multiplier=self.noise_multiplier, steps=t)
        try:
            return tight_epsilon([event], delta, method=method)
        except TruncationSlackError:
            if within_plan:
                return math.inf
            _validate.fail(
                "delta",
                delta,
                f"large enough to hold the sampler's truncation slack at "
                f"max_batch_size={self.max_batch_size} after {t} steps",
            )

    def epsilon_history(self, state: PrivateState | int, num_points: int = 10) -> list:
        """``[(t, ε_t)]`` at ``num_points`` step counts evenly spaced in [1, state.step], at δ.

        Each point is one accounting call (cached), for plots of privacy spent over training.
        """
        phases = self._phases(state)
        total = sum(t for _, t in phases)
        num_points = _validate.positive_int("num_points", num_points)
        if total <= 0:
            return []
        self._warn_past_plan(phases)
        points = sorted({max(1, round(total * (i + 1) / num_points)) for i in range(num_points)})
        return [(t, self._epsilon_of_phases(_first_steps(phases, t), self.delta)) for t in points]

    # ---- training loop

    def fit(
        self,
        params: Any,
        data: Any,
        *,
        state: PrivateState | None = None,
        steps: int | None = None,
        progress: bool = True,
        log_every: int | None = None,
    ) -> tuple[Any, PrivateState, dict]:
        """Run the remaining planned steps (or ``steps`` more), with a progress bar.

        The bar (tqdm, if installed; otherwise none, silently) shows the mean batch loss and
        the ε spent, refreshed every ``log_every`` steps (default: 20 refreshes per run; each
        refresh is one cached accounting call).

        Args:
            params: initial parameters.
            data: the training data (see :meth:`step`).
            state: resume from this state (default: ``init(params)``, allowed once per
                object: a second ``fit`` without ``state`` is refused, it would replay the
                first run's batches and noise).
            steps: number of steps to run (default: this plan's ``steps`` minus the steps
                the state already ran under this plan).
            progress: show the bar.
            log_every: refresh period in steps.

        Returns:
            ``(params, state, history)``; ``history`` has lists ``step``, ``loss``, ``epsilon``
            recorded at every refresh (loss is NOT private).

        Raises:
            ValueError: before any step runs: ``state`` omitted on an object that already
                ran, a state of another plan (see :meth:`continue_from`), bad ``data``
                (with ``noise=BandMF``: other rows, or another order, than the run's first
                step saw; see :meth:`step`), or a run whose final step count would leave no
                room in δ for the truncation slack. Running past the planned ``steps`` warns
                once (with ``noise=BandMF``: refused, the factorization has n = ``steps``
                rows).
        """
        if state is None:
            if self._host["started"]:
                _validate.fail(
                    "state",
                    None,
                    "the state returned by the previous fit/step of this PrivateTraining "
                    "(fit without state starts from init, and this object's keys were already "
                    "issued: a second run would replay its batches and noise); or build a new "
                    "make_private(..., key=<new key>) for a new run",
                )
            phases = [(self._plan, 0)]
        else:
            self._check_plan(state)
            phases = self._phases(state)
        self._check_params(params)
        self._check_data(data)
        done = sum(t for _, t in phases)
        in_plan = self._steps_in_this_plan(phases)
        if steps is None:
            todo = max(0, self.steps - in_plan)
        else:
            todo = _validate.positive_int("steps", steps)
        after = lambda k: phases[:-1] + [(phases[-1][0], phases[-1][1] + k)]  # noqa: E731
        if todo:
            self._check_room(after(todo), done + todo)
            if self.noise is not None and in_plan + todo > self.steps:
                _validate.fail(
                    "steps",
                    todo,
                    f"at most {self.steps - in_plan} more step(s): noise=BandMF's factorization "
                    f"is built for this plan's steps={self.steps}, and a step past it has no "
                    "noise row (it would return NaN); plan more steps in make_private",
                )
            if in_plan + todo > self.steps:
                warnings.warn(
                    f"fit runs {in_plan + todo} steps of this plan, beyond the planned "
                    f"steps={self.steps}: ε counts all of them",
                    stacklevel=2,
                )
        state = self.init(params) if state is None else state
        data = jax.tree.map(jnp.asarray, data)  # on the device once, not at every step
        every = (
            max(1, todo // 20)
            if log_every is None
            else _validate.positive_int("log_every", log_every)
        )
        bar = _progress_bar(todo, progress)
        history: dict[str, list] = {"step": [], "loss": [], "epsilon": []}
        for i in range(todo):
            params, state, metrics = self.step(params, state, data)
            if (i + 1) % every == 0 or i + 1 == todo:
                loss = float(metrics["loss"])
                eps = self._epsilon_of_phases(after(i + 1), self.delta)
                history["step"].append(done + i + 1)
                history["loss"].append(loss)
                history["epsilon"].append(eps)
                if bar is not None:
                    bar.set_postfix(loss=f"{loss:.4f}", epsilon=f"{eps:.3f}")
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
        return params, state, history

    def _check_room(self, phases: list[tuple[_plan.Plan, int]], end: int) -> None:
        """Refuse, before any step runs, a run whose final (ε, δ) would not hold at δ."""
        try:
            self._epsilon_of_phases(phases, self.delta)
        except ValueError as err:
            _validate.fail(
                "steps",
                f"a run ending at step {end}",
                f"one ending where δ={self.delta} still holds the sampler's truncation slack "
                f"(refused before any step ran; the plan has steps={self.steps}; for a longer "
                f"run build make_private with more steps): {err}",
            )

    def __repr__(self) -> str:
        return (
            f"PrivateTraining(noise_multiplier={self.noise_multiplier:.4g}, "
            f"sampling_rate={self.sampling_rate:.4g}, steps={self.steps}, "
            f"l2_clip_norm={self.l2_clip_norm}, expected_batch_size={self.expected_batch_size:.4g}"
            f", max_batch_size={self.max_batch_size}, delta={self.delta})"
        )


def _event_of(plan: _plan.Plan, steps: int) -> PoissonSampledGaussianEvent:
    return PoissonSampledGaussianEvent(
        noise_multiplier=plan.noise_multiplier,
        sampling_rate=plan.sampling_rate,
        count=plan.accounted_steps(steps),
        relation=plan.relation,
        privacy_unit=_privacy_unit(plan),
    )


def _privacy_unit(plan: _plan.Plan) -> str:
    """The event's privacy unit: one record, or (user level) every record of one user of
    the plan's grouping."""
    return f"user:{plan.grouping:016x}" if plan.examples_per_user else "example"


def _overflow(plan: _plan.Plan) -> float:
    """p̄ = P[Binomial(n + 1, q) > cap]: overflow chance per step of ``plan``'s sampler."""
    capped = dataclasses.replace(
        _event_of(plan, 1),
        dataset_size=plan.accounted_dataset_size(),
        max_batch_size=plan.max_batch_size,
    )
    return capped.overflow_probability


def _slack(epsilon: float, overflow: float) -> float:
    """(1 + e^ε)·(Σ t·p̄): the truncation slack (0 when nothing can overflow)."""
    return truncation_slack(epsilon, overflow)


def _first_steps(phases: list[tuple[Any, int]], t: int) -> list[tuple[Any, int]]:
    """The phases of the first ``t`` steps of a run whose phases are ``phases``."""
    out, left = [], t
    for plan, steps in phases:
        out.append((plan, min(steps, left)))
        left -= out[-1][1]
    return out


def _rekeyed(state: PrivateState, key: jax.Array) -> PrivateState:
    """``state`` with its sampling key and every noise state's key data drawn from ``key``."""
    train_key, noise_key = jax.random.split(key)
    return state._replace(
        key=jax.random.key_data(train_key),
        opt_state=rekeyed_noise_states(state.opt_state, noise_key),
    )


def _is_state_node(x: Any) -> bool:
    """A NamedTuple state of an optax or dpjax transformation (not ``optax.MaskedNode``, which
    stands for a masked-out parameter leaf inside a parameter-shaped tree)."""
    module = type(x).__module__ or ""
    return (
        isinstance(x, tuple)
        and hasattr(x, "_fields")
        and module.startswith(("optax", "dpjax"))
        and type(x).__name__ != "MaskedNode"
    )


def _holds_state_nodes(x: Any) -> bool:
    return any(_is_state_node(n) for n in jax.tree.leaves(x, is_leaf=_is_state_node))


def _state_skeleton(x: Any) -> Any:
    """The nesting of the transformation states in an optimizer state, with every subtree that
    holds no transformation state (parameter-shaped moments, counts, None) as ``"*"``."""
    if not _holds_state_nodes(x) and not _is_state_node(x):
        return "*"
    if _is_state_node(x):
        return (type(x).__qualname__, tuple(_state_skeleton(v) for v in x))
    if isinstance(x, (tuple, list)):
        return ("seq", tuple(_state_skeleton(v) for v in x))
    if isinstance(x, dict):
        return ("dict", tuple((k, _state_skeleton(x[k])) for k in sorted(x, key=str)))
    return "*"


def _skeleton_names(skeleton: Any) -> str:
    """The state types of a skeleton, in order (for error messages)."""
    if not isinstance(skeleton, tuple):
        return ""
    head, children = skeleton
    inner = [n for c in children for n in [_skeleton_names(c[1] if head == "dict" else c)] if n]
    names = ([] if head in ("seq", "dict") else [head]) + inner
    return ", ".join(names)


def _as_private_state(state: Any) -> PrivateState:
    """``state`` if it is a :class:`PrivateState` (a pre-ledger 3-field state is refused)."""
    if not isinstance(state, PrivateState):
        _validate.fail(
            "state",
            type(state).__name__,
            "a PrivateState from init / step / fit / continue_from (a PublicState holds no "
            "keys and cannot be stepped)",
        )
    return state


def _steps_of(state: Any) -> int:
    """The step count t ≥ 0 of a state (read on the host) or an integer."""
    is_state = isinstance(state, (PrivateState, PublicState))
    value = jax.device_get(state.step) if is_state else state
    t = _validate.integer("state.step", value)
    _validate.non_negative("state.step", t)
    return t


def _progress_bar(total: int, enabled: bool) -> Any:
    """A tqdm bar, or None when disabled or tqdm is not installed (optional dependency)."""
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc="DP-SGD", unit="step")


# ----------------------------------------------------------------------------- make_private


def _resolve_steps(n: int, batch_size: int, epochs: Any, steps: Any) -> int:
    if (epochs is None) == (steps is None):
        _validate.fail(
            "epochs",
            epochs,
            f"given, with steps=None (exactly one of epochs and steps; got steps={steps!r})",
        )
    if steps is not None:
        return _validate.positive_int("steps", steps)
    return poisson_schedule(n, batch_size, epochs)[1]


#: ε at or above this is reported as inf: e^ε overflows, so no truncation slack can be bounded.
NOT_PRIVATE_EPSILON = 700.0
#: The smallest positive σ make_private accepts. Below about 1e-151 the accountants' float64
#: arithmetic breaks (σ² underflows: the PLD grid divided by 0; the RDP bound overflowed to a
#: NaN read as ε = 0); σ = 1e-100 already gives ε ≈ 1e200, so nothing usable is refused.
MIN_NOISE_MULTIPLIER = 1e-100
#: The largest noise std σ·C make_private accepts: the noise is drawn in (at least) float32,
#: whose largest finite value this is (above it every update was NaN).
MAX_NOISE_STD = float(jnp.finfo(jnp.float32).max)
#: PLD grid of the ε that sizes the sampler's cap when σ is given: a valid (pessimistic) upper
#: bound at 1–5 % of the cost of the default grid (the cap depends on ε only through
#: e^ε·tail, so a looser ε adds a row or two at most); ``epsilon(state)`` is full precision.
_CAP_GRID = 1e-2


def _not_private(reason: str) -> None:
    warnings.warn(
        f"make_private: NOT PRIVATE — {reason}; epsilon(state) reports inf (a clip-only "
        "baseline for comparison, not a private run)",
        PrivacyLeakWarning,
        stacklevel=3,
    )


def _resolve_noise(
    noise_multiplier: Any,
    target_epsilon: Any,
    *,
    delta: float,
    q: float,
    steps: int,
    accounting: str,
) -> tuple[float, float]:
    """(σ, an upper bound on ε after ``steps`` at δ·(1 − SLACK_FRACTION); inf: not private).

    σ = 0 (clipping only) and σ so small that ε ≥ :data:`NOT_PRIVATE_EPSILON` are allowed and
    warned about (:class:`dpjax.PrivacyLeakWarning`, "NOT PRIVATE"); their bound is inf. A PLD
    grid too large to build falls back to RDP (a warning says so).
    """
    if (noise_multiplier is None) == (target_epsilon is None):
        _validate.fail(
            "noise_multiplier",
            noise_multiplier,
            "given, with target_epsilon=None (exactly one of noise_multiplier and "
            f"target_epsilon; got target_epsilon={target_epsilon!r})",
        )
    accounted = delta * (1.0 - SLACK_FRACTION)
    if target_epsilon is not None:
        target = _validate.epsilon("target_epsilon", target_epsilon)
        if target >= NOT_PRIVATE_EPSILON:
            _validate.fail("target_epsilon", target, f"< {NOT_PRIVATE_EPSILON:g} (e^ε finite)")
        sigma = calibrate_noise_multiplier(
            target_epsilon=target,
            delta=accounted,
            sampling_rate=q,
            steps=steps,
            accounting=accounting,
        )
        return sigma, target
    sigma = _validate.non_negative("noise_multiplier", noise_multiplier)
    if sigma == 0.0:
        _not_private("noise_multiplier=0: the clipped sums are released without noise")
        return sigma, math.inf
    if sigma < MIN_NOISE_MULTIPLIER:
        _validate.fail(
            "noise_multiplier",
            noise_multiplier,
            f"0 (the clip-only baseline, NOT private) or ≥ {MIN_NOISE_MULTIPLIER:g} (a smaller "
            "σ overflows the accountant's float64 arithmetic; its ε would exceed 1e190)",
        )
    eps = _epsilon_bound(sigma, q, steps, accounted, accounting)
    if eps >= NOT_PRIVATE_EPSILON:
        _not_private(f"noise_multiplier={sigma:g} gives ε = {eps:g} ≥ {NOT_PRIVATE_EPSILON:g}")
        return sigma, math.inf
    return sigma, eps


def _epsilon_bound(sigma: float, q: float, steps: int, delta: float, accounting: str) -> float:
    """An upper bound on ε(δ) of ``steps`` steps (PLD on a coarser grid, or RDP)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PLDGridCoarsenedWarning)
            return cached_dp_sgd_epsilon(
                noise_multiplier=sigma,
                sampling_rate=q,
                steps=steps,
                delta=delta,
                accounting=accounting,
                value_discretization_interval=_CAP_GRID,
            )
    except PLDGridTooLargeError:
        return _rdp_fallback(sigma, q, steps, delta)


def _rdp_fallback(sigma: float, q: float, steps: int, delta: float) -> float:
    warnings.warn(
        f"make_private: the PLD grid of noise_multiplier={sigma:g} cannot be built; ε is "
        "accounted by RDP instead (an upper bound, looser)",
        UserWarning,
        stacklevel=4,
    )
    eps = cached_dp_sgd_epsilon(
        noise_multiplier=sigma, sampling_rate=q, steps=steps, delta=delta, accounting="rdp"
    )
    return eps if math.isfinite(eps) else math.inf


def _plan_is_not_private(private: PrivateTraining, accounted: float) -> bool:
    """Whether make_private's ε bound for the whole plan reached 700 (cached, silent)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bound = _epsilon_bound(
            private.noise_multiplier,
            private.sampling_rate,
            private._plan.accounted_steps(private.steps),
            accounted,
            private.accounting,
        )
    return bound >= NOT_PRIVATE_EPSILON


#: Overflow tails below this (per step) come from e^ε, not from the batch (a calibrated ε this
#: large leaves no room for the truncation slack whatever the cap).
_TAIL_FLOOR = 1e-250


def _sampler_for_slack(
    n: int, requested_q: float, *, steps: int, epsilon: float, delta: float, calibrated: bool
) -> PoissonSampler:
    """A PoissonSampler whose cap keeps the truncation slack of ``steps`` steps ≤ SLACK·δ.

    ``epsilon = inf`` (a run that is not private): the cap is sized as for ε = 0, which keeps
    drops rare (at most SLACK·δ/2 over the run); no slack can be bounded, none is claimed.
    """
    budget = SLACK_FRACTION * delta
    q = realised_sampling_rate(requested_q)
    private = math.isfinite(epsilon)
    tail = budget / (steps * (1.0 + (math.exp(epsilon) if private else 1.0)))
    cap = min(n, _binomial_cap(n + 1, q, tail))
    sampler = PoissonSampler(dataset_size=n, sampling_rate=requested_q, max_batch_size=cap)
    if private and sampler.delta_slack(steps, epsilon) > budget:
        if calibrated and tail < _TAIL_FLOOR:
            _validate.fail(
                "target_epsilon",
                epsilon,
                f"small enough that the sampler's truncation slack (1 + e^ε)·T·p̄ can fit in "
                f"δ: at ε = {epsilon:g} a padded batch may overflow with probability at most "
                f"{tail:.3g} per step, below what any cap of n rows reaches",
            )
        _validate.fail(
            "batch_size",
            f"{requested_q * n:g} (q = {q:.4g})",
            "small enough that a padded batch of at most n rows overflows with probability "
            f"≤ {tail:.3g} per step (use a smaller batch_size or the full-batch DP-GD of "
            f"dpjax.erm; the per-step bound shrinks as e^-ε, here ε = {epsilon:.4g})",
        )
    return sampler


def make_private(
    loss_fn: Callable[..., jax.Array],
    *,
    optimizer: optax.GradientTransformation,
    l2_clip_norm: float | adaptive_clip.AdaptiveClip,
    dataset_size: int,
    batch_size: int,
    delta: float,
    key: jax.Array,
    epochs: float | None = None,
    steps: int | None = None,
    noise_multiplier: float | None = None,
    target_epsilon: float | None = None,
    physical_batch_size: int | None = None,
    clipping: str = "auto",
    accounting: str = "pld",
    user_ids: Any = None,
    noise: Any = None,
) -> PrivateTraining:
    r"""DP-SGD in one call: Poisson sampling, per-example clipping, noise once, accounting.

    Like Opacus' ``make_private`` / ``make_private_with_epsilon``: give either
    ``noise_multiplier`` σ or ``target_epsilon`` (σ is then calibrated with
    :func:`dpjax.accounting.calibrate_noise_multiplier` for the planned run), and either
    ``epochs`` (T = ⌈epochs·n/b⌉, :func:`poisson_schedule`) or ``steps`` T.

    Args:
        loss_fn: the loss of ONE example: ``loss_fn(params, example)``, or
            ``loss_fn(params, example, rng)`` (a parameter named ``rng``) to receive a JAX key
            for dropout, distinct for every (step, example) — fold ``step`` and the example's
            dataset index. ``example`` is one row of ``data`` (same pytree structure). For
            flax linen use ``model.apply({"params": params}, x, rngs={"dropout": rng})``; for
            flax nnx build it with :func:`nnx_loss`.
        optimizer: any optax optimizer; it sees the noisy normalised gradient.
        l2_clip_norm: C > 0, the per-example clip norm; or a
            :class:`~dpjax.dp_sgd.AdaptiveClip` (Andrew et al. 2021): C_t follows a target
            quantile of the per-example norms from a noisy count of unclipped examples
            (:mod:`dpjax.dp_sgd.adaptive_clip`). σ is then the ACCOUNTED noise multiplier:
            the clipped sum gets σ_Δ = (σ⁻² − (2σ_b)⁻²)^(−1/2) (needs σ_b > σ/2), the run is
            accounted as DP-SGD at σ, and C_t is kept in ``state.opt_state[0]``
            (:meth:`PrivateTraining.clip_norm`; published by ``public_state``).
        dataset_size: n ≥ 1, the number of records (the leading axis of ``data``).
        batch_size: b in [1, n], the EXPECTED logical batch: q = b/n.
        delta: δ in (0, 1) of the reported guarantee (the truncation slack of the padded
            sampler is paid from it; see "Formal guarantees"). δ ≥ 1/n warns
            (:class:`dpjax.PrivacyLeakWarning`): it permits releasing a whole record.
        key: a JAX PRNG key; split into the noise key and the sampling/dropout key (each split
            again at every step, never reused; one run per object: ``init`` and ``fit``
            without ``state`` refuse a second). The whole run is a function of it: use a NEW
            key for every ``make_private`` (``dpjax.os_key()`` or ``jax.random.key`` of a
            fresh seed). Two objects built with one key draw the same batches and the same
            noise: on neighbouring data sets D, D′ the difference of their first updates is
            (S_D − S_D′)/(q·n) with NO noise, which shows whether (and in which direction) the
            differing record moved the model; in a hyperparameter sweep on one data set the
            difference of two runs' updates is noise-free as well, so releasing both is not
            the composition of two private runs the accountant would assume.
        epochs: expected passes over the data (> 0); or give ``steps``.
        steps: T ≥ 1 noisy updates; or give ``epochs``.
        noise_multiplier: σ ≥ 0; or give ``target_epsilon`` (never a default). σ = 0 is the
            clip-only baseline: allowed, NOT private — a :class:`dpjax.PrivacyLeakWarning` at
            construction and ``epsilon(state) = inf``; so is a σ whose ε reaches 700.
        target_epsilon: ε > 0 to reach after T steps at ``delta``; or give ``noise_multiplier``.
        physical_batch_size: rows processed at once (memory). When smaller than the padded
            batch, each Poisson batch is split into micro-batches
            (:meth:`~dpjax.dp_sgd.PaddedBatch.micro_batches`: every record in exactly one),
            their clipped sums accumulated and the noise added ONCE; ε is unchanged. All
            micro-batches run, padding-only ones included (time does not depend on the
            realised batch size).
        clipping: the clipping backend of :func:`~dpjax.dp_sgd.clipped_grad`: "auto", "vmap"
            or "ghost".
        accounting: "pld" (tight) or "rdp".
        user_ids: None (example-level DP), or user-level DP: an int array of length
            ``dataset_size``, one PUBLIC user id per row (or a
            :class:`~dpjax.dp_sgd.UserGrouping` from :func:`~dpjax.dp_sgd.group_users`, to cap
            the rows per user). Then neighbouring data sets differ in ALL rows of one user,
            ``batch_size`` is the expected number of USERS per batch (q = b/U over the U
            users; ``epochs`` counts passes over the users), ``dataset_size`` stays the
            number of rows, ``physical_batch_size`` counts rows (micro-batches of
            ⌊physical_batch_size/k⌋ users), ``clipping`` must be "auto" or "vmap", and ε is
            user-level: see :class:`~dpjax.dp_sgd.UserLevelTraining`.
        noise: None (DP-SGD: independent noise, Poisson sampling of all n records) or
            ``dpjax.dp_sgd.BandMF(bands=b)``: the correlated noise σ·C·(C⁻¹Z)_t of a b-banded
            strategy C (:mod:`dpjax.dp_sgd.matrix_factorization`) with cyclic Poisson
            sampling — step t samples part t mod b of the records (i mod b = part) at rate
            q = batch_size/⌈n/b⌉, and ε is that of DP-SGD over ⌈T/b⌉ rounds at σ (C has max
            column norm 1). ``batch_size`` must be ≤ ⌈n/b⌉. The parts are ROW INDICES, so
            the order of ``data``'s rows is part of the plan: resume such a run only on the
            same rows in the same order (a record moved to another part can be sampled in
            adjacent steps, which the ⌈T/b⌉-round accounting does not cover).

    Returns:
        A :class:`PrivateTraining` with ``noise_multiplier``, ``sampling_rate``, ``steps``,
        ``l2_clip_norm``, ``expected_batch_size``, ``delta``, ``init(params)``,
        ``step(params, state, data)``, ``epsilon(state)``, ``fit(params, data)``.

    Raises:
        ValueError: a bad argument (named, with its valid range); both or neither of
            ``epochs``/``steps`` or of ``noise_multiplier``/``target_epsilon``.
        TypeError: ``key`` missing or not a JAX PRNG key.

    Formal guarantees:
        Each update is the Gaussian mechanism with standard deviation σ·C on the clipped sum of
        a Poisson-sampled batch; that sum has ℓ2 sensitivity C under add/remove-one (each
        record contributes at most C, certified in floating point by
        :func:`~dpjax.dp_sgd.clipped_grad`; padding rows contribute exactly 0; splitting into
        micro-batches leaves the sum of the one Poisson batch unchanged). The normalisation by
        the public constant q·n, the optimizer and dropout (keys independent of the data) are
        post-processing. T updates are accounted as one
        ``PoissonSampledGaussianEvent(σ, q, count=T)`` — the Poisson subsampled Gaussian
        mechanism composed T times (Abadi et al. 2016, "Deep learning with differential
        privacy"; lecture on ML under DP, amplification by subsampling), evaluated by PLD
        (dp-accounting; Doroshenko et al. 2022) or RDP (Mironov et al. 2019, "Rényi
        differential privacy of the sampled Gaussian mechanism"), at δ·(1 − 10⁻³). The padded
        sampler drops records only if more than ``max_batch_size`` are drawn; its cap is chosen
        so that the resulting slack (1 + e^ε)·T·p̄ (see :class:`~dpjax.dp_sgd.PoissonSampler`)
        is ≤ 10⁻³·δ, so ``epsilon(state)`` is an (ε, δ) guarantee with the slack included.
        What it covers: the sequence of parameters θ₁, …, θ_t and
        :meth:`~PrivateTraining.public_state` (step count, optimizer moments with the noise
        states reduced to their counts, the plan ledger, (ε, δ)) — functions of the noisy sums
        and public constants. NOT covered: the keys — the :class:`PrivateState` is a SECRET
        checkpoint (its key data fixes every later batch and noise draw: with it and one later
        model the noise-free clipped sum is recovered) — and the ``metrics`` of ``step`` /
        ``fit`` (realised batch size, loss), which are not private. Resume: a state restored
        from its checkpoint continues its key streams (nothing is replayed); ``step`` and
        ``fit`` refuse a state whose current phase is another plan (σ, q, C, normaliser, n,
        cap, relation); :meth:`~PrivateTraining.continue_from` opens a new phase and
        ``epsilon`` then reports the composition of all phases (tight when the truncation slack
        fits at the composed ε, else the basic composition of the phases). Re-run: one run per
        object (``init``, ``fit`` without ``state``); a new run needs a new key. Out of scope
        (the accounting trusts the state): editing ``step`` or ``plan`` by hand, stepping twice
        from one state, and two objects sharing a key. Past the plan: ``fit`` refuses before
        its first step a run whose δ could not hold the truncation slack and warns once
        otherwise; ``step`` is traced code and is not refused: ``epsilon(state)`` counts every
        step taken, warns past the plan, and raises if the slack no longer fits in δ.
        ``dataset_size`` is public (it fixes the cap and the normaliser q·n, and ``step``
        refuses data of any other length): a removed record is modelled as a row that is never
        sampled and contributes 0 ("zero-out" neighbours, Kairouz et al. 2021, "Practical and
        private (deep) learning without sampling or shuffling"), which the Poisson
        add/remove-one analysis covers; the cap is sized for n + 1 rows. With ``user_ids``
        every statement above holds with "user" for "record": each sampled user contributes
        one vector of norm ≤ C (the mean of its rows' clipped gradients, re-clipped and
        certified: :func:`~dpjax.dp_sgd.clipped_user_sum`), users are Poisson-sampled at q =
        b/U, the normaliser is q·U and the event is ``PoissonSampledGaussianEvent(σ, q, T)``
        over users (McMahan et al. 2018, "Learning differentially private recurrent language
        models"); the grouping is public and recorded in the plan.
        Adaptive clipping
        (``l2_clip_norm=AdaptiveClip(...)``): each step is the Gaussian mechanism on the pair
        (clipped sum in units of C_t, centred unclipped count) with noise (σ_Δ, σ_b) and
        sensitivities (1, 1/2), i.e. noise multiplier σ (Andrew et al. 2021, "Differentially
        private learning with adaptive clipping", Theorem 1); T steps are accounted as the
        same ``PoissonSampledGaussianEvent(σ, q, count=T)``. C_t is a function of earlier
        noisy releases: public, published in ``public_state`` and covered by the guarantee;
        the plan ledger records (C_0, γ, η, σ_b), so a resume under another config is refused
        (see :mod:`dpjax.dp_sgd.adaptive_clip`).
        With ``noise=BandMF(bands=b)`` the noise of step t is σ·C·(C⁻¹Z)_t for the b-banded C
        (max column norm 1) and step t samples only part t mod b: the run is accounted as
        ``PoissonSampledGaussianEvent(σ, q, count=⌈T/b⌉)`` on parts of ⌈n/b⌉ records
        (Choquette-Choo et al. 2023, "(Amplified) banded matrix factorization", Theorem 4);
        the noise buffers of the state are secret like its keys (``public_state`` drops them),
        and the strategy covers T steps: steps past T are refused (NaN under ``jit``). A
        record's part is its row index mod b, so the guarantee covers a run whose every step
        sees the rows of its first step in the same order: the SECRET state records a digest
        of the rows keyed by the run's key (never the public ledger) and ``step``/``fit``
        refuse other data or another row order (NaN under ``jit``).

    Example:
        >>> import jax, jax.numpy as jnp, optax, dpjax
        >>> x = jax.random.normal(jax.random.key(1), (200, 3))
        >>> data = {"x": x, "y": x @ jnp.array([1.0, -2.0, 0.5])}
        >>> loss_fn = lambda w, ex: 0.5 * (ex["x"] @ w - ex["y"]) ** 2
        >>> private = dpjax.make_private(loss_fn, optimizer=optax.sgd(0.1), l2_clip_norm=1.0,
        ...     dataset_size=200, batch_size=20, epochs=2, noise_multiplier=1.0, delta=1e-5,
        ...     key=jax.random.key(0))
        >>> private.steps, private.expected_batch_size
        (20, 20.0)
        >>> w, state, history = private.fit(jnp.zeros(3), data, progress=False)
        >>> int(state.step), round(private.epsilon(state), 2)
        (20, 3.59)
    """
    if not callable(loss_fn):
        _validate.fail("loss_fn", loss_fn, "a callable loss_fn(params, example[, rng])")
    if not isinstance(optimizer, optax.GradientTransformation):
        _validate.fail("optimizer", optimizer, "an optax.GradientTransformation")
    key = _check_key(key)
    l2_clip_norm = adaptive_clip.resolve_clip(l2_clip_norm)
    rows = _validate.positive_int("dataset_size", dataset_size)
    grouping = None
    if user_ids is not None:  # user level: the sampled units are users (dpjax.dp_sgd.user_level)
        from dpjax.dp_sgd import user_level  # noqa: PLC0415 (it subclasses PrivateTraining)

        if isinstance(l2_clip_norm, adaptive_clip.AdaptiveClip):
            _validate.fail(
                "l2_clip_norm",
                l2_clip_norm,
                "a float C > 0 with user_ids (adaptive clipping is example level only)",
            )
        grouping = user_level.as_grouping(user_ids, rows)
    n = rows if grouping is None else grouping.num_users
    batch_size = _validate.positive_int("batch_size", batch_size)
    if batch_size > n:
        units = "dataset_size" if grouping is None else "the number of users"
        _validate.fail("batch_size", batch_size, f"in [1, {units}={n}]")
    delta = _validate.in_range("delta", delta, 0.0, 1.0, low_inclusive=False)
    warn_if_delta_reveals_records(delta, n, "make_private")
    _validate.one_of("clipping", clipping, CLIPPING_BACKENDS)
    _validate.one_of("accounting", accounting, ACCOUNTING_METHODS)
    if physical_batch_size is not None:
        physical_batch_size = _validate.positive_int("physical_batch_size", physical_batch_size)
    steps = _resolve_steps(n, batch_size, epochs, steps)
    q, records, rounds = batch_size / n, n, steps
    if noise is not None and (
        grouping is not None or isinstance(l2_clip_norm, adaptive_clip.AdaptiveClip)
    ):
        _validate.fail(
            "noise",
            noise,
            "None with user_ids or an AdaptiveClip (correlated noise is analysed here for "
            "example-level DP-SGD with a fixed C only)",
        )
    if noise is not None:  # banded MF: DP-SGD over ⌈T/b⌉ rounds of parts of ⌈n/b⌉ records
        noise = _resolve_mf_noise(noise, dataset_size=n, batch_size=batch_size, steps=steps)
        q, records, rounds = noise.sampling_rate, noise.part_size, noise.rounds(steps)
    sigma, eps_bound = _resolve_noise(
        noise_multiplier,
        target_epsilon,
        delta=delta,
        q=realised_sampling_rate(q),
        steps=rounds,
        accounting=accounting,
    )
    adaptive_clip.check_budget(l2_clip_norm, sigma)
    _check_noise_std(l2_clip_norm, sigma)
    sampler = _sampler_for_slack(
        records,
        q,
        steps=rounds,
        epsilon=eps_bound,
        delta=delta,
        calibrated=target_epsilon is not None,
    )
    if noise is not None:
        sampler = noise.sampler(sampler, n)
    cls, unit = PrivateTraining, {}
    if grouping is not None:
        cls, unit = user_level.UserLevelTraining, {"grouping": grouping}
    return cls(
        **unit,
        loss_fn=loss_fn,
        optimizer=optimizer,
        sampler=sampler,
        noise_multiplier=sigma,
        l2_clip_norm=l2_clip_norm,
        steps=steps,
        delta=delta,
        key=key,
        physical_batch_size=physical_batch_size,
        clipping=clipping,
        accounting=accounting,
        noise=noise,
    )


def _check_noise_std(l2_clip_norm: Any, sigma: float) -> None:
    """Refuse a fixed C whose noise std σ·C overflows float32 (every update would be NaN)."""
    if isinstance(l2_clip_norm, adaptive_clip.AdaptiveClip):
        return
    if sigma * float(l2_clip_norm) > MAX_NOISE_STD:
        _validate.fail(
            "l2_clip_norm",
            l2_clip_norm,
            f"small enough that the noise std noise_multiplier·l2_clip_norm = "
            f"{sigma:g}·{float(l2_clip_norm):g} is at most {MAX_NOISE_STD:.4g} (float32's "
            "largest value: a larger std overflows and every update is NaN)",
        )


def _resolve_mf_noise(noise: Any, **kwargs: Any) -> Any:
    """The ``noise=`` switch fixed for this run (see :mod:`~dpjax.dp_sgd.matrix_factorization`)."""
    from dpjax.dp_sgd.matrix_factorization.config import BandMF  # noqa: PLC0415

    if not isinstance(noise, BandMF):
        _validate.fail("noise", noise, "None (DP-SGD) or dpjax.dp_sgd.BandMF(bands=b)")
    return noise.resolve(**kwargs)
