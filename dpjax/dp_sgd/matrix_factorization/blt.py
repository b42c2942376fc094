"""Buffered linear Toeplitz (BLT) strategies: Toeplitz C whose noise needs only a few buffers.

A BLT with buffer decays θ ∈ (0, 1)^m and output scales ω ∈ R^m is the lower-triangular
Toeplitz C with c_0 = 1 and c_t = Σ_i ω_i θ_i^{t−1} for t ≥ 1 (Dvijotham, McMahan, Pillutla,
Steinke, Thakurta 2024, "Efficient and near-optimal noise generation for streaming differential
privacy", FOCS). Its inverse is again Toeplitz with a rational generating function, so the
noise (C⁻¹Z)_t is generated with m buffers of size d: O(m·d) memory for any number of steps.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import scipy.optimize

from dpjax import _validate
from dpjax.dp_sgd.matrix_factorization._toeplitz import (
    sqrt_prefix_sum_coefficients,
    toeplitz_matrix,
)

__all__ = ["BLT", "blt_strategy", "toeplitz_errors"]

_UNSTABLE = 1e100
_UNSTABLE_LOSS = 1e4


class BLT(NamedTuple):
    """A buffered linear Toeplitz strategy: c_0 = 1, c_t = Σ_i ω_i θ_i^{t−1} (t ≥ 1).

    Attributes:
        buf_decay: θ, the buffer decays, a 1-D float64 array in (0, 1).
        output_scale: ω, the output scales, a 1-D float64 array of the same length.

    NOT normalised: c_0 = 1, so the single-participation sensitivity is ‖c‖₂ ≥ 1 (compute it
    with :func:`~dpjax.dp_sgd.matrix_factorization.sensitivity` on ``.matrix(n)``).
    """

    buf_decay: np.ndarray
    output_scale: np.ndarray

    def coefficients(self, n: int) -> np.ndarray:
        """The Toeplitz coefficients (c_0, ..., c_{n−1}), float64."""
        n = _validate.positive_int("n", n)
        theta = np.asarray(self.buf_decay, dtype=np.float64)
        omega = np.asarray(self.output_scale, dtype=np.float64)
        if theta.ndim != 1 or theta.size == 0 or not np.all((theta > 0) & (theta < 1)):
            _validate.fail("buf_decay", self.buf_decay, "a non-empty 1-D array in (0, 1)")
        if omega.shape != theta.shape or not np.all(np.isfinite(omega)):
            _validate.fail(
                "output_scale", self.output_scale, "a finite 1-D array as long as buf_decay"
            )
        powers = theta[None, :] ** np.arange(max(n - 1, 0))[:, None]
        return np.concatenate([[1.0], powers @ omega])

    def matrix(self, n: int) -> np.ndarray:
        """The n×n lower-triangular Toeplitz matrix C."""
        return toeplitz_matrix(self.coefficients(n), n)


def _inverse_series(c: np.ndarray) -> np.ndarray:
    """r with Σ_{j≤t} c_j r_{t−j} = δ_t (the Toeplitz coefficients of C⁻¹)."""
    n = c.size
    r = np.zeros(n)
    r[0] = 1.0 / c[0]
    for t in range(1, n):
        r[t] = -np.dot(c[1 : t + 1], r[t - 1 :: -1]) / c[0]
    return r


def toeplitz_errors(coefficients) -> tuple[float, float]:
    """Squared errors of a lower-triangular Toeplitz strategy, before the sensitivity factor.

    B = A·C⁻¹ is Toeplitz with coefficients s = cumsum(r), r the inverse series of c, so
    ‖B‖_F² = Σ_k (n − k) s_k² and the largest row norm² is Σ_k s_k² (the last row), in O(n²)
    instead of the dense O(n³).

    Args:
        coefficients: (c_0, ..., c_{n−1}) with c_0 ≠ 0.

    Returns:
        (‖B‖_F² / n, max_t ‖B_t‖²).
    """
    c = np.asarray(coefficients, dtype=np.float64)
    s = np.cumsum(_inverse_series(c))
    n = c.size
    return float(np.sum((n - np.arange(n)) * s**2) / n), float(np.sum(s**2))


def _cyclic_abs_gram(c: np.ndarray, b: int, k: int) -> tuple[float, np.ndarray]:
    """Σ_{s,t∈π₀} |(CᵀC)_st| for π₀ = {0, b, ..., (k−1)b} and Toeplitz C, and its gradient in c.

    Absolute values: an example's gradients may have opposite signs at its participations, so
    signed Gram entries must not be allowed to cancel (the optimiser would exploit it).
    """
    n = c.size
    starts = np.arange(0, n, b)[:k]
    columns = np.zeros((n, starts.size))
    for m, s0 in enumerate(starts):
        columns[s0:, m] = c[: n - s0]
    gram = columns.T @ columns
    grad_columns = 2.0 * columns @ np.sign(gram)
    grad = np.zeros(n)
    for m, s0 in enumerate(starts):
        grad[: n - s0] += grad_columns[s0:, m]
    return float(np.abs(gram).sum()), grad


def _blt_loss(params, n, buffers, objective, pattern):
    """log(error · sensitivity²) of the BLT with θ = sigmoid(a), ω; and its gradient."""
    a, omega = params[:buffers], params[buffers:]
    theta = 1.0 / (1.0 + np.exp(-a))
    t = np.arange(n - 1)
    powers = theta[None, :] ** t[:, None]
    c = np.concatenate([[1.0], powers @ omega])
    r = _inverse_series(c)
    s = np.cumsum(r)
    weights = (n - np.arange(n)) if objective == "mean" else np.ones(n)
    err = float(np.sum(weights * s**2))
    if not np.isfinite(err) or err > _UNSTABLE:
        # C⁻¹ blows up (a zero of the generating function inside the unit disk): a wall the
        # line search backs off from.
        return _UNSTABLE_LOSS, np.zeros_like(params)
    g_s = 2.0 * weights * s / err
    g_r = np.cumsum(g_s[::-1])[::-1]
    rr = np.convolve(r, r)[:n]
    g_c = -np.correlate(g_r, rr, mode="full")[n - 1 :]
    sens2, g_sens = _cyclic_abs_gram(c, *pattern)
    g_c = g_c + g_sens / sens2
    g_tail = g_c[1:]
    g_omega = powers.T @ g_tail
    dpow = np.where(t[:, None] > 0, t[:, None] * theta[None, :] ** np.maximum(t - 1, 0)[:, None], 0)
    g_theta = (dpow * omega[None, :]).T @ g_tail
    g_a = g_theta * theta * (1.0 - theta)
    return np.log(err) + np.log(sens2), np.concatenate([g_a, g_omega])


def _initial_fit(n: int, buffers: int) -> np.ndarray:
    """θ log-spaced towards 1, ω by least squares to the sqrt coefficients (the fallback fit)."""
    theta = 1.0 - np.logspace(-0.3, -np.log10(4.0 * n), buffers)
    target = sqrt_prefix_sum_coefficients(n)[1:]
    powers = theta[None, :] ** np.arange(n - 1)[:, None]
    omega, *_ = np.linalg.lstsq(powers, target, rcond=None)
    return np.concatenate([np.log(theta / (1.0 - theta)), omega])


def _value(params: np.ndarray, args: tuple) -> float:
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return _blt_loss(params, *args)[0]


def _minimise(start: np.ndarray, args: tuple, steps: int) -> np.ndarray:
    """L-BFGS from ``start``; ``start`` itself if the optimiser ends worse or non-finite."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        result = scipy.optimize.minimize(
            _blt_loss, start, args=args, jac=True, method="L-BFGS-B", options={"maxiter": steps}
        )
    if np.all(np.isfinite(result.x)) and _value(result.x, args) < _value(start, args):
        return result.x
    return start


