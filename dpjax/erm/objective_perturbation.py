"""Objective perturbation (002; CMS11 Algorithm 2; KST12 Algorithm 1): tilt, then solve exactly."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from dpjax import _validate
from dpjax._noise import tree_noise_like
from dpjax.accounting.events import EpsilonDeltaEvent
from dpjax.erm import bounds
from dpjax.erm.losses import Loss
from dpjax.erm.output_perturbation import fail_closed, gamma_norm_sampler
from dpjax.erm.result import ERMResult
from dpjax.erm.solver import DEFAULT_TOL, prepare_data, require_x64, solve_prepared
from dpjax.relation import REPLACE_ONE, NeighbouringRelation, as_relation

__all__ = [
    "objective_perturbation",
    "approximate_objective_perturbation",
    "check_objective_perturbation_loss",
    "calibrate",
]

_VARIANTS = ("kst", "lecture", "cms")


def check_objective_perturbation_loss(loss: Loss, mu: float) -> None:
    """Refuse what the proof of objective perturbation cannot cover, saying why.

    Raises:
        ValueError: μ ≤ 0, a loss that is not twice differentiable or has no bound c on φ'',
            a non-linear-model loss (Hessian rank > 1) or a loss Lipschitz only on a ball.
    """
    why = "002's median example: for J(w) = (1/n)Σ|w − x_i| on D = {0, 100} vs {0, 101} the "
    why += "tilted argmin reveals the data with probability 1/2"
    if not (_validate.is_concrete(mu) and float(mu) > 0):
        raise ValueError(
            f"mu must be in (0, inf) for objective perturbation; got {mu!r}: without strong "
            f"convexity the perturbed argmin is not unique and the proof fails ({why})"
        )
    if not loss.twice_differentiable or loss.smoothness is None:
        raise ValueError(
            f"loss must be twice differentiable with |φ''| ≤ c for objective perturbation; got "
            f"{loss.name}: the privacy proof maps the noise b to w_priv through ∇J and bounds "
            f"the Jacobian with c (CMS11 Thm 9, KST12 Thm 2), which a kink breaks ({why}). "
            "Use output_perturbation or DP-GD for it."
        )
    if not loss.linear_model:
        raise ValueError(
            f"loss must be a linear-model loss (rank-one Hessian) for objective perturbation; got "
            f"{loss.name} (KST12's assumption; use AMP / output perturbation otherwise)"
        )
    if loss.domain_radius is not None:
        raise ValueError(
            f"loss must be Lipschitz on all of R^d for (unconstrained) objective perturbation; got "
            f"{loss.name}, Lipschitz only on ‖w‖ ≤ {loss.domain_radius:g}: the tilt can push "
            "w_priv outside that ball. Use output_perturbation."
        )


def calibrate(
    variant: str,
    *,
    n: int,
    lipschitz: float,
    smoothness: float,
    mu: float,
    epsilon: float,
    delta: float,
    calibration: str = "classic",
) -> dict:
    """Host-side constants of each variant: noise scale, noise kind, extra ridge Δ, spent (ε, δ).

    * ``"lecture"`` (002): b ~ N(0, σ²I), σ² = 8L² ln(1.25/δ)/ε² (classic; ε < 1) or the
      analytic σ for Δ₂ = 2L. The lecture's argument omits the Jacobian of b ↦ w_priv; dpjax
      records ε + ln(1 + 2c/(nμ) + c²/(n²μ²)) (CMS11's Jacobian term) in the event.
    * ``"kst"`` (KST12 Alg. 1, literature §1.2): σ = L√(8 ln(2/δ) + 4ε)/ε, extra ridge so the
      total is ≥ 2c/(εn) (average scale of KST's Δ = 2λ/ε).
    * ``"cms"`` (CMS11 Alg. 2, pure ε): ε' = ε − ln(1 + 2c/(nμ) + c²/(n²μ²)); if ε' ≤ 0 then
      Δ = c/(n(e^{ε/4} − 1)) − μ and ε' = ε/2; density ∝ exp(−(ε'/(2L))‖b‖).
    """
    _validate.one_of("variant", variant, _VARIANTS)
    c, L, eps = float(smoothness), float(lipschitz), float(epsilon)
    jacobian = 2.0 * math.log1p(c / (n * float(mu)))
    if variant == "cms":
        eps_noise, extra = eps - jacobian, 0.0
        if eps_noise <= 0.0:
            extra, eps_noise = c / (n * math.expm1(eps / 4.0)) - float(mu), eps / 2.0
        return dict(
            scale=2.0 * L / eps_noise,
            noise="gamma_norm",
            extra=max(extra, 0.0),
            epsilon=eps,
            delta=0.0,
        )
    if not float(delta) > 0.0:
        _validate.fail("delta", delta, f"in (0, 1) for variant={variant!r} (use variant='cms')")
    if variant == "kst":
        sigma = L * math.sqrt(8.0 * math.log(2.0 / delta) + 4.0 * eps) / eps
        extra = max(0.0, 2.0 * c / (eps * n) - float(mu))
        return dict(scale=sigma, noise="gaussian", extra=extra, epsilon=eps, delta=float(delta))
    from dpjax.mechanisms import gaussian_sigma

    sigma = gaussian_sigma(sensitivity=2.0 * L, epsilon=eps, delta=delta, calibration=calibration)
    return dict(
        scale=sigma, noise="gaussian", extra=0.0, epsilon=eps + jacobian, delta=float(delta)
    )


def objective_perturbation(
    key: jax.Array,
    X,
    y,
    *,
    loss: Loss,
    mu: float,
    epsilon: float,
    delta: float,
    relation: NeighbouringRelation | str = REPLACE_ONE,
    variant: str = "kst",
    calibration: str = "classic",
    tol: float = DEFAULT_TOL,
    max_iter: int = 100,
) -> ERMResult:
    r"""Private ERM by objective perturbation: w_priv = argmin J(w) + (Δ/2)‖w‖² + bᵀw/n.

    .. math::  J(w) = \frac1n\sum_i \ell(w, x_i, y_i) + \frac{\mu}{2}\|w\|^2

    The perturbed problem is solved by the same certified damped Newton as
    :func:`dpjax.erm.solve` (float64, certificate ‖∇J̃‖²/(2(μ+Δ)) ≤ tol = 1e-18 by default);
    the output is NaN if the certificate fails (fail closed), because the proofs cover the
    exact minimiser only (see :mod:`dpjax.erm.solver`).

    Args:
        key: PRNG key, used once.
        X: features (n, d), ‖x_i‖ ≤ 1. y: labels (n,) (±1 for margin losses).
        loss: a twice-differentiable linear-model loss with a bound c on φ'' (logistic,
            linear; huber_svm(h) with ``variant="cms"``/``"lecture"`` only, its φ'' jumps);
            others are refused with the reason (002's median example).
        mu: μ > 0 (public).
        epsilon, delta: the budget (``variant="cms"`` is pure ε and ignores δ).
        relation: only ``REPLACE_ONE`` (the relation CMS11 and KST12 prove).
        variant: ``"kst"`` (default, KST12 Gaussian), ``"lecture"`` (002 as taught) or
            ``"cms"`` (CMS11 Algorithm 2, pure ε). See :func:`calibrate`.
        calibration: for ``"lecture"`` only: ``"classic"`` (σ² = 8L² ln(1.25/δ)/ε², ε < 1)
            or ``"analytic"``.
        tol, max_iter: the Newton certificate tolerance and iteration cap.

    Returns:
        An :class:`ERMResult`; ``event`` is an ``EpsilonDeltaEvent`` with the (ε, δ) spent and
        ``extra_regularization`` the ridge Δ the variant added.

    Formal guarantees:
        Privacy (replace-one; ℓ convex, twice differentiable, |φ'| ≤ L, |φ''| ≤ c, ‖x‖ ≤ 1,
        rank-one Hessian, exact argmin): ``"cms"`` ε-DP (CMS11 Theorem 9); ``"kst"``
        (ε, δ)-DP (KST12 Theorem 2, Gaussian case); ``"lecture"``: 002's Gaussian-mechanism
        argument for n∇J (sensitivity 2L), recorded as (ε + ln(1 + c/(nμ))², δ) to account for
        the Jacobian term the lecture omits — prefer ``"kst"`` for a published guarantee.
        Utility: E[J(w_priv)] − J(w*) ≤ E‖b‖²/(2n²(μ+Δ)) + ΔL²/(2μ²) (002 "Utility analysis"
        = dσ²/(2n²μ) when Δ = 0) — :func:`dpjax.erm.bounds.objective_perturbation_from_scale`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> jax.config.update("jax_enable_x64", True)
        >>> from dpjax.erm import losses, objective_perturbation
        >>> X = jnp.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]]); y = jnp.array([1.0, -1.0, 1.0])
        >>> r = objective_perturbation(jax.random.key(0), X, y, loss=losses.logistic, mu=0.1,
        ...                            epsilon=1.0, delta=1e-5)
        >>> r.params.shape
        (2,)
    """
    require_x64()
    check_objective_perturbation_loss(loss, mu)
    _validate.epsilon(epsilon)
    _validate.delta(delta)
    if variant == "kst" and not loss.continuous_hessian:
        raise ValueError(
            f"loss must have a continuous Hessian for variant='kst' (KST12's assumption); got "
            f"{loss.name}. Use variant='cms' (CMS11 cover the Huber-SVM loss)."
        )
    if as_relation(relation) != REPLACE_ONE:
        _validate.fail("relation", relation, "REPLACE_ONE (the relation CMS11/KST12 prove)")
    _validate.positive("tol", tol)
    max_iter = _validate.positive_int("max_iter", max_iter)
    n, d = jnp.shape(X)
    cal = calibrate(
        variant,
        n=n,
        lipschitz=loss.lipschitz,
        smoothness=loss.smoothness,
        mu=mu,
        epsilon=epsilon,
        delta=delta,
        calibration=calibration,
    )
    bound = bounds.objective_perturbation_from_scale(
        n=n,
        d=d,
        scale=cal["scale"],
        mu=mu,
        extra_regularization=cal["extra"],
        lipschitz=loss.lipschitz,
        noise=cal["noise"],
    )
    event = EpsilonDeltaEvent(epsilon=cal["epsilon"], delta=cal["delta"], relation=REPLACE_ONE)
    X, y = prepare_data(X, y, loss)
    sampler = jax.random.normal if cal["noise"] == "gaussian" else gamma_norm_sampler
    b = cal["scale"] * tree_noise_like(key, jnp.zeros(d, dtype=X.dtype), sampler)
    mu_total = float(mu) + cal["extra"]
    sol = solve_prepared(
        X, y, loss=loss, mu=mu_total, tilt=b / n, method="newton", tol=float(tol), max_iter=max_iter
    )
    return ERMResult(
        params=fail_closed(sol.params, sol.converged),
        certificate=sol.certificate,
        excess_risk_bound=bound,
        event=event,
        relation=REPLACE_ONE,
        sensitivity=2.0 * loss.lipschitz,
        noise_scale=cal["scale"],
        extra_regularization=cal["extra"],
    )


def approximate_objective_perturbation(
    key: jax.Array,
    X,
    y,
    *,
    loss: Loss,
    mu: float,
    epsilon: float,
    delta: float,
    gradient_tolerance: float | None = None,
    output_fraction: float = 0.01,
    max_iter: int = 5000,
) -> ERMResult:
    r"""Objective perturbation solved only approximately (L-BFGS), made private again by output
    noise — the idea of Approximate Minima Perturbation (Iyengar et al. 2019), with KST12's
    tilt and dpjax's own composition argument instead of AMP's constants.

    1. (ε₁, δ₁) = (1 − f)(ε, δ): KST12 tilt b ~ N(0, σ_b²I) and extra ridge, exactly as
       ``objective_perturbation(variant="kst")``, defining the (never computed) exact
       minimiser w_p of J̃(w) = J(w) + (Δ/2)‖w‖² + bᵀw/n.
    2. L-BFGS stops at ŵ with ‖∇J̃(ŵ)‖ ≤ γ, so ‖ŵ − w_p‖ ≤ γ/(μ+Δ). Default γ = 1e-9, which
       float64 L-BFGS reaches and which makes the output noise negligible (AMP's 1/n² with
       f = 0.01 would dominate the excess risk for n ≲ 10⁴).
    3. Release ŵ + N(0, σ_o²I), σ_o analytic-Gaussian for Δ₂ = 2γ/(μ+Δ) at (ε₂, δ₂) = f(ε, δ).

    Args:
        key: PRNG key (split into the tilt key and the output-noise key).
        X, y, loss, mu, epsilon, delta: as :func:`objective_perturbation`; δ ∈ (0, 1).
        gradient_tolerance: γ > 0; default 1e-9.
        output_fraction: f ∈ (0, 1), the share of (ε, δ) spent on the output noise.
        max_iter: L-BFGS iteration cap (NaN output, fail closed, if γ is not reached).

    Returns:
        :class:`ERMResult` with ``EpsilonDeltaEvent(ε, δ)`` and the bound below.

    Formal guarantees:
        Privacy (replace-one): step 1 is (ε₁, δ₁)-DP (KST12 Theorem 2). Given w_p, the tilt is
        b = −n∇(J + Δ/2‖·‖²)(w_p) and ŵ is a deterministic function of (D, b), within γ/(μ+Δ)
        of w_p for every D; so for fixed w_p the map D ↦ ŵ has ℓ2 sensitivity 2γ/(μ+Δ) and
        step 3 is an (ε₂, δ₂) Gaussian mechanism (Balle & Wang 2018). Adaptive composition
        (000) of the release (w_p, ŵ + z) gives (ε, δ); dropping w_p is post-processing.
        Utility: with J (c+μ)-smooth and ŵ + z − w_p independent of the sign of z,
        E[J(ŵ+z)] − J* ≤ B_obj + E‖∇J(w_p)‖·γ/μ' + ((c+μ)/2)(γ²/μ'² + dσ_o²), μ' = μ+Δ,
        E‖∇J(w_p)‖ ≤ σ_b√d/n + Δ(L + σ_b√d/n)/μ', B_obj the objective-perturbation bound.
    """
    require_x64()
    check_objective_perturbation_loss(loss, mu)
    if not loss.continuous_hessian:
        _validate.fail("loss", loss.name, "a loss with a continuous Hessian (KST12)")
    _validate.epsilon(epsilon)
    _validate.in_range("delta", delta, 0.0, 1.0, low_inclusive=False)
    _validate.in_range("output_fraction", output_fraction, 0.0, 1.0, low_inclusive=False)
    max_iter = _validate.positive_int("max_iter", max_iter)
    n, d = jnp.shape(X)
    gamma = 1e-9 if gradient_tolerance is None else gradient_tolerance
    gamma = float(_validate.positive("gradient_tolerance", gamma))
    f = float(output_fraction)
    eps1, delta1 = (1.0 - f) * float(epsilon), (1.0 - f) * float(delta)
    cal = calibrate(
        "kst",
        n=n,
        lipschitz=loss.lipschitz,
        smoothness=loss.smoothness,
        mu=mu,
        epsilon=eps1,
        delta=delta1,
    )
    mu_total = float(mu) + cal["extra"]
    from dpjax.mechanisms import gaussian_sigma

    out_sens = 2.0 * gamma / mu_total
    sigma_out = gaussian_sigma(sensitivity=out_sens, epsilon=f * epsilon, delta=f * delta)
    sigma_b = cal["scale"]
    b_norm = sigma_b * math.sqrt(d) / n
    grad_at_wp = b_norm + cal["extra"] * (loss.lipschitz + b_norm) / mu_total
    bound = (
        bounds.objective_perturbation_from_scale(
            n=n,
            d=d,
            scale=sigma_b,
            mu=mu,
            extra_regularization=cal["extra"],
            lipschitz=loss.lipschitz,
        )
        + grad_at_wp * gamma / mu_total
        + 0.5 * (loss.smoothness + float(mu)) * ((gamma / mu_total) ** 2 + d * sigma_out**2)
    )
    X, y = prepare_data(X, y, loss)
    tilt_key, out_key = jax.random.split(key)
    b = sigma_b * tree_noise_like(tilt_key, jnp.zeros(d, dtype=X.dtype), jax.random.normal)
    sol = solve_prepared(
        X,
        y,
        loss=loss,
        mu=mu_total,
        tilt=b / n,
        method="lbfgs",
        tol=gamma**2 / (2.0 * mu_total),
        max_iter=max_iter,
    )
    noisy = sol.params + sigma_out * tree_noise_like(out_key, sol.params, jax.random.normal)
    return ERMResult(
        params=fail_closed(noisy, sol.converged),
        certificate=sol.certificate,
        excess_risk_bound=bound,
        event=EpsilonDeltaEvent(epsilon=float(epsilon), delta=float(delta), relation=REPLACE_ONE),
        relation=REPLACE_ONE,
        sensitivity=out_sens,
        noise_scale=sigma_out,
        extra_regularization=cal["extra"],
    )
