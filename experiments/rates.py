"""Reproduce the excess-risk rates of the lectures (literature §1.9 and the protocol of §2).

Each *row* is one claim "the mean excess risk of method M on instance I decays like x^s" for
x ∈ {n, d, ε}. A row is a grid of *cells*; in each cell K independently generated data sets are
each hit with S independent noise draws (one compiled ``jax.vmap`` over S keys per data set), the
excess risk of every private output is measured in float64 against a certified exact optimum,
and the stated bound of the solver is compared with a one-sided upper confidence bound of the
mean. The slope of log2(mean) against log2(x) is fitted by OLS with a hierarchical-bootstrap
95% CI (see ``experiments.fitting``).

Float64: ``run`` enables ``jax_enable_x64`` before anything is computed, because the excess risks
at large n (1e-6…1e-9) are below float32 resolution of the objective (literature §2.3).

Hyperparameters (μ for the convex rows, T and step sizes for DP-GD) come from the theory's
formulas only, never from the private data.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import time
from collections.abc import Callable

import jax
import numpy as np

from experiments import fitting, instances, report

DESCRIPTION = "excess-risk rates of output/objective perturbation and DP-GD (slopes, bounds)"

__all__ = ["DESCRIPTION", "Scale", "SCALES", "Row", "rows", "run"]


@dataclasses.dataclass(frozen=True)
class Scale:
    """Grid sizes of one run (``tiny`` for tests, ``quick`` for ``make reproduce``, ``full``)."""

    n_grid: tuple[int, ...]
    d_grid: tuple[int, ...]
    eps_grid: tuple[float, ...]
    n_fixed: int
    datasets: int
    seeds: int
    n_boot: int
    tolerance: float


SCALES: dict[str, Scale] = {
    "tiny": Scale((512, 1024, 2048), (2, 8, 32), (0.5, 1.0, 2.0), 1024, 2, 48, 200, 0.1),
    "quick": Scale(
        tuple(2**k for k in range(9, 15)),
        (2, 4, 8, 16, 32),
        (0.25, 0.5, 1.0),
        4096,
        4,
        96,
        1000,
        0.1,
    ),
    "full": Scale(
        tuple(2**k for k in range(8, 17)),
        (2, 8, 32, 128),
        (0.25, 0.5, 1.0),
        8192,
        5,
        200,
        2000,
        0.05,
    ),
}

DELTA = 1e-6  # fixed for slope fits (literature §2.4: δ = 1/n² would bias slopes)


@dataclasses.dataclass(frozen=True)
class Setting:
    """One cell's parameters."""

    n: int
    d: int
    epsilon: float
    delta: float = DELTA


@dataclasses.dataclass
class Cell:
    """What one cell measured: excess risks (K, S), the stated bound, the trivial level."""

    excess: np.ndarray
    bound: float
    zero_excess: float
    certificate: float
    extra: dict = dataclasses.field(default_factory=dict)


Measure = Callable[[Setting, np.random.Generator, jax.Array], Cell]


@dataclasses.dataclass(frozen=True)
class Row:
    """One rate claim: method × instance × variable, with the theory's slopes.

    Attributes:
        name: short identifier (file names).
        method, instance, variable: what the report shows.
        expected_slope: the slope this instance should show (the refined prediction where the
            instance is benign, e.g. −2 for a smooth loss under output perturbation).
        bound_slope: the slope of the stated worst-case upper bound.
        measure: runs one cell.
        settings: the cells, from a ``Scale``.
        main: a main row of the issue (checked by the tests).
        note: one sentence the report prints under the table.
    """

    name: str
    method: str
    instance: str
    variable: str
    expected_slope: float
    bound_slope: float
    measure: Measure
    settings: Callable[[Scale], list[Setting]]
    main: bool = True
    note: str = ""


# --------------------------------------------------------------------------- solvers (dpjax API)


def _gaussian_output(keys: jax.Array, w_star: np.ndarray, sensitivity: float, s: Setting):
    """Output perturbation w* + N(0, σ²I) for every key (dpjax.mechanisms.gaussian, analytic σ)."""
    from dpjax.mechanisms import gaussian

    release = jax.jit(
        jax.vmap(
            lambda k: gaussian(k, w_star, sensitivity=sensitivity, epsilon=s.epsilon, delta=s.delta)
        )
    )
    return np.asarray(release(keys))


def _output_sigma(sensitivity: float, s: Setting) -> float:
    from dpjax.mechanisms import gaussian_sigma

    return gaussian_sigma(sensitivity=sensitivity, epsilon=s.epsilon, delta=s.delta)


