r"""``make_private``: DP-SGD in one call — σ, C, the batch and the accountant stated once.

Opacus' ``make_private`` for JAX: from the loss of ONE example, an optax optimizer, the clip norm,
the data set size, the expected batch size and the length of training, :func:`make_private`
builds the whole pipeline of :mod:`dpjax.dp_sgd` and returns a :class:`PrivateTraining`::

    sampler (Poisson, padded, cap sized for δ)  ->  gather  ->  clipped_grad (mask applied)  ->
    [k micro-batches, sums accumulated]  ->  N(0, (σC)²) once  ->  ÷ q·n  ->  optimizer

with a jit-able ``step``, a host-side ``epsilon(state)`` read from the step count, and ``fit``
(a training loop with a tqdm progress bar showing loss and ε spent). The parts stay public.
"""

from __future__ import annotations

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
from dpjax.accounting.dp_sgd import calibrate_noise_multiplier, dp_sgd_epsilon
from dpjax.dp_sgd._frozen import ReadOnlyAfterInit
from dpjax.dp_sgd.clipping import BACKENDS as CLIPPING_BACKENDS
from dpjax.dp_sgd.clipping import clipped_grad
from dpjax.dp_sgd.samplers import (
    PaddedBatch,
    PoissonSampler,
    _binomial_cap,
    realised_sampling_rate,
)
from dpjax.dp_sgd.transforms import add_gaussian_noise, normalize_by
from dpjax.events import PoissonSampledGaussianEvent
from dpjax.relation import ADD_OR_REMOVE_ONE

__all__ = [
    "PrivateState",
    "PrivateTraining",
    "make_private",
    "nnx_loss",
    "poisson_schedule",
]

