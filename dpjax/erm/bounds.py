"""Theoretical excess-risk bounds of the private ERM solvers, as functions of (n, d, ε, δ, L, μ, D).

All bounds are on the **average** scale, J(w) = (1/n)Σℓ(w, x_i, y_i) + (μ/2)‖w‖² (or F = J with
μ = 0 for the convex, tuned-μ rows), bound the **expectation** over the noise, and use the
explicit constants of the published theorems. Host-side floats: the rate experiments call
these directly. Noise scales are inputs where the solver may calibrate them several ways
(``*_from_scale``); the convenience wrappers use the textbook calibrations.

Formal guarantees (each function names its own):
    * output perturbation: E[J(w*+b)] − J(w*) ≤ L·E‖b‖ + (μ/2)E‖b‖² (L-Lipschitz F;
      CMS11, utility theorem and its proof),
      and ≤ ((c+μ)/2)E‖b‖² when F is c-smooth ;
    * objective perturbation: E[J(w_p)] − J(w*) ≤ E‖b‖²/(2n²μ) (CMS11,
      utility analysis);
    * DP-GD: Bassily, Smith, Thakurta 2014 (projected GD, averaging; zCDP).
"""

from __future__ import annotations

import math

from dpjax import _validate
from dpjax.accounting.zcdp import (
    zcdp_epsilon_bun_steinke,
    zcdp_gaussian_sigma,
    zcdp_rho_for_epsilon,
)
from dpjax.mechanisms.gaussian import classic_gaussian_ratio
from dpjax.relation import REPLACE_ONE, NeighbouringRelation, sensitivity_factor

__all__ = [
    "argmin_sensitivity",
    "classic_sigma",
    "output_perturbation_from_scale",
    "output_perturbation",
    "output_perturbation_pure",
    "objective_perturbation_from_scale",
    "objective_perturbation",
    "tuned_mu_output_perturbation",
    "tuned_output_perturbation",
    "tuned_mu_objective_perturbation",
    "tuned_objective_perturbation",
    "rho_from_epsilon_delta",
    "epsilon_from_rho",
    "dp_gd_sigma",
    "dp_gd_convex",
    "dp_gd_strongly_convex",
    "bst_lower_bound_convex",
    "bst_lower_bound_strongly_convex",
]


def argmin_sensitivity(
    *, lipschitz: float, mu: float, n: int, relation: NeighbouringRelation | str = REPLACE_ONE
) -> float:
    """ℓ2 sensitivity of w* = argmin J: 2L/(μn) (replace-one), L/(μn) (add/remove-one).

    Formal guarantees:
        Sensitivity lemma of CMS11 (Corollary 8): for L-Lipschitz
        convex ℓ and μ-strongly convex regulariser, ‖w*(D) − w*(D′)‖ ≤ 2L/(μn) under replace-one.
        Under add/remove-one with the public normaliser n (J = (1/n)Σ_{i∈D} ℓ + (μ/2)‖w‖² for
        |D| = n ± 1) the two objectives differ by one term ℓ/n, whence L/(μn) by the same proof.
    """
    _validate.positive("lipschitz", lipschitz)
    _validate.positive("mu", mu)
    n = _validate.positive_int("n", n)
    return sensitivity_factor(relation) * float(lipschitz) / (float(mu) * n)


def classic_sigma(*, sensitivity: float, epsilon: float, delta: float) -> float:
    """σ = Δ√(2 ln(1.25/δ))/ε, the classical formula (no ε < 1 check: for bounds only)."""
    _validate.positive("sensitivity", sensitivity)
    return float(sensitivity) * classic_gaussian_ratio(epsilon=epsilon, delta=delta)


def _noise_moments(d: int, scale: float, noise: str) -> tuple[float, float]:
    """(E‖b‖ upper bound, E‖b‖²) for N(0, σ²I_d) or the Gamma(d)-norm noise with 1/β = scale."""
    if noise == "gaussian":
        return scale * math.sqrt(d), d * scale**2
    return d * scale, d * (d + 1) * scale**2