def _output_bound(sigma: float, d: int, mu: float, lipschitz: float = 1.0) -> float:
    """E[J(w*+b)] − J* ≤ Lσ√d + μdσ²/2 (output perturbation, 000_a9865af81d0677e1.txt; §1.1)."""
    return lipschitz * sigma * math.sqrt(d) + 0.5 * mu * d * sigma**2


# --------------------------------------------------------------------------- cells


def _per_dataset(
    setting: Setting,
    rng: np.random.Generator,
    keys: jax.Array,
    one: Callable[[np.random.Generator, jax.Array], tuple[np.ndarray, float, float, float]],
) -> Cell:
    """Run ``one(rng, keys[k])`` for each data set k and stack into a ``Cell``."""
    rows, bounds, zeros, certs = [], [], [], []
    for k in range(keys.shape[0]):
        excess, bound, zero, cert = one(rng, keys[k])
        rows.append(np.asarray(excess, dtype=np.float64))
        bounds.append(bound)
        zeros.append(zero)
        certs.append(cert)
    return Cell(np.stack(rows), float(max(bounds)), float(np.mean(zeros)), float(max(certs)))


def output_sc_sharp(mu: float) -> Measure:
    """Output perturbation, μ-SC, on the sharp interpolating L1 instance (expected slope −1)."""

    def measure(s: Setting, rng: np.random.Generator, keys: jax.Array) -> Cell:
        sens = 2.0 / (mu * s.n)  # replace-one argmin sensitivity 2L/(μn), L = 1
        sigma = _output_sigma(sens, s)

        def one(rng, k):
            inst = instances.sharp_l1_instance(rng, s.n, s.d, mu=mu)
            W = _gaussian_output(k, inst.w_star, sens, s)
            ex = instances.sharp_l1_excess(W, inst.X, inst.y, inst.w_star, mu)
            return ex, _output_bound(sigma, s.d, mu), inst.zero_excess, inst.certificate

        return _per_dataset(s, rng, keys, one)

    return measure


def output_sc_logistic(mu: float) -> Measure:
    """Output perturbation, μ-SC, on logistic regression (smooth: expected −2, bound −1)."""

    def measure(s: Setting, rng: np.random.Generator, keys: jax.Array) -> Cell:
        sens = 2.0 / (mu * s.n)
        sigma = _output_sigma(sens, s)

        def one(rng, k):
            inst = instances.logistic_instance(rng, s.n, s.d, mu=mu)
            W = _gaussian_output(k, inst.w_star, sens, s)
            ex = instances.logistic_excess(W, inst.X, inst.y, inst.w_star, mu)
            return ex, _output_bound(sigma, s.d, mu), inst.zero_excess, inst.certificate

        return _per_dataset(s, rng, keys, one)

    return measure


def tuned_output_mu(n: int, d: int, epsilon: float, delta: float, radius: float) -> float:
    """μ* = √(2B)/R, B = 2√2 L²√(d ln(1.25/δ))/(εn): balances μR²/2 against B/μ (000; lit. §1.1)."""
    b = 2.0 * math.sqrt(2.0) * math.sqrt(d * math.log(1.25 / delta)) / (epsilon * n)
    return math.sqrt(2.0 * b) / radius


def output_convex_tuned(radius: float) -> Measure:
    """Output perturbation with μ = μ*(n) on the sharp instance, ‖w0‖ = R: expected −1/2.

    The regularisation bias vanishes (w0 stays the exact optimum, certified), so the excess of
    F is the noise term ∝ σ ∝ 1/(μ* n) ∝ n^{-1/2}: the bound's rate is attained, at a constant
    fraction of it. The bound on F adds μR²/2 to the bound on J (lit. §1.1, convex case).
    """

    def measure(s: Setting, rng: np.random.Generator, keys: jax.Array) -> Cell:
        mu = tuned_output_mu(s.n, s.d, s.epsilon, s.delta, radius)
        sens = 2.0 / (mu * s.n)
        sigma = _output_sigma(sens, s)
        bound = _output_bound(sigma, s.d, mu) + 0.5 * mu * radius**2

        def one(rng, k):
            inst = instances.sharp_l1_instance(rng, s.n, s.d, mu=mu, radius=radius)
            W = _gaussian_output(k, inst.w_star, sens, s)
            ex = instances.sharp_l1_risk_excess(W, inst.X, inst.w_star)
            zero = float(np.mean(np.abs(inst.y)))
            return ex, bound, zero, inst.certificate

        cell = _per_dataset(s, rng, keys, one)
        cell.extra["mu"] = mu
        return cell

    return measure


