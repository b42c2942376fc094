"""Synthetic instances of the rate experiments, with certified exact optima (literature §2.2–2.3).

Every feature vector lies on the unit sphere (x = g/‖g‖, g ~ N(0, I_d)), so the Lipschitz
constant L of each loss is known exactly and no clipping is ever active. Generation is host-side
NumPy in float64 from an explicit ``numpy.random.Generator``; objectives are evaluated in
float64 (the caller enables x64) as means of per-example *differences* to the optimum, so the
excess risk is not lost in the rounding of two nearly equal objective values.

Instances (letters as in literature §2.2):

* A ``logistic``: P(y = 1 | x) = sigmoid(<w0, x>), ‖w0‖ = 2 (non-separable). Optimum of
  J(w) = F(w) + (μ/2)‖w‖² by damped Newton, certified by the PL inequality
  J(w) − J* ≤ ‖∇J(w)‖²/(2μ).
* D ``sharp_l1``: y = <w0, x>, absolute loss |<w, x> − y|, ‖w0‖ = R. F is sharp at w0 and
  w* = w0 exactly when 0 ∈ ∂J(w0); certified by the explicit subgradient
  s = X v, v = −μ n (XᵀX)⁻¹ w0, which is valid when max|s_i| ≤ 1 (then (1/n)Xᵀs = −μ w0).
* E ``bst_linear``: z ∈ {±1/√d}^d with a FIXED integer imbalance per column, so the mean z̄ has
  norm exactly ∝ 1/n (BST14's lower-bound scaling); loss −<w, z> on the ball ‖w‖ ≤ R, whose
  optimum is w* = R z̄/‖z̄‖ in closed form.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "Instance",
    "unit_sphere",
    "logistic_instance",
    "sharp_l1_instance",
    "bst_linear_instance",
    "logistic_excess",
    "sharp_l1_excess",
    "linear_excess",
]


@dataclasses.dataclass(frozen=True)
class Instance:
    """One generated data set with its exact regularised optimum.

    Attributes:
        name: instance letter/name.
        X: features, shape (n, d), rows on the unit sphere.
        y: labels/targets, shape (n,).
        mu: regularisation of J(w) = F(w) + (μ/2)‖w‖² (0 for the constrained linear instance).
        w_star: the exact minimiser of J (or of F on the ball).
        j_star: J(w_star).
        certificate: upper bound on J(w_star) − min J (0 for closed forms).
        zero_excess: J(0) − J*, the excess of the trivial output w = 0 (vacuity threshold).
    """

    name: str
    X: np.ndarray
    y: np.ndarray
    mu: float
    w_star: np.ndarray
    j_star: float
    certificate: float
    zero_excess: float


def unit_sphere(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    """``n`` points drawn uniformly on the unit sphere of R^d (float64)."""
    g = rng.standard_normal((n, d))
    return g / np.linalg.norm(g, axis=1, keepdims=True)


def _direction(rng: np.random.Generator, d: int, norm: float) -> np.ndarray:
    return norm * unit_sphere(rng, 1, d)[0]


# --------------------------------------------------------------------------- A. logistic


def _logistic_terms(w, X, y):
    return jnp.logaddexp(0.0, -y * (X @ w))


def _logistic_j(w, X, y, mu):
    return jnp.mean(_logistic_terms(w, X, y)) + 0.5 * mu * jnp.dot(w, w)


@jax.jit
def _logistic_newton(X, y, mu):
    grad = jax.grad(_logistic_j)
    hess = jax.hessian(_logistic_j)

    def step(w, _):
        g = grad(w, X, y, mu)
        return w - jnp.linalg.solve(hess(w, X, y, mu), g), None

    w, _ = jax.lax.scan(step, jnp.zeros(X.shape[1], X.dtype), None, length=40)
    return w, grad(w, X, y, mu)


def logistic_instance(rng: np.random.Generator, n: int, d: int, *, mu: float) -> Instance:
    """Instance A: logistic regression, ‖w0‖ = 2, exact optimum of the μ-regularised objective.

    Newton from 0 converges globally here (J is μ-strongly convex, its Hessian is
    (1/4)-Lipschitz-smooth-bounded, and 40 full steps are far beyond the quadratic phase).
    """
    X = unit_sphere(rng, n, d)
    w0 = _direction(rng, d, 2.0)
    p = 1.0 / (1.0 + np.exp(-(X @ w0)))
    y = np.where(rng.uniform(size=n) < p, 1.0, -1.0)
    w, g = (np.asarray(a) for a in _logistic_newton(jnp.asarray(X), jnp.asarray(y), mu))
    j_star = float(_logistic_j(jnp.asarray(w), jnp.asarray(X), jnp.asarray(y), mu))
    zero = float(math.log(2.0)) - j_star
    return Instance("logistic", X, y, mu, w, j_star, float(g @ g) / (2.0 * mu), zero)


@jax.jit
def logistic_excess(W, X, y, w_star, mu):
    """J(w) − J(w*) for each row of ``W`` (shape (S, d)), as a mean of per-example differences."""

    def one(w):
        diff = _logistic_terms(w, X, y) - _logistic_terms(w_star, X, y)
        return jnp.mean(diff) + 0.5 * mu * (jnp.dot(w, w) - jnp.dot(w_star, w_star))

    return jax.vmap(one)(W)


# --------------------------------------------------------------------------- D. sharp L1


def sharp_l1_certificate(X: np.ndarray, w0: np.ndarray, mu: float) -> float:
    """max|s_i| of the explicit subgradient certificate; w0 is the exact optimum iff ≤ 1."""
    n = X.shape[0]
    v = -mu * n * np.linalg.solve(X.T @ X, w0)
    return float(np.max(np.abs(X @ v)))


def sharp_l1_instance(
    rng: np.random.Generator, n: int, d: int, *, mu: float, radius: float = 1.0
) -> Instance:
    """Instance D: interpolating absolute-loss regression y = <w0, x>, ‖w0‖ = ``radius``.

    Raises:
        ValueError: if the optimality certificate fails (μ·radius too large for this d), so
            that no cell is ever measured against a wrong optimum.
    """
    X = unit_sphere(rng, n, d)
    w0 = _direction(rng, d, radius)
    y = X @ w0
    cert = sharp_l1_certificate(X, w0, mu)
    if cert > 1.0:
        raise ValueError(
            f"mu must make w0 optimal (certificate max|s| <= 1); got mu={mu!r}, "
            f"radius={radius!r}, d={d}, certificate={cert:.3f}"
        )
    j_star = 0.5 * mu * radius**2
    zero = float(np.mean(np.abs(y))) - j_star
    return Instance("sharp_l1", X, y, mu, w0, j_star, 0.0, zero)


@jax.jit
def sharp_l1_excess(W, X, y, w_star, mu):
    """J(w) − J(w*) for each row of ``W``; F(w*) = 0 exactly, so F(w) is already a difference."""

    def one(w):
        b = w - w_star
        return jnp.mean(jnp.abs(X @ b)) + mu * jnp.dot(w_star, b) + 0.5 * mu * jnp.dot(b, b)

    return jax.vmap(one)(W)


@jax.jit
def sharp_l1_risk_excess(W, X, w_star):
    """F(w) − F* (unregularised) for each row of ``W``: F* = 0 at w0."""
    return jax.vmap(lambda w: jnp.mean(jnp.abs(X @ (w - w_star))))(W)


# --------------------------------------------------------------------------- E. BST linear


def bst_linear_instance(
    rng: np.random.Generator, n: int, d: int, *, imbalance: int, radius: float = 1.0
) -> Instance:
    """Instance E: z ∈ {±1/√d}^d, every column has exactly ``imbalance`` more +1 than −1 ... /2.

    Column j has (n + imbalance)/2 entries +1/√d and (n − imbalance)/2 entries −1/√d, in a random
    order, so z̄ = (imbalance/(n√d))·(1, …, 1) and ‖z̄‖ = imbalance/n exactly: the mean
    gradient shrinks like 1/n (BST14's lower-bound scaling g_n ≍ √d/(εn)). Loss −<w, z>
    (labels y = 1), domain the ball ‖w‖ ≤ ``radius``: F* = −radius·‖z̄‖ at w* = radius·z̄/‖z̄‖.
    """
    if imbalance <= 0 or (n - imbalance) % 2 or imbalance > n:
        raise ValueError(f"imbalance must be in (0, n] with n - imbalance even; got {imbalance!r}")
    col = np.concatenate([np.ones((n + imbalance) // 2), -np.ones((n - imbalance) // 2)])
    Z = np.stack([rng.permutation(col) for _ in range(d)], axis=1) / math.sqrt(d)
    zbar = Z.mean(axis=0)
    g = float(np.linalg.norm(zbar))
    w_star = radius * zbar / g
    return Instance("bst_linear", Z, np.ones(n), 0.0, w_star, -radius * g, 0.0, radius * g)


@jax.jit
def linear_excess(W, X, y, w_star):
    """F(w) − F* = <w* − w, z̄> for each row of ``W`` (F(w) = −mean y<w, x>)."""
    zbar = jnp.mean(y[:, None] * X, axis=0)
    return jax.vmap(lambda w: jnp.dot(w_star - w, zbar))(W)