def output_perturbation_from_scale(
    *,
    d: int,
    scale: float,
    lipschitz: float,
    mu: float,
    smoothness: float | None = None,
    noise: str = "gaussian",
) -> float:
    r"""E[J(w* + b)] − J(w*) for b ~ N(0, σ²I) (``scale`` = σ) or density ∝ e^{−β‖b‖} (1/β).

    .. math::  \min\{L\,E\|b\| + \tfrac{\mu}{2}E\|b\|^2,\ \tfrac{c+\mu}{2}E\|b\|^2\}

    (the second term only when the loss is c-smooth). Gaussian: E‖b‖ ≤ σ√d, E‖b‖² = dσ²;
    Gamma-norm: E‖b‖ = d/β, E‖b‖² = d(d+1)/β².

    Formal guarantees:
        J(w*+b) − J(w*) = F(w*+b) − F(w*) + μ⟨w*, b⟩ + (μ/2)‖b‖² with E⟨w*, b⟩ = 0 and
        F(w*+b) − F(w*) ≤ L‖b‖ (Chaudhuri, Monteleoni, Sarwate 2011, utility); for a
        c-smooth F, F(w*+b) − F(w*) ≤ ⟨∇F(w*), b⟩ + (c/2)‖b‖².
    """
    d = _validate.positive_int("d", d)
    _validate.positive("scale", scale)
    _validate.one_of("noise", noise, ("gaussian", "gamma_norm"))
    m1, m2 = _noise_moments(d, float(scale), noise)
    bound = float(lipschitz) * m1 + 0.5 * float(mu) * m2
    if smoothness is not None:
        bound = min(bound, 0.5 * (float(smoothness) + float(mu)) * m2)
    return bound


def output_perturbation(
    *,
    n: int,
    d: int,
    epsilon: float,
    delta: float,
    lipschitz: float,
    mu: float,
    smoothness: float | None = None,
    relation: NeighbouringRelation | str = REPLACE_ONE,
) -> float:
    """The Gaussian output-perturbation bound with the classical σ = Δ√(2 ln(1.25/δ))/ε.

    ≈ 3L²√(d ln(1.25/δ))/(εμn) (Chaudhuri, Monteleoni, Sarwate 2011) while √(d ln(1.25/δ))/(εn)
    ≤ 0.043; the two-term form is returned. The solver's own bound uses its
    actual (e.g. analytic) σ.
    """
    sens = argmin_sensitivity(lipschitz=lipschitz, mu=mu, n=n, relation=relation)
    sigma = classic_sigma(sensitivity=sens, epsilon=epsilon, delta=delta)
    return output_perturbation_from_scale(
        d=d, scale=sigma, lipschitz=lipschitz, mu=mu, smoothness=smoothness
    )


def output_perturbation_pure(
    *,
    n: int,
    d: int,
    epsilon: float,
    lipschitz: float,
    mu: float,
    smoothness: float | None = None,
    relation: NeighbouringRelation | str = REPLACE_ONE,
) -> float:
    """CMS11 Algorithm 1 (ε-DP): 2Ld/(nμε) + 2d(d+1)L²/(μn²ε²) under replace-one."""
    sens = argmin_sensitivity(lipschitz=lipschitz, mu=mu, n=n, relation=relation)
    _validate.epsilon("epsilon", epsilon)
    return output_perturbation_from_scale(
        d=d,
        scale=sens / float(epsilon),
        lipschitz=lipschitz,
        mu=mu,
        smoothness=smoothness,
        noise="gamma_norm",
    )


def objective_perturbation_from_scale(
    *,
    n: int,
    d: int,
    scale: float,
    mu: float,
    extra_regularization: float = 0.0,
    lipschitz: float = 1.0,
    noise: str = "gaussian",
) -> float:
    r"""E[J(w_p)] − J(w*) for w_p = argmin J + (Δ/2)‖w‖² + bᵀw/n.

    .. math::  \frac{E\|b\|^2}{2n^2(\mu+\Delta)} + \frac{\Delta L^2}{2\mu^2}

    Formal guarantees:
        Strong convexity of the perturbed objective (Chaudhuri, Monteleoni, Sarwate 2011, utility
        analysis) gives
        J_Δ(w_p) − J_Δ(w_Δ*) ≤ ‖b‖²/(2n²(μ+Δ)); the extra ridge costs (Δ/2)‖w*‖² ≤ ΔL²/(2μ²)
        since ‖w*‖ = ‖∇F(w*)‖/μ ≤ L/μ.
    """
    n = _validate.positive_int("n", n)
    d = _validate.positive_int("d", d)
    _validate.positive("scale", scale)
    _validate.positive("mu", mu)
    _validate.non_negative("extra_regularization", extra_regularization)
    _, m2 = _noise_moments(d, float(scale), noise)
    mu_total = float(mu) + float(extra_regularization)
    penalty = float(extra_regularization) * float(lipschitz) ** 2 / (2.0 * float(mu) ** 2)
    return m2 / (2.0 * n**2 * mu_total) + penalty


