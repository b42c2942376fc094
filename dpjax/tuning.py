r"""Private hyperparameter tuning: private selection over candidate configurations.

Tuning a DP-SGD run by training with several settings on the private data and keeping the best
spends privacy for *every* run (up to the composition of all of them). Private selection
(Liu & Talwar 2019; Papernot & Steinke 2022) pays far less: run a *random* number K of trials,
each a full private run with a uniformly random candidate, and release only the best one. K must
stay hidden, so :func:`private_selection` always runs a public number ``max_trials`` of trials
and selects among the first K (the cap is charged on δ).

:func:`private_selection` does this and returns a :class:`~dpjax.events.RepeatAndSelectEvent`
to record in a :class:`~dpjax.accounting.PrivacyAccountant` (accounted by RDP).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from dpjax import _validate
from dpjax import events as ev
from dpjax.accounting.num_trials import max_trials_for, tnb_gamma

__all__ = [
    "DISTRIBUTIONS",
    "SelectionResult",
    "draw_num_trials",
    "max_trials_for",
    "private_selection",
]

#: Distribution of the number of trials → dp-accounting's ``shape`` (None: given by ``shape=``).
DISTRIBUTIONS = {"poisson": math.inf, "geometric": 1.0, "truncated_negative_binomial": None}


@dataclasses.dataclass(frozen=True)
class SelectionResult:
    """What a private selection releases.

    Attributes:
        candidate: the best trial's candidate (None if no trial ran: Poisson K = 0).
        score: its score.
        output: its third return value from ``train_and_score`` (e.g. the model), or None.
        event: the :class:`~dpjax.events.RepeatAndSelectEvent` to record. The number of
            trials K is deliberately absent: it must stay secret (see
            :func:`private_selection`); ``event.max_trials`` is the public number of trials
            that ran.
        failed: whether the released trial failed (raised, or returned a malformed value):
            then ``score`` is −inf and ``output`` None.
    """

    candidate: Any
    score: float | None
    output: Any
    event: ev.RepeatAndSelectEvent
    failed: bool = False


def _shape_of(distribution: str, shape: float | None) -> float:
    _validate.one_of("distribution", distribution, tuple(DISTRIBUTIONS))
    fixed = DISTRIBUTIONS[distribution]
    if fixed is not None:
        if shape is not None and float(shape) != fixed:
            _validate.fail("shape", shape, f"None or {fixed} for distribution={distribution!r}")
        return fixed
    if shape is None:
        _validate.fail("shape", shape, "η ≥ 0 (0: logarithmic, 1: geometric) for the TNB")
    return _validate.in_range("shape", shape, 0.0, math.inf)


def draw_num_trials(rng: np.random.Generator, *, mean: float, shape: float) -> int:
    """Draw K from the distribution dp-accounting's ``RepeatAndSelectDpEvent(mean, shape)``
    accounts: Poisson(mean) for shape = inf; else the truncated negative binomial
    P[K = k] ∝ C(k + η − 1, k)(1 − γ)^k, k ≥ 1 (η = shape; geometric at η = 1, logarithmic
    at η = 0), with γ from dp-accounting's own mean → γ map so sampling and accounting agree.
    """
    if shape == math.inf:
        return int(rng.poisson(mean))
    gamma = tnb_gamma(shape, mean)
    if gamma >= 1.0:
        return 1
    if shape == 1.0:
        return int(rng.geometric(gamma))
    if shape == 0.0:
        return int(rng.logseries(1.0 - gamma))
    while True:  # negative binomial as a Gamma–Poisson mixture, conditioned on K ≥ 1
        k = int(rng.poisson(rng.gamma(shape, (1.0 - gamma) / gamma)))
        if k >= 1:
            return k


def _host_rng(key: jax.Array) -> np.random.Generator:
    bits = np.asarray(jax.random.bits(key, (4,), dtype=np.uint32))
    return np.random.default_rng([int(b) for b in bits])


class _Trial(NamedTuple):
    score: float
    event: Any  # what the trial returned as its event (checked against base_event)
    output: Any
    failed: bool


def _run_trial(train_and_score: Callable, key: jax.Array, candidate: Any) -> _Trial:
    """One trial; an exception or a malformed return is a failed trial (score −inf)."""
    try:
        returned = train_and_score(key, candidate)
        if not isinstance(returned, tuple) or len(returned) not in (2, 3):
            raise TypeError("train_and_score must return (score, event[, output])")
        score = float(np.asarray(returned[0]))
    except Exception:  # noqa: BLE001 -- a failure may depend on the data: never re-raised
        return _Trial(-math.inf, None, None, True)
    event = returned[1]
    if isinstance(event, list | tuple) and event:
        event = tuple(event)
    output = returned[2] if len(returned) == 3 else None
    return _Trial(score if math.isfinite(score) else -math.inf, event, output, False)


def _check_base_event(base_event: Any) -> ev.PrivacyEvent | tuple[ev.PrivacyEvent, ...]:
    if isinstance(base_event, list | tuple) and base_event:
        base_event = tuple(base_event)
    parts = base_event if isinstance(base_event, tuple) else (base_event,)
    if not parts or not all(
        isinstance(p, ev.PrivacyEvent) and not isinstance(p, ev.RepeatAndSelectEvent) for p in parts
    ):
        _validate.fail(
            "base_event",
            base_event,
            "the dpjax PrivacyEvent of one trial, or a tuple of them (their composition): what "
            "each trial spends, stated before any trial runs",
        )
    return base_event


def _same_event(event: Any, base_event: Any) -> bool:
    """Whether a trial's returned event is ``base_event`` (anything else, compared safely)."""
    parts = event if isinstance(event, tuple) else (event,)
    if not parts or not all(isinstance(p, ev.PrivacyEvent) for p in parts):
        return False
    return event == base_event


