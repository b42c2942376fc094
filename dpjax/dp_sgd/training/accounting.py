"""ε of a DP-SGD run: the phases of its plan ledger, composed, the truncation slack included.

A run is a sequence of phases, one per plan it ran under (the ledger of
:mod:`~dpjax.dp_sgd.training.ledger`); a phase of t steps is one
``PoissonSampledGaussianEvent(σ, q, count=t)`` (⌈t/b⌉ rounds with banded correlated noise).
:class:`PhaseAccounting` is the part of :class:`~dpjax.dp_sgd.PrivateTraining` that reports ε
(``event``, ``epsilon``, ``epsilon_history``), composes phases and refuses, before a run, a run
whose δ cannot hold the padded sampler's truncation slack. The module functions bound ε for
:func:`~dpjax.make_private` before any object exists (σ given, the sampler's cap).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any

from dpjax import _validate
from dpjax.accounting.dp_sgd import cached_dp_sgd_epsilon
from dpjax.accounting.tight import (
    TRUNCATION_DELTA_SHARES,
    PLDGridCoarsenedWarning,
    PLDGridTooLargeError,
    TruncationSlackError,
    tight_epsilon,
    truncation_slack,
)
from dpjax.dp_sgd.training import ledger as _plan
from dpjax.dp_sgd.training.state import PrivateState, PublicState, _steps_of
from dpjax.events import PoissonSampledGaussianEvent

__all__ = ["NOT_PRIVATE_EPSILON", "SLACK_FRACTION", "PhaseAccounting"]

#: Share of δ set aside for the padded sampler's truncation slack: ε is accounted at
#: δ·(1 − SLACK_FRACTION) and the cap ``max_batch_size`` is chosen so the slack of the planned
#: run is ≤ SLACK_FRACTION·δ.
SLACK_FRACTION = TRUNCATION_DELTA_SHARES[0]
#: ε at or above this is reported as inf: e^ε overflows, so no truncation slack can be bounded.
NOT_PRIVATE_EPSILON = 700.0
#: PLD grid of the ε that sizes the sampler's cap when σ is given: a valid (pessimistic) upper
#: bound at 1–5 % of the cost of the default grid (the cap depends on ε only through
#: e^ε·tail, so a looser ε adds a row or two at most); ``epsilon(state)`` is full precision.
_CAP_GRID = 1e-2


class PhaseAccounting:
    """The privacy spent by a :class:`~dpjax.dp_sgd.PrivateTraining` (a mixin of it).

    Reads the attributes ``PrivateTraining.__init__`` sets: ``_plan``, ``sampler``,
    ``noise_multiplier``, ``sampling_rate``, ``steps``, ``delta``, ``accounting``,
    ``max_batch_size`` and the caches ``_epsilons`` and ``_composed``.
    """

    def event(self, steps: int | None = None) -> PoissonSampledGaussianEvent:
        """The privacy event of ``steps`` (default: the planned T) noisy updates."""
        steps = self.steps if steps is None else _validate.positive_int("steps", steps)
        rounds = self._plan.accounted_steps(steps)  # ⌈T/b⌉ rounds for banded MF
        event = self.sampler.event(noise_multiplier=self.noise_multiplier, steps=rounds)
        return dataclasses.replace(event, privacy_unit=_privacy_unit(self._plan))

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


def _plan_is_not_private(private: PhaseAccounting, accounted: float) -> bool:
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
