"""Reproduce the excess-risk rates of private convex optimisation (theory vs measurement).

Each *row* is one claim "the mean excess risk of method M on instance I decays like x^s" for
x ∈ {n, d, ε}. A row is a grid of *cells*; in each cell K independently generated data sets are
each hit with S independent noise draws (one compiled ``jax.vmap`` over S keys per data set), the
excess risk of every private output is measured in float64 against a certified exact optimum,
and the stated bound of the solver is compared with the mean (one-sided t tests, Holm over the
row). The slope of log2(mean) against log2(x) is fitted by OLS with a hierarchical-bootstrap
95% CI (see ``experiments.fitting``).

Modules: ``grid`` (scales, settings, the row record), ``solvers`` (the public ``dpjax.erm``
solvers, one compiled vmapped call per data set), ``cells`` (one measurement per method ×
instance), ``table`` (the rows and their expected slopes), ``runner`` (fits, bound checks,
JSON, plots, Markdown).

Example:
    >>> import pathlib, tempfile
    >>> from experiments import rates
    >>> out = rates.run(pathlib.Path(tempfile.mkdtemp()), size="tiny", only=("output_sc_sharp",))
    >>> out["records"][0]["within_tolerance"]
    True

Float64: ``run`` enables ``jax_enable_x64`` before anything is computed, because the excess risks
at large n (1e-6…1e-9) are below float32 resolution of the objective.

Hyperparameters (μ for the convex rows, T and step sizes for DP-GD) come from the theory's
formulas only, never from the private data.
"""

from __future__ import annotations

from experiments.rates.grid import DELTA, SCALES, Cell, Row, Scale, Setting
from experiments.rates.runner import run, run_row, summarise_row
from experiments.rates.solvers import SolverUnavailable, erm_function, erm_loss, private_release
from experiments.rates.table import rows

DESCRIPTION = "excess-risk rates of output/objective perturbation and DP-GD (slopes, bounds)"

__all__ = [
    "DELTA",
    "DESCRIPTION",
    "SCALES",
    "Cell",
    "Row",
    "Scale",
    "Setting",
    "SolverUnavailable",
    "erm_function",
    "erm_loss",
    "private_release",
    "rows",
    "run",
    "run_row",
    "summarise_row",
]
