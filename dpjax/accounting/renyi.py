"""ε(δ) by Rényi DP: dp-accounting's RDP accountant over dpjax events.

RDP adds up under composition, so :func:`rdp_curve` evaluates one release of each distinct
event (cached) and sums; :func:`rdp_epsilon` converts the curve to (ε, δ), the padded
sampler's truncation slack paid from δ. Never tighter than PLD (:mod:`dpjax.accounting.tight`
says where each method is tight).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import dp_accounting
import numpy as np
from dp_accounting import rdp

from dpjax import _validate
from dpjax import events as ev
from dpjax.accounting import vectorized
from dpjax.accounting.conversion import _common_relation, _group, _quiet_absl, to_dp_event
from dpjax.accounting.padded_slack import _with_truncation_slack

__all__ = ["DEFAULT_RDP_ORDERS", "rdp_curve", "rdp_epsilon", "rdp_to_epsilon"]


#: RDP orders: fractional near 1 (large ε), dense up to 64, geometric up to 10⁴ (small ε).
DEFAULT_RDP_ORDERS: tuple[float, ...] = tuple(
    float(a)
    for a in np.unique(
        np.concatenate(
            [
                1.0 + np.arange(1, 10) / 100.0,
                1.0 + np.arange(1, 100) / 10.0,
                np.arange(11, 65),
                np.round(np.geomspace(64, 1e4, 25)),
            ]
        )
    )
)


def rdp_epsilon(
    events: Sequence[ev.PrivacyEvent],
    delta: float,
    *,
    orders: Sequence[float] | None = None,
) -> float:
    """ε(δ) of the composition of ``events`` by dp-accounting's RDP accountant.

    Formal guarantees:
        RDP composition (Mironov 2017, Proposition 1) of the Poisson-subsampled Gaussian
        (Mironov, Talwar, Zhang 2019), the Gaussian, the Laplace, and the without-replacement
        subsampled Gaussian (Wang, Balle, Kasiviswanathan 2019, Theorem 27), converted to (ε, δ)
        by Canonne, Kamath and Steinke (2020), Proposition 12, minimised over ``orders``. An
        upper bound; never tighter than :func:`pld_epsilon` up to PLD's discretisation.
        Fractional orders whose series does not converge are skipped by dp-accounting (its
        warnings are silenced here); skipping an order only loosens the bound. A padded
        sampler's truncation slack is paid from δ (module docstring; :func:`truncation_slack`).

    Args:
        events: dpjax events, all under one relation.
        delta: δ in [0, 1) (δ = 0 gives ``inf`` for Gaussian events).
        orders: RDP orders α > 1; default :data:`DEFAULT_RDP_ORDERS`.

    Returns:
        ε.
    """
    delta = _validate.real("delta", delta)
    _validate.delta("delta", delta)

    def evaluate(plain: Sequence[ev.PrivacyEvent], d: float) -> float:
        grid, curve = rdp_curve(plain, orders=orders)
        return rdp_to_epsilon(grid, curve, d)

    return _with_truncation_slack(events, delta, evaluate)


def rdp_to_epsilon(orders: Sequence[float], curve: Sequence[float], delta: float) -> float:
    """ε(δ) of an RDP curve, orders whose RDP value is NaN skipped.

    A NaN RDP value is a failed evaluation (e.g. dp-accounting's sum of terms at a noise
    multiplier whose square underflows, σ ≲ 1e-154, meets inf − inf), not a divergence: it is
    read as +inf (the order is skipped). dp-accounting's conversion would instead return ε = 0
    for a curve with a NaN order (its minimum over orders picks the NaN, then max(0, NaN) = 0),
    so a mechanism with almost no noise read as perfectly private.

    Formal guarantees:
        Canonne, Kamath, Steinke 2020 (https://arxiv.org/abs/2004.00603), Proposition 12, as
        ``dp_accounting.rdp.compute_epsilon`` evaluates it, minimised over the orders with a
        valid (non-NaN) RDP value; ``inf`` when none has one. Skipping an order only loosens
        the bound.

    Args:
        orders: RDP orders α > 1.
        curve: RDP values at ``orders``.
        delta: δ in [0, 1).

    Returns:
        ε ≥ 0, or ``inf``.
    """
    values = np.asarray(curve, dtype=np.float64)
    if np.isnan(values).any():
        values = np.where(np.isnan(values), np.inf, values)
    return float(rdp.compute_epsilon(orders, values, delta)[0])


def _rdp_relation(events: Sequence[ev.PrivacyEvent]) -> dp_accounting.NeighboringRelation:
    """The dp-accounting relation to compose ``events`` in (validating each for RDP)."""
    # dp-accounting's RDP treats Gaussian/Laplace events as a unit shift under every relation
    # (tested in tests/accounting/test_tight_dp_sgd.py), so the unit-shift events compose
    # correctly in the replace-one accountant that independently sampled fixed-batch events need.
    rels = {to_dp_event(e, method="rdp")[1] for e in events}
    if dp_accounting.NeighboringRelation.REPLACE_ONE in rels:
        return dp_accounting.NeighboringRelation.REPLACE_ONE
    return dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE


@functools.lru_cache(maxsize=64)
def _rdp_vector(
    event: ev.PrivacyEvent,
    orders: tuple[float, ...],
    dp_relation: dp_accounting.NeighboringRelation,
) -> np.ndarray:
    """RDP of ``event`` at ``orders`` (read-only array), cached by event and orders.

    One Poisson-subsampled Gaussian release (add/remove-one) is evaluated by
    :func:`dpjax.accounting.vectorized.poisson_gaussian_rdp`: dp-accounting's values, bit for
    bit, without its per-term Python loop over integer orders up to 10⁴."""
    dp_event = to_dp_event(event, method="rdp")[0]
    inner = dp_event.event if isinstance(dp_event, dp_accounting.SelfComposedDpEvent) else None
    with _quiet_absl():
        if (
            inner is not None
            and dp_event.count == 1
            and dp_relation is dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
            and vectorized.is_poisson_gaussian(inner)
        ):
            vector = vectorized.poisson_gaussian_rdp(
                inner.sampling_probability, inner.event.noise_multiplier, orders
            )
        else:
            accountant = rdp.RdpAccountant(orders=list(orders), neighboring_relation=dp_relation)
            accountant.compose(dp_event)
            vector = accountant.rdp
    vector.setflags(write=False)
    return vector


def rdp_curve(
    events: Sequence[ev.PrivacyEvent], *, orders: Sequence[float] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The RDP curve (orders α, ε_α) of the composition of ``events``.

    RDP adds up under composition, so the curve is Σ countᵢ · (RDP of one release of event i):
    one release of each distinct event is evaluated (and cached), whatever the number of
    records, so a thousand recorded one-step events cost one evaluation and a vector sum.
    Shuffled fixed-batch events (not additive in ``count``) are evaluated whole.

    Args:
        events: dpjax events, all under one relation.
        orders: RDP orders α > 1; default :data:`DEFAULT_RDP_ORDERS`.

    Returns:
        ``(orders, rdp)`` float64 arrays; convert with ``dp_accounting.rdp.compute_epsilon``.

    Raises:
        ValueError: if RDP does not apply to an event (see :func:`to_dp_event`).
    """
    _common_relation(events)
    grid = tuple(float(a) for a in (DEFAULT_RDP_ORDERS if orders is None else orders))
    dp_relation = _rdp_relation(events)
    curve = np.zeros(len(grid), dtype=np.float64)
    for e in _group(events):
        if ev.count_is_additive(e):
            curve += e.count * _rdp_vector(dataclasses.replace(e, count=1), grid, dp_relation)
        else:
            curve += _rdp_vector(e, grid, dp_relation)
    return np.asarray(grid, dtype=np.float64), curve
