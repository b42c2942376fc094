"""An accountant that records heterogeneous privacy events and answers ε(δ).

It counts noisy releases (events' ``count``), never micro-batches, and refuses to mix
neighbouring relations. ``epsilon(delta)`` returns the smallest ε among the accounting methods
that are valid for *every* recorded event (each is a valid upper bound, so the minimum is too);
``epsilon(delta, accounting=...)`` uses one method and raises if it does not apply.

Recording costs O(1): consecutive identical events are merged into one of summed ``count``
(:func:`dpjax.events.merge`), so a training loop that records one event per step keeps one
event, and ε after 1000 such records costs what ε of one 1000-step event costs. Answers are
cached per recorded state.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Any

from dpjax import _validate
from dpjax import events as ev
from dpjax.accounting.composition import advanced_composition_heterogeneous, convert_relation
from dpjax.accounting.optimal import optimal_composition_epsilon
from dpjax.accounting.padded_slack import _untruncated_one, _with_truncation_slack
from dpjax.accounting.renyi import rdp_to_epsilon
from dpjax.accounting.selection import repeat_and_select_rdp
from dpjax.accounting.tight import (
    _TAIL_MASS_TRUNCATION,
    DEFAULT_VALUE_DISCRETIZATION_INTERVAL,
    PLDGridTooLargeError,
    fixed_batch_uses,
    plan_pld,
    pld_epsilon,
    pld_epsilons_incremental,
    rdp_curve,
    rdp_epsilon,
    to_dp_event,
)
from dpjax.accounting.with_replacement import with_replacement_pld
from dpjax.accounting.zcdp import gaussian_zcdp_rho, zcdp_epsilon_cks
from dpjax.relation import (
    ADD_OR_REMOVE_ONE,
    REPLACE_ONE,
    NeighbouringRelation,
    as_relation,
    sensitivity_factor,
)

__all__ = ["METHODS", "STATE_FORMAT", "PrivacyAccountant"]

#: Accounting methods, tightest first (PLD ≤ RDP for the same events; "optimal" ≤ "advanced").
METHODS = ("pld", "rdp", "zcdp", "optimal", "advanced", "basic")

_COMPOSITION_METHODS = ("optimal", "advanced", "basic")

#: The ``"format"`` tag of :meth:`PrivacyAccountant.state_dict`.
STATE_FORMAT = "dpjax.PrivacyAccountant/1"

#: What to do with a fixed-size batch event stated under add/remove-one.
FIXED_BATCH_RELATION_ADVICE = (
    "'replace_one' for a FixedBatchGaussianEvent: fixed-size batches (shuffled or uniformly "
    "drawn b of a public n) are analysed under replace-one only, and no analysis of them holds "
    "under add/remove-one (the batch size would reveal n). Build the event with "
    "relation='replace_one' (keep noise_multiplier = σ/C: the accountant charges the "
    "replace-one sensitivity 2C itself), or sample with PoissonSampler for an add/remove-one "
    "guarantee"
)


def _dp_profile(event: ev.PrivacyEvent) -> list[tuple[float, float, int]] | None:
    """The event as (ε, δ, count) triples of (ε, δ)-DP releases, or None if it has no
    fixed (ε, δ) (Gaussian-type events have a whole curve ε(δ) instead)."""
    if isinstance(event, ev.EpsilonDeltaEvent):
        return [(event.epsilon, event.delta, event.count)]
    if isinstance(event, ev.LaplaceEvent):
        return [(1.0 / event.noise_multiplier, 0.0, event.count)]  # Laplace: ε = Δ₁/b
    if isinstance(event, ev.LaplaceDPSGDEvent):
        return [(e, 0.0, event.count) for e in event.epsilons]
    return None


def _zcdp_rho(event: ev.PrivacyEvent) -> float | None:
    """ρ of the event's releases, or None if zCDP does not apply."""
    if isinstance(event, ev.GaussianEvent):
        return event.count * gaussian_zcdp_rho(sigma=event.noise_multiplier, sensitivity=1.0)
    if isinstance(event, ev.DiscreteGaussianEvent):  # CKS 2020 Theorem 14: same ρ as N(0, σ²)
        return event.count * gaussian_zcdp_rho(sigma=event.sigma, sensitivity=event.sensitivity)
    if isinstance(event, ev.PoissonSampledGaussianEvent) and event.sampling_rate == 1.0:
        shift = sensitivity_factor(event.relation)  # replace-one moves the sum by 2C
        return event.count * gaussian_zcdp_rho(sigma=event.noise_multiplier, sensitivity=shift)
    if isinstance(event, ev.FixedBatchGaussianEvent) and event.relation is REPLACE_ONE:
        # No amplification: fixed_batch_uses releases, each of sensitivity 2C.
        rho = gaussian_zcdp_rho(
            sigma=event.noise_multiplier, sensitivity=sensitivity_factor(REPLACE_ONE)
        )
        return fixed_batch_uses(event) * rho
    profile = _dp_profile(event)
    if profile is not None and all(d == 0.0 for _, d, _ in profile):
        # Pure ε-DP implies ε²/2-zCDP (Bun & Steinke 2016, Proposition 1.4).
        return math.fsum(c * e * e / 2.0 for e, _, c in profile)
    return None