# --------------------------------------------------------------------------- rows


def _over_n(d: int, epsilon: float = 1.0) -> Callable[[Scale], list[Setting]]:
    return lambda sc: [Setting(n, d, epsilon) for n in sc.n_grid]


def _over_d(epsilon: float = 1.0) -> Callable[[Scale], list[Setting]]:
    return lambda sc: [Setting(sc.n_fixed, d, epsilon) for d in sc.d_grid]


def _over_eps(d: int) -> Callable[[Scale], list[Setting]]:
    return lambda sc: [Setting(sc.n_fixed, d, e) for e in sc.eps_grid]


def rows() -> list[Row]:
    """Every row of the report, main rows first."""
    return [
        Row(
            "output_sc_sharp",
            "output perturbation, μ-SC (000)",
            "D sharp L1, d=5, μ=0.05",
            "n",
            -1.0,
            -1.0,
            output_sc_sharp(0.05),
            _over_n(5),
            note="sharp instance: E|<b,x>| = σ√(2/π) ∝ 1/n attains the bound's slope.",
        ),
        Row(
            "output_sc_logistic",
            "output perturbation, μ-SC (000)",
            "A logistic, d=5, μ=0.05",
            "n",
            -2.0,
            -1.0,
            output_sc_logistic(0.05),
            _over_n(5),
            note="smooth loss: the linear term has mean 0; excess ≈ (β+μ)dσ²/2 ∝ n^-2.",
        ),
        Row(
            "output_convex_tuned",
            "output perturbation, convex, μ = μ*(n) (000)",
            "D sharp L1, d=2, ‖w0‖=1",
            "n",
            -0.5,
            -0.5,
            output_convex_tuned(1.0),
            _over_n(2),
            note="μ* ∝ n^-1/2 keeps w0 optimal (no bias); the noise term ∝ 1/(μ*n) gives n^-1/2.",
        ),
        Row(
            "output_sc_sharp_eps",
            "output perturbation, μ-SC (000)",
            "D sharp L1, d=5, μ=0.05",
            "epsilon",
            -1.0,
            -1.0,
            output_sc_sharp(0.05),
            _over_eps(5),
            main=False,
            note="σ of the analytic Gaussian is ≈ ∝ 1/ε on ε ≤ 1.",
        ),
        Row(
            "output_sc_sharp_d",
            "output perturbation, μ-SC (000)",
            "D sharp L1, μ=0.05",
            "d",
            0.0,
            0.5,
            output_sc_sharp(0.05),
            _over_d(),
            main=False,
            note=(
                "a linear-model loss with ‖x‖ = 1 cannot attain the √d of the bound: "
                "E|<b,x>| = σ√(2/π) for every d, so the refined d-slope is 0."
            ),
        ),
    ]


# --------------------------------------------------------------------------- running


def _cell_keys(seed: int, row_index: int, cell_index: int, scale: Scale) -> jax.Array:
    """Independent keys of shape (K, S) for one cell (never shared across cells or rows)."""
    root = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), row_index), cell_index)
    keys = jax.random.split(root, scale.datasets * scale.seeds)
    return keys.reshape(scale.datasets, scale.seeds)


def _x_of(s: Setting, variable: str) -> float:
    return {"n": s.n, "d": s.d, "epsilon": s.epsilon}[variable]


def run_row(row: Row, row_index: int, scale: Scale, seed: int) -> dict:
    """Measure every cell of ``row``, fit its slope, check its bound cells; return the record."""
    settings = row.settings(scale)
    cells = []
    for i, s in enumerate(settings):
        rng = np.random.default_rng([seed, row_index, i])
        cells.append(row.measure(s, rng, _cell_keys(seed, row_index, i, scale)))
    return summarise_row(row, settings, cells, scale, seed)


