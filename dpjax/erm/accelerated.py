"""A minimiser with a data-independent accuracy guarantee: Nesterov's AGD for a public step count.

The private solvers need ‖ŵ − w*‖ ≤ τ on EVERY data set, with no data-dependent failure branch
(a release that is NaN, or raises, on D but not on D′ tells them apart with probability 1).
A stopping rule on a certificate cannot give that: whether it is reached depends on the data.
Instead, for a μ-strongly convex, β-smooth J, Nesterov's accelerated gradient descent

    y_{s+1} = x_s − ∇J(x_s)/β,   x_{s+1} = y_{s+1} + m (y_{s+1} − y_s),   m = (√κ − 1)/(√κ + 1)

(x_1 = y_1 = w_0, κ = β/μ) satisfies (Bubeck 2015, "Convex Optimization: Algorithms and
Complexity", Theorem 3.18; Nesterov 2004, §2.2)

    J(y_{K+1}) − J* ≤ ((μ + β)/2) ‖w_0 − w*‖² exp(−K/√κ),

and strong convexity gives ‖y − w*‖² ≤ (2/μ)(J(y) − J*), so

    ‖y_{K+1} − w*‖ ≤ τ   as soon as   K ≥ √κ · ln((1 + κ) R² / τ²),   R ≥ ‖w_0 − w*‖.

With w_0 = 0 and a linear-model loss, ‖w*‖ ≤ ‖∇F(0)‖/μ ≤ (n/N)·L/μ (plus ‖tilt‖/μ for a tilted
objective), a bound computed from public constants (and the noise, for a tilt) — never from
the data values. :func:`accelerated_steps` is that K; :func:`accelerated_minimiser` runs it.

The theorem is for exact arithmetic. In float64 the iteration settles within about
eps₆₄·√κ·R of w* (rounding of the gradient, amplified by the momentum); callers choose τ many
orders of magnitude above that floor (relative accuracy 1e-7 of the sensitivity, or 1e-10 of
R), and say so.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from dpjax import _validate

__all__ = ["smoothness_bound", "accelerated_steps", "accelerated_minimiser"]

_BETA_SLACK = 1e-9
"""Relative slack on β: rows scaled to ‖x‖ ≤ 1 may exceed 1 by a rounding error."""


def smoothness_bound(*, loss_smoothness: float, mu: float, data_ratio: float = 1.0) -> float:
    """β ≥ the gradient-Lipschitz constant of J = (1/N)Σℓ + (μ/2)‖w‖² for ‖x_i‖ ≤ 1.

    ∇²J = (1/N)Σ φ''(s_i) x_i x_iᵀ + μI ⪯ (c·n/N + μ)I, with ``data_ratio`` = n/N (the
    row count of the array, a static shape, over the public normaliser).
    """
    beta = float(loss_smoothness) * float(data_ratio) + float(mu)
    return beta * (1.0 + _BETA_SLACK)


def accelerated_steps(*, mu: float, beta, radius, accuracy: float):
    """K = ⌈√κ·ln((1 + κ)R²/τ²)⌉ (≥ 0): AGD steps that guarantee ‖ŵ − w*‖ ≤ τ from ‖w_0 − w*‖ ≤ R.

    Host int for host ``radius``; a traced int32 array when ``radius`` is traced (a tilt
    drawn inside the solver: the count then depends on the noise, never on the data).
    """
    kappa = float(beta) / float(mu)
    if _validate.is_concrete(radius) and not isinstance(radius, jax.Array):
        ratio = (1.0 + kappa) * float(radius) ** 2 / float(accuracy) ** 2
        return max(0, math.ceil(math.sqrt(kappa) * math.log(ratio))) if ratio > 1.0 else 0
    ratio = (1.0 + kappa) * radius**2 / float(accuracy) ** 2
    steps = jnp.ceil(math.sqrt(kappa) * jnp.log(jnp.maximum(ratio, 1.0)))
    return steps.astype(jnp.int32)


def accelerated_minimiser(
    J: Callable[[jax.Array], jax.Array], w0: jax.Array, *, mu: float, beta: float, steps
) -> jax.Array:
    """Nesterov's AGD (Bubeck 2015, §3.7.1) run for exactly ``steps`` iterations; returns y.

    No stopping rule and no failure branch: the iteration count is ``steps`` (public, or a
    function of the noise only), whatever the data.
    """
    grad = jax.grad(J)
    root = math.sqrt(float(beta) / float(mu))
    momentum = (root - 1.0) / (root + 1.0)
    inv_beta = 1.0 / float(beta)

    def body(_, carry):
        x, y_prev = carry
        y = x - inv_beta * grad(x)
        return y + momentum * (y - y_prev), y

    _, y = jax.lax.fori_loop(0, steps, body, (w0, w0))
    return y