def _why_not(events: Sequence[ev.PrivacyEvent], method: str) -> str | None:
    """None if ``method`` applies to every event, else the reason."""
    if not events:
        return "no events recorded"
    if method in ("pld", "rdp"):
        # With a private selection, RDP is evaluated on the untruncated events and the padded
        # samplers' slack paid on δ (_rdp_with_selections), so a padded event composes with it.
        selecting = method == "rdp" and any(isinstance(e, ev.RepeatAndSelectEvent) for e in events)
        for e in events:
            why = _extension_why_not(e, method)
            if why is not None:
                return why
            if isinstance(e, _EXTENSION_EVENTS):
                continue
            try:
                # balls-in-bins: the slack is paid on δ by every evaluator (no DpEvent has it)
                plain = selecting or isinstance(e, ev.BallsInBinsGaussianEvent)
                to_dp_event(_untruncated_one(e) if plain else e, method=method)
            except ValueError as err:
                return str(err)
        return None
    if method == "zcdp":
        bad = [e for e in events if _zcdp_rho(e) is None]
        return None if not bad else f"zCDP does not apply to {bad[0]!r} (subsampling or δ > 0)"
    profiles = [_dp_profile(e) for e in events]
    if any(p is None for p in profiles):
        bad = events[profiles.index(None)]
        return (
            f"composition theorems need an (ε, δ) per release; {bad!r} has a privacy curve "
            "(use 'pld', 'rdp' or 'zcdp')"
        )
    if method == "optimal":
        pairs = {(e, d) for p in profiles for e, d, _ in p}
        if len(pairs) > 1:
            return "the optimal (KOV) composition needs identical (ε, δ) releases"
    return None


def _closed_form_epsilon(events: Sequence[ev.PrivacyEvent], delta: float, method: str) -> float:
    """ε(δ) of ``events`` by ``"zcdp"`` or a composition theorem (checked applicable)."""
    if method == "zcdp":
        if delta == 0.0:
            return math.inf
        rho = math.fsum(_zcdp_rho(e) for e in events)
        if not rho < math.inf:  # ρ = Δ²/2σ² overflows at σ ≲ 1e-154: no noise, not private
            return math.inf
        return zcdp_epsilon_cks(rho=rho, delta=delta)
    triples = [t for e in events for t in _dp_profile(e)]
    spent = math.fsum(c * d for _, d, c in triples)
    if method == "basic":
        return math.fsum(c * e for e, _, c in triples) if spent <= delta else math.inf
    if method == "optimal":
        eps, d, _ = triples[0]
        count = sum(c for _, _, c in triples)
        if delta == 0.0:
            return count * eps if d == 0.0 else math.inf
        return optimal_composition_epsilon(epsilon=eps, delta=d, steps=count, delta_total=delta)
    delta_prime = delta - spent  # advanced
    if delta_prime <= 0.0:
        return math.inf
    return advanced_composition_heterogeneous(
        [e for e, _, _ in triples],
        [d for _, d, _ in triples],
        counts=[c for _, _, c in triples],
        delta_prime=delta_prime,
    )[0]


