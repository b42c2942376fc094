"""Optimisation of a column-normalised banded strategy (helper of ``strategies.banded_strategy``).

The free parameters are the band table W (n × bands): W[j, d] = C[j + d, j]. Each column is
normalised, C[:, j] = W[j] / ‖W[j]‖, so that every column has norm 1 and the sensitivity is a
function of the pattern only when bands ≤ b (columns b apart have disjoint supports; the
"amplified banded" setting of Choquette-Choo, Ganesh, McKenna, McMahan, Rush, Thakurta, Xu 2023,
NeurIPS). With bands > b the objective multiplies by a smooth maximum of Σ_{s,t∈π}|(CᵀC)_st|
over the cyclic patterns π = {s, s + b, ...}, a surrogate of sens²; the caller normalises the
result by the certified :func:`sensitivity` afterwards, so the surrogate only steers.

Loss and gradient cost O(n²·bands) per evaluation: B = A·C⁻¹ and the adjoint come from banded
triangular solves with n right-hand sides (LAPACK gbsv without pivots: the systems are
triangular). With E(C) = φ(‖B_1‖², ..., ‖B_n‖²), dE/dC = −2·Bᵀ·diag(φ′)·B·C⁻ᵀ, of which only the
band is needed.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg
import scipy.optimize

_SMOOTH_MAX_POWER = 32.0


def band_table(matrix: np.ndarray, bands: int) -> np.ndarray:
    """The n × bands table W[j, d] = C[j + d, j] (0 below the matrix)."""
    n = matrix.shape[0]
    table = np.zeros((n, bands))
    for d in range(bands):
        table[: n - d, d] = np.diagonal(matrix, -d)
    return table


def band_matrix(table: np.ndarray) -> np.ndarray:
    """The n × n lower-triangular matrix of a band table."""
    n, bands = table.shape
    out = np.zeros((n, n))
    for d in range(bands):
        out += np.diag(table[: n - d, d], -d)
    return out


def _valid_mask(n: int, bands: int) -> np.ndarray:
    return np.add.outer(np.arange(n), np.arange(bands)) < n


def _solve_lower(table: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """C⁻¹·rhs for the lower-banded C of ``table``, as J·(J C J)⁻¹·J·rhs with J the reversal.

    J·C·J is upper-banded; LAPACK's banded solver is much faster without sub-diagonals.
    """
    n, bands = table.shape
    upper = np.zeros((bands, n))
    for d in range(bands):
        upper[bands - 1 - d, d:] = table[n - 1 - d :: -1, d]
    flipped = scipy.linalg.solve_banded((0, bands - 1), upper, rhs[::-1], check_finite=False)
    return flipped[::-1]


def _solve_upper(table: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """C⁻ᵀ·rhs for the lower-banded C of ``table``."""
    n, bands = table.shape
    upper = np.zeros((bands, n))
    for d in range(bands):
        upper[bands - 1 - d, d:] = table[: n - d, d]
    return scipy.linalg.solve_banded((0, bands - 1), upper, rhs, check_finite=False)


def _smooth_max(values: np.ndarray) -> tuple[float, np.ndarray]:
    """(Σ v^p)^{1/p} and its gradient, computed stably (p = 32)."""
    top = values.max()
    ratio = values / top
    total = np.sum(ratio**_SMOOTH_MAX_POWER)
    value = top * total ** (1.0 / _SMOOTH_MAX_POWER)
    return value, (values / value) ** (_SMOOTH_MAX_POWER - 1.0)


def _error_term(table: np.ndarray, objective: str) -> tuple[float, np.ndarray]:
    """log E(C) and its gradient with respect to the band table of C."""
    n, bands = table.shape
    b_transposed = _solve_upper(table, np.triu(np.ones((n, n))))
    row_norms = np.einsum("ij,ij->j", b_transposed, b_transposed)
    if objective == "mean":
        value, weights = float(row_norms.sum()), np.ones(n)
    else:
        value, weights = _smooth_max(row_norms)
    adjoint = _solve_lower(table, b_transposed * weights[None, :])
    grad = np.zeros((n, bands))
    for d in range(bands):
        grad[: n - d, d] = -2.0 * np.einsum("ij,ij->i", b_transposed[d:], adjoint[: n - d])
    return float(np.log(value)), grad / value


def _sensitivity_term(table: np.ndarray, b: int, k: int) -> tuple[float, np.ndarray]:
    """log of a smooth max over cyclic patterns π of Σ_{s,t∈π} |(CᵀC)_st|, and its gradient.

    The absolute values matter: with signed entries the optimiser would let the columns of a
    pattern cancel, while the sensitivity lets an example's gradients take opposite signs.
    """
    n, bands = table.shape
    matrix = band_matrix(table)
    members = [np.arange(s, n, b)[:k] for s in range(min(b, n))]
    grams = [matrix[:, m].T @ matrix[:, m] for m in members]
    value, weights = _smooth_max(np.array([np.abs(g).sum() for g in grams]))
    grad = np.zeros((n, bands))
    for weight, member, gram in zip(weights, members, grams, strict=True):
        columns_grad = 2.0 * weight * matrix[:, member] @ np.sign(gram)
        for d in range(bands):
            rows = member + d
            ok = rows < n
            grad[member[ok], d] += columns_grad[rows[ok], np.flatnonzero(ok)]
    return float(np.log(value)), grad / value


def _normalise(raw: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    norms = np.sqrt(np.sum((raw * mask) ** 2, axis=1, keepdims=True))
    return raw * mask / norms, norms


def _loss(flat, shape, mask, objective, pattern) -> tuple[float, np.ndarray]:
    raw = flat.reshape(shape)
    table, norms = _normalise(raw, mask)
    value, grad = _error_term(table, objective)
    if pattern is not None:
        extra, extra_grad = _sensitivity_term(table, *pattern)
        value, grad = value + extra, grad + extra_grad
    grad = grad * mask
    radial = np.sum(grad * table, axis=1, keepdims=True)
    grad_raw = (grad - table * radial) / norms
    return value, grad_raw.ravel()


def optimise_banded(
    initial: np.ndarray, bands: int, objective: str, pattern: tuple[int, int] | None, steps: int
) -> np.ndarray:
    """L-BFGS on the column-normalised band table from ``initial``; returns the banded matrix.

    ``pattern`` = (b, k) adds the cyclic-pattern sensitivity surrogate (needed when bands > b);
    None means every column counts once (bands ≤ b or single participation).
    """
    n = initial.shape[0]
    mask = _valid_mask(n, bands)
    start = band_table(initial, bands)
    result = scipy.optimize.minimize(
        _loss,
        start.ravel(),
        args=(start.shape, mask, objective, pattern),
        jac=True,
        method="L-BFGS-B",
        options={"maxiter": steps},
    )
    table, _ = _normalise(result.x.reshape(start.shape), mask)
    return band_matrix(table)