def blt_strategy(
    n: int,
    buffers: int,
    *,
    min_separation: int | None = None,
    max_participations: int = 1,
    objective: str = "mean",
    steps: int = 200,
) -> BLT:
    """A BLT with ``buffers`` buffers optimised for the prefix-sum error over ``n`` steps.

    Minimises log(E(c)) + log(Σ_{s,t∈π₀} |(CᵀC)_st|) over θ ∈ (0, 1)^m (as sigmoids) and ω, with
    E the mean (‖B‖_F²/n) or max (last row of B) squared error and π₀ = {0, b, 2b, ...} (k
    terms) the cyclic pattern from the first step — the worst pattern for the non-negative,
    decreasing coefficients these fits produce; always check with
    :func:`~dpjax.dp_sgd.matrix_factorization.sensitivity`, which certifies it. L-BFGS from
    a least-squares fit of the square-root coefficients (Dvijotham, McMahan, Pillutla, Steinke,
    Thakurta 2024, FOCS, optimise the same parametrisation) and, for m > 1, also from the
    optimum with m − 1 buffers plus an idle one, so more buffers are never worse; if the
    optimiser fails, its start is kept. O(n²) per evaluation; n up to a few thousand.

    Args:
        n: number of steps, ≥ 2.
        buffers: m ≥ 1, the number of buffers.
        min_separation: b for multi-participation (None: 1).
        max_participations: k ≥ 1.
        objective: ``"mean"`` or ``"max"``.
        steps: L-BFGS iterations, ≥ 1.

    Returns:
        A :class:`BLT` (c_0 = 1; not normalised).

    Raises:
        ValueError: on bad arguments.

    Example:
        >>> blt = blt_strategy(64, 2)
        >>> blt.matrix(64).shape
        (64, 64)
    """
    n = _validate.positive_int("n", n)
    if n < 2:
        _validate.fail("n", n, "an integer ≥ 2")
    buffers = _validate.positive_int("buffers", buffers)
    k = _validate.positive_int("max_participations", max_participations)
    b = 1 if min_separation is None else _validate.positive_int("min_separation", min_separation)
    _validate.one_of("objective", objective, ("mean", "max"))
    steps = _validate.positive_int("steps", steps)
    best = np.zeros(0)
    for m in range(1, buffers + 1):
        args = (n, m, objective, (b, k))
        starts = [_initial_fit(n, m)]
        if m > 1:  # the previous optimum plus an idle buffer (ω = 0): never worse
            starts.append(np.concatenate([best[: m - 1], [0.0], best[m - 1 :], [0.0]]))
        best = min((_minimise(x0, args, steps) for x0 in starts), key=lambda x: _value(x, args))
    theta = 1.0 / (1.0 + np.exp(-best[:buffers]))
    return BLT(buf_decay=theta, output_scale=best[buffers:].copy())