def summarise_row(row: Row, settings, cells: list[Cell], scale: Scale, seed: int) -> dict:
    """Fit window, slope with CI, bound compliance and the per-cell numbers of one row."""
    xs = [_x_of(s, row.variable) for s in settings]
    means = [float(c.excess.mean()) for c in cells]
    vacuous = [c.bound >= c.zero_excess for c in cells]
    certified = [c.certificate <= 0.01 * min(means) for c in cells]
    window = [i for i in range(len(cells)) if not vacuous[i] and certified[i] and means[i] > 0]
    if len(window) < 2:
        window = [i for i in range(len(cells)) if means[i] > 0]
    fit = fitting.slope_with_ci(
        [xs[i] for i in window],
        [cells[i].excess for i in window],
        n_boot=scale.n_boot,
        seed=seed,
    )
    counted = [i for i in range(len(cells)) if not vacuous[i]]
    held = fitting.holm_bound_held(
        [cells[i].excess for i in counted], [cells[i].bound for i in counted]
    )
    held_by_cell = dict(zip(counted, held, strict=True))
    lo, hi = fit["ci_low"] - scale.tolerance, fit["ci_high"] + scale.tolerance
    cell_results = [
        {
            "x": xs[i],
            "n": s.n,
            "d": s.d,
            "epsilon": s.epsilon,
            "delta": s.delta,
            "runs": int(c.excess.size),
            "mean": means[i],
            "ucb99": fitting.upper_confidence_bound(c.excess),
            "bound": c.bound,
            "ratio_to_bound": means[i] / c.bound,
            "zero_excess": c.zero_excess,
            "vacuous": vacuous[i],
            "bound_held": held_by_cell.get(i),
            "certificate": c.certificate,
            "certified": certified[i],
            "in_window": i in window,
            **c.extra,
        }
        for i, (s, c) in enumerate(zip(settings, cells, strict=True))
    ]
    return {
        "name": row.name,
        "method": row.method,
        "instance": row.instance,
        "variable": row.variable,
        "main": row.main,
        "expected_slope": row.expected_slope,
        "bound_slope": row.bound_slope,
        "measured_slope": fit["slope"],
        "intercept": fit["intercept"],
        "ci_low": fit["ci_low"],
        "ci_high": fit["ci_high"],
        "local_slopes": fit["local_slopes"],
        "within_tolerance": bool(lo <= row.expected_slope <= hi),
        "cells": len(cells),
        "cells_bound_held": int(sum(held)),
        "cells_vacuous": int(sum(vacuous)),
        "note": row.note,
        "cell_results": cell_results,
    }


def _progress(total: int):
    try:
        from tqdm import tqdm

        return tqdm(total=total, desc="rates", unit="row", leave=False)
    except ImportError:  # pragma: no cover - tqdm is in the experiments extra
        return None


def run(
    out_dir: pathlib.Path,
    *,
    full: bool = False,
    seed: int = 0,
    size: str | None = None,
    only: tuple[str, ...] | None = None,
) -> dict:
    """Run every row, write ``rates_experiment.json``, ``rates.json``, plots; return the summary.

    Args:
        out_dir: output folder (created).
        full: the full grid of literature §2.4 (overrides ``size``).
        seed: root seed; the same seed reproduces every number.
        size: ``"tiny"`` (tests), ``"quick"`` (default) or ``"full"``.
        only: restrict to these row names.

    Returns:
        dict with ``report_md``, ``records`` (the rates.json list) and ``rows`` (everything).
    """
    jax.config.update("jax_enable_x64", True)  # float64 for every measured number (lit. §2.3)
    size = "full" if full else (size or "quick")
    scale = SCALES[size]
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    selected = [(i, r) for i, r in enumerate(rows()) if only is None or r.name in only]
    bar = _progress(len(selected))
    results = []
    for index, row in selected:
        start = time.perf_counter()
        result = run_row(row, index, scale, seed)
        result["seconds"] = time.perf_counter() - start
        results.append(result)
        report.plot_row(out_dir / f"rates_{row.name}.png", result)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    records = [{k: r[k] for k in report.RECORD_KEYS} | {"name": r["name"]} for r in results]
    report.write_json(out_dir / "rates.json", records)
    report.write_json(
        out_dir / "rates_experiment.json",
        {"size": size, "seed": seed, "scale": dataclasses.asdict(scale), "rows": results},
    )
    return {
        "report_md": _markdown(results, records, scale, size, seed),
        "records": records,
        "rows": results,
    }


def _markdown(results, records, scale: Scale, size: str, seed: int) -> str:
    notes = "\n".join(f"- **{r['name']}**: {r['note']}" for r in results if r["note"])
    return (
        "## Excess-risk rates (slope of mean excess risk, log–log)\n\n"
        f"Scale `{size}` (seed {seed}): {scale.datasets} data sets × {scale.seeds} noise seeds "
        f"per cell, δ = {DELTA:g}, hierarchical bootstrap B = {scale.n_boot}. Float64 "
        "throughout; optima certified (≤ 1% of the smallest mean excess of the row).\n\n"
        + report.markdown_table(records, scale.tolerance)
        + "\n"
        + notes
        + "\n\nPlots: `rates_<row>.png`; every cell's numbers: `rates_experiment.json`.\n"
    )