def objective_perturbation(
    *, n: int, d: int, epsilon: float, delta: float, lipschitz: float, mu: float
) -> float:
    """The textbook bound dσ²/(2n²μ) with σ² = 8L² ln(1.25/δ)/ε² (CMS11)."""
    sens = sensitivity_factor(REPLACE_ONE) * float(lipschitz)  # objective perturbation: 2L
    sigma = classic_sigma(sensitivity=sens, epsilon=epsilon, delta=delta)
    return objective_perturbation_from_scale(n=n, d=d, scale=sigma, mu=mu, lipschitz=lipschitz)


def _log_term(n: int, d: int, epsilon: float, delta: float) -> float:
    """s = √(d ln(1.25/δ))/(εn) = √(d/2)·(σ/Δ of the classic Gaussian)/n."""
    n = _validate.positive_int("n", n)
    d = _validate.positive_int("d", d)
    return math.sqrt(d / 2.0) * classic_gaussian_ratio(epsilon=epsilon, delta=delta) / n


def tuned_mu_output_perturbation(
    *, n: int, d: int, epsilon: float, delta: float, lipschitz: float, radius: float
) -> float:
    """μ* = √(2B)/R, B = 2√2 L²√(d ln(1.25/δ))/(εn): balances μR²/2 against B/μ (output-pert.).

    For a merely convex L-Lipschitz loss with ‖w*_F‖ ≤ R (convex case, μ tuned).
    """
    _validate.positive("radius", radius)
    b = 2.0 * math.sqrt(2.0) * float(lipschitz) ** 2 * _log_term(n, d, epsilon, delta)
    return math.sqrt(2.0 * b) / float(radius)


def tuned_output_perturbation(
    *, n: int, d: int, epsilon: float, delta: float, lipschitz: float, radius: float
) -> float:
    """E[F(w_priv)] − F* at μ*: μ*R²/2 + Lσ√d + μ*dσ²/2 (≈ 2^{5/4} L R √s, s as above).

    Formal guarantees:
        F(w) − F* ≤ J(w) − J(w_J*) + μR²/2 (Chaudhuri, Monteleoni, Sarwate 2011,
        "what if we had no regularizer")
        plus the strongly convex output-perturbation bound at μ*.
    """
    mu = tuned_mu_output_perturbation(
        n=n, d=d, epsilon=epsilon, delta=delta, lipschitz=lipschitz, radius=radius
    )
    sc = output_perturbation(n=n, d=d, epsilon=epsilon, delta=delta, lipschitz=lipschitz, mu=mu)
    return 0.5 * mu * float(radius) ** 2 + sc


def tuned_mu_objective_perturbation(
    *, n: int, d: int, epsilon: float, delta: float, lipschitz: float, radius: float
) -> float:
    """μ* = √d σ/(nR), σ² = 8L² ln(1.25/δ)/ε² (CMS11)."""
    _validate.positive("radius", radius)
    sens = sensitivity_factor(REPLACE_ONE) * float(lipschitz)  # objective perturbation: 2L
    sigma = classic_sigma(sensitivity=sens, epsilon=epsilon, delta=delta)
    return math.sqrt(_validate.positive_int("d", d)) * sigma / (n * float(radius))


def tuned_objective_perturbation(
    *, n: int, d: int, epsilon: float, delta: float, lipschitz: float, radius: float
) -> float:
    """E[F(w_p)] − F* ≤ R√d σ/n = 2√2 L R √(d ln(1.25/δ))/(εn) at μ*.

    Objective perturbation (CMS11).
    """
    return 2.0 * math.sqrt(2.0) * float(lipschitz) * float(radius) * _log_term(n, d, epsilon, delta)


