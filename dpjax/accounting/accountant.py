"""An accountant that records heterogeneous privacy events and answers ε(δ).

It counts noisy releases (events' ``count``), never micro-batches, and refuses to mix
neighbouring relations. ``epsilon(delta)`` returns the smallest ε among the methods that are
valid for *every* recorded event (each is a valid upper bound, so the minimum is too);
``epsilon(delta, method=...)`` uses one method and raises if it does not apply.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from dpjax import _validate
from dpjax import events as ev
from dpjax.accounting.composition import advanced_composition_heterogeneous
from dpjax.accounting.optimal import optimal_composition_epsilon
from dpjax.accounting.tight import (
    DEFAULT_VALUE_DISCRETIZATION_INTERVAL,
    PLDGridTooLargeError,
    fixed_batch_uses,
    pld_epsilon,
    rdp_epsilon,
    to_dp_event,
)
from dpjax.accounting.zcdp import zcdp_epsilon_cks
from dpjax.relation import ADD_OR_REMOVE_ONE, REPLACE_ONE, NeighbouringRelation, as_relation

__all__ = ["METHODS", "PrivacyAccountant"]

#: Accounting methods, tightest first (PLD ≤ RDP for the same events; "optimal" ≤ "advanced").
METHODS = ("pld", "rdp", "zcdp", "optimal", "advanced", "basic")

_COMPOSITION_METHODS = ("optimal", "advanced", "basic")

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
        return event.count / (2.0 * event.noise_multiplier**2)
    if isinstance(event, ev.PoissonSampledGaussianEvent) and event.sampling_rate == 1.0:
        shift = 2.0 if event.relation is REPLACE_ONE else 1.0  # replace-one moves the sum by 2C
        return event.count * shift**2 / (2.0 * event.noise_multiplier**2)
    if isinstance(event, ev.FixedBatchGaussianEvent) and event.relation is REPLACE_ONE:
        # No amplification: fixed_batch_uses releases, each of sensitivity 2C.
        return fixed_batch_uses(event) * 4.0 / (2.0 * event.noise_multiplier**2)
    profile = _dp_profile(event)
    if profile is not None and all(d == 0.0 for _, d, _ in profile):
        # Pure ε-DP implies ε²/2-zCDP (Bun & Steinke 2016, Proposition 1.4).
        return math.fsum(c * e * e / 2.0 for e, _, c in profile)
    return None


class PrivacyAccountant:
    """Records privacy events and answers ε(δ) by the tightest valid method or a named one.

    Methods (see :data:`METHODS`):

    * ``"pld"`` / ``"rdp"``: dp-accounting (:mod:`dpjax.accounting.tight`); Gaussian, Laplace,
      Poisson-subsampled Gaussian (RDP: add/remove-one or q = 1) and fixed-batch Gaussian
      (replace-one; amplified by RDP only for independently drawn batches) events.
    * ``"zcdp"``: Gaussian events, full-batch (q = 1) DP-GD events, fixed-batch events (no
      amplification) and pure-DP events (ε²/2-zCDP), converted by Canonne–Kamath–Steinke 2020.
    * ``"optimal"`` (Kairouz–Oh–Viswanath 2015), ``"advanced"`` (lecture on properties of DP,
      advanced composition, heterogeneous form; Dwork, Rothblum, Vadhan 2010), ``"basic"``
      (lectures on properties of DP and on advances in DP, sequential composition): events with
      a fixed (ε, δ): generic (ε, δ), Laplace (Δ₁/b, 0), Laplace DP-SGD (ε_h, 0) events;
      ``"optimal"`` needs all of them identical.

    Gaussian-only records (Gaussian, full-batch DP-GD and fixed-batch events) are one Gaussian
    release with μ = √(Σμᵢ²): ``"pld"`` answers them by the exact Gaussian profile (see
    :func:`dpjax.accounting.tight.pld_epsilon`), so it is fast at any number of releases.

    Fixed-size batch events (:class:`~dpjax.events.FixedBatchGaussianEvent`) are
    refused under add/remove-one when recorded: their analyses hold under replace-one only.

    The (ε, δ) composition methods spend Σδᵢ of the requested δ on the events' own δᵢ; if
    nothing is left they return ``inf``.

    Formal guarantees:
        Each method's result is an upper bound on ε(δ) of the adaptive composition of the
        recorded releases under the accountant's relation; see the functions it calls.

    Args:
        events: events to record now.
        relation: the relation of the guarantee; default: that of the first event recorded.
        value_discretization_interval: PLD grid (default 1e-4).
        orders: RDP orders (default :data:`dpjax.accounting.DEFAULT_RDP_ORDERS`).

    Example:
        >>> acc = PrivacyAccountant()
        >>> acc.record(ev.LaplaceEvent(noise_multiplier=10.0, count=5))
        PrivacyAccountant(relation='replace_one', events=1, releases=5)
        >>> acc.applicable_methods()
        ('pld', 'rdp', 'zcdp', 'optimal', 'advanced', 'basic')
        >>> acc.epsilon(0.0, method="basic")
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
        self._vdi = _validate.real("value_discretization_interval", value_discretization_interval)
        _validate.in_range(
            "value_discretization_interval",
            self._vdi,
            0.0,
            1e-2,
            low_inclusive=False,
            high_inclusive=True,
        )
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
        """The recorded events, in order."""
        return tuple(self._events)

    @property
    def releases(self) -> int:
        """Number of noisy releases recorded (a Laplace DP-SGD event counts each ε_h)."""
        total = 0
        for e in self._events:
            per = len(e.epsilons) if isinstance(e, ev.LaplaceDPSGDEvent) else 1
            total += per * e.count
        return total

    def record(self, event: ev.PrivacyEvent) -> PrivacyAccountant:
        """Record one event; returns ``self``.

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
                "refused: restate the event's sensitivity under one relation)",
            )
        self._events.append(event)
        return self

    def extend(self, events: Iterable[ev.PrivacyEvent]) -> PrivacyAccountant:
        """Record several events; returns ``self``."""
        for e in events:
            self.record(e)
        return self

    def _why_not(self, method: str) -> str | None:
        """None if ``method`` applies to every recorded event, else the reason."""
        if not self._events:
            return "no events recorded"
        if method in ("pld", "rdp"):
            for e in self._events:
                try:
                    to_dp_event(e, method=method)
                except ValueError as err:
                    return str(err)
            return None
        if method == "zcdp":
            bad = [e for e in self._events if _zcdp_rho(e) is None]
            return None if not bad else f"zCDP does not apply to {bad[0]!r} (subsampling or δ > 0)"
        profiles = [_dp_profile(e) for e in self._events]
        if any(p is None for p in profiles):
            bad = self._events[profiles.index(None)]
            return (
                f"composition theorems need an (ε, δ) per release; {bad!r} has a privacy curve "
                "(use 'pld', 'rdp' or 'zcdp')"
            )
        if method == "optimal":
            pairs = {(e, d) for p in profiles for e, d, _ in p}
            if len(pairs) > 1:
                return "the optimal (KOV) composition needs identical (ε, δ) releases"
        return None

    def applicable_methods(self) -> tuple[str, ...]:
        """The methods that apply to every recorded event, tightest first."""
        return tuple(m for m in METHODS if self._why_not(m) is None)

    def epsilon(self, delta: float, method: str | None = None) -> float:
        """ε(δ) of everything recorded, by ``method`` or (None) the tightest valid one.

        Args:
            delta: δ in [0, 1).
            method: one of :data:`METHODS`, or None for the minimum over applicable methods.

        Returns:
            ε (``inf`` where the method gives no finite ε at this δ).

        Raises:
            ValueError: if ``method`` does not apply to a recorded event, or none applies.
        """
        delta = _validate.real("delta", delta)
        _validate.delta("delta", delta)
        if method is None:
            methods = self.applicable_methods()
            if not methods:
                _validate.fail("method", None, "a method valid for every recorded event (none)")
            return self._tightest(delta, methods)
        _validate.one_of("method", method, METHODS)
        why = self._why_not(method)
        if why is not None:
            raise ValueError(f"method={method!r} does not apply: {why}")
        return self._epsilon(delta, method)

    def _tightest(self, delta: float, methods: tuple[str, ...]) -> float:
        """min over ``methods`` (each a valid upper bound); a PLD whose grid cannot be built
        is skipped when another method answers."""
        results, too_large = [], None
        for m in methods:
            try:
                results.append(self._epsilon(delta, m))
            except PLDGridTooLargeError as err:
                too_large = err
        if not results:
            raise too_large  # type: ignore[misc]
        return min(results)

    def epsilons(self, delta: float) -> dict[str, float]:
        """ε(δ) by every applicable method, tightest-first keys."""
        delta = _validate.real("delta", delta)
        _validate.delta("delta", delta)
        return {m: self._epsilon(delta, m) for m in self.applicable_methods()}

    def _epsilon(self, delta: float, method: str) -> float:
        if method == "pld":
            return pld_epsilon(self._events, delta, value_discretization_interval=self._vdi)
        if method == "rdp":
            return rdp_epsilon(self._events, delta, orders=self._orders)
        if method == "zcdp":
            if delta == 0.0:
                return math.inf
            rho = math.fsum(_zcdp_rho(e) for e in self._events)
            return zcdp_epsilon_cks(rho=rho, delta=delta)
        triples = [t for e in self._events for t in _dp_profile(e)]
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
