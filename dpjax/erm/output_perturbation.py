"""Output perturbation (Chaudhuri, Monteleoni, Sarwate 2011, Algorithm 1): solve, add noise."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from dpjax import _validate
from dpjax._noise import tree_add_noise
from dpjax.erm import bounds
from dpjax.erm._common import check_domain, prepare_data, public_dataset_size, require_x64
from dpjax.erm.accelerated import accelerated_minimiser, accelerated_steps, smoothness_bound
from dpjax.erm.losses import Loss, moreau_smoothed
from dpjax.erm.result import ERMResult
from dpjax.erm.solver import objective
from dpjax.events import EpsilonDeltaEvent, GaussianEvent
from dpjax.mechanisms import gaussian_sigma
from dpjax.mechanisms._vmap_guard import guarded_release
from dpjax.relation import REPLACE_ONE, NeighbouringRelation, as_relation

__all__ = ["output_perturbation", "gamma_norm_sampler", "smoothing_width", "default_accuracy"]

_VARIANTS = ("gaussian", "cms")


def gamma_norm_sampler(key: jax.Array, shape: tuple[int, ...], dtype) -> jax.Array:
    """Noise with density ∝ exp(−‖b‖) on R^k: ‖b‖ ~ Gamma(k, 1) times a uniform direction.

    A sampler for the shared noise path (``dpjax._noise``); scale it by 1/β for exp(−β‖b‖).
    """
    k_dir, k_norm = jax.random.split(key)
    size = math.prod(shape)
    g = jax.random.normal(k_dir, shape, dtype)
    radius = jax.random.gamma(k_norm, jnp.asarray(float(size), dtype), dtype=dtype)
    return g / jnp.linalg.norm(g) * radius


def _calibrate(variant, sensitivity, epsilon, delta, calibration, relation):
    """(noise scale, sampler, event) fixed before any data is touched."""
    if variant == "cms":
        scale = sensitivity / float(epsilon)
        event = EpsilonDeltaEvent(epsilon=float(epsilon), delta=0.0, relation=relation)
        return scale, gamma_norm_sampler, event
    if not float(delta) > 0.0:
        _validate.fail("delta", delta, "in (0, 1) for variant='gaussian' (use variant='cms')")
    sigma = gaussian_sigma(
        sensitivity=sensitivity, epsilon=epsilon, delta=delta, calibration=calibration
    )
    event = GaussianEvent(noise_multiplier=sigma / sensitivity, relation=relation)
    return sigma, jax.random.normal, event


RELATIVE_ACCURACY = 1e-7
"""Default inner-solver accuracy τ as a fraction of the argmin sensitivity (adds 2τ to it)."""

SMOOTHING_FRACTION = 0.1
"""Default Moreau width h of hinge/absolute as a fraction of the noise's E‖b‖ bound."""


def default_accuracy(sensitivity: float) -> float:
    """τ = 1e-7·Δ₂: the inner solver's guaranteed distance to the exact minimiser."""
    return RELATIVE_ACCURACY * float(sensitivity)


def smoothing_width(*, d: int, scale: float, variant: str) -> float:
    """Default public Moreau width h = 0.1·E‖b‖-bound (σ√d, or d/β for the Gamma-norm noise).

    The smoothing costs at most L²h/2 = 0.05·L·E‖b‖ of excess risk (a twentieth of the noise
    term L·E‖b‖ of the bound), and keeps κ = β/μ = 1/(hμ) moderate, so the public step count
    of the inner solver stays small.
    """
    mean_norm = scale * math.sqrt(d) if variant == "gaussian" else d * scale
    return SMOOTHING_FRACTION * mean_norm


def _inexact_term(*, lipschitz: float, mu: float, mean_norm: float, accuracy: float) -> float:
    """E[J(ŵ + b)] − E[J(w + b)] for ‖ŵ − w‖ ≤ τ, ‖w‖ ≤ L/μ: ≤ (2L + μE‖b‖)τ + μτ²/2."""
    return (2.0 * lipschitz + mu * mean_norm) * accuracy + 0.5 * mu * accuracy**2


