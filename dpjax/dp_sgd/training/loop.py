"""The training object :class:`PrivateTraining`: one run's keys, states and training loop.

Built by :func:`~dpjax.make_private`. It holds the pipeline (noise → ÷ q·n → optimizer, the
clipped gradient, the sampler) and the plan; issues a run's keys once (``init``), restores
(``state_template``), continues another plan's state (``continue_from``), publishes
(``public_state``) and runs the loop (``fit``). The update is :class:`~.step.Stepping`, the
privacy spent :class:`~.accounting.PhaseAccounting`, ``continue_from`` (another plan, or a new
key for a re-run) :class:`~.resume.Resuming` (its three mixins).
"""

from __future__ import annotations

import inspect
import os
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from dpjax import _validate
from dpjax.accounting.filters import BudgetExhaustedError
from dpjax.dp_sgd import adaptive_clip, sharded
from dpjax.dp_sgd._frozen import ReadOnlyAfterInit
from dpjax.dp_sgd.clipping import clipped_grad
from dpjax.dp_sgd.matrix_factorization import row_order as _row_order
from dpjax.dp_sgd.samplers import PoissonSampler
from dpjax.dp_sgd.training import hooks as _hooks
from dpjax.dp_sgd.training import ledger as _plan
from dpjax.dp_sgd.training.accounting import PhaseAccounting
from dpjax.dp_sgd.training.resume import Resuming
from dpjax.dp_sgd.training.state import PrivateState, PublicState, _as_private_state
from dpjax.dp_sgd.training.step import Stepping
from dpjax.dp_sgd.transforms import (
    _gaussian_noise_at_runtime_stddev,
    add_gaussian_noise,
    normalize_by,
    public_opt_state,
)
from dpjax.events import PoissonSampledGaussianEvent
from dpjax.relation import ADD_OR_REMOVE_ONE

__all__ = ["PrivateTraining"]


