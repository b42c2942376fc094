"""Synthetic instances of the rate experiments, with certified exact optima.

Every feature vector lies on the unit sphere (x = g/‖g‖, g ~ N(0, I_d)), so the Lipschitz
constant L of each loss is known exactly and no clipping is ever active. Generation, exact
optima and excess risks are host-side NumPy in float64 (an explicit ``numpy.random.Generator``;
no JAX compile per shape). Excess risks are means of per-example *differences* to the optimum,
so they are not lost in the rounding of two nearly equal objective values.

Instances:

* A ``logistic``: P(y = 1 | x) = sigmoid(<w0, x>), ‖w0‖ = 2 (non-separable). Optimum of
  J(w) = F(w) + (μ/2)‖w‖² by damped Newton (NumPy), certified by the PL inequality
  J(w) − J* ≤ ‖∇J(w)‖²/(2μ).
* D ``sharp_l1``: y = <w0, x>, absolute loss |<w, x> − y|, ‖w0‖ = R. F is sharp at w0 and
  w* = w0 exactly when 0 ∈ ∂J(w0); certified by the explicit subgradient
  s = X v, v = −μ n (XᵀX)⁻¹ w0, which is valid when max|s_i| ≤ 1 (then (1/n)Xᵀs = −μ w0).
* E ``bst_linear``: z ∈ {±1/√d}^d with a FIXED integer imbalance per column, so the mean z̄ has
  norm exactly ∝ 1/n (BST14's lower-bound scaling); loss −<w, z> on the ball ‖w‖ ≤ R, whose
  optimum is w* = R z̄/‖z̄‖ in closed form.
* G ``quadratic``: ridge regression with |y| ≤ 1 (the bounded squared loss), an exact quadratic:
  w* = H⁻¹Xᵀy/n and J(w) − J* = ½(w − w*)ᵀH(w − w*).
* ``linear_ridge``: −<w, x> + (μ/2)‖w‖², Hessian exactly μI (the Laplace DP-SGD rows).
"""

from __future__ import annotations

import dataclasses
import math

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
    "quadratic_instance",
    "quadratic_excess",
    "linear_ridge_instance",
    "ridge_excess",
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


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def _logistic_j(w: np.ndarray, X: np.ndarray, y: np.ndarray, mu: float) -> float:
    return float(np.mean(np.logaddexp(0.0, -y * (X @ w))) + 0.5 * mu * w @ w)


def _logistic_grad(w, X, y, mu):
    return -(X.T @ (y * _sigmoid(-y * (X @ w)))) / X.shape[0] + mu * w


def logistic_newton(
    X: np.ndarray, y: np.ndarray, mu: float, *, tol: float = 1e-13, max_iter: int = 100
) -> tuple[np.ndarray, float]:
    """Damped Newton (backtracking on J) in float64 NumPy; returns (w*, ‖∇J(w*)‖²/(2μ)).

    The returned certificate bounds J(w) − J* by the PL inequality of the μ-strongly convex J.
    """
    w = np.zeros(X.shape[1])
    for _ in range(max_iter):
        g = _logistic_grad(w, X, y, mu)
        if np.linalg.norm(g) <= tol:
            break
        p = _sigmoid(X @ w) * _sigmoid(-(X @ w))
        H = (X.T * p) @ X / X.shape[0] + mu * np.eye(X.shape[1])
        step, t, j0 = np.linalg.solve(H, g), 1.0, _logistic_j(w, X, y, mu)
        while _logistic_j(w - t * step, X, y, mu) > j0 - 0.25 * t * g @ step and t > 1e-10:
            t *= 0.5
        w = w - t * step
    g = _logistic_grad(w, X, y, mu)
    return w, float(g @ g) / (2.0 * mu)


def logistic_instance(rng: np.random.Generator, n: int, d: int, *, mu: float) -> Instance:
    """Instance A: logistic regression, ‖w0‖ = 2, exact optimum of the μ-regularised objective."""
    X = unit_sphere(rng, n, d)
    w0 = _direction(rng, d, 2.0)
    y = np.where(rng.uniform(size=n) < _sigmoid(X @ w0), 1.0, -1.0)
    w, certificate = logistic_newton(X, y, mu)
    j_star = _logistic_j(w, X, y, mu)
    return Instance("logistic", X, y, mu, w, j_star, certificate, math.log(2.0) - j_star)


