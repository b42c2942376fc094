"""Training hooks of :meth:`~dpjax.dp_sgd.PrivateTraining.fit`: evaluate, checkpoint, log, stop.

``fit(params, data, callbacks=[...])`` calls every :class:`Callback` at the start of the run,
after each step and at the end, with one :class:`FitRun` (what the run has done so far). The
built-in callbacks, and what each one means for privacy:

- :class:`Evaluate` — ``eval_fn(params)`` every k steps on PUBLIC data only. An evaluation on
  private validation data is a release the run's ε does not account, so it is refused unless
  the caller states ``eval_data_is_public=True`` (data that are not the training data nor any
  other private records); the function receives the parameters only (a release covered by the
  guarantee), never the secret state.
- :class:`Checkpoint` (``fit(..., checkpoint_every=k, checkpoint_dir=d)``) — writes the SECRET
  state (its key data fixes every later batch and noise draw; keep it private, file mode 0600)
  and, beside it, the publishable parameters and :meth:`public_state`.
- :class:`CSVLogger` (``fit(..., log_to="run.csv")``) — step, training loss, ε and the public
  evaluation metrics. The training loss is computed on the private batch WITHOUT noise: the
  log is for the data holder, not for publication. ``log_to`` also takes any callable
  ``log_to(step, values)`` (a TensorBoard or wandb writer of your own).
- :class:`EarlyStopping` — stops on a metric of a public evaluation (refused on the training
  loss or any other metric computed on private data: the stopping time would be an
  unaccounted release). The run is accounted as its full plan: see the class.

``history`` (the third value ``fit`` returns) records the step and loss every ``log_every``
steps; its ``"epsilon"`` list is computed when first read (one accounting call per point).
"""

from __future__ import annotations

import csv
import math
import os
import pathlib
from collections.abc import Callable, Iterable
from typing import Any

from dpjax import _validate

__all__ = [
    "CSVLogger",
    "Callback",
    "Checkpoint",
    "EarlyStopping",
    "Evaluate",
    "FitRun",
    "TrainingHistory",
    "restore_checkpoint",
]

#: The metrics ``step`` returns: computed on the private batch without noise (NOT private).
PRIVATE_METRICS = ("loss", "batch_size", "num_clipped", "num_nonfinite")