class PrivateTraining(PhaseAccounting, Stepping, Resuming, ReadOnlyAfterInit):
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
        layer_clip_norms: Any = None,
        gamma: float | None = None,
        layout: Any = None,
        budget: Any = None,
        budget_slack: float = 0.0,
        public: Any = None,
    ):
        self.loss_fn = loss_fn
        #: the PUBLIC pytree passed to ``loss_fn(params, example, public=...)`` (an argument
        #: of the compiled step, never differentiated, clipped, noised or updated), or None
        self.public = _check_public(public, loss_fn)
        #: the :class:`~dpjax.accounting.PrivacyFilter` every step is charged to, or None
        self.budget = budget
        #: the :class:`~dpjax.dp_sgd.MeshLayout` of sharded parameters, or None (one device)
        self.layout = layout
        #: the resolved correlated noise (``make_private(noise=BandMF(b))``), or None: DP-SGD
        self.noise = noise
        self.sampler = sampler
        self.noise_multiplier = noise_multiplier
        self.sampling_rate = sampler.sampling_rate
        self.steps = steps
        self.l2_clip_norm = l2_clip_norm
        #: per-layer clipping: the pytree (or float C, split C/√L) of per-leaf norms c_l,
        #: ``l2_clip_norm`` being their total sqrt(Σ c_l²); None: one norm for the whole gradient
        self.layer_clip_norms = layer_clip_norms
        #: γ of automatic clipping (``l2_clip_norm`` is then its scale R), or None
        self.gamma = gamma
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
        #: σ·C, passed by ``step`` to the compiled update as an argument (plain DP-SGD: one
        #: device, independent noise, fixed C); None: σ·C is a constant of the compiled step
        self._runtime_stddev = (
            float(noise_multiplier * l2_clip_norm)
            if not self._adaptive and noise is None and layout is None
            else None
        )
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
                self._noise_transform(noise_multiplier * l2_clip_norm, noise_key),
                normalize_by(self.expected_batch_size),
                optimizer,
            )
            loss, c = self._example_loss, l2_clip_norm
        self.grad_fn = clipped_grad(
            loss,
            l2_clip_norm=c if layer_clip_norms is None else layer_clip_norms,
            backend=clipping,
            per_layer=layer_clip_norms is not None,
            clip_rule="flat" if gamma is None else "automatic",
            gamma=0.01 if gamma is None else gamma,
        )
        if layout is not None:  # parameters sharded on a mesh (dpjax.dp_sgd.sharded)
            self.grad_fn = sharded.sharded_clipped_grad(self.grad_fn, layout)
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
        #: one step's event, charged to ``budget`` before the step runs (the untruncated
        #: Poisson subsampled Gaussian; the truncation slack is reserved in the filter)
        self._step_event = None
        if budget is not None:  # make_private refuses a budget with σ = 0
            self._step_event = PoissonSampledGaussianEvent(
                noise_multiplier=float(noise_multiplier), sampling_rate=float(self.sampling_rate)
            )
            budget.reserve_delta(budget_slack)
        self._epsilons: dict[tuple[int, float], float] = {}
        self._composed: dict[tuple[Any, float], float] = {}
        # host-side bookkeeping (mutable contents of a frozen attribute): whether this object
        # has issued a run's keys (init / continue_from), and the last plan leaf checked
        self._host: dict[str, Any] = {"started": False, "verified": None}
        self._jitted_step = jax.jit(self._step_impl)
        self._freeze()

    def _noise_transform(self, stddev: float, key: jax.Array) -> optax.GradientTransformation:
        """N(0, stddev²) once per step: i.i.d., BandMF-correlated, or drawn shard by shard."""
        if self.noise is not None:
            return self.noise.transform(self.noise_multiplier, self.l2_clip_norm, key=key)
        if self.layout is not None:
            return sharded.add_sharded_gaussian_noise(stddev, key=key, layout=self.layout)
        if self._runtime_stddev is not None:  # σ·C an argument of the step (see step)
            return _gaussian_noise_at_runtime_stddev(stddev, key=key)
        return add_gaussian_noise(stddev, key=key)

    def _plan_unit(self) -> dict[str, int]:
        """The privacy unit's fields of the plan (none: example level; see user_level)."""
        return {}

    # ---- the per-example loss, with or without its dropout key

    def _example_loss(self, params: Any, example: Any, *key_data: jax.Array) -> jax.Array:
        extra = {} if self.public is None else {"public": self._traced_public()}
        if not self._uses_rng:
            return self.loss_fn(params, example, **extra)
        rng = jax.random.wrap_key_data(key_data[0], impl=self._impl)
        return self.loss_fn(params, example, rng=rng, **extra)

    def _traced_public(self) -> Any:
        """The public pytree as the argument of the step being traced (see ``_step_impl``)."""
        public = self._host.get("public_in_trace")
        if public is None:
            raise RuntimeError("the loss with public= is evaluated only inside the DP step")
        return public

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

    # ---- the run's states

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

    def public_state(self, state: PrivateState, delta: float | None = None) -> PublicState:
        """What may be published of ``state`` with the parameters: no key data.

        Keeps the step count, the optimizer's moments (noise states reduced to their counts),
        the phase ledger and (ε, δ) of the whole run (with ``make_private(budget=filter)``:
        the filter's ε and ``delta_total``, the guarantee of the adaptive interaction;
        ``delta`` is then ignored); drops the sampling/dropout key and the
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
        if self.budget is not None:  # the adaptive interaction's guarantee: the filter's
            eps, delta = self.budget.epsilon, self.budget.delta_total
        return PublicState(
            step=state.step,
            opt_state=public_opt_state(state.opt_state),
            plan=state.plan,
            epsilon=eps,
            delta=delta,
        )

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
        callbacks: list[_hooks.Callback] | None = None,
        checkpoint_every: int | None = None,
        checkpoint_dir: str | os.PathLike | None = None,
        log_to: str | os.PathLike | Callable | None = None,
    ) -> tuple[Any, PrivateState, dict]:
        """Run the remaining planned steps (or ``steps`` more), with hooks and a progress bar.

        The bar (tqdm; a warning once per process when it is not installed) shows the mean
        batch loss, refreshed every ``log_every`` steps (default: 20 refreshes per run), and
        ε at the end. Hooks (:mod:`dpjax.dp_sgd.training.hooks`): ``callbacks`` run after
        every step (public evaluations first); ``checkpoint_every``/``checkpoint_dir`` and
        ``log_to`` add a :class:`~dpjax.dp_sgd.Checkpoint` and a
        :class:`~dpjax.dp_sgd.CSVLogger`.

        Args:
            params: initial parameters.
            data: the training data (see :meth:`step`).
            state: resume from this state (default: ``init(params)``, allowed once per
                object: a second ``fit`` without ``state`` is refused, it would replay the
                first run's batches and noise).
            steps: number of steps to run (default: this plan's ``steps`` minus the steps
                the state already ran under this plan).
            progress: show the bar.
            log_every: the period in steps of the history, the bar and ``log_to``.
            callbacks: :class:`~dpjax.dp_sgd.Callback` s, e.g. :class:`~dpjax.dp_sgd.Evaluate`
                (public data only: ``eval_data_is_public=True`` is required, an evaluation
                on private data is an unaccounted release) and
                :class:`~dpjax.dp_sgd.EarlyStopping` (on a public evaluation metric only).
            checkpoint_every: save every k steps and after the last (with
                ``checkpoint_dir``): a SECRET state file (key data, mode 0600) and the
                publishable parameters and :meth:`public_state` beside it.
            checkpoint_dir: the folder of the checkpoints.
            log_to: a CSV path, or a callable ``log_to(step, values)`` (your TensorBoard or
                wandb writer): step, training loss (NOT private), ε and the public
                evaluation metrics, every ``log_every`` steps.

        Returns:
            ``(params, state, history)``; ``history`` (a dict) has lists ``step`` and
            ``loss`` recorded every ``log_every`` steps (the loss is NOT private),
            ``epsilon`` (ε after each recorded step, computed when first read), the public
            evaluations' lists (``eval_step`` and one per metric), and, when a callback
            stopped the run early, ``stopped_early`` (the reason) and ``epsilon_guarantee``
            (the ε of the planned steps: a stopping time chosen from the parameters is
            post-processing of the full plan, which is the guarantee to report; see
            :class:`~dpjax.dp_sgd.EarlyStopping`).

        Raises:
            ValueError: before any step runs: ``state`` omitted on an object that already
                ran, a state of another plan (see :meth:`continue_from`), bad ``data``
                (with ``noise=BandMF``: other rows, or another order, than the run's first
                step saw; see :meth:`step`), a run whose final step count would leave no
                room in δ for the truncation slack, or a bad hook argument (an evaluation
                not declared public, an early stop on a private metric, ``checkpoint_every``
                without ``checkpoint_dir``). Running past the planned ``steps`` warns once
                (with ``noise=BandMF``: refused, the factorization has n = ``steps`` rows).
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
        every = (
            max(1, todo // 20)
            if log_every is None
            else _validate.positive_int("log_every", log_every)
        )
        hooks = _hooks.fit_callbacks(
            callbacks,
            checkpoint_every=checkpoint_every,
            checkpoint_dir=checkpoint_dir,
            log_to=log_to,
            log_every=every,
        )
        hooks.sort(key=lambda hook: not isinstance(hook, _hooks.Evaluate))  # evaluations first
        state = self.init(params) if state is None else state
        data = jax.tree.map(jnp.asarray, data)  # on the device once, not at every step
        history = _hooks.TrainingHistory(
            {"step": [], "loss": []},
            # with a budget: the filter's ε (the steps' own ε is no adaptive guarantee)
            (lambda t: self.budget.epsilon)
            if self.budget is not None
            else (lambda t: self._epsilon_of_phases(after(t - done), self.delta)),
        )
        run = _hooks.FitRun(self, params, state, history, done)
        run.last_step = done + todo
        for hook in hooks:
            hook.on_fit_start(run)
        bar = _progress_bar(todo, progress)
        for i in range(todo):
            try:
                params, state, metrics = self.step(params, state, data)
            except BudgetExhaustedError as refused:
                run.stop(f"privacy budget exhausted before step {done + i + 1}: {refused}")
                warnings.warn(f"fit stopped: {run.stop_reason}", stacklevel=2)
                break
            run.params, run.state, run.metrics, run.step = params, state, metrics, done + i + 1
            run.public_metrics = {}
            for hook in hooks:
                hook.on_step_end(run)
            if (i + 1) % every == 0 or run.is_last:
                loss = float(metrics["loss"])
                history["step"].append(run.step)
                history["loss"].append(loss)
                if bar is not None:
                    bar.set_postfix(loss=f"{loss:.4f}")
            if bar is not None:
                bar.update(1)
            if run.stop_reason is not None:
                break
        for hook in hooks:
            hook.on_fit_end(run)
        if run.stop_reason is not None and run.step < run.last_step:
            history["stopped_early"] = run.stop_reason
            history["epsilon_guarantee"] = self._epsilon_of_phases(after(todo), self.delta)
        if self.budget is not None:  # the filter's ε holds for the whole adaptive interaction
            history["epsilon_guarantee"] = self.budget.epsilon
        if bar is not None:
            if history["loss"]:  # none when the budget refused the first step
                bar.set_postfix(loss=f"{history['loss'][-1]:.4f}", epsilon=f"{run.epsilon:.3f}")
            bar.close()
        return params, state, history

    def __repr__(self) -> str:
        return (
            f"PrivateTraining(noise_multiplier={self.noise_multiplier:.4g}, "
            f"sampling_rate={self.sampling_rate:.4g}, steps={self.steps}, "
            f"l2_clip_norm={self.l2_clip_norm}, expected_batch_size={self.expected_batch_size:.4g}"
            f", max_batch_size={self.max_batch_size}, delta={self.delta})"
        )


def _wants_rng(loss_fn: Callable) -> bool:
    """Whether ``loss_fn`` takes a parameter named ``rng`` (then it gets per-example keys)."""
    try:
        return "rng" in inspect.signature(loss_fn).parameters
    except (TypeError, ValueError):
        return False


def _progress_bar(total: int, enabled: bool) -> Any:
    """A tqdm bar, or None when disabled or when tqdm is not installed (then a warning, once:
    tqdm is an optional dependency, installed by the ``experiments`` extra)."""
    if not enabled:
        return None
    try:
        from tqdm import tqdm  # noqa: PLC0415 (optional dependency)
    except ImportError:
        warnings.warn(
            "fit(progress=True) shows a progress bar only with tqdm installed "
            "(pip install tqdm, or the experiments extra); pass progress=False to silence this",
            stacklevel=3,
        )
        return None
    return tqdm(total=total, desc="DP-SGD", unit="step")


def _check_public(public: Any, loss_fn: Callable) -> Any:
    """``public`` as a pytree of JAX arrays (None: none), for a ``loss_fn`` that takes it.

    Raises:
        ValueError: ``public`` has no leaf or a non-numeric leaf, or ``loss_fn`` has no
            parameter named ``public``.
    """
    if public is None:
        return None
    leaves = jax.tree.leaves(public)
    if not leaves or not all(_is_numeric_array(x) for x in leaves):
        _validate.fail("public", public, "None or a pytree of numeric arrays (one leaf or more)")
    try:
        takes = "public" in inspect.signature(loss_fn).parameters
    except (TypeError, ValueError):
        takes = False
    if not takes:
        _validate.fail(
            "public",
            "given for a loss_fn without a parameter named public",
            "None, or a loss_fn(params, example, public) that receives it",
        )
    return jax.tree.map(jnp.asarray, public)


def _is_numeric_array(x: Any) -> bool:
    try:
        return bool(jnp.issubdtype(jnp.result_type(x), jnp.number))
    except TypeError:
        return False
