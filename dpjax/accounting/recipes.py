"""The textbook DP-GD noise recipes: per-step noise from a total (ε, δ)
budget, as functions.

They return the σ of N(0, σ²I) added to each step's released gradient, for a per-step ℓ2
sensitivity Δ *under the relation you claim*: usually the noisy *average* gradient of n
records clipped to C has Δ = C/n under add/remove-one with n public, and 2C/n under replace-one.
Divide the result by Δ to compare it with :func:`dpjax.accounting.calibrate_noise_multiplier` at
``sampling_rate=1`` (the tight answer; these recipes are looser, which the composition
experiment shows).
"""

from __future__ import annotations

from dpjax import _validate
from dpjax.accounting.composition import advanced_composition
from dpjax.accounting.zcdp import zcdp_gaussian_sigma, zcdp_rho_for_epsilon
from dpjax.mechanisms.gaussian import gaussian_sigma

__all__ = ["advanced_composition_step_budget", "dpgd_sigma_advanced", "dpgd_sigma_zcdp"]


def _check(epsilon: float, delta: float, steps: int, sensitivity: float) -> int:
    epsilon = _validate.real("epsilon", epsilon)
    _validate.epsilon("epsilon", epsilon)
    delta = _validate.real("delta", delta)
    _validate.in_range("delta", delta, 0.0, 1.0, low_inclusive=False)
    sensitivity = _validate.real("sensitivity", sensitivity)
    _validate.positive("sensitivity", sensitivity)
    return _validate.positive_int("steps", steps)


def advanced_composition_step_budget(
    *, epsilon: float, delta: float, steps: int
) -> tuple[float, float]:
    """The per-step (ε₀, δ₀) of the recipe: δ₀ = δ/(2T), δ' = δ/2, ε₀ solving advanced
    composition exactly (ε₀√(2T ln(1/δ')) + Tε₀ tanh(ε₀/2) = ε, by bisection).

    Formal guarantees:
        Advanced Composition in Dwork & Roth 2014: T steps of (ε₀, δ₀) give
        (ε, Tδ₀ + δ') = (ε, δ). Solving the equation instead of the corollary's
        ε₀ = ε/√(8T ln(1/δ')) is tighter and valid for every ε (the corollary needs ε < 1).

    Args:
        epsilon: total ε in (0, inf).
        delta: total δ in (0, 1).
        steps: T, a positive integer.

    Returns:
        ``(epsilon_step, delta_step)``.
    """
    epsilon = _validate.real("epsilon", epsilon)
    _validate.epsilon("epsilon", epsilon)
    delta = _validate.real("delta", delta)
    _validate.in_range("delta", delta, 0.0, 1.0, low_inclusive=False)
    steps = _validate.positive_int("steps", steps)
    delta_step, delta_prime = delta / (2.0 * steps), delta / 2.0

    def total(eps0: float) -> float:
        return advanced_composition(
            epsilon=eps0, delta=delta_step, steps=steps, delta_prime=delta_prime
        )[0]

    lo, hi = 0.0, float(epsilon)  # total(ε) ≥ ε, so the root lies in (0, ε]
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if total(mid) <= epsilon:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-14 * hi:
            break
    return lo, delta_step


def dpgd_sigma_advanced(
    *,
    epsilon: float,
    delta: float,
    steps: int,
    sensitivity: float,
    calibration: str = "classic",
) -> float:
    """σ per DP-GD step from the recipe "Gaussian mechanism + advanced composition".

    .. math::
        σ = Δ\\sqrt{2\\ln(1.25/δ_0)}/ε_0,\\qquad (ε_0, δ_0) = \\text{per-step budget}.

    Formal guarantees:
        The privacy analysis of DP gradient descent (Bassily, Smith, Thakurta 2014): each step is
        (ε₀, δ₀)-DP by the Gaussian mechanism (classic calibration, Dwork & Roth 2014 Thm A.1,
        ε₀ < 1; or ``calibration="analytic"``, Balle & Wang 2018), and T steps compose to
        (ε, δ) by advanced composition (Dwork & Roth 2014) with the split of
        :func:`advanced_composition_step_budget`. Same relation as ``sensitivity``.

    Args:
        epsilon: total ε in (0, inf).
        delta: total δ in (0, 1).
        steps: T, a positive integer.
        sensitivity: per-step ℓ2 sensitivity Δ in (0, inf) (C/n: average gradient, add/remove-one).
        calibration: per-step Gaussian calibration, ``"classic"`` (textbook) or ``"analytic"``.

    Returns:
        σ.

    Raises:
        ValueError: if ``calibration="classic"`` and the per-step ε₀ ≥ 1.

    Example:
        >>> round(dpgd_sigma_advanced(epsilon=1.0, delta=1e-5, steps=100, sensitivity=1.0), 2)
        294.18
    """
    steps = _check(epsilon, delta, steps, sensitivity)
    eps0, delta0 = advanced_composition_step_budget(epsilon=epsilon, delta=delta, steps=steps)
    return gaussian_sigma(
        sensitivity=sensitivity, epsilon=eps0, delta=delta0, calibration=calibration
    )


def dpgd_sigma_zcdp(
    *,
    epsilon: float,
    delta: float,
    steps: int,
    sensitivity: float,
    conversion: str = "bun_steinke",
) -> float:
    """σ per DP-GD step from the zCDP recipe: σ = Δ√(T/(2ρ)).

    ρ is the largest total zCDP budget that converts to (ε, δ): with
    ``conversion="bun_steinke"`` (the textbook one) ρ = (√(ln(1/δ) + ε) − √(ln(1/δ)))²; with
    ``"cks"`` the tighter Canonne–Kamath–Steinke conversion. Each step is then ρ/T-zCDP.

    Formal guarantees:
        The analysis with concentrated DP (Bun & Steinke 2016): the Gaussian
        mechanism with σ is Δ²/(2σ²)-zCDP, T steps compose to TΔ²/(2σ²) = ρ, and ρ-zCDP
        implies (ρ + 2√(ρ ln(1/δ)), δ)-DP (Bun & Steinke 2016). The notes' per-step variance
        ½(C/(ε₀n))² ln(1.25/δ) carries a stray ln(1.25/δ) factor: ε₀²-zCDP needs
        σ² = ½(C/(ε₀n))², which is what we use (Bun & Steinke 2016, Prop. 1.6).

    Args:
        epsilon: total ε in (0, inf).
        delta: total δ in (0, 1).
        steps: T, a positive integer.
        sensitivity: per-step ℓ2 sensitivity Δ in (0, inf).
        conversion: ``"bun_steinke"`` (the textbook one) or ``"cks"``.

    Returns:
        σ.

    Example:
        >>> round(dpgd_sigma_zcdp(epsilon=1.0, delta=1e-5, steps=100, sensitivity=1.0), 2)
        49.01
    """
    steps = _check(epsilon, delta, steps, sensitivity)
    rho = zcdp_rho_for_epsilon(epsilon=epsilon, delta=delta, conversion=conversion)
    return zcdp_gaussian_sigma(rho=rho, sensitivity=sensitivity, steps=steps)
