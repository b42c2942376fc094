"""Zero-concentrated DP (zCDP): the Gaussian mechanism's ρ, composition, conversion to (ε, δ).

ρ-zCDP means D_α(M(D) ‖ M(D')) ≤ ρα for every α > 1 and neighbours D, D' (Bun and Steinke
2016). ρ adds up under composition; it does not amplify by subsampling (Bun & Steinke
2016), so DP-SGD with q < 1 needs RDP or PLD accounting instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import optimize

from dpjax import _validate

__all__ = [
    "gaussian_zcdp_rho",
    "zcdp_gaussian_sigma",
    "zcdp_compose",
    "zcdp_epsilon",
    "zcdp_epsilon_bun_steinke",
    "zcdp_epsilon_cks",
    "zcdp_rho_for_epsilon",
]


def gaussian_zcdp_rho(*, sigma: float, sensitivity: float) -> float:
    """ρ = Δ²/(2σ²) of the Gaussian mechanism f(D) + N(0, σ²I).

    Formal guarantees:
        Bun and Steinke (TCC 2016), Proposition 1.6; "Improved Analysis with Concentrated DP" in the
        Bun & Steinke 2016. Δ is the ℓ2 sensitivity under the relation you claim.

    Args:
        sigma: noise standard deviation in (0, inf).
        sensitivity: ℓ2 sensitivity Δ in (0, inf).

    Returns:
        ρ.

    Example:
        >>> gaussian_zcdp_rho(sigma=2.0, sensitivity=1.0)
        0.125
    """
    sigma = _validate.real("sigma", sigma)
    _validate.positive("sigma", sigma)
    sensitivity = _validate.real("sensitivity", sensitivity)
    _validate.positive("sensitivity", sensitivity)
    return float(sensitivity) ** 2 / (2.0 * float(sigma) ** 2)


def zcdp_gaussian_sigma(*, rho: float, sensitivity: float, steps: int = 1) -> float:
    """σ = Δ√(T/(2ρ)): the noise per release so that T Gaussian releases are together ρ-zCDP.

    The one home of this calibration (the DP-GD recipes and bounds call it).

    Formal guarantees:
        Each release with N(0, σ²) noise on a statistic of ℓ2 sensitivity Δ is Δ²/(2σ²)-zCDP
        (Bun and Steinke 2016, Proposition 1.6) and T of them compose to TΔ²/(2σ²) = ρ
        (Lemma 2.3; Bun & Steinke 2016). Δ under the
        relation you claim.

    Args:
        rho: total ρ in (0, inf).
        sensitivity: per-release ℓ2 sensitivity Δ in (0, inf).
        steps: T, a positive integer.

    Returns:
        σ.

    Example:
        >>> zcdp_gaussian_sigma(rho=0.5, sensitivity=2.0, steps=4)
        4.0
    """
    rho = _validate.real("rho", rho)
    _validate.positive("rho", rho)
    sensitivity = _validate.real("sensitivity", sensitivity)
    _validate.positive("sensitivity", sensitivity)
    steps = _validate.positive_int("steps", steps)
    return float(sensitivity) * math.sqrt(steps / (2.0 * float(rho)))


def zcdp_compose(rhos: Sequence[float]) -> float:
    """Composition of zCDP: ρ = Σ ρᵢ.

    Formal guarantees:
        Bun and Steinke (TCC 2016), Lemma 2.3 (adaptive composition); "By composition of zCDP"
        in Bun & Steinke 2016. Same relation as the inputs.

    Args:
        rhos: per-mechanism ρᵢ, each in (0, inf).

    Returns:
        The total ρ.
    """
    vals = [float(_validate.positive("rhos[i]", r)) for r in rhos]
    if not vals:
        _validate.fail("rhos", rhos, "a non-empty sequence")
    return math.fsum(vals)


def _check(rho: float, delta: float) -> tuple[float, float]:
    rho = _validate.real("rho", rho)
    _validate.positive("rho", rho)
    delta = _validate.real("delta", delta)
    _validate.in_range("delta", delta, 0.0, 1.0, low_inclusive=False)
    return rho, delta


def zcdp_epsilon_bun_steinke(*, rho: float, delta: float) -> float:
    """ε = ρ + 2√(ρ ln(1/δ)) of a ρ-zCDP mechanism at δ.

    Formal guarantees:
        Bun and Steinke (TCC 2016), Proposition 1.3; the conversion used in the
        Bun & Steinke 2016 (zCDP to (ε, δ)-DP).

    Args:
        rho: ρ in (0, inf).
        delta: δ in (0, 1).

    Returns:
        ε.

    Example:
        >>> round(zcdp_epsilon_bun_steinke(rho=0.01, delta=1e-5), 6)
        0.688614
    """
    rho, delta = _check(rho, delta)
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))


def _cks_epsilon_at(alpha: float, rho: float, log_inv_delta: float) -> float:
    # ε(α) = αρ + (ln(1/δ) − ln α)/(α − 1) + ln(1 − 1/α)
    tail = (log_inv_delta - math.log(alpha)) / (alpha - 1.0)
    return alpha * rho + tail + math.log1p(-1.0 / alpha)


def zcdp_epsilon_cks(*, rho: float, delta: float) -> float:
    """ε of a ρ-zCDP mechanism at δ by the conversion of Canonne, Kamath and Steinke (2020).

    .. math::
        ε = \\inf_{α > 1}\\; αρ + \\frac{\\ln(1/δ) - \\ln α}{α - 1} + \\ln(1 - 1/α).

    Formal guarantees:
        Canonne, Kamath and Steinke, "The Discrete Gaussian for Differential Privacy"
        (NeurIPS 2020), Proposition 12 / Corollary 13: (α, τ)-RDP implies (ε, δ)-DP with
        δ = e^{(α−1)(τ−ε)}(1 − 1/α)^α/(α − 1); with τ = ρα and the infimum over α it is never
        larger than :func:`zcdp_epsilon_bun_steinke`. The infimum is found numerically (bounded
        scalar search in ln(α − 1)); any α gives a valid bound, so an inexact minimiser only
        loosens the result.

    Args:
        rho: ρ in (0, inf).
        delta: δ in (0, 1).

    Returns:
        ε ≥ 0.
    """
    rho, delta = _check(rho, delta)
    log_inv_delta = math.log(1.0 / delta)

    def objective(log_am1: float) -> float:
        return _cks_epsilon_at(1.0 + math.exp(log_am1), rho, log_inv_delta)

    # α* ≈ 1 + √(ln(1/δ)/ρ); search ln(α − 1) on a wide bracket around it.
    guess = 0.5 * math.log(log_inv_delta / rho)
    grid = np.linspace(guess - 12.0, guess + 12.0, 97)
    values = [objective(x) for x in grid]
    i = int(np.argmin(values))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    res = optimize.minimize_scalar(
        objective, bounds=(lo, hi), method="bounded", options={"xatol": 1e-10}
    )
    best = min(float(res.fun), values[i])
    return max(0.0, best)


def zcdp_epsilon(*, rho: float, delta: float, conversion: str = "cks") -> float:
    """ε of a ρ-zCDP mechanism at δ, by ``conversion`` in {"cks", "bun_steinke"}.

    Formal guarantees:
        See :func:`zcdp_epsilon_cks` (tighter, default) and :func:`zcdp_epsilon_bun_steinke`.

    Args:
        rho: ρ in (0, inf).
        delta: δ in (0, 1).
        conversion: ``"cks"`` (Canonne–Kamath–Steinke 2020) or ``"bun_steinke"`` (the textbook one).

    Returns:
        ε.
    """
    _validate.one_of("conversion", conversion, ("cks", "bun_steinke"))
    if conversion == "cks":
        return zcdp_epsilon_cks(rho=rho, delta=delta)
    return zcdp_epsilon_bun_steinke(rho=rho, delta=delta)


def zcdp_rho_for_epsilon(*, epsilon: float, delta: float, conversion: str = "cks") -> float:
    """The largest ρ whose ρ-zCDP guarantee converts to (ε, δ)-DP.

    For ``"bun_steinke"`` it is the closed form ρ = (√(ln(1/δ) + ε) − √(ln(1/δ)))²; for ``"cks"``
    it is a bisection on :func:`zcdp_epsilon_cks` (which increases in ρ), returning the lower end
    of the final bracket so the conversion of the result is ≤ ε.

    Args:
        epsilon: target ε in (0, inf).
        delta: δ in (0, 1).
        conversion: ``"cks"`` or ``"bun_steinke"``.

    Returns:
        ρ.

    Example:
        >>> round(zcdp_rho_for_epsilon(epsilon=1.0, delta=1e-5, conversion="bun_steinke"), 6)
        0.02082
    """
    epsilon = _validate.real("epsilon", epsilon)
    _validate.epsilon("epsilon", epsilon)
    delta = _validate.real("delta", delta)
    _validate.in_range("delta", delta, 0.0, 1.0, low_inclusive=False)
    _validate.one_of("conversion", conversion, ("cks", "bun_steinke"))
    log_inv_delta = math.log(1.0 / delta)
    rho_bs = (math.sqrt(log_inv_delta + epsilon) - math.sqrt(log_inv_delta)) ** 2
    if conversion == "bun_steinke":
        return rho_bs
    lo, hi = rho_bs, max(2.0 * rho_bs, float(epsilon))
    while zcdp_epsilon_cks(rho=hi, delta=delta) <= epsilon:
        lo, hi = hi, 2.0 * hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if zcdp_epsilon_cks(rho=mid, delta=delta) <= epsilon:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return lo