def logistic_excess(W, X, y, w_star, mu) -> np.ndarray:
    """J(w) − J(w*) for each row of ``W`` (shape (S, d)), as a mean of per-example differences."""
    W = np.asarray(W, dtype=np.float64)
    margins = y * (W @ X.T)
    ref = np.logaddexp(0.0, -y * (X @ w_star))
    data = np.mean(np.logaddexp(0.0, -margins) - ref, axis=1)
    return data + 0.5 * mu * (np.sum(W * W, axis=1) - w_star @ w_star)


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


def sharp_l1_excess(W, X, y, w_star, mu) -> np.ndarray:
    """J(w) − J(w*) for each row of ``W``; F(w*) = 0 exactly, so F(w) is already a difference."""
    B = np.asarray(W, dtype=np.float64) - w_star
    return sharp_l1_risk_excess(W, X, w_star) + mu * (B @ w_star) + 0.5 * mu * np.sum(B * B, 1)


def sharp_l1_risk_excess(W, X, w_star) -> np.ndarray:
    """F(w) − F* (unregularised) for each row of ``W``: F* = 0 at w0."""
    B = np.asarray(W, dtype=np.float64) - w_star
    return np.mean(np.abs(B @ X.T), axis=1)


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


def linear_excess(W, X, y, w_star) -> np.ndarray:
    """F(w) − F* = <w* − w, z̄> for each row of ``W`` (F(w) = −mean y<w, x>)."""
    zbar = np.mean(y[:, None] * X, axis=0)
    return (w_star - np.asarray(W, dtype=np.float64)) @ zbar


# --------------------------------------------------------------------------- G. quadratic


def quadratic_instance(
    rng: np.random.Generator, n: int, d: int, *, mu: float, target_norm: float = 0.5
) -> Instance:
    """Instance G: ridge regression J(w) = (1/2n)Σ(<w, x_i> − y_i)² + (μ/2)‖w‖², |y| ≤ 1.

    y = clip(<w0, x> + N(0, 0.1²), −1, 1) with ‖w0‖ = ``target_norm``. J is an exact
    quadratic with Hessian H = XᵀX/n + μI, so w* = H⁻¹Xᵀy/n in closed form and
    J(w) − J* = ½(w − w*)ᵀH(w − w*) exactly (no cancellation). ‖w*‖ ≤ ‖Xᵀy/n‖/μ ≤ 1/μ.
    """
    X = unit_sphere(rng, n, d)
    w0 = _direction(rng, d, target_norm)
    y = np.clip(X @ w0 + 0.1 * rng.standard_normal(n), -1.0, 1.0)
    H = X.T @ X / n + mu * np.eye(d)
    w_star = np.linalg.solve(H, X.T @ y / n)
    j_star = float(0.5 * np.mean((X @ w_star - y) ** 2) + 0.5 * mu * w_star @ w_star)
    zero = float(0.5 * w_star @ H @ w_star)
    return Instance("quadratic", X, y, mu, w_star, j_star, 0.0, zero)


def quadratic_excess(W, X, w_star, mu) -> np.ndarray:
    """J(w) − J* = ½(w − w*)ᵀH(w − w*) with H = XᵀX/n + μI, for each row of ``W``."""
    B = np.asarray(W, dtype=np.float64) - w_star
    XB = B @ X.T
    return 0.5 * (np.mean(XB * XB, axis=1) + mu * np.sum(B * B, axis=1))


def linear_ridge_instance(rng: np.random.Generator, n: int, d: int, *, mu: float) -> Instance:
    """Linear loss −<w, x> (y = 1) plus (μ/2)‖w‖²: J is exactly quadratic with Hessian μI.

    w* = x̄/μ and J(w) − J* = (μ/2)‖w − w*‖² exactly, so the excess is the second moment
    of the iterate's error that the recursions of the Laplace batch-1 DP-SGD analysis (its theorems
    36–37) track. The per-example gradient −x_i has norm 1: clipping at L = 1 is never active.
    """
    X = unit_sphere(rng, n, d)
    w_star = X.mean(axis=0) / mu
    j_star = float(-0.5 * mu * w_star @ w_star)
    return Instance("linear_ridge", X, np.ones(n), mu, w_star, j_star, 0.0, -j_star)


def ridge_excess(W, w_star, mu) -> np.ndarray:
    """(μ/2)‖w − w*‖² for each row of ``W`` (the exact excess on ``linear_ridge_instance``)."""
    B = np.asarray(W, dtype=np.float64) - w_star
    return 0.5 * mu * np.sum(B * B, axis=1)
