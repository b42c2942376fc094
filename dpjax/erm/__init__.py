"""Private convex ERM: output / objective perturbation, DP-GD, and their excess-risk bounds.

    J(w) = (1/n) Σ_i ℓ(w, x_i, y_i) + (μ/2)‖w‖²,   ‖x_i‖ ≤ 1

Every solver takes (key, X, y) plus static hyperparameters, returns an :class:`ERMResult`
(``.params``, ``.excess_risk_bound``, ``.event``, ``.relation``) and runs under ``jax.jit`` and
``jax.vmap`` over keys. Float64 is required (``jax.config.update("jax_enable_x64", True)``).

Modules: ``losses`` (losses with L, c), ``solver`` (certified exact minimiser, for reference
optima; data checks), ``accelerated`` (the private solvers' inner minimiser: a public step count
that guarantees its accuracy on every input, no failure branch), ``bounds``
(theorem bounds as functions of n, d, ε, δ, L, μ, D), ``output_perturbation``,
``objective_perturbation``, ``iterative`` (DP-GD / DP-SGD / Laplace DP-SGD),
``linear_regression`` (noisy sufficient statistics), ``hypothesis_grid`` (exponential mechanism).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dpjax.erm import bounds, losses
from dpjax.erm.hypothesis_grid import exponential_mechanism_grid
from dpjax.erm.iterative import dp_gd, dp_sgd, laplace_dp_sgd
from dpjax.erm.linear_regression import noisy_sufficient_statistics_regression
from dpjax.erm.objective_perturbation import (
    approximate_objective_perturbation,
    objective_perturbation,
)
from dpjax.erm.output_perturbation import output_perturbation
from dpjax.erm.result import ERMResult
from dpjax.erm.solver import SolveResult, objective, solve

if TYPE_CHECKING:
    from dpjax.erm.estimator import PrivateLogisticRegression


def __getattr__(name: str) -> Any:
    """``PrivateLogisticRegression`` on first access: its module imports scikit-learn, which
    ``import dpjax.erm`` does not need."""
    if name != "PrivateLogisticRegression":
        raise AttributeError(f"module 'dpjax.erm' has no attribute {name!r}")
    value = importlib.import_module("dpjax.erm.estimator").PrivateLogisticRegression
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "ERMResult",
    "PrivateLogisticRegression",
    "SolveResult",
    "approximate_objective_perturbation",
    "bounds",
    "dp_gd",
    "exponential_mechanism_grid",
    "dp_sgd",
    "laplace_dp_sgd",
    "losses",
    "noisy_sufficient_statistics_regression",
    "objective",
    "objective_perturbation",
    "output_perturbation",
    "solve",
]
