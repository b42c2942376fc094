"""Matrix-factorization strategies for the prefix-sum workload: the lower-triangular C of A = B·C.

The matrix-factorization mechanism releases the prefix sums A·G of the per-step clipped gradient
sums G (A is the n×n all-ones lower triangle) as A·G + B·Z with A = B·C and Z iid Gaussian;
equivalently, DP-SGD whose noise at step t is (C⁻¹Z)_t (Choquette-Choo, McMahan, Rush, Thakurta
2023, "Multi-epoch matrix factorization mechanisms for private machine learning", Section 2).
A strategy here is the lower-triangular C, a float64 NumPy array: lower-triangular means the
noise at step t depends on Z_1..Z_t only, so it can be generated online.

Convention (shared with the streaming noise): a strategy is returned NORMALISED so that its
sensitivity (:func:`dpjax.dp_sgd.matrix_factorization.sensitivity`) is 1 under the participation
pattern it was built for (single participation unless the builder takes a pattern), unless the
docstring says otherwise. Scaling C does not change the error of the mechanism at a fixed
privacy level; the error metrics of :mod:`~dpjax.dp_sgd.matrix_factorization.errors` multiply by
the sensitivity anyway.

Everything is constructed in float64 NumPy: the strategies are public, data-independent
constants, and the exact identities tested here (C·C = A to 1e-12) need the precision.
"""

from __future__ import annotations

import math

import numpy as np

from dpjax import _validate
from dpjax.dp_sgd.matrix_factorization._toeplitz import (
    _size,
    prefix_sum_matrix,
    sqrt_prefix_sum_coefficients,
    toeplitz_matrix,
)

__all__ = [
    "sqrt_prefix_sum_coefficients",
    "toeplitz_matrix",
    "prefix_sum_matrix",
    "banded_sqrt_strategy",
    "banded_strategy",
    "tree_aggregation",
    "tree_aggregation_nodes",
]


def banded_sqrt_strategy(n: int, bands: int) -> np.ndarray:
    """The banded square-root strategy: the sqrt coefficients truncated to ``bands`` bands.

    C = Toeplitz(c_0, ..., c_{bands−1}) / ‖(c_0, ..., c_{bands−1})‖₂ with c_k from
    :func:`sqrt_prefix_sum_coefficients` (Kalinin & Lampert 2024, "Banded square root matrix
    factorization for differentially private model training", NeurIPS). Normalised: every
    column has norm ≤ 1 and the first has norm 1, so the single-participation sensitivity is 1;
    under b-min-separated participation with ``bands`` ≤ b the columns a user touches have
    disjoint supports and the sensitivity is √k for k participations. ``bands = 1`` is DP-SGD
    (C = I); ``bands = n`` is the (normalised) full square root.

    Args:
        n: number of steps, a positive integer.
        bands: number of non-zero diagonals, 1 ≤ bands ≤ n.

    Returns:
        The n×n lower-triangular float64 matrix.

    Raises:
        ValueError: on a non-positive ``n`` or ``bands`` outside [1, n].

    Example:
        >>> banded_sqrt_strategy(3, 1)
        array([[1., 0., 0.],
               [0., 1., 0.],
               [0., 0., 1.]])
    """
    n = _size("n", n)
    bands = _validate.integer("bands", bands, f"an integer in [1, n = {n}]")
    if not 1 <= bands <= n:
        _validate.fail("bands", bands, f"an integer in [1, n = {n}]")
    c = sqrt_prefix_sum_coefficients(bands)
    return toeplitz_matrix(c / np.linalg.norm(c), n)


def tree_aggregation_nodes(n: int) -> np.ndarray:
    """The binary-tree (DP-FTRL) node matrix: one row per dyadic interval, ones on its leaves.

    The tree has 2^h ≥ n leaves (h = ⌈log₂ n⌉); row r is the indicator of a dyadic interval
    [j·2^l, (j+1)·2^l) ∩ [0, n) for l = 0..h, intervals disjoint from [0, n) dropped. Every
    step lies in exactly h + 1 intervals, so every column has norm √(h + 1) (Kairouz, McMahan,
    Song, Thakkar, Thakurta, Xu 2021, "Practical and private (deep) learning without sampling
    or shuffling", ICML; Dwork, Naor, Pitassi, Rothblum 2010; Chan, Shi, Song 2011).

    Args:
        n: number of leaves (steps), a positive integer.

    Returns:
        The m×n 0/1 float64 matrix (m ≤ 2^{h+1} − 1), rows ordered by level then position.
    """
    n = _size("n", n)
    height = max(0, math.ceil(math.log2(n))) if n > 1 else 0
    rows = []
    for level in range(height + 1):
        width = 2**level
        for start in range(0, n, width):
            row = np.zeros(n, dtype=np.float64)
            row[start : min(start + width, n)] = 1.0
            rows.append(row)
    return np.stack(rows)


def _reverse_cholesky(gram: np.ndarray) -> np.ndarray:
    """The lower-triangular L with Lᵀ·L = gram (a UL factorisation via the flipped Cholesky)."""
    flipped = np.linalg.cholesky(gram[::-1, ::-1])
    return flipped.T[::-1, ::-1].copy()


