r"""RDP of private selection: repeat a private run a random number of times, release the best.

Papernot & Steinke 2022 ("Hyperparameter tuning with Rényi differential privacy", ICLR): if one
run is (λ, ε_λ)-RDP for all λ and the number of runs K is drawn independently of the data, then
releasing only the best run is RDP with

* K ~ truncated negative binomial (shape η ≥ 0, parameter γ; η = 1 geometric, η = 0
  logarithmic), their Theorem 2:

  .. math:: ε'_λ ≤ ε_λ + (1 + η)\Big(1 - \frac1{\hatλ}\Big)ε_{\hatλ}
            + \frac{(1 + η)\ln(1/γ)}{\hatλ} + \frac{\ln E[K]}{λ - 1}
            \quad\text{for every } \hatλ ≥ 1;

* K ~ Poisson(μ), their Theorem 6 (with ε̂, δ̂ any (ε̂, δ̂)-DP guarantee of one run):

  .. math:: ε'_λ ≤ ε_λ + μ\hatδ + \frac{\ln μ}{λ - 1}
            \quad\text{with } \hatε = \ln(1 + 1/(λ - 1)).

dp-accounting's RDP accountant implements both for ``RepeatAndSelectDpEvent``; this module
feeds it the base event (any event dpjax accounts by RDP) and caches the curve.

A selection capped at ``max_trials`` trials, or over trials with a padded Poisson sampler, is not
the mechanism of these theorems; it is within total variation m̄ of it (m̄ = P[K > K_max] +
E[K]·Σ count·p̄, see :func:`dpjax.accounting.padded_slack._selection_mass`), which
:class:`~dpjax.accounting.PrivacyAccountant` charges on δ as (1 + e^ε)·m̄. Its RDP curve alone is
therefore refused here.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
from dp_accounting import dp_event as dp_events
from dp_accounting import rdp

from dpjax import _validate
from dpjax import events as ev
from dpjax.accounting.conversion import _quiet_absl, to_dp_event
from dpjax.accounting.renyi import DEFAULT_RDP_ORDERS, _rdp_relation

__all__ = ["repeat_and_select_rdp", "SHAPES"]

#: Named shapes of the distribution of the number of runs (dp-accounting's convention).
SHAPES = {"poisson": math.inf, "geometric": 1.0, "logarithmic": 0.0}


@functools.lru_cache(maxsize=64)
def _curve(event: ev.RepeatAndSelectEvent, orders: tuple[float, ...]) -> np.ndarray:
    parts = list(event.base_parts)
    inner = [to_dp_event(p, method="rdp")[0] for p in parts]  # raises where RDP does not apply
    inner = inner[0] if len(inner) == 1 else dp_events.ComposedDpEvent(inner)
    accountant = rdp.RdpAccountant(orders=list(orders), neighboring_relation=_rdp_relation(parts))
    with _quiet_absl():
        accountant.compose(dp_events.RepeatAndSelectDpEvent(inner, event.mean, event.shape))
    out = np.array(accountant.rdp, dtype=np.float64)
    out.setflags(write=False)
    return out


def repeat_and_select_rdp(
    event: ev.RepeatAndSelectEvent, *, orders: Sequence[float] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(orders, RDP) of ``event.count`` private selections over ``event.base_event``.

    Formal guarantees:
        Papernot & Steinke 2022, Theorem 2 (truncated negative binomial K, including the
        geometric and logarithmic cases) and Theorem 6 (Poisson K), applied to the base event's
        RDP curve by dp-accounting's RDP accountant; RDP composition over ``count``. Holds
        only if K is independent of the data and hidden, and only the best run's output
        (candidate, score, model) is released.

    Raises:
        ValueError: if RDP does not apply to the base event, or the event carries a slack
            that no RDP curve holds (``max_trials`` set, or a padded sampler in the base
            event: record it in a :class:`~dpjax.accounting.PrivacyAccountant`, which pays the
            slack on δ).
    """
    padded = [
        p
        for p in event.base_parts
        if isinstance(p, ev.PoissonSampledGaussianEvent | ev.BallsInBinsGaussianEvent)
        and p.truncated
    ]
    if event.max_trials is not None or padded:
        _validate.fail(
            "event",
            event,
            "a selection without max_trials and without a padded sampler in base_event (their "
            "slack (1 + e^ε)·m̄ is an (ε, δ) term, not an RDP one: record the event in a "
            "PrivacyAccountant, which charges it)",
        )
    grid = tuple(float(a) for a in (DEFAULT_RDP_ORDERS if orders is None else orders))
    return np.asarray(grid), event.count * _curve(event, grid)
