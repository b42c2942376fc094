"""dpjax privacy events as dp-accounting events, validated for the method that accounts them.

:func:`to_dp_event` maps each event of :mod:`dpjax.events` to a dp-accounting ``DpEvent`` and
its neighbouring relation (or refuses an analysis the method does not have, naming why);
``_group`` joins identical events so one evaluation serves a thousand recorded steps. Shared
by the RDP (:mod:`~dpjax.accounting.renyi`) and PLD (:mod:`~dpjax.accounting.tight`)
evaluators; how each relation is handled is stated in :mod:`dpjax.accounting.tight`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterator, Sequence

import dp_accounting

from dpjax import _validate
from dpjax import events as ev
from dpjax.relation import ADD_OR_REMOVE_ONE, REPLACE_ONE, NeighbouringRelation, sensitivity_factor

__all__ = ["fixed_batch_uses", "to_dp_event"]


TIGHT_METHODS = ("pld", "rdp")


REPLACE_ONE_DP = dp_accounting.NeighboringRelation.REPLACE_ONE


#: A clipped sum moves by 2C under replace-one (C under add/remove-one).
_REPLACE_FACTOR = sensitivity_factor(REPLACE_ONE)


_DP_RELATION = {
    ADD_OR_REMOVE_ONE: dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
    REPLACE_ONE: dp_accounting.NeighboringRelation.REPLACE_ONE,
}


def balls_in_bins_dp_event(event: ev.BallsInBinsGaussianEvent) -> dp_accounting.DpEvent:
    """The conservative (no amplification) bound on balls-in-bins batches: ``event.epochs``
    Gaussian releases of σ/Δ = ``noise_multiplier`` / (1 or 2), Δ = C add/remove-one, 2C
    replace-one (read under dp-accounting's unit-shift relation). The untruncated event's;
    the truncation slack of a padded event is paid on δ by the callers
    (:mod:`dpjax.accounting.padded_slack`). See :class:`dpjax.dp_sgd.BallsInBinsSampler`.
    """
    factor = _REPLACE_FACTOR if event.relation is REPLACE_ONE else 1.0
    inner = dp_accounting.GaussianDpEvent(event.noise_multiplier / factor)
    return dp_accounting.SelfComposedDpEvent(inner, event.epochs)


def fixed_batch_uses(event: ev.FixedBatchGaussianEvent) -> int:
    """How many of the event's noisy releases one record can be part of.

    ``"shuffle"``: ⌈count / ⌊n/b⌋⌉ (one batch per epoch, counting a partial epoch as whole);
    ``"independent"``: ``count`` (a record may be drawn at every step).
    """
    if event.sampling == "shuffle":
        per_epoch = event.dataset_size // event.batch_size
        return -(-event.count // per_epoch)
    return event.count


def _unsupported(event: ev.PrivacyEvent, method: str, why: str) -> ValueError:
    return ValueError(f"accounting={method!r} does not apply to {event!r}: {why}")


def to_dp_event(
    event: ev.PrivacyEvent, *, method: str = "pld"
) -> tuple[dp_accounting.DpEvent, dp_accounting.NeighboringRelation]:
    """Convert a dpjax event to a dp-accounting ``DpEvent`` and the relation to account it under.

    Composing the returned ``DpEvent`` in a dp-accounting accountant of ``method``
    (``PLDAccountant`` or ``RdpAccountant``) constructed with the returned
    ``neighboring_relation`` gives the event's guarantee under ``event.relation``. Unit-shift
    events (Gaussian, Laplace, and replace-one full-batch DP-GD as a Gaussian with σ/(2C)) are
    returned with ``ADD_OR_REMOVE_ONE``, which both accountants read as "shift by one unit".

    Args:
        event: a dpjax event.
        method: ``"pld"`` or ``"rdp"`` (the analyses supported differ).

    Returns:
        ``(dp_event, neighboring_relation)``; ``dp_event`` is self-composed ``event.count`` times.

    Raises:
        ValueError: if no analysis of ``method`` applies to the event under its relation
            (generic (ε, δ) and Laplace DP-SGD events; replace-one Poisson sampling with RDP;
            fixed-size batches under add/remove-one).

    Example:
        >>> e = ev.PoissonSampledGaussianEvent(noise_multiplier=1.0, sampling_rate=0.01, count=10)
        >>> dp_event, rel = to_dp_event(e)
        >>> type(dp_event).__name__, rel.name
        ('SelfComposedDpEvent', 'ADD_OR_REMOVE_ONE')
    """
    _validate.one_of("method", method, TIGHT_METHODS)
    unit = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    if isinstance(event, ev.GaussianEvent):
        inner, rel = dp_accounting.GaussianDpEvent(event.noise_multiplier), unit
    elif isinstance(event, ev.LaplaceEvent):
        inner, rel = dp_accounting.LaplaceDpEvent(event.noise_multiplier), unit
    elif isinstance(event, ev.PoissonSampledGaussianEvent) and event.truncated:
        inner, rel = _truncated_poisson_dp_event(event, method)
    elif isinstance(event, ev.PoissonSampledGaussianEvent):
        inner, rel = _poisson_dp_event(event, method)
    elif isinstance(event, ev.FixedBatchGaussianEvent):
        if event.relation is not REPLACE_ONE:
            raise ValueError(
                f"event.relation must be 'replace_one' for a FixedBatchGaussianEvent; got "
                f"{event.relation.value!r}: fixed-size batches are analysed under replace-one "
                "only (n is public) and the Poisson analyses do not apply to them. Build the "
                "event with relation='replace_one' (noise_multiplier stays σ/C; the "
                "sensitivity 2C is charged by the accountant) or use Poisson sampling"
            )
        if event.sampling == "independent" and method == "rdp":
            # Wang, Balle, Kasiviswanathan 2019, Theorem 27: base Gaussian on the batch has
            # replace-one sensitivity 2C, so its σ/Δ is noise_multiplier/2.
            inner = dp_accounting.SampledWithoutReplacementDpEvent(
                source_dataset_size=event.dataset_size,
                sample_size=event.batch_size,
                event=dp_accounting.GaussianDpEvent(event.noise_multiplier / _REPLACE_FACTOR),
            )
            return dp_accounting.SelfComposedDpEvent(inner, event.count), REPLACE_ONE_DP
        # No amplification: a record sits in at most `fixed_batch_uses` batches, each a
        # Gaussian release with sensitivity 2C (parallel composition within an epoch).
        inner = dp_accounting.GaussianDpEvent(event.noise_multiplier / _REPLACE_FACTOR)
        return dp_accounting.SelfComposedDpEvent(inner, fixed_batch_uses(event)), unit
    elif isinstance(event, ev.BallsInBinsGaussianEvent):
        if event.truncated:  # no DpEvent carries the cap: its slack would be dropped
            raise ValueError(
                "event must be an untruncated BallsInBinsGaussianEvent for dp-accounting: the "
                "padded sampler's truncation slack (1 + e^ε)·count·p̄ is paid on δ by dpjax's "
                "accountants (PrivacyAccountant), or use event.untruncated("
                "slack_paid_separately=True) and add dpjax.accounting.truncation_slack yourself"
            )
        return balls_in_bins_dp_event(event), unit
    else:
        raise _unsupported(
            event,
            method,
            "only the composition theorems (basic, advanced, optimal) apply to generic (ε, δ) "
            "and Laplace DP-SGD events",
        )
    return dp_accounting.SelfComposedDpEvent(inner, event.count), rel


def _truncated_poisson_dp_event(
    event: ev.PoissonSampledGaussianEvent, method: str
) -> tuple[dp_accounting.DpEvent, dp_accounting.NeighboringRelation]:
    """A padded Poisson sampler as dp-accounting's ``TruncatedSubsampledGaussianDpEvent``.

    Its analysis (Poisson sampling, then a uniformly random subset of at most m of the
    selected, Gaussian on the sum; PLD only, add/remove-one) matches
    :class:`~dpjax.dp_sgd.PoissonSampler`'s truncation rule. ``dataset_size`` is given as
    n + 1, the larger data set of an add-one pair (as in ``overflow_probability``).
    dpjax's own evaluators instead add the truncation slack to δ (see
    :func:`truncation_slack`), so they agree with ``make_private``.
    """
    if method != "pld" or event.relation is not ADD_OR_REMOVE_ONE:
        raise _unsupported(
            event,
            method,
            "dp-accounting analyses a truncated (padded) Poisson sampler only by PLD under "
            "add/remove-one; dpjax.accounting.tight_epsilon accounts it by any method (the "
            "truncation slack is added to δ)",
        )
    inner = dp_accounting.TruncatedSubsampledGaussianDpEvent(
        dataset_size=event.dataset_size + 1,
        sampling_probability=event.sampling_rate,
        truncated_batch_size=event.max_batch_size,
        noise_multiplier=event.noise_multiplier,
    )
    return inner, dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE


def _poisson_dp_event(
    event: ev.PoissonSampledGaussianEvent, method: str
) -> tuple[dp_accounting.DpEvent, dp_accounting.NeighboringRelation]:
    q, nm = event.sampling_rate, event.noise_multiplier
    unit = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    if event.relation is ADD_OR_REMOVE_ONE:
        if q == 1.0:
            return dp_accounting.GaussianDpEvent(nm), unit
        return dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(nm)), unit
    # Replace-one: the clipped sum moves by up to 2C.
    if q == 1.0:
        return dp_accounting.GaussianDpEvent(nm / _REPLACE_FACTOR), unit
    if method == "rdp":
        raise _unsupported(
            event,
            method,
            "dp-accounting's RDP has no replace-one analysis of Poisson subsampling; use "
            "accounting='pld' or the add/remove-one relation",
        )
    inner = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(nm))
    return inner, dp_accounting.NeighboringRelation.REPLACE_ONE


def _common_relation(events: Sequence[ev.PrivacyEvent]) -> NeighbouringRelation:
    if not events:
        _validate.fail("events", events, "a non-empty sequence of privacy events")
    relations = {e.relation for e in events}
    if len(relations) > 1:
        _validate.fail(
            "events",
            sorted(r.value for r in relations),
            "events under one neighbouring relation (a guarantee mixing relations is not "
            "defined; convert the sensitivities first)",
        )
    return relations.pop()


@contextlib.contextmanager
def _quiet_absl() -> Iterator[None]:
    """Silence dp-accounting's per-order "failed to converge ... excluding this order" warnings
    (an excluded order only loosens the bound; :func:`rdp_epsilon` documents it)."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _group(events: Sequence[ev.PrivacyEvent]) -> list[ev.PrivacyEvent]:
    """Identical events (all fields but ``count``, additive counts) joined into one, in order of
    first appearance. Composition is commutative, so the guarantee is unchanged; evaluating one
    event of count k + m (one self-composition, one RDP evaluation) instead of two is what keeps
    per-step records cheap."""
    joined: dict[ev.PrivacyEvent, int] = {}
    out: list[ev.PrivacyEvent | None] = []
    for e in events:
        if not ev.count_is_additive(e):
            out.append(e)
            continue
        unit = dataclasses.replace(e, count=1)
        if unit not in joined:
            joined[unit] = len(out)
            out.append(e)
        else:
            i = joined[unit]
            out[i] = dataclasses.replace(out[i], count=out[i].count + e.count)
    return out