def tree_aggregation(n: int) -> np.ndarray:
    """Binary-tree aggregation with Honaker's estimator, as a square lower-triangular strategy.

    The tree mechanism releases T·G + Z for the node matrix T of
    :func:`tree_aggregation_nodes`; Honaker's estimator (Honaker 2015, "Efficient use of
    differentially private binary trees") is the minimum-variance linear unbiased estimate of
    the prefix sums from all noisy nodes, the least-squares estimate A·T⁺·(T·G + Z) = A·G +
    A·T⁺Z. Its error covariance A(TᵀT)⁻¹Aᵀ and its sensitivity (column norms and Gram TᵀT)
    depend on T only through TᵀT. So the square lower-triangular C with CᵀC = TᵀT (a flipped
    Cholesky factorisation) is the same mechanism: the release A·G + A·C⁻¹Z has the same
    Gaussian distribution, the same sensitivity under every participation pattern, and C is
    causal (the noise at step t uses Z_1..Z_t). This is how the tree fits the error and
    sensitivity code of this package and the streaming noise.

    Normalised: C = C_T / √(h + 1) so the single-participation sensitivity is 1.

    Args:
        n: number of steps, a positive integer.

    Returns:
        The n×n lower-triangular float64 C with CᵀC = TᵀT / (h + 1).

    Example:
        >>> c = tree_aggregation(4)
        >>> bool(np.allclose(c.T @ c, tree_aggregation_nodes(4).T @ tree_aggregation_nodes(4) / 3))
        True
    """
    nodes = tree_aggregation_nodes(n)
    gram = nodes.T @ nodes
    return _reverse_cholesky(gram / np.max(np.diag(gram)))


def banded_strategy(
    n: int,
    bands: int,
    *,
    min_separation: int | None = None,
    max_participations: int = 1,
    objective: str = "mean",
    steps: int = 100,
) -> np.ndarray:
    """A banded strategy optimised for the prefix-sum error under a participation pattern.

    Minimises the squared error of the prefix sums at a fixed privacy level,
    sens(C)²·‖A·C⁻¹‖_F²/n (``"mean"``) or sens(C)²·max_t ‖(A·C⁻¹)_t‖² (``"max"``, through a
    smooth 32-norm of the row norms), over lower-triangular C with ``bands`` non-zero
    diagonals, every column normalised to norm 1 (Choquette-Choo, Ganesh, McKenna, McMahan,
    Rush, Thakurta, Xu 2023, "(Amplified) banded matrix factorization: a unified approach to
    private training", NeurIPS, Section 4). When ``bands`` ≤ b (or single participation) the
    columns one example touches have disjoint supports, so sens² is the number of
    participations and only the error term is optimised; when ``bands`` > b the loss also
    multiplies by a smooth maximum of Σ_{s,t∈π} |(CᵀC)_st| over the cyclic patterns
    π = {s, s + b, ...}, a surrogate of sens², and the banded square root is returned instead
    if its certified error is smaller. The optimiser is L-BFGS (float64, O(n²·bands) per
    evaluation) started from the banded square root (:func:`banded_sqrt_strategy`), which it
    can only improve on its own loss. Measured: n = 500, 16 bands, 100 iterations in about 7 s
    on a loaded 2-core CPU; about 30 iterations already reach the optimum to 4 digits.

    The result is NORMALISED by the certified :func:`~dpjax.dp_sgd.matrix_factorization.
    sensitivity` under the given pattern, so its sensitivity is (at most) 1 there.

    Args:
        n: number of steps, a positive integer.
        bands: number of non-zero diagonals, 1 ≤ bands ≤ n (1 is DP-SGD).
        min_separation: b, the least gap between participations (None: 1).
        max_participations: k ≥ 1, the most participations of one example.
        objective: ``"mean"`` (root-mean-squared error) or ``"max"``.
        steps: at most this many L-BFGS iterations (≥ 1); about 30–100 converge.

    Returns:
        The n×n lower-triangular float64 C.

    Raises:
        ValueError: on bad arguments.

    Example:
        >>> c = banded_strategy(16, 4, min_separation=4, max_participations=4)
        >>> from dpjax.dp_sgd.matrix_factorization import sensitivity
        >>> round(sensitivity(c, min_separation=4, max_participations=4), 6)
        1.0
    """
    from dpjax.dp_sgd.matrix_factorization import _banded_opt
    from dpjax.dp_sgd.matrix_factorization.sensitivity import sensitivity

    n = _size("n", n)
    bands = _validate.integer("bands", bands, f"an integer in [1, n = {n}]")
    if not 1 <= bands <= n:
        _validate.fail("bands", bands, f"an integer in [1, n = {n}]")
    k = _validate.positive_int("max_participations", max_participations)
    b = 1 if min_separation is None else _validate.positive_int("min_separation", min_separation)
    _validate.one_of("objective", objective, ("mean", "max"))
    steps = _validate.positive_int("steps", steps)
    if bands == 1:
        matrix = np.eye(n)
    else:
        pattern = (b, k) if k > 1 and bands > b else None
        initial = banded_sqrt_strategy(n, bands)
        matrix = _banded_opt.optimise_banded(initial, bands, objective, pattern, steps)
        if pattern is not None:
            matrix = _better(matrix, initial, objective, min_separation, k)
    scale = sensitivity(matrix, min_separation=min_separation, max_participations=k)
    return matrix / scale


def _better(candidate, fallback, objective, min_separation, k) -> np.ndarray:
    """The strategy with the smaller certified error (the surrogate loss may mislead)."""
    from dpjax.dp_sgd.matrix_factorization.errors import prefix_sum_errors

    def error(matrix):
        errors = prefix_sum_errors(matrix, min_separation=min_separation, max_participations=k)
        return errors.rmse if objective == "mean" else errors.max_error

    return candidate if error(candidate) <= error(fallback) else fallback
