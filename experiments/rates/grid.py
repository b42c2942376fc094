"""Grid sizes, cell settings and the row record of the rate experiments."""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Callable

import jax
import numpy as np

__all__ = ["Scale", "SCALES", "DELTA", "Setting", "Cell", "Measure", "Row"]


@dataclasses.dataclass(frozen=True)
class Scale:
    """Grid sizes of one run (``tiny`` for tests, ``quick`` for ``make reproduce``, ``full``).

    Attributes:
        n_grid: n values of the closed-form solvers' rows.
        n_grid_iterative: n values of the DP-GD rows (T ∝ n² makes them cost ∝ n³).
        steps_grid: N = n values of the Laplace DP-SGD rows (batch 1, N steps).
        d_grid, eps_grid: the secondary rows' grids (at n = ``n_fixed``).
        datasets: K data sets per cell. seeds: S noise seeds per data set.
        n_boot: hierarchical-bootstrap replicates. tolerance: the slack of the lenient
            verdict "expected slope within the CI widened by ±tolerance" (the strict verdict,
            "the CI contains the expected slope", has none).
    """

    n_grid: tuple[int, ...]
    n_grid_iterative: tuple[int, ...]
    steps_grid: tuple[int, ...]
    d_grid: tuple[int, ...]
    eps_grid: tuple[float, ...]
    n_fixed: int
    datasets: int
    seeds: int
    n_boot: int
    tolerance: float


def _powers(lo: int, hi: int, every: int = 1) -> tuple[int, ...]:
    return tuple(2**k for k in range(lo, hi + 1, every))


SCALES: dict[str, Scale] = {
    "tiny": Scale(
        n_grid=(512, 1024, 2048),  # three points per fitted line, even at the smoke scale
        n_grid_iterative=(256, 512, 1024),
        steps_grid=(1024, 2896, 8192),  # ≈ 2^10, 2^11.5, 2^13
        d_grid=(2, 4, 8, 16),
        eps_grid=(0.25, 0.5, 1.0),
        n_fixed=1024,
        datasets=2,
        seeds=48,
        n_boot=200,
        tolerance=0.1,
    ),
    "quick": Scale(
        n_grid=_powers(9, 14),
        n_grid_iterative=_powers(8, 11),
        steps_grid=_powers(10, 14, 2),
        d_grid=(2, 4, 8, 16, 32),
        eps_grid=(0.25, 0.5, 1.0),
        n_fixed=4096,
        datasets=4,
        seeds=96,
        n_boot=1000,
        tolerance=0.1,
    ),
    "full": Scale(
        n_grid=_powers(8, 16),
        n_grid_iterative=_powers(8, 12),
        steps_grid=_powers(10, 16),
        d_grid=(2, 8, 32, 128),
        eps_grid=(0.25, 0.5, 1.0),
        n_fixed=8192,
        datasets=5,
        seeds=200,
        n_boot=2000,
        tolerance=0.05,
    ),
}

DELTA = 1e-6  # fixed for slope fits (δ = 1/n² would bias slopes)


@dataclasses.dataclass(frozen=True)
class Setting:
    """One cell's parameters."""

    n: int
    d: int
    epsilon: float
    delta: float = DELTA


@dataclasses.dataclass
class Cell:
    """What one cell measured: excess risks (K, S), the stated bound, the trivial levels.

    ``vacuity_level`` is L·D (a bound ≥ L·D says nothing; D the diameter of the
    ball the comparator lives in); ``zero_excess`` the excess of the trivial output w = 0.
    """

    excess: np.ndarray
    bound: float
    zero_excess: float
    certificate: float
    vacuity_level: float = math.inf
    extra: dict = dataclasses.field(default_factory=dict)


Measure = Callable[[Setting, np.random.Generator, jax.Array], Cell]


@dataclasses.dataclass(frozen=True)
class Row:
    """One rate claim: method × instance × variable, with the theory's slopes.

    Attributes:
        name: short identifier (file names).
        method, instance, variable: what the report shows.
        title: the plot's title in words (e.g. "output perturbation, smooth logistic loss").
        plot_note: a short explanation drawn on the figure (e.g. why there is no bound).
        expected_slope: the slope this instance should show (the refined prediction where the
            instance is benign, e.g. −2 for a smooth loss under output perturbation).
        bound_slope: the slope of the stated worst-case upper bound.
        measure: runs one cell.
        settings: the cells, from a ``Scale``.
        main: a main row of the issue (checked by the tests).
        note: one sentence the report prints under the table.
        data: rows with the same label see the same data sets (paired comparisons).
        normaliser: a known factor f(cell) divided out of excess, bound and prediction before
            fitting (e.g. the √ln(1.25/δ) of δ = n^-2); ``None``: none.
    """

    name: str
    method: str
    instance: str
    variable: str
    expected_slope: float
    bound_slope: float
    measure: Measure
    settings: Callable[[Scale], list[Setting]]
    title: str = ""
    plot_note: str = ""
    main: bool = True
    note: str = ""
    data: str = ""
    normaliser: Callable[[Setting], float] | None = None

    @property
    def data_id(self) -> int:
        """Rows with the same ``data`` label see the same generated data sets (paired designs)."""
        return zlib.crc32((self.data or self.name).encode())
