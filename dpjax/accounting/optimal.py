"""The optimal composition of T identical (ε, δ)-DP mechanisms (Kairouz, Oh, Viswanath 2015).

KOV show that the k-fold composition of *any* (ε, δ)-DP mechanisms is dominated by the k-fold
composition of one canonical pair of distributions (randomised response with an extra
δ-mass outcome), so the hockey-stick divergence of that canonical pair is the exact, tight
privacy curve of homogeneous composition. We evaluate it in log space (log-binomials and
log-sum-exp), so T = 10⁴ or more is stable, and invert it in ε by bisection.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from dpjax import _validate

__all__ = ["optimal_composition_delta", "optimal_composition_epsilon"]


def _log_delta_pure(epsilon: float, steps: int, epsilon_total: float) -> float:
    """log δ_pure(ε') of the k-fold composition of the canonical (ε, 0) pair.

    δ_pure(ε') = Σ_{l : (k−2l)ε > ε'} C(k,l)(e^{(k−l)ε} − e^{ε'} e^{lε}) / (1 + e^ε)^k.
    """
    k = steps
    l = np.arange(k + 1, dtype=np.float64)
    loss = (k - 2.0 * l) * epsilon  # privacy loss of an outcome with l "flipped" coordinates
    active = loss > epsilon_total
    if not np.any(active):
        return -math.inf
    l = l[active]
    log_binom = special.gammaln(k + 1.0) - special.gammaln(l + 1.0) - special.gammaln(k - l + 1.0)
    # log(e^{(k−l)ε} − e^{ε' + lε}) = (k−l)ε + log(1 − e^{ε' − (k−2l)ε})
    log_gap = np.log(-np.expm1(epsilon_total - loss[active]))
    terms = log_binom + (k - l) * epsilon + log_gap
    return float(special.logsumexp(terms) - k * np.logaddexp(0.0, epsilon))


def _check(epsilon: float, delta: float, steps: int) -> int:
    epsilon = _validate.real("epsilon", epsilon)
    _validate.epsilon("epsilon", epsilon)
    delta = _validate.real("delta", delta)
    _validate.delta("delta", delta)
    return _validate.positive_int("steps", steps)


def optimal_composition_delta(
    *, epsilon: float, delta: float, steps: int, epsilon_total: float
) -> float:
    """The smallest δ_total such that T-fold (ε, δ)-DP composition is (ε', δ_total)-DP.

    .. math::
        δ_{total}(ε') = 1 - (1-δ)^T\\Bigl(1 - \\sum_{l:(T-2l)ε>ε'} \\binom{T}{l}
        \\frac{e^{(T-l)ε} - e^{ε'+lε}}{(1+e^ε)^T}\\Bigr).

    Formal guarantees:
        Kairouz, Oh and Viswanath, "The Composition Theorem for Differential Privacy", ICML 2015,
        Theorem 3.3 (optimal homogeneous composition, adaptive): tight for every ε' ≥ 0, i.e.
        there exist (ε, δ)-DP mechanisms whose composition attains it. Same neighbouring relation
        as the inputs. Cross-checked against dp-accounting's PLD of ``from_privacy_parameters``.

    Args:
        epsilon: per-step ε in (0, inf).
        delta: per-step δ in [0, 1).
        steps: T, a positive integer.
        epsilon_total: ε' ≥ 0.

    Returns:
        δ_total in [0, 1].
    """
    steps = _check(epsilon, delta, steps)
    epsilon_total = _validate.real("epsilon_total", epsilon_total)
    _validate.non_negative("epsilon_total", epsilon_total)
    delta_pure = math.exp(_log_delta_pure(float(epsilon), steps, float(epsilon_total)))
    # 1 − (1−δ)^T (1 − δ_pure), with log1p/expm1 for small δ.
    log_keep = steps * math.log1p(-delta) + math.log1p(-min(delta_pure, 1.0))
    return -math.expm1(log_keep)


def optimal_composition_epsilon(
    *, epsilon: float, delta: float, steps: int, delta_total: float, tol: float = 1e-12
) -> float:
    """The smallest ε' with T-fold (ε, δ)-DP composition (ε', δ_total)-DP (KOV 2015, tight).

    Bisection over ε' ∈ [0, Tε] on :func:`optimal_composition_delta`, which decreases in ε'.
    The returned ε' is the upper end of the final bracket, so it always meets ``delta_total``.

    Formal guarantees:
        Kairouz, Oh and Viswanath (ICML 2015), Theorem 3.3; see :func:`optimal_composition_delta`.
        Never larger than advanced composition (Dwork & Roth 2014) or basic composition
        with the same total δ.

    Args:
        epsilon: per-step ε in (0, inf).
        delta: per-step δ in [0, 1).
        steps: T, a positive integer.
        delta_total: the target total δ in (0, 1); must exceed 1 − (1 − δ)^T ≈ Tδ.
        tol: absolute tolerance of the bisection on ε'.

    Returns:
        ε' (``math.inf`` if ``delta_total`` ≤ 1 − (1 − δ)^T, where no finite ε' exists).

    Example:
        >>> round(optimal_composition_epsilon(epsilon=1.0, delta=0.0, steps=2, delta_total=0.01), 4)
        1.9811
    """
    steps = _check(epsilon, delta, steps)
    delta_total = _validate.real("delta_total", delta_total)
    _validate.in_range("delta_total", delta_total, 0.0, 1.0, low_inclusive=False)
    tol = _validate.real("tol", tol)
    _validate.positive("tol", tol)
    lo, hi = 0.0, steps * float(epsilon)
    if (
        optimal_composition_delta(epsilon=epsilon, delta=delta, steps=steps, epsilon_total=hi)
        > delta_total
    ):
        return math.inf
    if (
        optimal_composition_delta(epsilon=epsilon, delta=delta, steps=steps, epsilon_total=lo)
        <= delta_total
    ):
        return 0.0
    while hi - lo > tol * max(1.0, hi):
        mid = 0.5 * (lo + hi)
        d = optimal_composition_delta(epsilon=epsilon, delta=delta, steps=steps, epsilon_total=mid)
        if d <= delta_total:
            hi = mid
        else:
            lo = mid
    return hi
