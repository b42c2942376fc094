"""Write what the rate experiments measured: JSON records, PNG plots and the Markdown table.

The table a reader checks at a glance (``REPORT.md``)::

    method · instance · variable · expected slope · measured slope [95% CI] · bound held in k/m

``rates.json`` holds the same rows as a list of records with the keys of ``RECORD_KEYS``.
"""

from __future__ import annotations

import json
import math
import pathlib
from collections.abc import Sequence

import numpy as np

__all__ = ["RECORD_KEYS", "write_json", "plot_row", "markdown_table", "comparison_table"]

RECORD_KEYS = (
    "method",
    "instance",
    "variable",
    "expected_slope",
    "bound_slope",
    "measured_slope",
    "ci_low",
    "ci_high",
    "within_tolerance",
    "cells",
    "cells_bound_held",
    "cells_bound_established",
    "cells_vacuous",
)


def _clean(value):
    """Make ``value`` JSON-safe: NumPy scalars to Python, NaN/inf to None."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if isinstance(value, np.ndarray):
        return _clean(value.tolist())
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_json(path: pathlib.Path, payload) -> pathlib.Path:
    """Write ``payload`` as indented JSON (NaN written as null) and return the path."""
    path.write_text(json.dumps(_clean(payload), indent=1) + "\n")
    return path


def plot_row(path: pathlib.Path, row: dict) -> pathlib.Path | None:
    """Log–log plot of one row: measured means (with 95% bootstrap bars), fit, bound, trivial level.

    Returns the path, or None when matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    cells = row["cell_results"]
    x = np.array([c["x"] for c in cells], dtype=float)
    mean = np.array([c["mean"] for c in cells])
    fig, ax = plt.subplots(figsize=(5.6, 3.8))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.plot(x, mean, "o", color="C0", label="measured mean excess")
    bound = np.array([c["bound"] for c in cells], dtype=float)
    if np.all(np.isfinite(bound)):
        ax.plot(x, bound, "--", color="C3", label="stated bound")
    ax.plot(x, [c["zero_excess"] for c in cells], ":", color="grey", label="trivial (w=0)")
    if row["measured_slope"] is not None and math.isfinite(row["measured_slope"]):
        fit = 2.0 ** (row["intercept"] + row["measured_slope"] * np.log2(x))
        label = f"fit slope {row['measured_slope']:.2f}"
        ax.plot(x, fit, "-", color="C0", alpha=0.6, label=label)
    ax.set_xlabel(row["variable"])
    ax.set_ylabel("excess risk")
    ax.set_title(
        f"{row['method']}\n{row['instance']} · expected slope {row['expected_slope']:g}",
        fontsize=8,
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _fmt(v: float | None, digits: int = 2) -> str:
    if v is None or not math.isfinite(v):
        return "n/a"
    return f"{v:+.{digits}f}"


def markdown_table(records: Sequence[dict], tolerance: float) -> str:
    """The report's table, one line per record, with a ✓/✗ for slope and bound compliance."""
    head = (
        "| method | instance | variable | expected slope | measured slope [95% CI] "
        "| bound held in k/m cells | ok |\n|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for r in records:
        expected = _fmt(r["expected_slope"])
        if r.get("bound_slope") is not None and r["bound_slope"] != r["expected_slope"]:
            expected += f" (bound {_fmt(r['bound_slope'])})"
        measured = f"{_fmt(r['measured_slope'])} [{_fmt(r['ci_low'])}, {_fmt(r['ci_high'])}]"
        counted = r["cells"] - r["cells_vacuous"]
        held = f"{r['cells_bound_held']}/{counted} ({r['cells_bound_established']} at 99%"
        held += f"; {r['cells_vacuous']} vacuous)" if r["cells_vacuous"] else ")"
        ok = "✓" if r["within_tolerance"] and r["cells_bound_held"] == counted else "✗"
        lines.append(
            f"| {r['method']} | {r['instance']} | {r['variable']} | {expected} | {measured} "
            f"| {held} | {ok} |"
        )
    foot = (
        f"\n✓ = expected slope inside the 95% CI widened by ±{tolerance:g}, and the solver's "
        "stated bound held in every non-vacuous cell (vacuous: bound ≥ L·D, literature §2.7, or "
        "no explicit bound). Held: no significant excess of the mean over the bound (one-sided t "
        'test, Holm–Bonferroni over the row, 1%). "at 99%": cells where the one-sided 99% '
        "upper confidence bound of the mean is below the bound (Holm–Bonferroni), the positive "
        "check; nearly tight bounds need more runs for it.\n"
    )
    return head + "\n".join(lines) + "\n" + foot


def comparison_table(first: dict, second: dict) -> str:
    """Cell-by-cell ratio of two rows measured on the same data sets and grid (paired design)."""
    head = (
        f"| {first['variable']} | {first['method']} | {second['method']} | ratio |\n"
        "|---|---|---|---|\n"
    )
    lines = []
    for a, b in zip(first["cell_results"], second["cell_results"], strict=True):
        lines.append(
            f"| {a['x']:g} | {a['mean']:.3e} | {b['mean']:.3e} | {a['mean'] / b['mean']:.1f} |"
        )
    return head + "\n".join(lines) + "\n"
