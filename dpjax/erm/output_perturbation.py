"""Output perturbation (000; CMS11 Algorithm 1): solve exactly, then add calibrated noise."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from dpjax import _validate
from dpjax._noise import tree_add_noise
from dpjax.accounting.events import EpsilonDeltaEvent, GaussianEvent
from dpjax.erm import bounds
from dpjax.erm.losses import Loss
from dpjax.erm.result import ERMResult
from dpjax.erm.solver import (
    check_domain,
    default_tol,
    distance_bound,
    prepare_data,
    require_x64,
    resolve_method,
    solve_prepared,
)
from dpjax.mechanisms import gaussian_sigma
from dpjax.relation import REPLACE_ONE, NeighbouringRelation, as_relation

__all__ = ["output_perturbation", "gamma_norm_sampler", "fail_closed"]

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


def fail_closed(params: jax.Array, converged: jax.Array) -> jax.Array:
    """NaN parameters when the exact solve missed its certificate (raise on concrete values)."""
    if _validate.is_concrete(converged) and not bool(converged):
        raise RuntimeError(
            "the exact solver missed its certificate tolerance, so the privacy proof does not "
            "cover its output; raise max_iter or loosen tol (nothing was released)"
        )
    return jnp.where(converged, params, jnp.full_like(params, jnp.nan))


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
    method: str = "auto",
    tol: float | None = None,
    max_iter: int | None = None,
    normalizer: int | None = None,
) -> ERMResult:
    r"""Private ERM by output perturbation: w_priv = argmin J + b.

    .. math::  J(w) = \frac1n\sum_i \ell(w, x_i, y_i) + \frac{\mu}{2}\|w\|^2,\qquad
               \Delta_2 = 2L/(\mu n)\ (\text{replace-one}),\ L/(\mu n)\ (\text{add/remove})

    Args:
        key: PRNG key, used once (split inside the shared noise path).
        X: features (n, d), ‖x_i‖ ≤ 1. y: labels (n,) within the loss's label bound.
        loss: any :mod:`dpjax.erm.losses` loss (convex, L-Lipschitz; smoothness not needed).
        mu: μ > 0, strong convexity of the regulariser (public).
        epsilon, delta: the budget; ``variant="cms"`` is pure ε and ignores δ.
        relation: neighbouring relation of the guarantee; the sensitivity follows it.
        variant: ``"gaussian"`` (b ~ N(0, σ²I)) or ``"cms"`` (CMS11 Alg. 1: density
            ∝ exp(−β‖b‖), β = ε/Δ₂, i.e. ‖b‖ ~ Gamma(d, β) with a uniform direction).
        calibration: ``"analytic"`` (Balle–Wang, every ε; default) or ``"classic"``
            (σ = Δ₂√(2 ln(1.25/δ))/ε of 000, ε < 1 only).
        method, tol, max_iter: passed to the exact solver (:func:`dpjax.erm.solve`).
        normalizer: the PUBLIC N of J = (1/N)Σℓ + (μ/2)‖w‖² (default n = len(X)). Under
            ``ADD_OR_REMOVE_ONE`` the guarantee compares this release with the same function
            (same N, same σ) on D plus or minus one record: then J_D and J_D′ differ by one
            term ℓ/N and Δ₂ = L/(μN). (Dividing by the realised size instead would give
            Δ₂ ≈ 2L/(μn) and a noise scale that depends on the private size.)

    Returns:
        An :class:`ERMResult` with ``event`` = ``GaussianEvent(σ/Δ₂)`` or
        ``EpsilonDeltaEvent(ε, 0)`` and ``excess_risk_bound`` ≥ E[J(w_priv)] − J(w*).

    Formal guarantees:
        Privacy: (ε, δ)-DP (Gaussian) or ε-DP (cms) under ``relation``, for L-Lipschitz convex ℓ
        with ‖x‖ ≤ 1 and μ > 0: sensitivity lemma of 000_a9865af81d0677e1.txt (CMS11
        Corollary 8) + Gaussian mechanism (000; Balle & Wang 2018 Thm 8) or CMS11 Theorem 6.
        The solver is inexact by at most √(2·tol/μ) on each data set, so Δ₂ is inflated by
        2√(2·tol/μ) (≈1e-8 relative by default) and the guarantee covers the computed output;
        the output is NaN if the certificate fails (fail closed).
        Utility: E[J(w_priv)] − J(w*) ≤ L·E‖b‖ + (μ/2)E‖b‖², or ((c+μ)/2)E‖b‖² for a c-smooth
        loss (000 "Output perturbation: utility"; literature §1.1) — see
        :func:`dpjax.erm.bounds.output_perturbation_from_scale`.

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
    _validate.epsilon(epsilon)
    _validate.delta(delta)
    _validate.one_of("variant", variant, _VARIANTS)
    relation = as_relation(relation)
    method = resolve_method(loss, method)
    tol = default_tol(method) if tol is None else float(_validate.positive("tol", tol))
    if max_iter is None:
        max_iter = 100 if method == "newton" else 2000
    max_iter = _validate.positive_int("max_iter", max_iter)
    check_domain(loss, mu)
    n, d = jnp.shape(X)
    n = n if normalizer is None else _validate.positive_int("normalizer", normalizer)
    sens = bounds.argmin_sensitivity(lipschitz=loss.lipschitz, mu=mu, n=n, relation=relation)
    sens += 2.0 * distance_bound(tol, mu)
    scale, sampler, event = _calibrate(variant, sens, epsilon, delta, calibration, relation)
    bound = bounds.output_perturbation_from_scale(
        d=d,
        scale=scale,
        lipschitz=loss.lipschitz,
        mu=mu,
        smoothness=loss.smoothness,
        noise="gaussian" if variant == "gaussian" else "gamma_norm",
    )
    X, y = prepare_data(X, y, loss)
    exact = solve_prepared(
        X, y, loss=loss, mu=float(mu), method=method, tol=tol, max_iter=max_iter, normalizer=n
    )
    noisy = tree_add_noise(key, exact.params, sampler, scale)
    return ERMResult(
        params=fail_closed(noisy, exact.converged),
        certificate=exact.certificate,
        excess_risk_bound=bound,
        event=event,
        relation=relation,
        sensitivity=sens,
        noise_scale=scale,
    )
