"""Correlated noise by matrix factorization: strategies, their sensitivity and their error.

The matrix-factorization mechanism releases the prefix sums A·G of the clipped gradient sums as
A·G + B·Z with A = B·C, i.e. DP-SGD whose step-t noise is (C⁻¹Z)_t (Choquette-Choo, McMahan,
Rush, Thakurta 2023). Modules: ``strategies`` (the lower-triangular C: square root, banded,
tree), ``blt`` (buffered linear Toeplitz), ``sensitivity`` (single and b-min-separated
participation), ``errors`` (max and root-mean-squared error of the prefix sums).
"""

from dpjax.dp_sgd.matrix_factorization.sensitivity import (
    SensitivityBounds,
    sensitivity,
    sensitivity_bounds,
)
from dpjax.dp_sgd.matrix_factorization.strategies import (
    banded_sqrt_strategy,
    prefix_sum_matrix,
    sqrt_prefix_sum_coefficients,
    toeplitz_matrix,
    tree_aggregation,
    tree_aggregation_nodes,
)

__all__ = [
    "SensitivityBounds",
    "banded_sqrt_strategy",
    "prefix_sum_matrix",
    "sensitivity",
    "sensitivity_bounds",
    "sqrt_prefix_sum_coefficients",
    "toeplitz_matrix",
    "tree_aggregation",
    "tree_aggregation_nodes",
]