#: Events accounted here rather than through :func:`dpjax.accounting.tight.to_dp_event`.
_EXTENSION_EVENTS = (ev.RepeatAndSelectEvent, ev.WithReplacementGaussianEvent)


def _extension_why_not(event: ev.PrivacyEvent, method: str) -> str | None:
    """None unless ``event`` is an extension event that ``method`` ("pld"/"rdp") cannot
    account: private selection has an RDP analysis only (Papernot & Steinke 2022), sampling
    with replacement a PLD only (:mod:`dpjax.accounting.with_replacement`)."""
    if isinstance(event, ev.RepeatAndSelectEvent):
        if method == "pld":
            return f"private selection {event!r} is accounted by RDP only (Papernot & Steinke)"
        try:
            for part in _untruncated_one(event).base_parts:  # padded samplers: slack on δ
                to_dp_event(part, method="rdp")
        except ValueError as err:
            return f"the base event of a private selection: {err}"
    if isinstance(event, ev.WithReplacementGaussianEvent) and method == "rdp":
        return f"sampling with replacement {event!r} is accounted by PLD only"
    return None


def composed_pld(events: Sequence[ev.PrivacyEvent], vdi: float):
    """The PLD of the composition of ``events`` (dp-accounting object), including sampling
    with replacement; raises ValueError for events PLD does not apply to."""
    why = _why_not(events, "pld")
    if why is not None:
        raise ValueError(f"PLD does not apply: {why}")
    standard = [e for e in events if not isinstance(e, _EXTENSION_EVENTS)]
    plds = plan_pld(standard, vdi)[1] if standard else []
    plds += [
        with_replacement_pld(e, value_discretization_interval=vdi)
        for e in events
        if isinstance(e, ev.WithReplacementGaussianEvent)
    ]
    total = plds[0]
    for p in plds[1:]:
        total = total.compose(p, tail_mass_truncation=_TAIL_MASS_TRUNCATION)
    return total


def _rdp_with_selections(
    events: Sequence[ev.PrivacyEvent], delta: float, orders: Sequence[float] | None
) -> float:
    """RDP ε(δ) of events with private selections: the uncapped selections over untruncated
    trials (and untruncated padded samplers) by RDP at δ(1 − f), and the coupling slack
    (1 + e^ε)·m̄ of the caps in f·δ (:func:`dpjax.accounting.padded_slack._selection_mass`)."""

    def evaluate(plain: Sequence[ev.PrivacyEvent], d: float) -> float:
        standard = [e for e in plain if not isinstance(e, ev.RepeatAndSelectEvent)]
        selections = [e for e in plain if isinstance(e, ev.RepeatAndSelectEvent)]
        grid, curve = repeat_and_select_rdp(selections[0], orders=orders)
        curve = curve.copy()
        for e in selections[1:]:
            curve += repeat_and_select_rdp(e, orders=orders)[1]
        if standard:
            curve += rdp_curve(standard, orders=tuple(grid))[1]
        return rdp_to_epsilon(grid, curve, d)

    return _with_truncation_slack(events, delta, evaluate)


def _prefix(events: Sequence[ev.PrivacyEvent], steps: int) -> list[ev.PrivacyEvent]:
    """The first ``steps`` recorded steps (units of ``count``) of ``events``."""
    out, left = [], steps
    for e in events:
        if left <= 0:
            break
        out.append(e if e.count <= left else dataclasses.replace(e, count=left))
        left -= e.count
    return out


