"""The prefix-sum workload and lower-triangular Toeplitz matrices, in float64 NumPy.

The all-ones lower triangle A (:func:`prefix_sum_matrix`), the coefficients of its square
root (:func:`sqrt_prefix_sum_coefficients`) and the Toeplitz matrix of given coefficients
(:func:`toeplitz_matrix`): the building blocks that the strategies
(:mod:`~dpjax.dp_sgd.matrix_factorization.strategies`), the BLT parametrisation and the error
metrics share (importable from ``strategies`` too).
"""

from __future__ import annotations

import numpy as np

from dpjax import _validate

__all__ = ["prefix_sum_matrix", "sqrt_prefix_sum_coefficients", "toeplitz_matrix"]


def _size(name: str, value) -> int:
    return _validate.positive_int(name, value)


def prefix_sum_matrix(n: int) -> np.ndarray:
    """The prefix-sum workload A: the n×n lower triangle of ones (float64).

    Args:
        n: number of steps, a positive integer.

    Returns:
        A with A[t, s] = 1 for s ≤ t, else 0.
    """
    n = _size("n", n)
    return np.tril(np.ones((n, n), dtype=np.float64))


def sqrt_prefix_sum_coefficients(n: int) -> np.ndarray:
    """The Toeplitz coefficients of the square root of the prefix-sum matrix.

    .. math:: c_k = \\binom{2k}{k} / 4^k,\\qquad c_0 = 1,\\; c_k = c_{k-1}\\,(2k-1)/(2k),

    the Taylor coefficients of (1 − x)^{−1/2}; the lower-triangular Toeplitz matrix C with
    these coefficients satisfies C·C = A, because ((1 − x)^{−1/2})² = 1/(1 − x) = Σ x^k
    (Fichtenberger, Henzinger, Upadhyay 2023, "Constant matters: fine-grained error bound on
    differentially private continual observation", ICML; Henzinger, Upadhyay, Upadhyay 2023,
    "Almost tight error bounds on differentially private continual counting", SODA).

    Computed by the product recurrence in float64 (each c_k is within a few ulps; no
    factorial overflows).

    Args:
        n: number of coefficients, a positive integer.

    Returns:
        The float64 array (c_0, ..., c_{n−1}).

    Raises:
        ValueError: if ``n`` is not a positive integer.

    Example:
        >>> sqrt_prefix_sum_coefficients(4)
        array([1.    , 0.5   , 0.375 , 0.3125])
    """
    n = _size("n", n)
    k = np.arange(1, n, dtype=np.float64)
    return np.concatenate([[1.0], np.cumprod((2.0 * k - 1.0) / (2.0 * k))])


def toeplitz_matrix(coefficients, n: int | None = None) -> np.ndarray:
    """The lower-triangular Toeplitz matrix C[t, s] = c_{t−s} (0 for s > t).

    With fewer coefficients than ``n`` the missing ones are 0: a banded matrix with
    ``len(coefficients)`` bands.

    Args:
        coefficients: 1-D array of finite reals (c_0, c_1, ...), c_0 ≠ 0 is not required here.
        n: the size; defaults to ``len(coefficients)``.

    Returns:
        The n×n float64 matrix.

    Raises:
        ValueError: if the coefficients are not a non-empty finite 1-D array, or ``n`` is not a
            positive integer.

    Example:
        >>> toeplitz_matrix([1.0, 0.5], 3)
        array([[1. , 0. , 0. ],
               [0.5, 1. , 0. ],
               [0. , 0.5, 1. ]])
    """
    c = np.asarray(coefficients, dtype=np.float64)
    if c.ndim != 1 or c.size == 0 or not np.all(np.isfinite(c)):
        _validate.fail("coefficients", coefficients, "a non-empty 1-D array of finite reals")
    n = c.size if n is None else _size("n", n)
    padded = np.zeros(n, dtype=np.float64)
    padded[: min(n, c.size)] = c[:n]
    lag = np.subtract.outer(np.arange(n), np.arange(n))
    return np.where(lag >= 0, padded[np.clip(lag, 0, n - 1)], 0.0)
