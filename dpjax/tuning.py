r"""Private hyperparameter tuning: private selection over candidate configurations.

Tuning a DP-SGD run by training with several settings on the private data and keeping the best
spends privacy for *every* run (the Abadi et al. 2016: "run analyses with various
hyperparameter settings and choose the best one. Q: any problems?"). Private selection
(Liu & Talwar 2019; Papernot & Steinke 2022) pays far less: run a *random* number K of trials,
each a full private run with a uniformly random candidate, and release only the best one.

:func:`private_selection` does this and returns a :class:`~dpjax.events.RepeatAndSelectEvent`
to record in a :class:`~dpjax.accounting.PrivacyAccountant` (accounted by RDP).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant as _dp_rdp

from dpjax import _validate
from dpjax import events as ev

__all__ = ["DISTRIBUTIONS", "SelectionResult", "draw_num_trials", "private_selection"]

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
            :func:`private_selection`).
    """

    candidate: Any
    score: float | None
    output: Any
    event: ev.RepeatAndSelectEvent


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
    gamma = _dp_rdp._gamma_truncated_negative_binomial(shape, mean)  # noqa: SLF001
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


def _unpack(returned: Any) -> tuple[float, Any, Any]:
    if not isinstance(returned, tuple) or len(returned) not in (2, 3):
        _validate.fail("train_and_score(...)", type(returned).__name__, "(score, event[, output])")
    score, event = returned[0], returned[1]
    output = returned[2] if len(returned) == 3 else None
    if isinstance(event, list | tuple) and event:
        event = tuple(event)
        parts = event
    else:
        parts = (event,)
    if not all(
        isinstance(p, ev.PrivacyEvent) and not isinstance(p, ev.RepeatAndSelectEvent) for p in parts
    ):
        _validate.fail(
            "train_and_score(...)[1]",
            event,
            "the dpjax PrivacyEvent of the trial, or a tuple of them (a trial that cannot "
            "state its event is not known to be private and is refused)",
        )
    score = float(np.asarray(score))
    return (score if math.isfinite(score) else -math.inf), event, output


def private_selection(
    key: jax.Array,
    candidates: Sequence[Any],
    train_and_score: Callable[[jax.Array, Any], tuple],
    *,
    mean: float,
    distribution: str = "geometric",
    shape: float | None = None,
    base_event: ev.PrivacyEvent | None = None,
) -> SelectionResult:
    r"""Run K ~ D(mean) private trials with uniformly random candidates; release the best.

    Each trial draws a candidate uniformly from ``candidates`` and calls
    ``train_and_score(trial_key, candidate)``, which must return ``(score, event)`` or
    ``(score, event, output)``: ``event`` is the trial's own privacy event (or a tuple of
    events, their composition) covering everything it computed from the private data, the
    score included (score on public validation data, or privately, e.g. a noisy count). A
    trial without an event is refused.

    Every trial must report the same event (decided here: the guarantee is stated for one
    base mechanism "random candidate, then a run with this event"; configurations with
    different σ, q or steps need one common event, e.g. calibrate σ per candidate to the same
    ε), else ``ValueError``. Nothing is released then, but the trials already ran: fix the
    candidates and spend a fresh budget.

    K, the candidate picks and the trial keys come from ``key``: K and the picks are drawn on
    the host (NumPy generator seeded from ``key``), trial i gets ``fold_in(key_runs, i)``, so
    no key is reused. K is NOT returned and must not be logged or published: the bound holds
    for the best trial alone, and revealing K voids it.

    Formal guarantees:
        Papernot & Steinke 2022 ("Hyperparameter tuning with Rényi differential privacy"),
        Theorem 2 (truncated negative binomial K; geometric η = 1 is Liu & Talwar 2019's
        setting, logarithmic η = 0) and Theorem 6 (Poisson K): if one trial is
        (λ, ε_λ)-RDP (the base event, under its relation), releasing the best trial is
        (λ, ε'_λ)-RDP with ε'_λ given in :mod:`dpjax.accounting.selection`. The random
        candidate is part of the base mechanism (its RDP is that of the common event). Ties go
        to the first trial; a non-finite score counts as −inf.

    Args:
        key: JAX PRNG key.
        candidates: a non-empty sequence of configurations.
        train_and_score: ``(key, candidate) -> (score, event[, output])``; larger is better.
        mean: E[K] ≥ 1.
        distribution: ``"poisson"``, ``"geometric"`` or ``"truncated_negative_binomial"``.
        shape: η ≥ 0 for the truncated negative binomial (0 logarithmic, 1 geometric);
            None for the others.
        base_event: the event every trial must report. Required for Poisson (K = 0 runs no
            trial, and the selection is charged all the same).

    Returns:
        A :class:`SelectionResult` (its ``event`` is the RepeatAndSelectEvent to record).

    Raises:
        ValueError: invalid arguments, a trial without an event, or trials with different
            events.

    Example:
        >>> import jax
        >>> step = ev.GaussianEvent(noise_multiplier=4.0)
        >>> res = private_selection(jax.random.key(0), [1, 2, 3], lambda k, c: (float(c), step),
        ...                         mean=5.0, distribution="geometric")
        >>> res.event.mean, res.event.shape, res.candidate in (1, 2, 3)
        (5.0, 1.0, True)
    """
    if not isinstance(candidates, Sequence) or isinstance(candidates, str) or not candidates:
        _validate.fail("candidates", candidates, "a non-empty sequence of configurations")
    if not callable(train_and_score):
        _validate.fail("train_and_score", train_and_score, "a callable (key, candidate)")
    mean = _validate.in_range("mean", mean, 1.0, math.inf)
    shape = _shape_of(distribution, shape)
    if base_event is not None and not isinstance(base_event, ev.PrivacyEvent):
        _validate.fail("base_event", base_event, "a dpjax PrivacyEvent or None")
    if shape == math.inf and base_event is None:
        _validate.fail("base_event", None, "the trials' event (Poisson K may be 0)")
    key_count, key_picks, key_runs = jax.random.split(key, 3)
    k = draw_num_trials(_host_rng(key_count), mean=mean, shape=shape)
    picks = _host_rng(key_picks).integers(0, len(candidates), size=k)
    best: tuple[float, Any, Any] | None = None
    for i, pick in enumerate(picks):
        candidate = candidates[int(pick)]
        score, event, output = _unpack(train_and_score(jax.random.fold_in(key_runs, i), candidate))
        if base_event is None:
            base_event = event
        elif event != base_event:
            _validate.fail(
                "train_and_score(...)[1]",
                event,
                f"the same event in every trial ({base_event!r}); state one common event",
            )
        if best is None or score > best[0]:
            best = (score, candidate, output)
    selection = ev.RepeatAndSelectEvent(base_event=base_event, mean=mean, shape=shape)
    if best is None:
        return SelectionResult(candidate=None, score=None, output=None, event=selection)
    return SelectionResult(candidate=best[1], score=best[0], output=best[2], event=selection)