def _max_trials(max_trials: int | None, mean: float, shape: float) -> int:
    if max_trials is None:
        return max_trials_for(mean=mean, shape=shape)
    return _validate.positive_int("max_trials", max_trials)


def private_selection(
    key: jax.Array,
    candidates: Sequence[Any],
    train_and_score: Callable[[jax.Array, Any], tuple],
    *,
    mean: float,
    base_event: ev.PrivacyEvent | Sequence[ev.PrivacyEvent],
    distribution: str = "geometric",
    shape: float | None = None,
    max_trials: int | None = None,
) -> SelectionResult:
    r"""Draw K ~ D(mean), run ``max_trials`` private trials, release the best of the first K.

    Each trial draws a candidate uniformly from ``candidates`` and calls
    ``train_and_score(trial_key, candidate)``, which must return ``(score, event)`` or
    ``(score, event, output)``: ``event`` is the trial's own privacy event (or a tuple of
    events, their composition) covering everything it computed from the private data, the
    score included (score on public validation data, or privately, e.g. a noisy count).

    **K stays hidden.** K is NOT returned and must not be logged or published: the bound holds
    for the best trial alone, and revealing K voids it. So that the work done does not show K,
    every call runs exactly ``max_trials`` = K_max trials (a public number, the same for every
    K) and selects among the first min(K, K_max) of them; the other trials run on the data and
    are discarded. The cap costs P[K > K_max] on δ (see "Formal guarantees"); the default K_max
    is :func:`~dpjax.accounting.num_trials.max_trials_for` at tail 10⁻¹⁰ (for E[K] = 10: 36
    trials for Poisson K, 219 geometric, 108 at η = 3: the price of hiding K).

    **The trials' event is stated up front** (``base_event``): every trial must return it
    (one base mechanism "random candidate, then a run with this event"; configurations with
    different σ, q or steps need one common event, e.g. calibrate σ per candidate to the same
    ε). A trial that returns another event, or none, makes the call raise ``ValueError`` after
    all K_max trials ran (nothing is released; the trials already ran: fix the trials and
    spend a fresh budget). Events must be public constants, never computed from the data.

    **A trial that fails** (raises an ``Exception``, or returns something other than
    ``(score, event[, output])``) is a candidate with score −inf and no output; the exception
    is not re-raised and the run continues, because whether a trial fails can depend on the
    data and re-raising would show it (and K). If the released trial is a failed one, the
    result says so (``failed=True``) and a ``RuntimeWarning`` is issued (a function of the
    released output only). The failure is covered by the trial's event only if it depends on
    the trial's private outputs alone (e.g. a non-finite noisy loss), not on the raw data:
    debug ``train_and_score`` on public or synthetic data first.

    Side channels that remain (outside the guarantee; control them yourself): the duration,
    memory and logs of each trial. Total work is independent of K, but not of the data or the
    candidates: a trial whose running time depends on the data (early stopping, data-dependent
    shapes) leaks through time, and trials whose running time depends on the candidate
    (different numbers of steps) show the sequence of picks, which together with the released
    candidate bounds K from below. Give every candidate the same amount of work and keep
    per-trial timings and logs private.

    K, the candidate picks and the trial keys come from ``key``: K and the picks are drawn on
    the host (NumPy generator seeded from ``key``), trial i gets ``fold_in(key_runs, i)``, so
    no key is reused.

    Formal guarantees:
        Papernot & Steinke 2022 ("Hyperparameter tuning with Rényi differential privacy",
        https://arxiv.org/abs/2110.03620), Theorem 2 (truncated negative binomial K;
        geometric η = 1 is Liu & Talwar 2019's setting, logarithmic η = 0) and Theorem 6
        (Poisson K): if one trial is (λ, ε_λ)-RDP (the base event, under its relation),
        releasing the best of K trials is (λ, ε'_λ)-RDP with ε'_λ given in
        :mod:`dpjax.accounting.selection`, hence (ε, δ)-DP. The random candidate is part of
        the base mechanism (its RDP is that of the common event). Ties go to the first trial;
        a non-finite score counts as −inf. The cap: this function's output equals that
        selection's unless K > K_max (the same K, picks and trial randomness), so the two are
        within total variation τ = P[K > K_max] on every data set, and the capped selection
        is (ε, δ + (1 + e^ε)·τ)-DP (the coupling argument of
        :func:`dpjax.accounting.truncation_slack`), which is how the recorded
        :class:`~dpjax.events.RepeatAndSelectEvent` (``max_trials`` set) is accounted. Padded
        Poisson samplers inside the trials add E[K]·Σ count·p̄ to τ the same way.

    Args:
        key: JAX PRNG key.
        candidates: a non-empty sequence of configurations.
        train_and_score: ``(key, candidate) -> (score, event[, output])``; larger is better.
        mean: E[K] ≥ 1.
        base_event: the event every trial reports (a PrivacyEvent or a tuple of them).
        distribution: ``"poisson"``, ``"geometric"`` or ``"truncated_negative_binomial"``.
        shape: η ≥ 0 for the truncated negative binomial (0 logarithmic, 1 geometric);
            None for the others.
        max_trials: K_max, the public number of trials run; default
            ``max_trials_for(mean=mean, shape=η)`` (P[K > K_max] ≤ 10⁻¹⁰).

    Returns:
        A :class:`SelectionResult` (its ``event`` is the RepeatAndSelectEvent to record).

    Raises:
        ValueError: invalid arguments (before any trial runs), or, after all trials ran, a
            trial that reported another event than ``base_event``.

    Example:
        >>> import jax
        >>> step = ev.GaussianEvent(noise_multiplier=4.0)
        >>> res = private_selection(jax.random.key(0), [1, 2, 3], lambda k, c: (float(c), step),
        ...                         mean=5.0, base_event=step, max_trials=60)
        >>> res.event.mean, res.event.shape, res.event.max_trials, res.candidate in (1, 2, 3)
        (5.0, 1.0, 60, True)
    """
    if not isinstance(candidates, Sequence) or isinstance(candidates, str) or not candidates:
        _validate.fail("candidates", candidates, "a non-empty sequence of configurations")
    if not callable(train_and_score):
        _validate.fail("train_and_score", train_and_score, "a callable (key, candidate)")
    mean = _validate.in_range("mean", mean, 1.0, math.inf)
    shape = _shape_of(distribution, shape)
    base_event = _check_base_event(base_event)
    k_max = _max_trials(max_trials, mean, shape)
    key_count, key_picks, key_runs = jax.random.split(key, 3)
    released = min(draw_num_trials(_host_rng(key_count), mean=mean, shape=shape), k_max)
    picks = _host_rng(key_picks).integers(0, len(candidates), size=k_max)
    best: tuple[_Trial, Any] | None = None
    wrong_event = None
    for i, pick in enumerate(picks):  # all K_max trials, whatever K is
        candidate = candidates[int(pick)]
        trial = _run_trial(train_and_score, jax.random.fold_in(key_runs, i), candidate)
        if not trial.failed and not _same_event(trial.event, base_event) and wrong_event is None:
            wrong_event = (trial.event,)
        if i < released and (best is None or trial.score > best[0].score):
            best = (trial, candidate)
    if wrong_event is not None:
        _validate.fail(
            "train_and_score(...)[1]",
            wrong_event[0],
            f"base_event ({base_event!r}) in every trial: a trial that cannot state its event "
            "is not known to be private (nothing is released)",
        )
    selection = ev.RepeatAndSelectEvent(
        base_event=base_event, mean=mean, shape=shape, max_trials=k_max
    )
    if best is None:  # Poisson K = 0
        return SelectionResult(candidate=None, score=None, output=None, event=selection)
    trial, candidate = best
    if trial.failed:
        warnings.warn(
            "the selected trial failed (raised or returned a malformed value); its exception "
            "is not shown, since whether a trial fails can depend on the data",
            RuntimeWarning,
            stacklevel=2,
        )
    return SelectionResult(
        candidate=candidate,
        score=trial.score,
        output=trial.output,
        event=selection,
        failed=trial.failed,
    )
