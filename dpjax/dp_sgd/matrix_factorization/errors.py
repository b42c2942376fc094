"""Error of the prefix sums released by a matrix-factorization strategy, at a fixed privacy level.

Conventions. The mechanism with strategy C releases the prefix sums A·G + B·Z·(z·clip·sens(C))
with B = A·C⁻¹, Z iid N(0, 1) per step and coordinate, and z the noise multiplier of the
Gaussian's privacy accounting (so the noise is calibrated to the sensitivity). Per unit of
z·clip and per coordinate, the prefix sum at step t has standard deviation sens(C)·‖B_t‖, so

.. math:: \\mathrm{rmse}(C) = \\mathrm{sens}(C)\\,\\|B\\|_F/\\sqrt{n},\\qquad
    \\mathrm{max}(C) = \\mathrm{sens}(C)\\,\\max_t \\|B_t\\|_2 .

Both are invariant to scaling C. DP-SGD is C = I: rmse = sens·√((n+1)/2), max = sens·√n.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np
import scipy.linalg

from dpjax import _validate
from dpjax.dp_sgd.matrix_factorization._toeplitz import (
    prefix_sum_matrix,
    sqrt_prefix_sum_coefficients,
)
from dpjax.dp_sgd.matrix_factorization.blt import BLT
from dpjax.dp_sgd.matrix_factorization.sensitivity import sensitivity_bounds

__all__ = [
    "PrefixSumErrors",
    "compare_strategies",
    "prefix_sum_errors",
    "sqrt_prefix_sum_errors",
]


class PrefixSumErrors(NamedTuple):
    """Errors of the prefix sums per unit of noise multiplier × clip norm (see module doc).

    Attributes:
        rmse: root-mean-squared error over the n prefix sums, sens·‖B‖_F/√n.
        max_error: the largest standard deviation of a prefix sum, sens·max_t ‖B_t‖.
        sensitivity: sens(C) under the pattern used (a certified upper bound when not exact).
        exact: whether the sensitivity is exact (else the errors are upper bounds).
    """

    rmse: float
    max_error: float
    sensitivity: float
    exact: bool


def _square_lower(strategy, n: int | None) -> np.ndarray:
    if isinstance(strategy, BLT):
        if n is None:
            _validate.fail("n", n, "a positive integer when the strategy is a BLT")
        return strategy.matrix(n)
    c = np.asarray(strategy, dtype=np.float64)
    ok = c.ndim == 2 and c.size > 0 and c.shape[0] == c.shape[1] and np.all(np.isfinite(c))
    if not ok or np.any(np.triu(c, 1) != 0) or np.any(np.diag(c) == 0):
        _validate.fail(
            "strategy", strategy, "a square lower-triangular finite matrix with non-zero diagonal"
        )
    return c


def prefix_sum_errors(
    strategy,
    *,
    min_separation: int | None = None,
    max_participations: int = 1,
    n: int | None = None,
) -> PrefixSumErrors:
    """Root-mean-squared and max error of the prefix sums under a participation pattern.

    .. math:: \\mathrm{rmse} = \\mathrm{sens}(C)\\,\\|A C^{-1}\\|_F/\\sqrt{n},\\quad
        \\mathrm{max} = \\mathrm{sens}(C)\\,\\max_t\\|(A C^{-1})_t\\|_2

    Args:
        strategy: the n×n lower-triangular C (non-zero diagonal), or a :class:`BLT` with ``n``.
        min_separation: b of the participation pattern (None: 1).
        max_participations: k ≥ 1 (1: single participation).
        n: the number of steps, required only for a :class:`BLT`.

    Returns:
        A :class:`PrefixSumErrors`.

    Raises:
        ValueError: if C is not square lower-triangular with a non-zero diagonal, or the
            pattern is invalid.

    Example:
        >>> import numpy as np
        >>> e = prefix_sum_errors(np.eye(3))
        >>> round(e.rmse ** 2, 12), round(e.max_error ** 2, 12)
        (2.0, 3.0)
    """
    c = _square_lower(strategy, n)
    size = c.shape[0]
    workload = prefix_sum_matrix(size)
    b_matrix = scipy.linalg.solve_triangular(c.T, workload.T, lower=False).T
    bounds = sensitivity_bounds(
        c, min_separation=min_separation, max_participations=max_participations
    )
    sens = bounds.upper
    rmse = sens * float(np.linalg.norm(b_matrix)) / math.sqrt(size)
    max_error = sens * float(np.max(np.linalg.norm(b_matrix, axis=1)))
    return PrefixSumErrors(rmse, max_error, sens, bounds.exact)


def sqrt_prefix_sum_errors(n: int) -> PrefixSumErrors:
    """Closed-form errors of the square-root strategy C = A^{1/2} under single participation.

    With c_k = binom(2k, k)/4^k: B = A·C⁻¹ = C, sens(C) = ‖c‖₂ (the first column), so

    .. math:: \\mathrm{max} = \\sum_{k<n} c_k^2,\\qquad
        \\mathrm{rmse}^2 = \\Big(\\sum_{k<n} c_k^2\\Big)\\,\\frac{1}{n}\\sum_{k<n} (n-k)\\,c_k^2,

    O(n) instead of the O(n³) matrix computation. Since c_k ≤ 1/√(πk) (Wallis), the max error
    is at most 1 + (1 + ln(n − 1))/π for n ≥ 2, the logarithmic growth shown by Fichtenberger,
    Henzinger, Upadhyay 2023 (ICML) and Henzinger, Upadhyay, Upadhyay 2023 (SODA); rmse ≤ max.

    Args:
        n: number of steps, a positive integer.

    Returns:
        A :class:`PrefixSumErrors` (exact sensitivity).

    Example:
        >>> round(sqrt_prefix_sum_errors(2).max_error, 12)
        1.25
    """
    c2 = sqrt_prefix_sum_coefficients(n) ** 2
    total = float(np.sum(c2))
    mean = float(np.sum((n - np.arange(n)) * c2)) / n
    return PrefixSumErrors(math.sqrt(total * mean), total, math.sqrt(total), True)


def compare_strategies(
    named: Mapping[str, object],
    *,
    min_separation: int | None = None,
    max_participations: int = 1,
    n: int | None = None,
) -> dict[str, PrefixSumErrors]:
    """:func:`prefix_sum_errors` of several strategies under the same participation pattern.

    Args:
        named: name → strategy (matrix, or :class:`BLT` together with ``n``).
        min_separation: b of the pattern (None: 1).
        max_participations: k ≥ 1.
        n: the number of steps for BLT entries.

    Returns:
        name → :class:`PrefixSumErrors`, in the order given.

    Example:
        >>> import numpy as np
        >>> from dpjax.dp_sgd.matrix_factorization import tree_aggregation
        >>> table = compare_strategies({"DP-SGD": np.eye(8), "tree": tree_aggregation(8)})
        >>> bool(table["tree"].rmse < table["DP-SGD"].rmse)
        True
    """
    return {
        name: prefix_sum_errors(
            strategy, min_separation=min_separation, max_participations=max_participations, n=n
        )
        for name, strategy in named.items()
    }