class PrivacyAccountant:
    """Records privacy events and answers ε(δ) by the tightest valid method or a named one.

    Accounting methods (``accounting=``; see :data:`METHODS`):

    * ``"pld"`` / ``"rdp"``: dp-accounting (:mod:`dpjax.accounting.tight`); Gaussian, Laplace,
      Poisson-subsampled Gaussian (RDP: add/remove-one or q = 1) and fixed-batch Gaussian
      (replace-one; amplified by RDP only for independently drawn batches) events.
    * Private selection (:class:`~dpjax.events.RepeatAndSelectEvent`, Papernot & Steinke 2022):
      ``"rdp"`` only; sampling with replacement
      (:class:`~dpjax.events.WithReplacementGaussianEvent`, Balle, Barthe, Gaboardi 2018):
      ``"pld"`` only (:mod:`dpjax.accounting.selection`, :mod:`dpjax.accounting.with_replacement`).
    * ``"zcdp"``: Gaussian events, full-batch (q = 1) DP-GD events, fixed-batch events (no
      amplification) and pure-DP events (ε²/2-zCDP), converted by Canonne–Kamath–Steinke 2020.
    * ``"optimal"`` (Kairouz–Oh–Viswanath 2015), ``"advanced"`` (Dwork & Roth 2014,
      advanced composition, heterogeneous form; Dwork, Rothblum, Vadhan 2010), ``"basic"``
      (Dwork & Roth 2014, Theorem 3.16, sequential composition): events with
      a fixed (ε, δ): generic (ε, δ), Laplace (Δ₁/b, 0), Laplace DP-SGD (ε_h, 0) events;
      ``"optimal"`` needs all of them identical.

    Cost: consecutive identical events are merged on :meth:`record` (one event of summed
    ``count``), PLD and RDP evaluate each distinct event once (RDP curves of one release are
    cached and scaled by the count), and ε is cached per recorded state and δ. The one-step PLD
    and RDP of a Poisson-subsampled Gaussian are dp-accounting's, evaluated on arrays
    (:mod:`dpjax.accounting.vectorized`, bit-identical). 1000 one-step DP-SGD records
    (σ = 1.1, q = 0.01) then ε(1e-5) by the tightest method take about 0.2 CPU-s in a fresh
    process (``python -m benchmarks --accounting``), milliseconds once the one-step PLD and RDP
    are cached; :meth:`epsilon_history` composes PLDs incrementally.

    Gaussian-only records (Gaussian, full-batch DP-GD and fixed-batch events) are one Gaussian
    release with μ = √(Σμᵢ²): ``"pld"`` answers them by the exact Gaussian profile (see
    :func:`dpjax.accounting.tight.pld_epsilon`), so it is fast at any number of releases.

    Fixed-size batch events (:class:`~dpjax.events.FixedBatchGaussianEvent`) are
    refused under add/remove-one when recorded: their analyses hold under replace-one only.
    Shuffled ones are not merged (their cost is not additive in ``count``: two recorded runs are
    two permutations).

    The (ε, δ) composition methods spend Σδᵢ of the requested δ on the events' own δᵢ; if
    nothing is left they return ``inf``.

    To combine an add/remove-one run (DP-SGD) with a replace-one release, turn the run into
    one replace-one (ε, δ) event with :meth:`as_event` (group privacy,
    :func:`dpjax.accounting.convert_relation`).

    Formal guarantees:
        Each method's result is an upper bound on ε(δ) of the adaptive composition of the
        recorded releases under the accountant's relation; see the functions it calls. Merging
        k and m consecutive releases of one mechanism into a count of k + m is the same
        composition (:func:`dpjax.events.merge`).

    Args:
        events: events to record now.
        relation: the relation of the guarantee; default: that of the first event recorded.
        value_discretization_interval: PLD grid (default 1e-4).
        orders: RDP orders, a non-empty sequence in (1, inf) (default
            :data:`dpjax.accounting.DEFAULT_RDP_ORDERS`).

    Example:
        >>> acc = PrivacyAccountant()
        >>> for _ in range(5):
        ...     _ = acc.record(ev.LaplaceEvent(noise_multiplier=10.0))
        >>> acc  # five one-release records, merged into one event
        PrivacyAccountant(relation='replace_one', events=1, releases=5)
        >>> acc.applicable_methods()
        ('pld', 'rdp', 'zcdp', 'optimal', 'advanced', 'basic')
        >>> acc.epsilon(0.0, accounting="basic")
        0.5
    """

    def __init__(
        self,
        events: Iterable[ev.PrivacyEvent] = (),
        *,
        relation: NeighbouringRelation | str | None = None,
        value_discretization_interval: float = DEFAULT_VALUE_DISCRETIZATION_INTERVAL,
        orders: Sequence[float] | None = None,
    ):
        self._relation = None if relation is None else as_relation(relation)
        self._events: list[ev.PrivacyEvent] = []
        self._cache: dict[tuple[float, str], float] = {}
        self._vdi = _validate.real("value_discretization_interval", value_discretization_interval)
        _validate.in_range(
            "value_discretization_interval",
            self._vdi,
            0.0,
            1e-2,
            low_inclusive=False,
            high_inclusive=True,
        )
        if orders is not None:
            orders = tuple(_validate.real("orders[i]", a) for a in orders)
            if not orders:
                _validate.fail(
                    "orders",
                    [],
                    "a non-empty sequence of RDP orders in (1, inf), or None for "
                    "dpjax.accounting.DEFAULT_RDP_ORDERS",
                )
            for a in orders:
                if not 1.0 < a < math.inf:
                    _validate.fail("orders[i]", a, "in (1, inf)")
        self._orders = orders
        for e in events:
            self.record(e)

    def __repr__(self) -> str:
        rel = None if self._relation is None else self._relation.value
        return (
            f"PrivacyAccountant(relation={rel!r}, events={len(self._events)}, "
            f"releases={self.releases})"
        )

    @property
    def relation(self) -> NeighbouringRelation | None:
        """The neighbouring relation of every recorded event (None before the first)."""
        return self._relation

    @property
    def events(self) -> tuple[ev.PrivacyEvent, ...]:
        """The recorded events, in order, with consecutive identical ones merged into one of
        summed ``count`` (so 1000 one-step records of one DP-SGD step read as one event with
        ``count=1000``)."""
        return tuple(self._events)

    @property
    def steps(self) -> int:
        """Number of recorded steps: the sum of the events' ``count``."""
        return sum(e.count for e in self._events)

    @property
    def releases(self) -> int:
        """Number of noisy releases recorded (a Laplace DP-SGD event counts each ε_h)."""
        total = 0
        for e in self._events:
            per = len(e.epsilons) if isinstance(e, ev.LaplaceDPSGDEvent) else 1
            total += per * e.count
        return total

    def record(self, event: ev.PrivacyEvent) -> PrivacyAccountant:
        """Record one event (merged into the last one if they differ only in ``count``);
        returns ``self``. Costs O(1).

        Raises:
            ValueError: if ``event`` is not a privacy event, its relation differs from the
                accountant's, or it is a fixed-size batch event under add/remove-one.
        """
        if not isinstance(event, ev.PrivacyEvent):
            _validate.fail("event", event, "a dpjax.events.PrivacyEvent")
        if isinstance(event, ev.FixedBatchGaussianEvent) and event.relation is ADD_OR_REMOVE_ONE:
            _validate.fail("event.relation", event.relation.value, FIXED_BATCH_RELATION_ADVICE)
        if self._relation is None:
            self._relation = event.relation
        elif event.relation is not self._relation:
            _validate.fail(
                "event.relation",
                event.relation.value,
                f"the accountant's relation {self._relation.value!r} (mixing relations is "
                "refused: restate the event's sensitivity under one relation, or turn an "
                "add/remove-one accountant into a replace-one event with as_event)",
            )
        units = ev.privacy_units(event)
        known = set().union(*(ev.privacy_units(e) for e in self._events))
        if len(units) > 1 or (known and units != known):
            _validate.fail(
                "event.privacy_unit",
                sorted(units),
                f"the accountant's privacy unit {sorted(known or units)} (an example-level and "
                "a user-level guarantee do not compose: account them separately, or bound one "
                "by the other through group privacy)",
            )
        merged = ev.merge(self._events[-1], event) if self._events else None
        if merged is not None:
            self._events[-1] = merged
        else:
            self._events.append(event)
        self._cache.clear()
        return self

    def extend(self, events: Iterable[ev.PrivacyEvent]) -> PrivacyAccountant:
        """Record several events; returns ``self``."""
        for e in events:
            self.record(e)
        return self

    def applicable_methods(self) -> tuple[str, ...]:
        """The accounting methods that apply to every recorded event, tightest first."""
        return tuple(m for m in METHODS if _why_not(self._events, m) is None)

    def _check_accounting(self, accounting: str | None) -> tuple[str, ...]:
        """The methods to evaluate for ``accounting`` (None: every applicable one)."""
        if accounting is None:
            methods = self.applicable_methods()
            if not methods:
                _validate.fail("accounting", None, "a method valid for every recorded event (none)")
            return methods
        _validate.one_of("accounting", accounting, METHODS)
        why = _why_not(self._events, accounting)
        if why is not None:
            raise ValueError(f"accounting={accounting!r} does not apply: {why}")
        return (accounting,)

    def epsilon(self, delta: float, accounting: str | None = None) -> float:
        """ε(δ) of everything recorded, by ``accounting`` or (None) the tightest valid method.

        Cached per recorded state: asking again before the next :meth:`record` is free.

        Args:
            delta: δ in [0, 1).
            accounting: one of :data:`METHODS`, or None for the minimum over the applicable
                methods.

        Returns:
            ε (``inf`` where the method gives no finite ε at this δ).

        Raises:
            ValueError: if ``accounting`` does not apply to a recorded event, or none applies.
        """
        delta = _validate.real("delta", delta)
        _validate.delta("delta", delta)
        methods = self._check_accounting(accounting)
        return self._tightest(delta, methods)

    def _tightest(self, delta: float, methods: tuple[str, ...]) -> float:
        """min over ``methods`` (each a valid upper bound); a PLD whose grid cannot be built
        is skipped when another method answers."""
        results, too_large = [], None
        for m in methods:
            try:
                results.append(self._cached(delta, m))
            except PLDGridTooLargeError as err:
                if len(methods) == 1:
                    raise
                too_large = err
        if not results:
            raise too_large  # type: ignore[misc]
        return min(results)

    def _cached(self, delta: float, method: str) -> float:
        key = (delta, method)
        if key not in self._cache:
            self._cache[key] = self._epsilon_of(self._events, delta, method)
        return self._cache[key]

    def epsilons(self, delta: float) -> dict[str, float]:
        """ε(δ) by every applicable method, tightest-first keys."""
        delta = _validate.real("delta", delta)
        _validate.delta("delta", delta)
        return {m: self._cached(delta, m) for m in self.applicable_methods()}

    def _epsilon_of(self, events: Sequence[ev.PrivacyEvent], delta: float, method: str) -> float:
        if method == "pld" and any(isinstance(e, _EXTENSION_EVENTS) for e in events):
            return float(composed_pld(events, self._vdi).get_epsilon_for_delta(delta))
        if method == "rdp" and any(isinstance(e, _EXTENSION_EVENTS) for e in events):
            return _rdp_with_selections(events, delta, self._orders)
        if method == "pld":
            return pld_epsilon(events, delta, value_discretization_interval=self._vdi)
        if method == "rdp":
            return rdp_epsilon(events, delta, orders=self._orders)
        return _closed_form_epsilon(events, delta, method)

    def epsilon_history(
        self, delta: float, *, every: int, accounting: str | None = None
    ) -> list[tuple[int, float]]:
        """ε(δ) after every ``every`` recorded steps and after the last one, for plots.

        A step is one unit of an event's ``count``. The k-th entry is ``(s, ε)`` with
        s = min(k·every, :attr:`steps`): the ε of the first s recorded steps, as
        :meth:`epsilon` of an accountant holding only them would report it. RDP and the closed
        forms sum per-event terms (cheap at any number of checkpoints); PLD keeps the composed
        distribution of the steps so far and composes only the new block
        (:func:`dpjax.accounting.tight.pld_epsilons_incremental`), so its values may differ
        from per-prefix :meth:`epsilon` calls by the PLD discretisation error (≈ 1e-9
        relative), each still a valid upper bound.

        Args:
            delta: δ in [0, 1).
            every: checkpoint spacing in recorded steps, a positive integer.
            accounting: one of :data:`METHODS`, or None for the minimum over the methods that
                apply to every recorded event.

        Returns:
            ``[(steps, epsilon), ...]`` in increasing ``steps``, ending at :attr:`steps`.

        Raises:
            ValueError: invalid arguments, nothing recorded, or ``accounting`` not applicable.

        Example:
            >>> acc = PrivacyAccountant([ev.LaplaceEvent(noise_multiplier=10.0, count=5)])
            >>> acc.epsilon_history(0.0, every=2, accounting="basic")
            [(2, 0.2), (4, 0.4), (5, 0.5)]
        """
        delta = _validate.real("delta", delta)
        _validate.delta("delta", delta)
        every = _validate.positive_int("every", every)
        methods = self._check_accounting(accounting)
        total = self.steps
        marks = list(range(every, total, every)) + [total]
        prefixes = [_prefix(self._events, s) for s in marks]
        results, too_large = [], None
        for m in methods:
            try:
                results.append(self._history_of(prefixes, delta, m))
            except PLDGridTooLargeError as err:  # skipped when another method answers
                if len(methods) == 1:
                    raise
                too_large = err
        if not results:
            raise too_large  # type: ignore[misc]
        best = [min(values) for values in zip(*results, strict=True)]
        return list(zip(marks, best, strict=True))

    def _history_of(
        self, prefixes: list[list[ev.PrivacyEvent]], delta: float, method: str
    ) -> list[float]:
        if any(isinstance(e, _EXTENSION_EVENTS) or _padded_balls_in_bins(e) for e in prefixes[-1]):
            # per prefix, through the evaluators that pay a padded sampler's slack on δ
            return [self._epsilon_of(p, delta, method) for p in prefixes]
        if method == "pld":
            blocks = _blocks(prefixes)
            if blocks is not None:
                return pld_epsilons_incremental(
                    blocks, delta, value_discretization_interval=self._vdi
                )
        if method == "rdp":
            grids = [rdp_curve(p, orders=self._orders) for p in prefixes]
            return [rdp_to_epsilon(o, c, delta) for o, c in grids]
        return [self._epsilon_of(p, delta, method) for p in prefixes]

    def as_event(
        self,
        delta: float,
        *,
        relation: NeighbouringRelation | str | None = None,
        accounting: str | None = None,
    ) -> ev.EpsilonDeltaEvent:
        """Everything recorded as one (ε, δ) event, optionally restated under another relation.

        Use it to combine a DP-SGD run (add/remove-one) with a replace-one release in one
        replace-one accountant: ``replace_acc.record(run_acc.as_event(1e-6,
        relation="replace_one"))``.

        Formal guarantees:
            The recorded composition is (ε, δ)-DP under :attr:`relation` with ε =
            :meth:`epsilon` (δ); under the other relation it is (2ε, (1 + e^ε)δ)-DP by group
            privacy with k = 2 (Dwork & Roth 2014, Theorem 2.2; see
            :func:`dpjax.accounting.convert_relation`), add/remove-one → replace-one only.

        Args:
            delta: δ in [0, 1) at which to read this accountant's ε.
            relation: the relation of the returned event (default: this accountant's).
            accounting: as in :meth:`epsilon`.

        Returns:
            An :class:`~dpjax.events.EpsilonDeltaEvent` with ``count=1`` and the recorded
            events' privacy unit (an accountant of user-level events gives a user-level event,
            which an example-level accountant refuses).

        Raises:
            ValueError: nothing recorded, an infinite ε, a converted δ ≥ 1, or a conversion
                from replace-one to add/remove-one (not sound in general).

        Example:
            >>> run = PrivacyAccountant([ev.LaplaceEvent(1.0, relation="add_or_remove_one")])
            >>> e = run.as_event(0.0, relation="replace_one", accounting="basic")
            >>> e.epsilon, e.delta, e.relation.value
            (2.0, 0.0, 'replace_one')
        """
        eps = self.epsilon(delta, accounting)
        if not math.isfinite(eps):
            _validate.fail("delta", delta, "a δ at which the accountant's ε is finite")
        target = self._relation if relation is None else as_relation(relation)
        eps, dlt = convert_relation(epsilon=eps, delta=delta, from_=self._relation, to=target)
        if not dlt < 1.0:
            _validate.fail("delta", delta, f"small enough that the converted δ < 1 (got {dlt})")
        if eps == 0.0:
            _validate.fail("delta", delta, "a δ at which the accountant's ε is > 0")
        (unit,) = set().union(*(ev.privacy_units(e) for e in self._events))
        return ev.EpsilonDeltaEvent(epsilon=eps, delta=dlt, relation=target, privacy_unit=unit)

    def state_dict(self) -> dict[str, Any]:
        """The accountant as a plain dict of JSON-able values (save it with the training state).

        Example:
            >>> import json
            >>> acc = PrivacyAccountant([ev.GaussianEvent(noise_multiplier=2.0, count=3)])
            >>> again = PrivacyAccountant.from_state_dict(json.loads(json.dumps(acc.state_dict())))
            >>> again.events == acc.events
            True
        """
        return {
            "format": STATE_FORMAT,
            "relation": None if self._relation is None else self._relation.value,
            "value_discretization_interval": self._vdi,
            "orders": None if self._orders is None else list(self._orders),
            "events": [ev.event_to_dict(e) for e in self._events],
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> PrivacyAccountant:
        """Rebuild an accountant from :meth:`state_dict` (every event re-validated).

        Raises:
            ValueError: a dict of another format, or invalid contents.
        """
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            got = state.get("format") if isinstance(state, dict) else state
            _validate.fail("state['format']", got, repr(STATE_FORMAT))
        missing = sorted(
            {"relation", "value_discretization_interval", "orders", "events"} - set(state)
        )
        if missing:
            _validate.fail("state", missing, "a dict with every key written by state_dict")
        if not isinstance(state["events"], list):
            _validate.fail("state['events']", state["events"], "a list of event dicts")
        return cls(
            [ev.event_from_dict(e) for e in state["events"]],
            relation=state["relation"],
            value_discretization_interval=state["value_discretization_interval"],
            orders=state["orders"],
        )


def _padded_balls_in_bins(event: ev.PrivacyEvent) -> bool:
    """A balls-in-bins event with a cap: its slack is paid on δ, not by an RDP curve."""
    return isinstance(event, ev.BallsInBinsGaussianEvent) and event.truncated


def _blocks(prefixes: list[list[ev.PrivacyEvent]]) -> list[list[ev.PrivacyEvent]] | None:
    """The increments between successive prefixes (events and partial counts), or None when a
    shuffled fixed-batch event is split (its cost is not additive in count: recompute)."""
    blocks, previous = [], []
    for p in prefixes:
        block = []
        for i, e in enumerate(p):
            done = previous[i].count if i < len(previous) else 0
            if e.count == done:
                continue
            if done and not ev.count_is_additive(e):
                return None
            block.append(dataclasses.replace(e, count=e.count - done))
        blocks.append(block)
        previous = p
    return blocks