class TrainingHistory(dict):
    """``fit``'s history: lists ``step`` and ``loss`` (every ``log_every`` steps), the lists of
    the public evaluations (``eval_step`` and one per metric), and ``epsilon``: ε after each
    recorded step, computed when the history is first read as a whole or ``["epsilon"]``
    (each point one cached accounting call; a run that never reads it pays none).
    """

    def __init__(self, lists: dict[str, list], epsilon_of: Callable[[int], float]):
        super().__init__(lists)
        self._epsilon_of = epsilon_of

    def _materialize(self) -> None:
        if not dict.__contains__(self, "epsilon"):
            steps = dict.__getitem__(self, "step")
            dict.__setitem__(self, "epsilon", [self._epsilon_of(t) for t in steps])

    def __missing__(self, key: str) -> list:
        if key != "epsilon":
            raise KeyError(key)
        self._materialize()
        return dict.__getitem__(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self else default

    def __contains__(self, key: object) -> bool:
        return key == "epsilon" or dict.__contains__(self, key)

    def __iter__(self):
        self._materialize()
        return dict.__iter__(self)

    def __len__(self) -> int:
        return dict.__len__(self) + (0 if dict.__contains__(self, "epsilon") else 1)

    def keys(self):
        self._materialize()
        return dict.keys(self)

    def items(self):
        self._materialize()
        return dict.items(self)

    def values(self):
        self._materialize()
        return dict.values(self)

    def __eq__(self, other: object) -> bool:
        self._materialize()
        return dict.__eq__(self, other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        self._materialize()
        return f"TrainingHistory({dict.__repr__(self)})"

    def copy(self) -> dict:
        self._materialize()
        return dict(dict.items(self))


class FitRun:
    """What a :class:`Callback` sees: the run so far (one object per ``fit``, updated in place).

    Attributes:
        private: the :class:`~dpjax.dp_sgd.PrivateTraining`.
        step: the state's step count after the latest update (0 before the first).
        first_step: the step count the run started from; ``last_step`` the one it ends at
            unless stopped.
        params: the parameters after the latest update (covered by the guarantee).
        state: the SECRET :class:`PrivateState` (key data: never publish it; see
            :meth:`~dpjax.dp_sgd.PrivateTraining.public_state`).
        metrics: the latest step's metrics (loss, batch size, ...): computed on the private
            batch WITHOUT noise, NOT private.
        public_metrics: the metrics the public evaluations produced at this step (cleared
            before every step).
        history: the :class:`TrainingHistory` ``fit`` returns.
        stop_reason: None, or why a callback stopped the run (:meth:`stop`).
    """

    def __init__(self, private: Any, params: Any, state: Any, history: TrainingHistory, step: int):
        self.private = private
        self.params = params
        self.state = state
        self.history = history
        self.step = step
        self.first_step = self.step
        self.last_step = self.step
        self.metrics: dict[str, Any] = {}
        self.public_metrics: dict[str, float] = {}
        self.stop_reason: str | None = None

    @property
    def is_last(self) -> bool:
        """Whether this step is the last one the run will take."""
        return self.step >= self.last_step or self.stop_reason is not None

    def due(self, every: int) -> bool:
        """Whether a hook with period ``every`` runs now (every k-th step, and the last)."""
        return self.step > self.first_step and (
            (self.step - self.first_step) % every == 0 or self.is_last
        )

    @property
    def epsilon(self) -> float:
        """ε of the steps run so far at the plan's δ (one cached accounting call); with
        ``make_private(budget=filter)`` the filter's ε, the only guarantee of an adaptive
        interaction (the steps' own ε leaves out the other releases charged to it)."""
        private = self.private
        if private.budget is not None:
            return private.budget.epsilon
        return private._epsilon_of_phases(private._phases(self.state), private.delta)

    def stop(self, reason: str) -> None:
        """End the run after this step (``fit`` returns the current params and state)."""
        self.stop_reason = reason


class Callback:
    """A hook of ``fit``: override any of the three methods (each gets the :class:`FitRun`)."""

    def on_fit_start(self, run: FitRun) -> None:
        """Before the first step."""

    def on_step_end(self, run: FitRun) -> None:
        """After every step (use ``run.due(k)`` to act every k steps)."""

    def on_fit_end(self, run: FitRun) -> None:
        """After the last step (also when a callback stopped the run)."""


class Evaluate(Callback):
    """``eval_fn(params)`` every ``every`` steps (and after the last), on PUBLIC data.

    Its metrics go to ``run.public_metrics`` (for :class:`EarlyStopping`, the logger) and to
    the history (``eval_step`` and one list per metric).

    Args:
        eval_fn: ``eval_fn(params) -> dict[str, float]`` (or one float, named ``"eval"``); it
            gets the parameters only.
        every: period in steps (≥ 1).
        eval_data_is_public: must be True: the data ``eval_fn`` reads are public (not the
            training data and no other private records).

    Raises:
        ValueError: ``eval_data_is_public`` is not True, or ``every`` < 1.

    Formal guarantees:
        The parameters are covered by the run's (ε, δ) guarantee, and any function of them and
        of public data is post-processing (Dwork & Roth 2014, "The algorithmic foundations of
        differential privacy", Proposition 2.1, https://doi.org/10.1561/0400000042): an
        evaluation on public data costs nothing. On private data (a held-out split of the
        private data set) the metric is a new release the accountant does not see, so it is
        refused; evaluate such data once after training, outside the published results, or
        account that release yourself.
    """

    def __init__(
        self, eval_fn: Callable[[Any], Any], *, every: int, eval_data_is_public: bool = False
    ):
        if not callable(eval_fn):
            _validate.fail("eval_fn", eval_fn, "a callable eval_fn(params) -> dict of floats")
        if eval_data_is_public is not True:
            _validate.fail(
                "eval_data_is_public",
                eval_data_is_public,
                "True, stating that eval_fn reads only public data (an evaluation on private "
                "validation data is a release this run's ε does not account: evaluate it once "
                "after training, outside what you publish, or account it yourself)",
            )
        self.eval_fn = eval_fn
        self.every = _validate.positive_int("every", every)

    def on_step_end(self, run: FitRun) -> None:
        if not run.due(self.every):
            return
        values = self.eval_fn(run.params)
        if not isinstance(values, dict):
            values = {"eval": values}
        values = {str(k): float(v) for k, v in values.items()}
        run.public_metrics.update(values)
        run.history.setdefault("eval_step", []).append(run.step)
        for name, value in values.items():
            run.history.setdefault(name, []).append(value)


class EarlyStopping(Callback):
    """Stop when a PUBLIC evaluation metric has not improved for ``patience`` evaluations.

    Args:
        monitor: the name of a metric an :class:`Evaluate` (public data) produces; the
            training metrics (``loss``, ``batch_size``, ``num_clipped``, ``num_nonfinite``:
            computed on the private batch without noise) are refused.
        patience: evaluations without improvement before stopping (≥ 1).
        mode: "min" (lower is better) or "max".
        min_delta: the improvement that counts (≥ 0).

    Raises:
        ValueError: a private ``monitor``; at the first evaluation of the run, a ``monitor``
            that no public evaluation produced; a bad ``patience``, ``mode`` or ``min_delta``.

    Formal guarantees:
        The stopping time is then a function of the released parameters and public data, so
        the stopped run (θ₁, …, θ_τ) is post-processing of the full planned run (θ₁, …, θ_T)
        (Dwork & Roth 2014, Proposition 2.1): it is (ε_T, δ)-DP with ε_T the ε of the
        plan's ``steps``, and that is the guarantee to report. Stopping early saves compute,
        not privacy: ``private.epsilon(state)`` (the ε of the steps run) is the guarantee of
        a run whose length was fixed in advance, and does not hold for a stopping time that
        depends on the data through the parameters (a data-dependent stopping time needs a
        privacy filter or odometer: Rogers, Roth, Ullman & Vadhan 2016, "Privacy odometers
        and filters", https://arxiv.org/abs/1605.08294; charge the steps to a
        :class:`~dpjax.accounting.PrivacyFilter` with ``make_private(..., budget=...)``).
        ``fit`` records the plan's ε as ``history["epsilon_guarantee"]`` when a run stops
        early. A stopping rule on the
        training loss would release a function of the private batches without noise and is
        refused.
    """

    def __init__(
        self, monitor: str, *, patience: int = 1, mode: str = "min", min_delta: float = 0.0
    ):
        if monitor in PRIVATE_METRICS:
            _validate.fail(
                "monitor",
                monitor,
                "the name of a metric of a public evaluation (Evaluate(..., "
                "eval_data_is_public=True)); the training metrics are computed on the private "
                "batch without noise, and a stopping time chosen from them is an unaccounted "
                "release",
            )
        self.monitor = monitor
        self.patience = _validate.positive_int("patience", patience)
        self.mode = _validate.one_of("mode", mode, ("min", "max"))
        self.min_delta = _validate.non_negative("min_delta", min_delta)
        self.best = math.nan
        self.bad = 0

    def on_fit_start(self, run: FitRun) -> None:
        self.best, self.bad = math.nan, 0

    def _improved(self, value: float) -> bool:
        if math.isnan(self.best):
            return True
        if self.mode == "min":
            return value < self.best - self.min_delta
        return value > self.best + self.min_delta

    def on_step_end(self, run: FitRun) -> None:
        if not run.public_metrics:
            return
        if self.monitor not in run.public_metrics:
            _validate.fail(
                "monitor",
                self.monitor,
                f"one of the public evaluation metrics {sorted(run.public_metrics)}",
            )
        value = run.public_metrics[self.monitor]
        if self._improved(value):
            self.best, self.bad = value, 0
            return
        self.bad += 1
        if self.bad >= self.patience:
            run.stop(
                f"{self.monitor} did not improve for {self.bad} evaluation(s) "
                f"(best {self.best:.6g})"
            )


class Checkpoint(Callback):
    """Save the run every ``every`` steps (and after the last) with flax serialization.

    Two files per checkpoint in ``directory``:

    - ``step_<t>.SECRET-state.msgpack``: ``{"params", "state"}`` with the SECRET
      :class:`PrivateState` (key data: with it and one later model the noise-free clipped sum
      is recovered). Written with file mode 0600; never publish it. Resume with
      :func:`restore_checkpoint` and ``fit(params, data, state=state)``: the key streams
      continue, nothing is replayed.
    - ``step_<t>.public.msgpack``: ``{"params", "public_state"}``, what may be published
      (:meth:`~dpjax.dp_sgd.PrivateTraining.public_state`: no key data; its ε is that of the
      steps run).

    Args:
        directory: the folder (created if missing).
        every: period in steps (≥ 1).
    """

    SECRET_SUFFIX = ".SECRET-state.msgpack"
    PUBLIC_SUFFIX = ".public.msgpack"

    def __init__(self, directory: str | os.PathLike, *, every: int):
        self.directory = pathlib.Path(directory)
        self.every = _validate.positive_int("every", every)
        #: the (secret, public) paths written so far
        self.written: list[tuple[pathlib.Path, pathlib.Path]] = []

    def on_step_end(self, run: FitRun) -> None:
        if run.due(self.every):
            self.save(run)

    def save(self, run: FitRun) -> tuple[pathlib.Path, pathlib.Path]:
        """Write both files of ``run``'s current step; returns their paths."""
        from flax import serialization  # noqa: PLC0415 (imported when a checkpoint is written)

        self.directory.mkdir(parents=True, exist_ok=True)
        stem = self.directory / f"step_{run.step:08d}"
        secret = stem.with_name(stem.name + self.SECRET_SUFFIX)
        public = stem.with_name(stem.name + self.PUBLIC_SUFFIX)
        blob = serialization.to_bytes({"params": run.params, "state": run.state})
        _write_private(secret, blob)
        published = run.private.public_state(run.state)
        public.write_bytes(
            serialization.to_bytes({"params": run.params, "public_state": published})
        )
        self.written.append((secret, public))
        return secret, public


def _write_private(path: pathlib.Path, blob: bytes) -> None:
    """Write ``blob`` to a file only its owner can read (created 0600, then replaced)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(blob)
    os.replace(tmp, path)


def restore_checkpoint(path: str | os.PathLike, private: Any, params: Any) -> tuple[Any, Any]:
    """``(params, state)`` from a ``*.SECRET-state.msgpack`` file :class:`Checkpoint` wrote.

    Args:
        path: the secret checkpoint file.
        private: the :class:`~dpjax.dp_sgd.PrivateTraining` of the run (same plan).
        params: parameters of the model's structure (a template; values unused).

    Returns:
        ``(params, state)``; continue with ``private.fit(params, data, state=state)``.
    """
    from flax import serialization  # noqa: PLC0415

    template = {"params": params, "state": private.state_template(params)}
    restored = serialization.from_bytes(template, pathlib.Path(path).read_bytes())
    return restored["params"], restored["state"]


class CSVLogger(Callback):
    """One row every ``every`` steps (and after the last): step, loss, ε, public metrics.

    The loss is the mean training loss of the step's private batch, without noise: NOT
    private (the log is for the data holder). ε is the ε of the steps run (one cached
    accounting call per row; ``epsilon=False`` leaves the column out), or with
    ``make_private(budget=filter)`` the filter's ε (the adaptive interaction's guarantee).

    Args:
        path: the CSV file (overwritten), or any callable ``log(step, values)`` that writes
            the same values elsewhere (a TensorBoard or wandb writer).
        every: period in steps (≥ 1).
        epsilon: whether to log ε.
    """

    def __init__(self, path: str | os.PathLike | Callable, *, every: int = 1, epsilon: bool = True):
        self.writer = path if callable(path) else None
        self.path = None if callable(path) else pathlib.Path(path)
        self.every = _validate.positive_int("every", every)
        self.epsilon = bool(epsilon)
        self._columns: list[str] | None = None
        self._rows: list[dict[str, Any]] = []

    def on_fit_start(self, run: FitRun) -> None:
        self._rows, self._columns = [], None

    def on_step_end(self, run: FitRun) -> None:
        if not run.due(self.every):
            return
        values: dict[str, Any] = {"loss": float(run.metrics["loss"])}
        if self.epsilon:
            values["epsilon"] = run.epsilon
        values.update(run.public_metrics)
        if self.writer is not None:
            self.writer(run.step, values)
            return
        self._rows.append({"step": run.step, **values})
        self._flush()

    def _flush(self) -> None:
        """Append the last row; rewrite the file when it brings a new column."""
        columns = list(dict.fromkeys(k for row in self._rows for k in row))
        assert self.path is not None
        if columns == self._columns:
            with self.path.open("a", newline="") as f:
                csv.DictWriter(f, fieldnames=columns).writerow(self._rows[-1])
            return
        self._columns = columns
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(self._rows)


def fit_callbacks(
    callbacks: Iterable[Callback] | None,
    *,
    checkpoint_every: int | None,
    checkpoint_dir: str | os.PathLike | None,
    log_to: Any,
    log_every: int,
) -> list[Callback]:
    """``fit``'s callbacks: the given ones, then the checkpoint and the logger it builds."""
    hooks = list(callbacks or ())
    for hook in hooks:
        if not isinstance(hook, Callback):
            _validate.fail("callbacks", hook, "instances of dpjax.dp_sgd.Callback")
    if (checkpoint_every is None) != (checkpoint_dir is None):
        _validate.fail(
            "checkpoint_every",
            checkpoint_every,
            "given together with checkpoint_dir (both or neither)",
        )
    if checkpoint_every is not None:
        hooks.append(Checkpoint(checkpoint_dir, every=checkpoint_every))
    if log_to is not None:
        hooks.append(CSVLogger(log_to, every=log_every))
    return hooks
