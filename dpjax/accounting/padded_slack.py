"""The δ that a padded Poisson sampler's truncation (and a private selection's cap on its number
of trials) adds to an (ε, δ) guarantee.

A padded sampler (``PoissonSampledGaussianEvent`` with ``dataset_size``/``max_batch_size``)
drops records when more than its cap are drawn. Every evaluator accounts the untruncated event
at δ·(1 − f) and requires the slack (1 + e^ε)·Σ T·p̄ (:func:`truncation_slack`) to fit in
f·δ, for the first share f of :data:`TRUNCATION_DELTA_SHARES` that fits, else raises
:class:`TruncationSlackError`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from dpjax import events as ev
from dpjax.accounting.num_trials import num_trials_mean, num_trials_tail

__all__ = ["TRUNCATION_DELTA_SHARES", "TruncationSlackError", "truncation_slack"]


#: Shares of δ tried, in order, for a padded sampler's truncation slack: ε is evaluated at
#: δ·(1 − f) and the slack (1 + e^ε)·Σ count·p̄ must be ≤ f·δ. The first share is
#: ``make_private``'s, so an event of its sampler reports its (ε, δ) exactly.
TRUNCATION_DELTA_SHARES = (1e-3, 1e-2, 1e-1, 0.5)


class TruncationSlackError(ValueError):
    """δ is too small to hold a padded sampler's truncation slack (1 + e^ε)·T·p̄ (raise the
    sampler's ``max_batch_size``, or δ)."""


def truncation_slack(epsilon: float, overflow_mass: float) -> float:
    """(1 + e^ε)·Σ countᵢ·p̄ᵢ: the δ a padded sampler adds to an (ε, δ) guarantee.

    Formal guarantees:
        Couple the truncated run M with the untruncated run M* on the same randomness: they
        differ only if some step overflows, with probability ≤ m̄ = Σ countᵢ·p̄ᵢ on D and on
        any neighbour D′. If M* is (ε, δ)-DP then for every set S,
        P[M(D) ∈ S] ≤ P[M*(D) ∈ S] + m̄ ≤ e^ε (P[M(D′) ∈ S] + m̄) + δ + m̄, so M is
        (ε, δ + (1 + e^ε)·m̄)-DP (the standard coupling argument; Balle, Barthe, Gaboardi 2018,
        "Privacy amplification by subsampling: tight analyses via couplings and divergences",
        https://arxiv.org/abs/1807.01647). Other releases composed with M do not change the
        argument (the coupling is on the whole run).

    Args:
        epsilon: ε ≥ 0 of the untruncated run.
        overflow_mass: m̄ ≥ 0.

    Returns:
        The slack (``inf`` when e^ε overflows and m̄ > 0).
    """
    if overflow_mass == 0.0:
        return 0.0
    factor = 1.0 + math.exp(epsilon) if epsilon < 709.0 else math.inf
    return factor * overflow_mass


def _selection_mass(event: ev.RepeatAndSelectEvent) -> float:
    """count·(P[K > K_max] + E[K]·Σ count·p̄ of one trial): the chance that a capped selection
    over padded trials releases something else than the uncapped one over untruncated trials.

    Formal guarantees:
        Couple the run with K_max trials (selection among the first min(K, K_max)) and the
        uncapped selection over untruncated trials on the same K, candidates and trial
        randomness. Their released outputs differ only if K > K_max or one of the first
        min(K, K_max) trials overflows; by the union bound and the independence of K from the
        trials, with probability ≤ P[K > K_max] + Σ_k P[K = k]·k·m̄ = P[K > K_max] + E[K]·m̄,
        m̄ = Σ count·p̄ of one trial (on D and on any neighbour). :func:`truncation_slack`'s
        argument then applies to the whole run.
    """
    tail = 0.0
    if event.max_trials is not None:
        tail = num_trials_tail(event.max_trials, mean=event.mean, shape=event.shape)
    mean = num_trials_mean(mean=event.mean, shape=event.shape)
    return event.count * (tail + mean * _overflow_mass(event.base_parts))


#: Events of padded samplers (a public cap m on the batch; the overflow is charged on δ).
_PADDED_EVENTS = (ev.PoissonSampledGaussianEvent, ev.BallsInBinsGaussianEvent)


def _overflow_mass(events: Sequence[ev.PrivacyEvent]) -> float:
    """Σ count·p̄ over the padded-sampler events, plus :func:`_selection_mass` of private
    selections (0 if there are neither)."""
    return math.fsum(
        _selection_mass(e)
        if isinstance(e, ev.RepeatAndSelectEvent)
        else e.count * e.overflow_probability
        for e in events
        if isinstance(e, ev.RepeatAndSelectEvent) or (isinstance(e, _PADDED_EVENTS) and e.truncated)
    )


def _untruncated_one(e: ev.PrivacyEvent) -> ev.PrivacyEvent:
    """The event whose guarantee, plus the slack of :func:`_overflow_mass`, bounds ``e``'s."""
    if isinstance(e, _PADDED_EVENTS) and e.truncated:
        return e.untruncated(slack_paid_separately=True)
    if isinstance(e, ev.RepeatAndSelectEvent):
        parts = tuple(_untruncated_one(p) for p in e.base_parts)
        base = parts if isinstance(e.base_event, tuple) else parts[0]
        return dataclasses.replace(e, base_event=base, max_trials=None)
    return e


def _untruncated(events: Sequence[ev.PrivacyEvent]) -> list[ev.PrivacyEvent]:
    return [_untruncated_one(e) for e in events]


def _with_truncation_slack(events, delta: float, evaluate) -> float:
    """``evaluate(untruncated events, δ′)`` with the truncation slack paid from δ: the first
    share f of :data:`TRUNCATION_DELTA_SHARES` with slack(ε(δ(1 − f))) ≤ f·δ."""
    plain = _untruncated(events)
    mass = _overflow_mass(events)
    if mass == 0.0:
        return evaluate(plain, delta)
    if delta == 0.0:
        return math.inf
    for share in TRUNCATION_DELTA_SHARES:
        eps = evaluate(plain, delta * (1.0 - share))
        if truncation_slack(eps, mass) <= share * delta:
            return eps
    selection = any(isinstance(e, ev.RepeatAndSelectEvent) for e in events)
    raise TruncationSlackError(
        f"delta must be large enough to hold the padded sampler's truncation slack "
        f"(1 + e^ε)·T·p̄ (T·p̄ = {mass:.3g}, ε = {eps:.4g} at δ·{1 - share:g}); got {delta!r}. "
        "Use a larger max_batch_size in PoissonSampler (its overflow probability per step is "
        "p̄)"
        + (
            ", a larger max_trials in private_selection (P[K > max_trials] is charged)"
            if selection
            else ""
        )
        + " or a larger δ"
    )
