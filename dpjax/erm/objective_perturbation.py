"""Objective perturbation (Chaudhuri, Monteleoni, Sarwate 2011; CMS11 Alg. 2; KST12 Alg. 1)."""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from dpjax import _validate
from dpjax._noise import tree_noise_like
from dpjax.erm import bounds
from dpjax.erm._common import prepare_data, require_x64
from dpjax.erm.accelerated import accelerated_minimiser, accelerated_steps, smoothness_bound
from dpjax.erm.losses import Loss
from dpjax.erm.output_perturbation import gamma_norm_sampler
from dpjax.erm.result import ERMResult
from dpjax.erm.solver import objective
from dpjax.events import EpsilonDeltaEvent
from dpjax.mechanisms._vmap_guard import guarded_release
from dpjax.relation import REPLACE_ONE, NeighbouringRelation, as_relation, sensitivity_factor

__all__ = [
    "objective_perturbation",
    "approximate_objective_perturbation",
    "check_objective_perturbation_loss",
    "calibrate",
    "tilted_minimiser",
    "RELATIVE_ACCURACY",
]

RELATIVE_ACCURACY = 1e-10
"""Default accuracy τ of the tilted minimiser, as a fraction of L/(μ + Δ) (the scale of w*)."""


class TiltedSolution(NamedTuple):
    """ŵ (within τ of the tilted minimiser) and ‖∇J̃(ŵ)‖²/(2μ), a diagnostic only."""

    params: jax.Array
    certificate: jax.Array


def tilted_minimiser(
    X: jax.Array, y: jax.Array, *, loss: Loss, mu: float, tilt: jax.Array, accuracy: float
) -> TiltedSolution:
    """ŵ with ‖ŵ − argmin(J + ⟨tilt, ·⟩)‖ ≤ τ for EVERY data set, and its diagnostic certificate.

    J(w) = (1/n)Σℓ + (μ/2)‖w‖² is μ-strongly convex and (c + μ)-smooth; its tilted minimiser
    has ‖w_p‖ ≤ (L + ‖tilt‖)/μ = R. Nesterov's AGD from 0 for K(R) steps
    (:func:`dpjax.erm.accelerated.accelerated_steps`) reaches τ (Bubeck 2015 Thm 3.18). K depends
    on the noise through ‖tilt‖, never on the data; there is no convergence test and no
    failure branch.
    """
    beta = smoothness_bound(loss_smoothness=loss.smoothness, mu=mu)
    radius = (float(loss.lipschitz) + jnp.linalg.norm(tilt)) / float(mu)
    steps = accelerated_steps(mu=mu, beta=beta, radius=radius, accuracy=accuracy)
    J = objective(loss, float(mu), X, y, tilt)
    w = accelerated_minimiser(J, jnp.zeros_like(tilt), mu=mu, beta=beta, steps=steps)
    g = jax.grad(J)(w)
    return TiltedSolution(w, jnp.dot(g, g) / (2.0 * float(mu)))


_VARIANTS = ("kst", "lecture", "cms")


