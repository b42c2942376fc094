"""Correlated noise by matrix factorization: strategies, their sensitivity and their error.

The matrix-factorization mechanism releases the prefix sums A·G of the clipped gradient sums as
A·G + B·Z with A = B·C, i.e. DP-SGD whose step-t noise is (C⁻¹Z)_t (Choquette-Choo, McMahan,
Rush, Thakurta 2023, "Multi-epoch matrix factorization mechanisms for private machine
learning", ICML). A strategy is the lower-triangular n×n float64 matrix C, normalised to
sensitivity 1 under the pattern it was built for. Modules: ``strategies`` (square root,
Toeplitz, banded square root, optimised banded, tree aggregation), ``blt`` (buffered linear
Toeplitz), ``sensitivity`` (single and b-min-separated participation), ``errors`` (max and
root-mean-squared error of the prefix sums, comparison).
"""

from dpjax.dp_sgd.matrix_factorization.blt import BLT, blt_strategy, toeplitz_errors
from dpjax.dp_sgd.matrix_factorization.errors import (
    PrefixSumErrors,
    compare_strategies,
    prefix_sum_errors,
    sqrt_prefix_sum_errors,
)
from dpjax.dp_sgd.matrix_factorization.sensitivity import (
    SensitivityBounds,
    sensitivity,
    sensitivity_bounds,
)
from dpjax.dp_sgd.matrix_factorization.strategies import (
    banded_sqrt_strategy,
    banded_strategy,
    prefix_sum_matrix,
    sqrt_prefix_sum_coefficients,
    toeplitz_matrix,
    tree_aggregation,
    tree_aggregation_nodes,
)

__all__ = [
    "BLT",
    "PrefixSumErrors",
    "SensitivityBounds",
    "banded_sqrt_strategy",
    "banded_strategy",
    "blt_strategy",
    "compare_strategies",
    "prefix_sum_errors",
    "prefix_sum_matrix",
    "sensitivity",
    "sensitivity_bounds",
    "sqrt_prefix_sum_coefficients",
    "sqrt_prefix_sum_errors",
    "toeplitz_errors",
    "toeplitz_matrix",
    "tree_aggregation",
    "tree_aggregation_nodes",
]