#: Share of δ set aside for the padded sampler's truncation slack: ε is accounted at
#: δ·(1 − SLACK_FRACTION) and the cap ``max_batch_size`` is chosen so the slack of the planned
#: run is ≤ SLACK_FRACTION·δ.
SLACK_FRACTION = 1e-3
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
    """Training state of :class:`PrivateTraining` (a pytree of arrays: checkpoint it whole).

    Attributes:
        step: int32 scalar, noisy updates applied so far (what ``epsilon`` reads).
        key: uint32 raw key data for sampling and dropout, split at every step.
        opt_state: the optax state of noise (its own key data) → ÷ q·n → optimizer.
    """

    step: jax.Array
    key: jax.Array
    opt_state: Any


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

    Attributes:
        noise_multiplier: σ (noise std σ·C on the clipped sum of each logical batch).
        sampling_rate: q, the rate the sampler realises (⌊q·2⁶⁴⌋/2⁶⁴; what is accounted).
        steps: T, the planned number of noisy updates (``fit`` runs them).
        l2_clip_norm: C.
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
        l2_clip_norm: float,
        steps: int,
        delta: float,
        key: jax.Array,
        physical_batch_size: int | None,
        clipping: str,
        accounting: str,
    ):
        self.loss_fn = loss_fn
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
        self._tx = optax.chain(
            add_gaussian_noise(noise_multiplier * l2_clip_norm, key=noise_key),
            normalize_by(self.expected_batch_size),
            optimizer,
        )
        self.grad_fn = clipped_grad(self._example_loss, l2_clip_norm=l2_clip_norm, backend=clipping)
        self._epsilons: dict[tuple[int, float], float] = {}
        self._jitted_step = jax.jit(self._step_impl)
        self._freeze()

    # ---- the per-example loss, with or without its dropout key

    def _example_loss(self, params: Any, example: Any, *key_data: jax.Array) -> jax.Array:
        if not self._uses_rng:
            return self.loss_fn(params, example)
        rng = jax.random.wrap_key_data(key_data[0], impl=self._impl)
        return self.loss_fn(params, example, rng=rng)

    def event(self, steps: int | None = None) -> PoissonSampledGaussianEvent:
        """The privacy event of ``steps`` (default: the planned T) noisy updates."""
        steps = self.steps if steps is None else _validate.positive_int("steps", steps)
        return self.sampler.event(noise_multiplier=self.noise_multiplier, steps=steps)

    def init(self, params: Any) -> PrivateState:
        """The initial :class:`PrivateState` (step 0; keys derived from ``make_private``'s key).

        Calling it twice gives the same state: start a NEW run with a new ``make_private`` key;
        resume a run from its saved state, never from ``init``.
        """
        return PrivateState(
            step=jnp.zeros((), jnp.int32),
            key=jax.random.key_data(self._train_key),
            opt_state=self._tx.init(params),
        )

    # ---- one step

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
        """
        self._check_data(data)
        return self._jitted_step(params, state, data)

    def _step_impl(self, params: Any, state: PrivateState, data: Any):
        key = jax.random.wrap_key_data(state.key, impl=self._impl)
        next_key, sample_key, dropout_key = jax.random.split(key, 3)
        batch = self.sampler.sample(sample_key)
        if self.physical_batch_size is None:
            clipped_sum, stats = self._clipped_part(params, data, batch, dropout_key)
        else:
            clipped_sum, stats = self._accumulate(params, data, batch, dropout_key)
        updates, opt_state = self._tx.update(clipped_sum, state.opt_state, params)
        params = optax.apply_updates(params, updates)
        loss_sum, size, num_clipped, num_nonfinite = stats
        metrics = {
            "loss": loss_sum / jnp.maximum(size, 1).astype(loss_sum.dtype),
            "batch_size": size,
            "num_clipped": num_clipped,
            "num_nonfinite": num_nonfinite,
        }
        new_state = PrivateState(state.step + 1, jax.random.key_data(next_key), opt_state)
        return params, new_state, metrics

    def _clipped_part(self, params: Any, data: Any, batch: PaddedBatch, dropout_key: jax.Array):
        """Clipped sum and (loss sum, size, #clipped, #non-finite) of one (micro-)batch."""
        examples = jax.tree.map(lambda x: jnp.take(x, batch.indices, axis=0), data)
        extra: tuple[jax.Array, ...] = ()
        if self._uses_rng:  # one stream per (step, dataset index): fold the index in
            fold = lambda i: jax.random.key_data(jax.random.fold_in(dropout_key, i))  # noqa: E731
            extra = (jax.vmap(fold)(batch.indices),)
        clipped_sum, info = self.grad_fn(params, examples, *extra, mask=batch.mask)
        in_axes = (None, 0) + (0,) * len(extra)
        losses = jax.vmap(self._example_loss, in_axes=in_axes)(params, examples, *extra)
        loss_sum = jnp.sum(jnp.where(batch.mask, losses, jnp.zeros((), losses.dtype)))
        size = jnp.sum(batch.mask, dtype=jnp.int32)
        return clipped_sum, (loss_sum, size, info.num_clipped, info.num_nonfinite)

    def _accumulate(self, params: Any, data: Any, batch: PaddedBatch, dropout_key: jax.Array):
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
            s, stats = self._clipped_part(params, data, PaddedBatch(*mb), dropout_key)
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
        shapes = jax.eval_shape(self._clipped_part, params, data, first, dropout_key)
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

    def epsilon(self, state: PrivateState | int, delta: float | None = None) -> float:
        """ε spent so far: the run of t = ``state.step`` updates is (ε, δ)-DP (add/remove-one).

        One ``PoissonSampledGaussianEvent(σ, q, count=t)`` is accounted (cost independent of
        how the steps were recorded; results cached per (t, δ)) at δ·(1 − ``SLACK_FRACTION``);
        the padded sampler's truncation slack (1 + e^ε)·t·p̄ must fit in the rest of δ, so the
        returned ε holds at ``delta`` with the slack INCLUDED. Steps beyond the planned
        ``steps`` are counted (a warning is issued): ε reflects the actual count.

        Args:
            state: a :class:`PrivateState` (its ``step`` is read on the host) or a step count t.
            delta: δ in (0, 1); default: ``make_private``'s δ.

        Returns:
            ε (0.0 before the first step).

        Raises:
            ValueError: ``delta`` too small to hold the truncation slack of this cap.
        """
        t = _steps_of(state)
        if delta is not None:
            delta = _validate.in_range("delta", delta, 0.0, 1.0, low_inclusive=False)
        delta = self.delta if delta is None else delta
        if t == 0:
            return 0.0
        if t > self.steps:
            warnings.warn(
                f"{t} steps run, beyond the planned steps={self.steps}: ε counts all of them",
                stacklevel=2,
            )
        cached = self._epsilons.get((t, delta))
        if cached is None:
            cached = self._epsilons[(t, delta)] = self._epsilon_uncached(t, delta)
        return cached

    def _epsilon_uncached(self, t: int, delta: float) -> float:
        accounted = delta * (1.0 - SLACK_FRACTION)
        eps = dp_sgd_epsilon(
            noise_multiplier=self.noise_multiplier,
            sampling_rate=self.sampling_rate,
            steps=t,
            delta=accounted,
            accounting=self.accounting,
        )
        slack = self.sampler.delta_slack(t, eps)
        if accounted + slack > delta:
            _validate.fail(
                "delta",
                delta,
                f"large enough to hold the sampler's truncation slack {slack:.3g} at "
                f"max_batch_size={self.max_batch_size} after {t} steps",
            )
        return eps

    def epsilon_history(self, state: PrivateState | int, num_points: int = 10) -> list:
        """``[(t, ε_t)]`` at ``num_points`` step counts evenly spaced in [1, state.step], at δ.

        Each point is one accounting call (cached), for plots of privacy spent over training.
        """
        total = _steps_of(state)
        num_points = _validate.positive_int("num_points", num_points)
        if total <= 0:
            return []
        points = sorted({max(1, round(total * (i + 1) / num_points)) for i in range(num_points)})
        return [(t, self.epsilon(t)) for t in points]

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
            state: resume from this state (default: ``init(params)``).
            steps: number of steps to run (default: ``self.steps − state.step``).
            progress: show the bar.
            log_every: refresh period in steps.

        Returns:
            ``(params, state, history)``; ``history`` has lists ``step``, ``loss``, ``epsilon``
            recorded at every refresh (loss is NOT private).
        """
        state = self.init(params) if state is None else state
        data = jax.tree.map(jnp.asarray, data)  # on the device once, not at every step
        done = int(jax.device_get(state.step))
        todo = (
            max(0, self.steps - done) if steps is None else _validate.positive_int("steps", steps)
        )
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
                loss, eps = float(metrics["loss"]), self.epsilon(done + i + 1)
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

    def __repr__(self) -> str:
        return (
            f"PrivateTraining(noise_multiplier={self.noise_multiplier:.4g}, "
            f"sampling_rate={self.sampling_rate:.4g}, steps={self.steps}, "
            f"l2_clip_norm={self.l2_clip_norm}, expected_batch_size={self.expected_batch_size:.4g}"
            f", max_batch_size={self.max_batch_size}, delta={self.delta})"
        )


def _steps_of(state: Any) -> int:
    """The step count t ≥ 0 of a :class:`PrivateState` (read on the host) or an integer."""
    value = jax.device_get(state.step) if isinstance(state, PrivateState) else state
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
        _validate.fail("epochs", epochs, "given, or steps given instead (exactly one of them)")
    if steps is not None:
        return _validate.positive_int("steps", steps)
    return poisson_schedule(n, batch_size, epochs)[1]


def _resolve_noise(
    noise_multiplier: Any,
    target_epsilon: Any,
    *,
    delta: float,
    q: float,
    steps: int,
    accounting: str,
) -> tuple[float, float]:
    """(σ, an upper bound on ε after ``steps`` at δ·(1 − SLACK_FRACTION))."""
    if (noise_multiplier is None) == (target_epsilon is None):
        _validate.fail(
            "noise_multiplier", noise_multiplier, "given, or target_epsilon given instead"
        )
    accounted = delta * (1.0 - SLACK_FRACTION)
    if target_epsilon is not None:
        target = _validate.epsilon("target_epsilon", target_epsilon)
        sigma = calibrate_noise_multiplier(
            target_epsilon=target,
            delta=accounted,
            sampling_rate=q,
            steps=steps,
            accounting=accounting,
        )
        return sigma, target
    sigma = _validate.positive("noise_multiplier", noise_multiplier)
    eps = dp_sgd_epsilon(
        noise_multiplier=sigma, sampling_rate=q, steps=steps, delta=accounted, accounting=accounting
    )
    return sigma, eps


def _sampler_for_slack(
    n: int, requested_q: float, *, steps: int, epsilon: float, delta: float, calibrated: bool
) -> PoissonSampler:
    """A PoissonSampler whose cap keeps the truncation slack of ``steps`` steps ≤ SLACK·δ."""
    budget = SLACK_FRACTION * delta
    q = realised_sampling_rate(requested_q)
    if epsilon >= 700.0:
        name = "target_epsilon" if calibrated else "noise_multiplier"
        _validate.fail(name, f"one giving ε = {epsilon:g}", "one giving ε < 700 (e^ε finite)")
    tail = budget / (steps * (1.0 + math.exp(epsilon)))
    cap = min(n, _binomial_cap(n + 1, q, tail))
    sampler = PoissonSampler(dataset_size=n, sampling_rate=requested_q, max_batch_size=cap)
    if sampler.delta_slack(steps, epsilon) > budget:
        _validate.fail(
            "batch_size",
            f"{requested_q * n:g} (q = {q:.4g})",
            "small enough that a padded batch of at most n rows overflows with probability "
            f"≤ {tail:.3g} per step (use a smaller batch_size or the full-batch DP-GD of "
            "dpjax.erm)",
        )
    return sampler


def make_private(
    loss_fn: Callable[..., jax.Array],
    *,
    optimizer: optax.GradientTransformation,
    l2_clip_norm: float,
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
        l2_clip_norm: C > 0, the per-example clip norm.
        dataset_size: n ≥ 1, the number of records (the leading axis of ``data``).
        batch_size: b in [1, n], the EXPECTED logical batch: q = b/n.
        delta: δ in (0, 1) of the reported guarantee (the truncation slack of the padded
            sampler is paid from it; see "Formal guarantees").
        key: a JAX PRNG key; split into the noise key and the sampling/dropout key (each split
            again at every step, never reused). The whole run is a function of it: use a NEW
            key for every run on the same data (two runs of a hyperparameter sweep with one key
            share their batches and noise draws, so their difference is noise-free and the
            sweep is not the composition the accountant would assume).
        epochs: expected passes over the data (> 0); or give ``steps``.
        steps: T ≥ 1 noisy updates; or give ``epochs``.
        noise_multiplier: σ > 0; or give ``target_epsilon``.
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
        The guarantee covers the released parameters and optimizer state, not the ``metrics``
        (realised batch size, loss), which are not private. Steps beyond the planned ``steps``
        are not refused (``step`` is traced code): ``epsilon(state)`` counts every step taken,
        warns past the plan, and raises if the truncation slack no longer fits in δ.
        ``dataset_size`` is public (it fixes the cap and the normaliser q·n, and ``step``
        refuses data of any other length): a removed record is modelled as a row that is never
        sampled and contributes 0 ("zero-out" neighbours, Kairouz et al. 2021, "Practical and
        private (deep) learning without sampling or shuffling"), which the Poisson
        add/remove-one analysis covers; the cap is sized for n + 1 rows.

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
    l2_clip_norm = _validate.positive("l2_clip_norm", l2_clip_norm)
    n = _validate.positive_int("dataset_size", dataset_size)
    batch_size = _validate.positive_int("batch_size", batch_size)
    if batch_size > n:
        _validate.fail("batch_size", batch_size, f"in [1, dataset_size={n}]")
    delta = _validate.in_range("delta", delta, 0.0, 1.0, low_inclusive=False)
    _validate.one_of("clipping", clipping, CLIPPING_BACKENDS)
    _validate.one_of("accounting", accounting, ACCOUNTING_METHODS)
    if physical_batch_size is not None:
        physical_batch_size = _validate.positive_int("physical_batch_size", physical_batch_size)
    steps = _resolve_steps(n, batch_size, epochs, steps)
    q = batch_size / n
    sigma, eps_bound = _resolve_noise(
        noise_multiplier,
        target_epsilon,
        delta=delta,
        q=realised_sampling_rate(q),
        steps=steps,
        accounting=accounting,
    )
    sampler = _sampler_for_slack(
        n, q, steps=steps, epsilon=eps_bound, delta=delta, calibrated=target_epsilon is not None
    )
    return PrivateTraining(
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
    )