def check_objective_perturbation_loss(loss: Loss, mu: float) -> None:
    """Refuse what the proof of objective perturbation cannot cover, saying why.

    Raises:
        ValueError: μ ≤ 0, a loss that is not twice differentiable or has no bound c on φ'',
            a non-linear-model loss (Hessian rank > 1) or a loss Lipschitz only on a ball.
    """
    why = "a median counterexample: for "
    why += "J(w) = (1/n)Σ|w − x_i| on D = {0, 100} vs {0, 101} the "
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

    * ``"lecture"`` (Chaudhuri, Monteleoni, Sarwate 2011): b ~ N(0, σ²I), σ² = 8L² ln(1.25/δ)/ε²
      (classic; ε < 1) or the analytic σ for Δ₂ = 2L. That textbook argument omits the Jacobian
      of b ↦ w_priv; dpjax records ε + ln(1 + 2c/(nμ) + c²/(n²μ²)) (CMS11's Jacobian term)
      in the event.
    * ``"kst"`` (KST12 Alg. 1): σ = L√(8 ln(2/δ) + 4ε)/ε, extra ridge so the
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
            scale=sensitivity_factor(REPLACE_ONE) * L / eps_noise,
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

    sens = sensitivity_factor(REPLACE_ONE) * L  # ‖∇ℓ‖ ≤ L, one record replaced: 2L
    sigma = gaussian_sigma(sensitivity=sens, epsilon=eps, delta=delta, calibration=calibration)
    return dict(
        scale=sigma, noise="gaussian", extra=0.0, epsilon=eps + jacobian, delta=float(delta)
    )


@guarded_release("X", "y")
def objective_perturbation(
    key: jax.Array,
    X,
    y,
    *,
    loss: Loss,
    mu: float,
    epsilon: float,
    delta: float | None = None,
    relation: NeighbouringRelation | str = REPLACE_ONE,
    variant: str = "kst",
    calibration: str = "classic",
    accuracy: float | None = None,
) -> ERMResult:
    r"""Private ERM by objective perturbation: w_priv = argmin J(w) + (Δ/2)‖w‖² + bᵀw/n.

    .. math::  J(w) = \frac1n\sum_i \ell(w, x_i, y_i) + \frac{\mu}{2}\|w\|^2

    The perturbed problem is solved by :func:`tilted_minimiser`: Nesterov's accelerated gradient
    descent for a step count fixed by public constants and ‖b‖ (never by the data), which
    guarantees ‖ŵ − w_p‖ ≤ τ (default τ = 1e-10·L/(μ+Δ)) on every data set. There is no
    convergence test and no failure branch: an output that is NaN (or an exception) on D and
    not on D′ would tell them apart with probability 1.

    Args:
        key: PRNG key, used once.
        X: features (n, d), finite, ‖x_i‖ ≤ 1. y: labels (n,), ±1 for margin losses
            (checked on concrete labels; under ``jax.jit`` a label 0 silently drops its row).
        loss: a twice-differentiable linear-model loss with a bound c on φ'' (logistic,
            linear; huber_svm(h) with ``variant="cms"``/``"lecture"`` only, its φ'' jumps);
            others are refused with the reason (median regression, the absolute
            loss, is the classic failure case).
        mu: μ > 0 (public).
        epsilon, delta: the budget. ``"kst"`` and ``"lecture"`` need δ ∈ (0, 1);
            ``variant="cms"`` is pure ε: δ may be omitted (``None``) or 0 (a δ > 0 is
            accepted and not used: the event records δ = 0).
        relation: only ``REPLACE_ONE`` (the relation CMS11 and KST12 prove).
        variant: ``"kst"`` (default, KST12 Gaussian), ``"lecture"`` (the textbook argument) or
            ``"cms"`` (CMS11 Algorithm 2, pure ε). See :func:`calibrate`.
        calibration: for ``"lecture"`` only: ``"classic"`` (σ² = 8L² ln(1.25/δ)/ε², ε < 1)
            or ``"analytic"``.
        accuracy: τ > 0, the guaranteed distance of ŵ to the exact tilted minimiser w_p;
            default 1e-10·L/(μ+Δ).

    Returns:
        An :class:`ERMResult`; ``event`` is an ``EpsilonDeltaEvent`` with the (ε, δ) spent and
        ``extra_regularization`` the ridge Δ the variant added.

    Formal guarantees:
        Privacy (replace-one; ℓ convex, twice differentiable, |φ'| ≤ L, |φ''| ≤ c, ‖x‖ ≤ 1,
        rank-one Hessian) for the exact tilted minimiser w_p: ``"cms"`` ε-DP (CMS11 Theorem 9);
        ``"kst"``
        (ε, δ)-DP (KST12 Theorem 2, Gaussian case); ``"lecture"``: the Gaussian-mechanism
        argument of Chaudhuri, Monteleoni, Sarwate 2011 for n∇J (sensitivity 2L), recorded as
        (ε + ln(1 + c/(nμ))², δ) to account for the Jacobian term that argument omits — prefer
        ``"kst"`` for a published guarantee. The released ŵ is a deterministic function of
        (D, b) within τ of w_p on every D (no data-dependent failure); that τ-residual is not
        covered by CMS11/KST12 (who assume the exact minimiser): the step count K(‖b‖) jumps
        with ‖b‖, so b ↦ ŵ skips tiny intervals of outputs at places that differ between D and
        D′, and δ = 0 does NOT hold for ŵ itself. ``event`` is the guarantee of w_p.
        :func:`approximate_objective_perturbation` covers the released iterate with a small
        output noise (pure ε with ``variant="cms"``).
        Utility: E[J(w_priv)] − J(w*) ≤ E‖b‖²/(2n²(μ+Δ)) + ΔL²/(2μ²) (Chaudhuri, Monteleoni, Sarwate
        2011, utility analysis; = dσ²/(2n²μ) when Δ = 0) —
        :func:`dpjax.erm.bounds.objective_perturbation_from_scale` — plus
        (L + μ(2L/μ' + E‖b‖/(nμ')))τ + (c+μ)τ²/2 for the inexact ŵ.

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
    _validate.epsilon("epsilon", epsilon)
    _validate.one_of("variant", variant, _VARIANTS)
    delta = _delta_for_variant(variant, delta)
    if variant == "kst" and not loss.continuous_hessian:
        raise ValueError(
            f"loss must have a continuous Hessian for variant='kst' (KST12's assumption); got "
            f"{loss.name}. Use variant='cms' (CMS11 cover the Huber-SVM loss)."
        )
    if as_relation(relation) != REPLACE_ONE:
        _validate.fail("relation", relation, "REPLACE_ONE (the relation CMS11/KST12 prove)")
    X, y = prepare_data(X, y, loss)
    n, d = X.shape
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
    mu_total = float(mu) + cal["extra"]
    tau = _accuracy(accuracy, loss, mu_total)
    bound += _inexact_term(loss, mu_total, cal, n, d, tau)
    sampler = jax.random.normal if cal["noise"] == "gaussian" else gamma_norm_sampler
    b = cal["scale"] * tree_noise_like(key, jnp.zeros(d, dtype=X.dtype), sampler)
    sol = tilted_minimiser(X, y, loss=loss, mu=mu_total, tilt=b / n, accuracy=tau)
    return ERMResult(
        params=sol.params,
        certificate=sol.certificate,
        excess_risk_bound=bound,
        event=event,
        relation=REPLACE_ONE,
        sensitivity=sensitivity_factor(REPLACE_ONE) * loss.lipschitz,
        noise_scale=cal["scale"],
        extra_regularization=cal["extra"],
    )


def _delta_for_variant(variant: str, delta) -> float:
    """δ as a float: pure-ε ``"cms"`` accepts None/0; the Gaussian variants need δ ∈ (0, 1)."""
    if delta is None:
        if variant == "cms":
            return 0.0
        _validate.fail("delta", delta, f"in (0, 1) for variant={variant!r} (use variant='cms')")
    return _validate.delta("delta", delta)


def _accuracy(accuracy, loss: Loss, mu_total: float) -> float:
    if accuracy is None:
        return RELATIVE_ACCURACY * float(loss.lipschitz) / mu_total
    return float(_validate.positive("accuracy", accuracy))


def _inexact_term(loss: Loss, mu_total: float, cal: dict, n: int, d: int, tau: float) -> float:
    """J(ŵ) − J(w_p) ≤ ‖∇J(w_p)‖τ + ((c+μ)/2)τ², ‖∇J(w_p)‖ = ‖Δw_p + b/n‖, in expectation."""
    mean_b = cal["scale"] * (math.sqrt(d) if cal["noise"] == "gaussian" else d) / n
    grad_at_wp = mean_b + cal["extra"] * (float(loss.lipschitz) + mean_b) / mu_total
    return grad_at_wp * tau + 0.5 * (float(loss.smoothness) + mu_total) * tau**2


@guarded_release("X", "y")
def approximate_objective_perturbation(
    key: jax.Array,
    X,
    y,
    *,
    loss: Loss,
    mu: float,
    epsilon: float,
    delta: float | None = None,
    gradient_tolerance: float | None = None,
    output_fraction: float = 0.01,
    variant: str = "kst",
) -> ERMResult:
    r"""Objective perturbation solved only approximately, made private again by output
    noise — the idea of Approximate Minima Perturbation (Iyengar et al. 2019), with KST12's
    (or CMS11's) tilt and dpjax's own composition argument instead of AMP's constants.

    1. (ε₁, δ₁) = (1 − f)(ε, δ): the tilt b and extra ridge, exactly as
       ``objective_perturbation(variant=variant)`` (``"kst"``: b ~ N(0, σ_b²I); ``"cms"``:
       density ∝ exp(−β‖b‖), pure ε₁), defining the (never computed) exact minimiser w_p of
       J̃(w) = J(w) + (Δ/2)‖w‖² + bᵀw/n.
    2. :func:`tilted_minimiser` (Nesterov's AGD for a step count fixed by public constants and
       ‖b‖) returns ŵ with ‖ŵ − w_p‖ ≤ τ = γ/(μ+Δ) on EVERY data set and for every b — no
       convergence test, no failure branch. Default γ = 1e-9, which makes the output noise
       negligible (AMP's 1/n² with f = 0.01 would dominate the excess risk for n ≲ 10⁴).
    3. Release ŵ + z for ℓ2 sensitivity Δ_o = 2γ/(μ+Δ) at (ε₂, δ₂) = f(ε, δ): ``"kst"``: z
       analytic Gaussian; ``"cms"``: z with density ∝ exp(−(ε₂/Δ_o)‖z‖) (pure ε₂).

    Why step 3 matters even for tiny τ: the step count K(‖b‖) jumps with ‖b‖, so b ↦ ŵ skips
    small intervals of outputs (≈ 1e-14 wide) at places that differ between D and D′; released
    without z, an output can have probability 0 under D and > 0 under D′, and no pure-ε claim
    holds for ŵ itself. z has a positive density everywhere and covers the residual.

    Args:
        key: PRNG key (split into the tilt key and the output-noise key).
        X, y, loss, mu, epsilon: as :func:`objective_perturbation`.
        delta: δ ∈ (0, 1) for ``"kst"``; ``"cms"`` is pure ε: None or 0 (a δ > 0 is accepted
            and not used: the event records δ = 0).
        gradient_tolerance: γ > 0, sets the guaranteed distance τ = γ/(μ+Δ); default 1e-9.
        output_fraction: f ∈ (0, 1), the share of (ε, δ) spent on the output noise.
        variant: ``"kst"`` (KST12 Gaussian tilt, (ε, δ)) or ``"cms"`` (CMS11 Algorithm 2
            tilt, ε-DP).

    Returns:
        :class:`ERMResult` with ``EpsilonDeltaEvent(ε, δ)`` (δ = 0 for ``"cms"``), the
        output-noise scale in ``noise_scale``, Δ_o in ``sensitivity`` and the bound below.

    Formal guarantees:
        Privacy (replace-one): step 1 is (ε₁, δ₁)-DP (KST12 Theorem 2) or ε₁-DP (CMS11
        Theorem 9). Given w_p, the tilt is b = −n∇(J + Δ/2‖·‖²)(w_p) and ŵ is a deterministic
        function of (D, b), within τ = γ/(μ+Δ) of w_p for every D and b (Bubeck 2015 Thm 3.18
        with the step count of :func:`tilted_minimiser`; exact-arithmetic theorem, the float64
        floor ≈ 1e-16·√κ·‖w_p‖ is far below τ for ‖b‖/n ≲ 10⁴L); so for fixed w_p the map
        D ↦ ŵ has ℓ2 sensitivity 2γ/(μ+Δ) and step 3 is an (ε₂, δ₂) Gaussian mechanism (Balle
        & Wang 2018) or an ε₂-DP gamma-norm mechanism (CMS11 Theorem 6: the density ratio is
        ≤ exp(ε₂‖a − a′‖/Δ_o)). Adaptive composition (Dwork & Roth 2014) of the
        release (w_p, ŵ + z) gives (ε, δ), or ε for ``"cms"``; dropping w_p is post-processing.
        Utility: with J (c+μ)-smooth and ŵ + z − w_p independent of the sign of z,
        E[J(ŵ+z)] − J* ≤ B_obj + E‖∇J(w_p)‖·γ/μ' + ((c+μ)/2)(γ²/μ'² + E‖z‖²), μ' = μ+Δ,
        E‖∇J(w_p)‖ ≤ E‖b‖/n + Δ(L + E‖b‖/n)/μ', B_obj the objective-perturbation bound,
        E‖b‖ ≤ σ_b√d (Gaussian) or d/β (gamma norm), E‖z‖² = dσ_o² or d(d+1)σ_o².
    """
    require_x64()
    check_objective_perturbation_loss(loss, mu)
    variant = _validate.one_of("variant", variant, ("kst", "cms"))
    if variant == "kst" and not loss.continuous_hessian:
        _validate.fail("loss", loss.name, "a loss with a continuous Hessian (KST12)")
    _validate.epsilon("epsilon", epsilon)
    delta = _delta_for_variant(variant, delta)
    if variant == "cms":
        delta = 0.0
    _validate.in_range("output_fraction", output_fraction, 0.0, 1.0, low_inclusive=False)
    X, y = prepare_data(X, y, loss)
    n, d = X.shape
    gamma = 1e-9 if gradient_tolerance is None else gradient_tolerance
    gamma = float(_validate.positive("gradient_tolerance", gamma))
    f = float(output_fraction)
    eps1, delta1 = (1.0 - f) * float(epsilon), (1.0 - f) * float(delta)
    cal = calibrate(
        variant,
        n=n,
        lipschitz=loss.lipschitz,
        smoothness=loss.smoothness,
        mu=mu,
        epsilon=eps1,
        delta=delta1,
    )
    mu_total = float(mu) + cal["extra"]
    out_sens = 2.0 * gamma / mu_total
    scale_out, out_sampler, out_noise = _output_noise(variant, out_sens, f, epsilon, delta)
    bound = _approximate_bound(loss, mu, cal, n, d, gamma, scale_out, out_noise)
    tilt_key, out_key = jax.random.split(key)
    tilt_sampler = jax.random.normal if cal["noise"] == "gaussian" else gamma_norm_sampler
    b = cal["scale"] * tree_noise_like(tilt_key, jnp.zeros(d, dtype=X.dtype), tilt_sampler)
    sol = tilted_minimiser(X, y, loss=loss, mu=mu_total, tilt=b / n, accuracy=gamma / mu_total)
    noisy = sol.params + scale_out * tree_noise_like(out_key, sol.params, out_sampler)
    return ERMResult(
        params=noisy,
        certificate=sol.certificate,
        excess_risk_bound=bound,
        event=EpsilonDeltaEvent(epsilon=float(epsilon), delta=float(delta), relation=REPLACE_ONE),
        relation=REPLACE_ONE,
        sensitivity=out_sens,
        noise_scale=scale_out,
        extra_regularization=cal["extra"],
    )


def _output_noise(variant: str, sensitivity: float, f: float, epsilon, delta):
    """(scale, sampler, noise kind) of step 3: analytic Gaussian, or gamma-norm at ε₂ = fε."""
    if variant == "cms":
        return sensitivity / (f * float(epsilon)), gamma_norm_sampler, "gamma_norm"
    from dpjax.mechanisms import gaussian_sigma

    sigma = gaussian_sigma(sensitivity=sensitivity, epsilon=f * epsilon, delta=f * delta)
    return sigma, jax.random.normal, "gaussian"


def _approximate_bound(
    loss: Loss, mu: float, cal: dict, n: int, d: int, gamma: float, scale_out: float, noise: str
) -> float:
    """B_obj + E‖∇J(w_p)‖γ/μ' + ((c+μ)/2)(γ²/μ'² + E‖z‖²) (see the guarantees above)."""
    mu_total = float(mu) + cal["extra"]
    mean_b = cal["scale"] * (math.sqrt(d) if cal["noise"] == "gaussian" else d) / n
    grad_at_wp = mean_b + cal["extra"] * (loss.lipschitz + mean_b) / mu_total
    z_sq = d * scale_out**2 if noise == "gaussian" else d * (d + 1) * scale_out**2
    base = bounds.objective_perturbation_from_scale(
        n=n,
        d=d,
        scale=cal["scale"],
        mu=mu,
        extra_regularization=cal["extra"],
        lipschitz=loss.lipschitz,
        noise=cal["noise"],
    )
    return (
        base
        + grad_at_wp * gamma / mu_total
        + 0.5 * (loss.smoothness + float(mu)) * ((gamma / mu_total) ** 2 + z_sq)
    )
