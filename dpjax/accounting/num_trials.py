r"""The distribution of the number of trials K of a private selection, and its cap.

dp-accounting's ``RepeatAndSelectDpEvent(event, mean, shape)`` accounts K drawn from

* Poisson(mean) for ``shape = inf``;
* the truncated negative binomial P[K = k] ∝ C(k + η − 1, k)(1 − γ)^k, k ≥ 1 (η = ``shape``:
  η = 1 geometric, η = 0 logarithmic P[K = k] ∝ (1 − γ)^k / k), with γ solving E[K] = mean
  (dp-accounting's own map, so sampling and accounting agree).

A run that executes exactly K trials shows K in its wall time, and the bound needs K hidden.
:func:`dpjax.tuning.private_selection` therefore always runs a PUBLIC number K_max of trials
(``max_trials``) and selects among the first min(K, K_max); :func:`num_trials_tail` is the
P[K > K_max] that the accountant charges for the cap (see
:class:`~dpjax.events.RepeatAndSelectEvent`).
"""

from __future__ import annotations

import math

from dp_accounting.rdp import rdp_privacy_accountant as _dp_rdp
from scipy import stats

from dpjax import _validate

__all__ = [
    "DEFAULT_TRIALS_TAIL",
    "max_trials_for",
    "num_trials_mean",
    "num_trials_tail",
    "tnb_gamma",
]

#: P[K > K_max] of the default cap on the number of trials (:func:`max_trials_for`).
DEFAULT_TRIALS_TAIL = 1e-10


def tnb_gamma(shape: float, mean: float) -> float:
    """γ of the truncated negative binomial with shape η and E[K] = ``mean`` (dp-accounting's
    map; γ = 1 means K = 1 surely)."""
    return float(_dp_rdp._gamma_truncated_negative_binomial(shape, mean))  # noqa: SLF001


def num_trials_mean(*, mean: float, shape: float) -> float:
    """E[K] of the distribution actually drawn: ``mean`` up to dp-accounting's γ tolerance
    (its γ is the conservative end of a bisection, so E[K] may exceed ``mean`` by ~1e-9
    relative); the larger of the two, for bounds that scale with E[K]."""
    if shape == math.inf or shape == 1.0:
        return mean
    gamma = tnb_gamma(shape, mean)
    if gamma >= 1.0:
        return 1.0
    if shape == 0.0:
        exact = (1.0 - gamma) / (gamma * -math.log(gamma))
    else:
        exact = shape * (1.0 - gamma) / (gamma * -math.expm1(shape * math.log(gamma)))
    return max(mean, exact)


def num_trials_tail(max_trials: int, *, mean: float, shape: float) -> float:
    """P[K > ``max_trials``] for K of dp-accounting's ``RepeatAndSelectDpEvent(mean, shape)``.

    Args:
        max_trials: K_max, a positive integer.
        mean: E[K] ≥ 1.
        shape: η ∈ [0, inf] (inf: Poisson).

    Returns:
        The tail probability, in [0, 1].
    """
    k = _validate.positive_int("max_trials", max_trials)
    if shape == math.inf:
        return float(stats.poisson.sf(k, mean))
    gamma = tnb_gamma(shape, mean)
    if gamma >= 1.0:
        return 0.0
    if shape == 0.0:
        return float(stats.logser.sf(k, 1.0 - gamma))
    # negative binomial (shape η, success probability γ) conditioned on K ≥ 1
    return float(stats.nbinom.sf(k, shape, gamma) / -math.expm1(shape * math.log(gamma)))


def max_trials_for(*, mean: float, shape: float, tail: float = DEFAULT_TRIALS_TAIL) -> int:
    """The smallest K_max ≥ 1 with P[K > K_max] ≤ ``tail``.

    For E[K] = 10 and tail 10⁻¹⁰ this is 36 for Poisson, 219 for the geometric, 108 for
    η = 3 and 687 for the logarithmic distribution: the public number of trials a selection
    runs to hide K (every trial costs a full run).

    Args:
        mean: E[K] ≥ 1.
        shape: η ∈ [0, inf] (inf: Poisson).
        tail: target P[K > K_max] in (0, 1).

    Returns:
        K_max.
    """
    tail = _validate.in_range("tail", tail, 0.0, 1.0, low_inclusive=False, high_inclusive=False)
    hi = 1
    while num_trials_tail(hi, mean=mean, shape=shape) > tail:
        hi *= 2
        if hi > 2**40:
            _validate.fail("tail", tail, "a tail the distribution of K reaches (too small)")
    lo = hi // 2  # tail(lo) > tail (or lo = 0), tail(hi) ≤ tail
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if num_trials_tail(mid, mean=mean, shape=shape) <= tail else (mid, hi)
    return max(1, hi)