@guarded_release("X", "y")
def output_perturbation(
    key: jax.Array,
    X,
    y,
    *,
    loss: Loss,
    mu: float,
    epsilon: float,
    delta: float,
    relation: NeighbouringRelation | str = REPLACE_ONE,
    variant: str = "gaussian",
    calibration: str = "analytic",
    normalizer: int | None = None,
    accuracy: float | None = None,
    smoothing: float | None = None,
) -> ERMResult:
    r"""Private ERM by output perturbation: w_priv = ŵ + b, ŵ within τ of argmin J.

    .. math::  J(w) = \frac1N\sum_i \ell(w, x_i, y_i) + \frac{\mu}{2}\|w\|^2,\qquad
               \Delta_2 = 2L/(\mu N) + 2\tau\ (\text{replace-one}),\ L/(\mu N) + 2\tau
               \ (\text{add/remove})

    The minimiser is computed by Nesterov's accelerated gradient descent run for a PUBLIC
    number of steps K (from μ, the smoothness bound β, L/μ and τ; :mod:`dpjax.erm.accelerated`)
    that guarantees ‖ŵ − w*‖ ≤ τ for every data set: there is no convergence test and no
    failure branch (a NaN or an exception that appears on D but not on D′ would reveal which).
    For the non-smooth ``hinge`` and ``absolute`` losses ℓ is replaced by its Moreau envelope
    ℓ_h (:func:`dpjax.erm.losses.moreau_smoothed`, public width h): still convex and
    L-Lipschitz, so the argmin sensitivity holds for ITS minimiser, and the bound pays L²h/2.

    Args:
        key: PRNG key, used once (split inside the shared noise path).
        X: features (n, d), finite, ‖x_i‖ ≤ 1, at least one row. y: labels (n,) within the
            loss's label bound; ±1 for margin losses (concrete labels are checked; under
            ``jax.jit`` they cannot be: a label 0 then silently drops its row's gradient).
        loss: any :mod:`dpjax.erm.losses` loss (convex, L-Lipschitz).
        mu: μ > 0, strong convexity of the regulariser (public).
        epsilon, delta: the budget; ``variant="cms"`` is pure ε and ignores δ.
        relation: neighbouring relation of the guarantee; the sensitivity follows it.
        variant: ``"gaussian"`` (b ~ N(0, σ²I)) or ``"cms"`` (CMS11 Alg. 1: density
            ∝ exp(−β‖b‖), β = ε/Δ₂, i.e. ‖b‖ ~ Gamma(d, β) with a uniform direction).
        calibration: ``"analytic"`` (Balle–Wang, every ε; default) or ``"classic"``
            (σ = Δ₂√(2 ln(1.25/δ))/ε of Dwork & Roth 2014, Theorem A.1, ε < 1 only).
        normalizer: the PUBLIC N of J (default n = len(X) under replace-one; REQUIRED under
            ``ADD_OR_REMOVE_ONE``, where len(X) differs between neighbours: dividing by it
            would double the sensitivity and make σ depend on the private size). With a public
            N, J_D and J_D′ differ by one term ℓ/N and Δ₂ = L/(μN).
        accuracy: τ > 0, the guaranteed ‖ŵ − w*‖; default 1e-7 × the argmin sensitivity.
        smoothing: h > 0 for hinge/absolute (ignored otherwise); default
            :func:`smoothing_width` (a tenth of the noise's mean norm).

    Returns:
        An :class:`ERMResult` with ``event`` = ``GaussianEvent(σ/Δ₂)`` or
        ``EpsilonDeltaEvent(ε, 0)`` and ``excess_risk_bound`` ≥ E[J(w_priv)] − J(w*)
        (``certificate`` = ‖∇J_h(ŵ)‖²/(2μ), a diagnostic the release does not depend on).

    Raises:
        ValueError: bad parameters, invalid concrete data (see
            :func:`dpjax.erm._common.prepare_data`), or add/remove-one without ``normalizer``.

    Formal guarantees:
        Privacy: (ε, δ)-DP (Gaussian) or ε-DP (cms) under ``relation``, for L-Lipschitz convex ℓ
        (or its Moreau envelope) with ‖x‖ ≤ 1 and μ > 0. Argmin sensitivity 2L/(μN)
        (replace-one) or L/(μN) (add/remove with public N): Chaudhuri, Monteleoni, Sarwate 2011,
        sensitivity lemma (CMS11 Corollary 8). The released ŵ is within τ of the exact argmin
        on every data set (Bubeck 2015 Thm 3.18 with the public step count, see
        :mod:`dpjax.erm.accelerated`), so ‖ŵ(D) − ŵ(D′)‖ ≤ Δ₂ with the 2τ included; then the
        Gaussian mechanism (Balle & Wang 2018 Thm 8) or CMS11 Theorem 6. Invalid traced data
        are mapped onto the assumptions first (non-finite → 0, rows scaled to ‖x‖ ≤ 1), so the
        sensitivity holds for every input. (Exact-arithmetic theorem; the float64 rounding floor
        of the iteration is orders of magnitude below the default τ.)
        Utility: E[J(w_priv)] − J(w*) ≤ L·E‖b‖ + (μ/2)E‖b‖², or ((c+μ)/2)E‖b‖² for a c-smooth
        loss (Chaudhuri, Monteleoni, Sarwate 2011, utility; see
        :func:`dpjax.erm.bounds.output_perturbation_from_scale`), plus L²h/2 for the smoothing
        and (2L + μE‖b‖)τ + μτ²/2 for the inexact minimiser (stated for N = n).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> jax.config.update("jax_enable_x64", True)
        >>> from dpjax.erm import losses, output_perturbation
        >>> X = jnp.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]]); y = jnp.array([1.0, -1.0, 1.0])
        >>> r = output_perturbation(jax.random.key(0), X, y, loss=losses.logistic, mu=0.1,
        ...                         epsilon=1.0, delta=1e-5)
        >>> r.params.shape, r.event.noise_multiplier > 0
        ((2,), True)
    """
    require_x64()
    _validate.positive("mu", mu)
    _validate.epsilon("epsilon", epsilon)
    _validate.delta("delta", delta)
    _validate.one_of("variant", variant, _VARIANTS)
    relation = as_relation(relation)
    check_domain(loss, mu)
    X, y = prepare_data(X, y, loss)
    n, d = X.shape
    big_n = public_dataset_size(n, normalizer, relation, name="normalizer")
    mu, lip = float(mu), float(loss.lipschitz)
    base = bounds.argmin_sensitivity(lipschitz=lip, mu=mu, n=big_n, relation=relation)
    tau = (
        default_accuracy(base)
        if accuracy is None
        else float(_validate.positive("accuracy", accuracy))
    )
    sens = base + 2.0 * tau
    scale, sampler, event = _calibrate(variant, sens, epsilon, delta, calibration, relation)
    noise = "gaussian" if variant == "gaussian" else "gamma_norm"
    smooth, width = _smoothed_loss(loss, smoothing, d=d, scale=scale, variant=variant)
    mean_norm = scale * math.sqrt(d) if variant == "gaussian" else d * scale
    bound = bounds.output_perturbation_from_scale(
        d=d, scale=scale, lipschitz=lip, mu=mu, smoothness=loss.smoothness, noise=noise
    )
    bound += 0.5 * lip**2 * width + _inexact_term(
        lipschitz=lip, mu=mu, mean_norm=mean_norm, accuracy=tau
    )
    ratio = n / big_n  # a static shape: it sets the step count, never the output law
    beta = smoothness_bound(loss_smoothness=smooth.smoothness, mu=mu, data_ratio=ratio)
    steps = accelerated_steps(mu=mu, beta=beta, radius=ratio * lip / mu, accuracy=tau)
    J = objective(smooth, mu, X, y, normalizer=big_n)
    w_hat = accelerated_minimiser(J, jnp.zeros(d, dtype=X.dtype), mu=mu, beta=beta, steps=steps)
    grad = jax.grad(J)(w_hat)
    return ERMResult(
        params=tree_add_noise(key, w_hat, sampler, scale),
        certificate=jnp.dot(grad, grad) / (2.0 * mu),
        excess_risk_bound=bound,
        event=event,
        relation=relation,
        sensitivity=sens,
        noise_scale=scale,
    )


def _smoothed_loss(loss: Loss, smoothing, *, d: int, scale: float, variant: str):
    """(the loss the inner solver minimises, its Moreau width h; 0 for smooth losses)."""
    if loss.twice_differentiable and loss.smoothness is not None:
        return loss, 0.0
    if smoothing is None:
        width = smoothing_width(d=d, scale=scale, variant=variant)
    else:
        width = float(_validate.positive("smoothing", smoothing))
    return moreau_smoothed(loss, width), width