def rho_from_epsilon_delta(epsilon: float, delta: float) -> float:
    """Largest ρ with ρ + 2√(ρ ln(1/δ)) ≤ ε (zCDP → (ε, δ), Bun & Steinke 2016, Prop. 1.3).

    Same as :func:`dpjax.accounting.zcdp_rho_for_epsilon` with ``conversion="bun_steinke"``.
    """
    return zcdp_rho_for_epsilon(epsilon=epsilon, delta=delta, conversion="bun_steinke")


def epsilon_from_rho(rho: float, delta: float) -> float:
    """ε = ρ + 2√(ρ ln(1/δ)) (Bun & Steinke 2016, Prop. 1.3).

    Same as :func:`dpjax.accounting.zcdp_epsilon_bun_steinke`.
    """
    return zcdp_epsilon_bun_steinke(rho=rho, delta=delta)


def dp_gd_sigma(*, n: int, steps: int, rho: float, lipschitz: float, relation=REPLACE_ONE) -> float:
    """σ of the noise on the *average* gradient so that T steps are ρ-zCDP.

    ρ = T·Δ²/(2σ²) with Δ = 2L/n (replace-one) or L/n (add/remove) (Bun & Steinke
    2016, concentrated DP) ⇒ σ = Δ√(T/(2ρ)).
    """
    n = _validate.positive_int("n", n)
    sens = sensitivity_factor(relation) * float(lipschitz) / n
    return zcdp_gaussian_sigma(rho=rho, sensitivity=sens, steps=steps)


def dp_gd_convex(*, d: int, steps: int, sigma: float, lipschitz: float, radius: float) -> float:
    """Projected DP-GD, constant η, averaged iterate: D√((L² + dσ²)/T) .

    Formal guarantees:
        E[F(w̄)] − F* ≤ D²/(2ηT) + η(L² + dσ²)/2 for stochastic subgradients with
        E‖ĝ‖² ≤ L² + dσ² and ‖w_0 − w*‖ ≤ D; equal to the stated value at η = D/√(T(L² + dσ²)).
        With σ from :func:`dp_gd_sigma` (replace-one) this is LD√(1/T + 2d/(n²ρ)).
    """
    d = _validate.positive_int("d", d)
    steps = _validate.positive_int("steps", steps)
    return float(radius) * math.sqrt((float(lipschitz) ** 2 + d * float(sigma) ** 2) / steps)


def dp_gd_strongly_convex(
    *, d: int, steps: int, sigma: float, lipschitz: float, mu: float, radius: float
) -> float:
    """Projected DP-GD, η_t = 2/(μ(t+1)), t-weighted average: 2(G² + dσ²)/(μ(T+1)).

    G = L + μD bounds the gradient of J = F + (μ/2)‖w‖² on the ball of radius D.

    Formal guarantees:
        Lacoste-Julien, Schmidt & Bach (2012), Theorem/Corollary for the weighted average of
        projected stochastic subgradient with E‖ĝ‖² ≤ G² + dσ² .
    """
    d = _validate.positive_int("d", d)
    steps = _validate.positive_int("steps", steps)
    _validate.positive("mu", mu)
    g = float(lipschitz) + float(mu) * float(radius)
    return 2.0 * (g**2 + d * float(sigma) ** 2) / (float(mu) * (steps + 1))


def bst_lower_bound_convex(
    *, n: int, d: int, epsilon: float, lipschitz: float, radius: float
) -> float:
    """BST14 lower-bound shape L·D·min(1, √d/(εn)) (Ω(·), constant 1)."""
    return float(lipschitz) * float(radius) * min(1.0, math.sqrt(d) / (float(epsilon) * n))


def bst_lower_bound_strongly_convex(
    *, n: int, d: int, epsilon: float, lipschitz: float, mu: float, radius: float
) -> float:
    """BST14 lower-bound shape min(LD, L²d/(με²n²)) (Ω(·), constant 1)."""
    sc = float(lipschitz) ** 2 * d / (float(mu) * float(epsilon) ** 2 * n**2)
    return min(float(lipschitz) * float(radius), sc)
