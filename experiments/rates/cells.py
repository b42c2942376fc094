"""One cell of each rate row: data sets × noise seeds → excess risks, stated bound, prediction."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from experiments import instances
from experiments.rates.grid import Cell, Measure, Setting
from experiments.rates.solvers import erm_function, erm_loss, private_release

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)  # E|N(0, σ²)| = σ√(2/π): the sharp instance's excess


def _per_dataset(
    keys: jax.Array,
    rng: np.random.Generator,
    one: Callable[[np.random.Generator, jax.Array], tuple[np.ndarray, float, float, float, float]],
    *,
    diameter: float | Callable[[], float],
    lipschitz: float = 1.0,
) -> Cell:
    """Run ``one(rng, keys[k])`` for each data set k and stack into a ``Cell``.

    ``one`` returns (excess (S,), bound, excess of w = 0, certificate of the reference optimum,
    largest certificate of the private solver's inner exact solves); the cell keeps the largest
    bound and certificates over data sets (conservative) and L·D as vacuity level.
    """
    rows, bounds, zeros, certs, solver_certs = [], [], [], [], []
    for k in range(keys.shape[0]):
        excess, bound, zero, cert, solver_cert = one(rng, keys[k])
        rows.append(np.asarray(excess, dtype=np.float64))
        bounds.append(bound)
        zeros.append(zero)
        certs.append(cert)
        solver_certs.append(solver_cert)
    diameter = diameter() if callable(diameter) else diameter
    return Cell(
        np.stack(rows),
        float(max(bounds)),
        float(np.mean(zeros)),
        float(max(certs)),
        vacuity_level=lipschitz * float(diameter),
        extra={"solver_certificate": float(max(solver_certs))},
    )


def _sharp_output_release(rng, k, s: Setting, loss, mu: float, radius: float):
    """One sharp-L1 data set and its output-perturbation releases over the keys ``k``."""
    inst = instances.sharp_l1_instance(rng, s.n, s.d, mu=mu, radius=radius)
    W, info, solver_cert = private_release(
        "output_perturbation",
        k,
        inst.X,
        inst.y,
        loss=loss,
        mu=mu,
        epsilon=s.epsilon,
        delta=s.delta,
    )
    return inst, W, info, solver_cert


def output_sc_sharp(mu: float, radius: float = 1.0) -> Measure:
    """Output perturbation, μ-SC, on the sharp interpolating L1 instance (expected slope −1).

    ‖w0‖ = ``radius``; w0 stays the exact optimum while μ·radius·d is small enough for the
    subgradient certificate (checked for every data set).
    """

    def measure(s: Setting, rng: np.random.Generator, keys: jax.Array) -> Cell:
        loss = erm_loss("absolute")
        sigmas: list[float] = []

        def one(rng, k):
            inst, W, info, solver_cert = _sharp_output_release(rng, k, s, loss, mu, radius)
            ex = instances.sharp_l1_excess(W, inst.X, inst.y, inst.w_star, mu)
            sigmas.append(info.noise_scale)
            return ex, info.excess_risk_bound, inst.zero_excess, inst.certificate, solver_cert

        cell = _per_dataset(keys, rng, one, diameter=2.0 * radius)
        sigma = sigmas[0]
        cell.extra["predicted_mean"] = sigma * _SQRT_2_OVER_PI + 0.5 * mu * s.d * sigma**2
        return cell

    return measure


def _sc_logistic(method: str, mu: float) -> Measure:
    """A private solver ``method`` of dpjax.erm, μ-SC, on the logistic instance A."""

    def measure(s: Setting, rng: np.random.Generator, keys: jax.Array) -> Cell:
        loss = erm_loss("logistic")
        norms: list[float] = []

        def one(rng, k):
            inst = instances.logistic_instance(rng, s.n, s.d, mu=mu)
            W, info, solver_cert = private_release(
                method,
                k,
                inst.X,
                inst.y,
                loss=loss,
                mu=mu,
                epsilon=s.epsilon,
                delta=s.delta,
            )
            ex = instances.logistic_excess(W, inst.X, inst.y, inst.w_star, mu)
            norms.append(float(np.linalg.norm(inst.w_star)))
            return ex, info.excess_risk_bound, inst.zero_excess, inst.certificate, solver_cert

        return _per_dataset(keys, rng, one, diameter=lambda: 2.0 * max(norms))

    return measure


def output_sc_logistic(mu: float) -> Measure:
    """Output perturbation, μ-SC, on logistic regression (smooth: expected −2, bound −1)."""
    return _sc_logistic("output_perturbation", mu)


def output_convex_tuned(radius: float) -> Measure:
    """Output perturbation with μ = μ*(n) on the sharp instance, ‖w0‖ = R: expected −1/2.

    μ* = √(2B)/R from ``dpjax.erm.tuned_mu_output_perturbation`` (a theory formula, no tuning on
    data). The regularisation bias vanishes (w0 stays the exact optimum, certified), so the excess
    of F is the noise term ∝ σ ∝ 1/(μ*n) ∝ n^{-1/2}: the bound's rate is attained at a constant
    fraction of it. The bound on F adds μR²/2 to the solver's bound on J (convex).
    """

    def measure(s: Setting, rng: np.random.Generator, keys: jax.Array) -> Cell:
        loss = erm_loss("absolute")
        mu = erm_function("tuned_mu_output_perturbation")(
            n=s.n, d=s.d, epsilon=s.epsilon, delta=s.delta, lipschitz=1.0, radius=radius
        )
        sigmas: list[float] = []

        def one(rng, k):
            inst, W, info, solver_cert = _sharp_output_release(rng, k, s, loss, mu, radius)
            ex = instances.sharp_l1_risk_excess(W, inst.X, inst.w_star)
            bound = info.excess_risk_bound + 0.5 * mu * radius**2
            sigmas.append(info.noise_scale)
            return ex, bound, float(np.mean(np.abs(inst.y))), inst.certificate, solver_cert

        cell = _per_dataset(keys, rng, one, diameter=2.0 * radius)
        cell.extra.update(mu=mu, predicted_mean=sigmas[0] * _SQRT_2_OVER_PI)
        return cell

    return measure


def objective_sc_logistic(mu: float) -> Measure:
    """Objective perturbation (KST12 Gaussian tilt), μ-SC, logistic: expected −2 (bound −2)."""
    return _sc_logistic("objective_perturbation", mu)


def bst_imbalance(n: int, d: int, epsilon: float, delta: float, fraction: float) -> int:
    """Column imbalance k of instance E so that ‖z̄‖ = k/n ≈ fraction·√d·σ_classic/n.

    This is g_n ≍ √d/(εn), BST14's lower-bound scaling, placed at ``fraction`` of the
    objective-perturbation tuning scale μ*R (so the tuned solution stays inside the ball).
    k is made to have the parity of n and is independent of n, so ‖z̄‖ ∝ 1/n exactly.
    """
    sigma = erm_function("classic_sigma")(sensitivity=2.0, epsilon=epsilon, delta=delta)
    k = max(2, int(round(fraction * math.sqrt(d) * sigma)))
    return k + (k - n) % 2


def objective_convex_linear(radius: float, fraction: float = 0.5) -> Measure:
    """Objective perturbation with μ = μ*(n) = √dσ/(nR) on the BST linear instance: slope −1.

    F(w) = −<w, z̄>; the tilted argmin is w_p = (z̄ − b/n)/μ*, so E[F(w_p)] − F* =
    ‖z̄‖(R − ‖z̄‖/μ*) ∝ 1/n. The stated bound on F adds μ*R²/2 to the solver's bound on J
    (convex case). F* is the minimum over the ball ‖w‖ ≤ R (the comparator class).
    """

    def measure(s: Setting, rng: np.random.Generator, keys: jax.Array) -> Cell:
        loss = erm_loss("linear")
        mu = erm_function("tuned_mu_objective_perturbation")(
            n=s.n, d=s.d, epsilon=s.epsilon, delta=s.delta, lipschitz=1.0, radius=radius
        )
        k_imb = bst_imbalance(s.n, s.d, s.epsilon, s.delta, fraction)
        mu_total: list[float] = []

        def one(rng, k):
            inst = instances.bst_linear_instance(rng, s.n, s.d, imbalance=k_imb, radius=radius)
            W, info, solver_cert = private_release(
                "objective_perturbation",
                k,
                inst.X,
                inst.y,
                loss=loss,
                mu=mu,
                epsilon=s.epsilon,
                delta=s.delta,
            )
            ex = instances.linear_excess(W, inst.X, inst.y, inst.w_star)
            bound = info.excess_risk_bound + 0.5 * mu * radius**2
            mu_total.append(mu + info.extra_regularization)
            return ex, bound, inst.zero_excess, inst.certificate, solver_cert

        cell = _per_dataset(keys, rng, one, diameter=2.0 * radius)
        g = k_imb / s.n  # ‖z̄‖; w_p = (z̄ − b/n)/μ ⇒ E[F(w_p)] − F* = g(R − g/μ) exactly
        cell.extra.update(mu=mu, imbalance=k_imb, predicted_mean=g * (radius - g / mu_total[0]))
        return cell

    return measure


def dpgd_convex_linear(radius: float, scale_factor: float = 2.0) -> Measure:
    """Projected full-batch DP-GD (μ = 0, T = ⌈n²ρ/(2d)⌉ ∝ n², constant η, averaging) on E.

    ‖z̄‖ = k/n with k ≈ ``scale_factor``·√d/ε (BST14's lower-bound scaling); with T ∝ n² the
    drift and the noise of the averaged iterate are both n-invariant multiples of R, so
    E[F(w̄)] − F* ∝ ‖z̄‖ ∝ 1/n, as the bound LD√(1/T + 2d/(n²ρ)).
    """

    def measure(s: Setting, rng: np.random.Generator, keys: jax.Array) -> Cell:
        loss = erm_loss("linear")
        k_imb = max(2, int(round(scale_factor * math.sqrt(s.d) / s.epsilon)))
        k_imb += (k_imb - s.n) % 2
        steps: list[int] = []

        def one(rng, k):
            inst = instances.bst_linear_instance(rng, s.n, s.d, imbalance=k_imb, radius=radius)
            W, info, solver_cert = private_release(
                "dp_gd",
                k,
                inst.X,
                inst.y,
                loss=loss,
                epsilon=s.epsilon,
                delta=s.delta,
                radius=radius,
            )
            steps.append(int(info.event.count))
            ex = instances.linear_excess(W, inst.X, inst.y, inst.w_star)
            return ex, info.excess_risk_bound, inst.zero_excess, 0.0, solver_cert

        cell = _per_dataset(keys, rng, one, diameter=2.0 * radius)
        cell.extra.update(steps=steps[0], imbalance=k_imb)
        return cell

    return measure


def dpgd_sc_quadratic(mu: float) -> Measure:
    """Projected DP-GD, μ-SC schedule η_t = 2/(μ(t+1)), t-weighted average, T = ⌈n²ρ/(2d)⌉.

    Ridge regression (instance G) with the bounded squared loss (R = 1, |y| ≤ 1, L = 2): J is a
    μ-strongly convex quadratic, the excess ½(w̄ − w*)ᵀH(w̄ − w*) is exact, and the bound
    2(G² + dσ²)/(μ(T+1)) with dσ² fixed by T ∝ n² decays like n^-2.
    """

    def measure(s: Setting, rng: np.random.Generator, keys: jax.Array) -> Cell:
        loss = erm_loss("squared")
        steps: list[int] = []

        def one(rng, k):
            inst = instances.quadratic_instance(rng, s.n, s.d, mu=mu)
            W, info, solver_cert = private_release(
                "dp_gd",
                k,
                inst.X,
                inst.y,
                loss=loss,
                epsilon=s.epsilon,
                delta=s.delta,
                radius=1.0,
                mu=mu,
            )
            steps.append(int(info.event.count))
            ex = instances.quadratic_excess(W, inst.X, inst.w_star, mu)
            return ex, info.excess_risk_bound, inst.zero_excess, 0.0, solver_cert

        cell = _per_dataset(keys, rng, one, diameter=2.0, lipschitz=loss.lipschitz)
        cell.extra["steps"] = steps[0]
        return cell

    return measure


def laplace_released_epsilon(rho: float, kappa: float, epsilon: float, steps: int) -> float:
    """Σ_{h≤N} ε_h: the pure-DP ε of the last iterate after N = ``steps`` Laplace DP-SGD steps.

    From dpjax's Laplace DP-SGD privacy event (basic composition of the per-step releases,
    replace-one); it does not depend on Δ₁ (ε_h = Δ₁/θ_h and θ_h ∝ Δ₁). Theorem 36's
    ``epsilon`` is only the base of the schedule: for (ρ, κ) = (0.5, 1) the sum grows like N/2.

    Example:
        >>> round(laplace_released_epsilon(0.5, 1.0, 1.0, 2**14))
        8286
    """
    import dpjax

    # laplace_dp_sgd_event after the DP-SGD API rename on main, laplace_dpsgd_event before it
    event_of = getattr(dpjax, "laplace_dp_sgd_event", None) or dpjax.laplace_dpsgd_event
    event = event_of(l1_sensitivity=1.0, epsilon=epsilon, rho=rho, kappa=kappa, steps=steps)
    return float(sum(event.epsilons))


@functools.cache
def _laplace_last_iterate(rho: float, kappa: float, epsilon: float, mu: float, steps: int):
    """Compiled vmapped N-step run of ``dpjax.laplace_dp_sgd_optimizer``: the LAST iterate."""
    import dpjax

    loss = erm_loss("linear")
    clip = loss.lipschitz

    def one(key, X, y):
        l1 = 2.0 * clip * math.sqrt(X.shape[1])  # ℓ1 sensitivity of a clipped gradient (replace)
        noise_key, index_key = jax.random.split(key)
        opt = dpjax.laplace_dp_sgd_optimizer(
            l1_sensitivity=l1, epsilon=epsilon, rho=rho, kappa=kappa, key=noise_key
        )
        grad_fn = dpjax.clipped_grad(loss, l2_clip_norm=clip, backend="vmap")
        idx = jax.random.randint(index_key, (steps,), 0, X.shape[0])

        def step(carry, i):
            w, state = carry
            g, _ = grad_fn(w, X[i][None], y[i][None])
            updates, state = opt.update(g + mu * w, state)
            return (w + updates, state), None

        w0 = jnp.zeros(X.shape[1], X.dtype)
        (w, _), _ = jax.lax.scan(step, (w0, opt.init(w0)), idx)
        return w

    return jax.jit(jax.vmap(one, in_axes=(0, None, None)))


def laplace_dpsgd_last(rho: float, kappa: float, mu: float = 1.0) -> Measure:
    """Laplace batch-1 DP-SGD (noise θ_h, a_h = h^κ).

    N = n steps, last iterate.

    Built from the public ``dpjax.laplace_dp_sgd_optimizer`` optax transform and
    ``dpjax.clipped_grad``, on the linear loss −<w, x> + (μ/2)‖w‖² (Hessian exactly μI,
    clipping at L = 1 never active), so
    the excess (μ/2)‖β_N − β*‖² follows m_{h+1} = (1 − μγ_h)²m_h + γ_h²(s² + 2dθ_h²), whose
    noise part is ∝ γ_Nθ_N²/μ ∝ N^{2−ρ−2κ} (Theorem 37's A₃ has the same
    exponent). No explicit-constant bound is stated (Theorem 37's constant is not explicit),
    so every cell is flagged vacuous. The γ-weighted average that ``dpjax.erm.laplace_dp_sgd``
    returns decays faster than this (the averaging cancels part of the noise), so the exponent
    is measured on the last iterate, where the stated recursion is sharp.
    """

    def measure(s: Setting, rng: np.random.Generator, keys: jax.Array) -> Cell:
        release = _laplace_last_iterate(rho, kappa, s.epsilon, mu, s.n)

        def one(rng, k):
            inst = instances.linear_ridge_instance(rng, s.n, s.d, mu=mu)
            W = np.asarray(release(k, jnp.asarray(inst.X), jnp.asarray(inst.y)))
            return instances.ridge_excess(W, inst.w_star, mu), math.inf, inst.zero_excess, 0.0, 0.0

        cell = _per_dataset(keys, rng, one, diameter=2.0 / mu)
        cell.extra.update(
            rho=rho,
            kappa=kappa,
            steps=s.n,
            base_epsilon=s.epsilon,
            released_epsilon=laplace_released_epsilon(rho, kappa, s.epsilon, s.n),
            released_delta=0.0,
        )
        return cell

    return measure
