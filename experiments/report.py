"""Write what the rate experiments measured: JSON records, PNG plots and the Markdown table.

The table a reader checks at a glance (``REPORT.md``)::

    method · instance · variable · privacy per cell · expected slope · measured slope [95% CI]
    · bound held in k/m · CI ∋ theory · within ±tol · ok

Two slope verdicts stand side by side: the strict one, "the 95% CI contains the theory's slope"
(what a reader assumes "matches" means, and what ``ok`` and the ``N/M rows ok`` line count), and
the lenient one, "the theory's slope is within the CI widened by ± the scale's tolerance".

``rates.json`` holds the same rows as a list of records with the keys of ``RECORD_KEYS``.
"""

from __future__ import annotations

import json
import math
import pathlib
import textwrap
from collections.abc import Sequence

import numpy as np

__all__ = [
    "RECORD_KEYS",
    "write_json",
    "privacy_summary",
    "row_ok",
    "verdict_line",
    "plot_row",
    "markdown_table",
    "comparison_table",
]

RECORD_KEYS = (
    "method",
    "instance",
    "variable",
    "expected_slope",
    "bound_slope",
    "measured_slope",
    "ci_low",
    "ci_high",
    "ci_contains_expected",
    "within_tolerance",
    "tolerance",
    "privacy",
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


CODE = (":(top)dpjax", ":(top)experiments/*.py")  # every Python file below experiments/


def code_commit() -> str | None:
    """The git commit of this checkout (``+dirty`` appended when a tracked Python file of
    ``dpjax/`` or ``experiments/`` differs from it), or None outside a git checkout: stored
    with a run's results so they name the code that ran (call it when the run starts)."""
    import subprocess

    def git(*args: str) -> str:
        here = pathlib.Path(__file__).resolve().parent
        done = subprocess.run(["git", *args], cwd=here, capture_output=True, text=True, check=True)
        return done.stdout.strip()

    try:
        head, changed = (
            git("rev-parse", "HEAD"),
            git("status", "--porcelain", "--untracked-files=no", "--", *CODE),
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if changed else "")


def write_json(path: pathlib.Path, payload) -> pathlib.Path:
    """Write ``payload`` as indented JSON (NaN written as null) and return the path."""
    path.write_text(json.dumps(_clean(payload), indent=1) + "\n")
    return path


def _num(v: float) -> str:
    """A privacy parameter, short: 1, 0.25, 1e-06, 8286."""
    if v >= 100:
        return f"{v:.0f}"
    return f"{v:.3g}" if v >= 1e-3 or v == 0 else f"{v:.1e}"


def _span(values: Sequence[float]) -> str:
    lo, hi = min(values), max(values)
    return _num(lo) if lo == hi else f"{_num(lo)}…{_num(hi)}"


def privacy_summary(cells: Sequence[dict]) -> str:
    """The privacy level of the released outputs over a row's cells, e.g. "(ε, δ) = (1, 1.0e-06)".

    Cells carry ``privacy_epsilon``/``privacy_delta``: the guarantee of the released output (for
    Laplace DP-SGD the last iterate's Σε_h, with ``base_epsilon`` the ε of Theorem 36), under the
    solvers' replace-one relation.
    """
    eps = [c["privacy_epsilon"] for c in cells]
    delta = [c["privacy_delta"] for c in cells]
    if any("base_epsilon" in c for c in cells):
        base = _span([c["base_epsilon"] for c in cells])
        return f"Σε_h = {_span(eps)} (base ε = {base}), δ = {_span(delta)}"
    if min(eps) == max(eps) and min(delta) == max(delta):
        return f"(ε, δ) = ({_num(eps[0])}, {_num(delta[0])})"
    return f"ε = {_span(eps)}, δ = {_span(delta)}"


def row_ok(record: dict) -> bool:
    """The row's verdict: the 95% CI contains the theory's slope and no bound was violated."""
    counted = record["cells"] - record["cells_vacuous"]
    return bool(record["ci_contains_expected"]) and record["cells_bound_held"] == counted


def verdict_line(records: Sequence[dict]) -> str:
    """``N/M rows ok`` (strict verdict), with the lenient ±tolerance count beside it."""
    ok = sum(row_ok(r) for r in records)
    counted = [r["cells"] - r["cells_vacuous"] for r in records]
    lenient = sum(
        r["within_tolerance"] and r["cells_bound_held"] == c
        for r, c in zip(records, counted, strict=True)
    )
    tol = ", ".join(sorted({f"±{r['tolerance']:g}" for r in records})) or "±tol"
    return (
        f"{ok}/{len(records)} rows ✓ (95% CI contains the theory's slope, "
        "no bound significantly exceeded); "
        f"{lenient}/{len(records)} within the CI widened by {tol}"
    )


def _plt():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def _tick_label(value: float, _position=None) -> str:
    """0.002, 0.5, 20, 1000 in plain digits; 10⁻⁵ or 2×10⁴ style outside [1e-3, 1e4)."""
    if value <= 0:
        return ""
    if 1e-3 <= value < 1e4:
        return f"{value:.2g}" if value < 1 else f"{value:.0f}"
    exponent = math.floor(math.log10(value) + 1e-9)
    mantissa = value / 10.0**exponent
    lead = "" if abs(mantissa - 1.0) < 1e-6 else f"{mantissa:.0f}\\times"
    return f"${lead}10^{{{exponent}}}$"


def _log_ticks(ax, values: np.ndarray) -> None:
    """Readable log-scale y ticks: a few labelled majors, unlabelled minors."""
    from matplotlib import ticker

    values = values[np.isfinite(values) & (values > 0)]
    decades = math.log10(values.max() / values.min()) if values.size else 1.0
    subs = (1.0, 2.0, 5.0) if decades < 2.5 else (1.0,)
    ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=subs, numticks=8))
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(_tick_label))
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())


def _x_ticks(ax, x: np.ndarray) -> None:
    from matplotlib import ticker

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(ticker.FixedLocator(x))
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_locator(ticker.NullLocator())


UNFITTED_LABEL = "mean excess (not fitted: vacuous bound or uncertified)"


def _line(x: np.ndarray, cx: float, cy: float, slope: float) -> np.ndarray:
    """2^(cy + slope·(log2 x − cx)): a line of given slope through (cx, cy) in log2 space."""
    return 2.0 ** (cy + slope * (np.log2(x) - cx))


def plot_row(path: pathlib.Path, row: dict) -> pathlib.Path | None:
    """Log–log plot of one row: measured means with 95% CI bars, fit, theory slope, bounds.

    Drawn: the means with hierarchical-bootstrap 95% error bars (hollow: outside the fit
    window); the OLS fit; a reference line of the theory's slope through the fit's centre
    (the centroid of the fitted points in log–log space, which the OLS line passes through); the
    stated bound, non-vacuous cells as a line and vacuous ones (bound ≥ L·D) as crosses; the
    excess of the trivial output w = 0. The row's ``plot_note`` (why there is no bound, why the
    measurement sits above the trivial level) and a warning when fewer than three points were
    fitted are written under the axes.

    Returns:
        The path, or None when matplotlib is not installed.
    """
    plt = _plt()
    if plt is None:
        return None
    cells = row["cell_results"]
    x = np.array([c["x"] for c in cells], dtype=float)
    mean = np.array([c["mean"] for c in cells])
    low = np.array([c.get("mean_ci_low", c["mean"]) for c in cells])
    high = np.array([c.get("mean_ci_high", c["mean"]) for c in cells])
    fitted = np.array([c["in_window"] for c in cells], dtype=bool)
    bound = np.array([c["bound"] if c["bound"] is not None else math.inf for c in cells])
    vacuous = np.array([c["vacuous"] for c in cells], dtype=bool)
    zero = np.array([c["zero_excess"] for c in cells], dtype=float)

    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    _x_ticks(ax, x)
    ax.set_yscale("log")
    err = np.vstack([mean - low, high - mean])
    ax.errorbar(x[fitted], mean[fitted], yerr=err[:, fitted], fmt="o", color="C0", capsize=3,
                label="mean excess, 95% CI (bootstrap)")  # fmt: skip
    if (~fitted).any():
        ax.errorbar(x[~fitted], mean[~fitted], yerr=err[:, ~fitted], fmt="o", mfc="white",
                    color="C0", capsize=3, label=UNFITTED_LABEL)  # fmt: skip
    slope = row["measured_slope"]
    if slope is not None and math.isfinite(slope) and fitted.sum() >= 2:
        lx = np.log2(x[fitted])
        cx, cy = float(lx.mean()), float(lx.mean() * slope + row["intercept"])
        xs = np.geomspace(x[fitted].min(), x[fitted].max(), 50)
        ci = f"[{row['ci_low']:+.2f}, {row['ci_high']:+.2f}]"
        ax.plot(xs, _line(xs, cx, cy, slope), "-", color="C0", alpha=0.7,
                label=f"fit: slope {slope:+.2f} {ci}")  # fmt: skip
        ax.plot(xs, _line(xs, cx, cy, row["expected_slope"]), "--", color="C2",
                label=f"theory slope {row['expected_slope']:+g} (through fit centre)")  # fmt: skip
    finite = np.isfinite(bound)
    if (finite & ~vacuous).any():
        ax.plot(x[finite & ~vacuous], bound[finite & ~vacuous], "v--", color="C3", ms=5,
                label="stated bound")  # fmt: skip
    if (finite & vacuous).any():
        ax.plot(x[finite & vacuous], bound[finite & vacuous], "x", color="C3", ms=8, mew=2,
                label="stated bound, vacuous (≥ L·D)")  # fmt: skip
    ax.plot(x, zero, ":", color="grey", label="trivial output w = 0")
    shown = np.concatenate([low, high, zero, bound[finite]])
    _log_ticks(ax, shown)
    ax.set_xlabel({"n": "n (data set size)", "d": "d (dimension)", "epsilon": "ε"}.get(
        row["variable"], row["variable"]))  # fmt: skip
    if row["name"].startswith("laplace"):
        ax.set_xlabel("N = n (steps, one example each)")
    ax.set_ylabel("mean excess risk")
    verdict = "CI contains theory slope" if row.get("ci_contains_expected") else (
        "CI excludes theory slope")  # fmt: skip
    ax.set_title(
        f"{row.get('title') or row['method']}\n{row['instance']} · {verdict}\n"
        f"privacy: {row.get('privacy', '')}",
        fontsize=8,
    )
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="best", framealpha=0.85)
    notes = [row["plot_note"]] if row.get("plot_note") else []
    if not finite.any() and not notes:
        notes.append("No stated bound to compare with.")
    if fitted.sum() < 3:
        notes.append(f"Only {int(fitted.sum())} points in the fit: a wide CI, a rough slope.")
    footer = "\n".join(textwrap.fill(n, 110) for n in notes)
    lines = footer.count("\n") + 1 if footer else 0
    fig.tight_layout(rect=(0, 0.035 * lines, 1, 1))
    if footer:
        fig.text(0.01, 0.01, footer, fontsize=6.5, va="bottom", ha="left")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _fmt(v: float | None, digits: int = 2) -> str:
    if v is None or not math.isfinite(v):
        return "n/a"
    return f"{v:+.{digits}f}"


def _mark(flag: bool) -> str:
    return "✓" if flag else "✗"


def markdown_table(records: Sequence[dict], tolerance: float) -> str:
    """The report's table, one line per record: privacy level, slope, both verdicts, bounds."""
    head = (
        "| method | instance | variable | privacy per cell | expected slope "
        "| measured slope [95% CI] | bound held in k/m cells | CI ∋ theory "
        f"| within ±{tolerance:g} | ok |\n|---|---|---|---|---|---|---|---|---|---|\n"
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
        if counted == 0:
            held = f"no bound ({r['cells_vacuous']} vacuous or none stated)"
        lines.append(
            f"| {r['method']} | {r['instance']} | {r['variable']} | {r['privacy']} | {expected} "
            f"| {measured} | {held} | {_mark(r['ci_contains_expected'])} "
            f"| {_mark(r['within_tolerance'])} | {_mark(row_ok(r))} |"
        )
    foot = (
        "\n**ok** (✓) = the 95% CI of the slope contains the theory's slope (column CI ∋ theory) "
        "and the stated bound was not violated in any non-vacuous cell; the line "
        f'"N/M rows ✓" counts it. "within ±{tolerance:g}" is the lenient verdict (the theory\'s '
        "slope inside the CI widened by the tolerance), shown for comparison and not counted. "
        "Vacuous: bound ≥ L·D (it says nothing), or no explicit bound. Held: no significant "
        "excess of the mean over the bound (one-sided t test, Holm–Bonferroni over the row, 1%). "
        '"at 99%": cells where the one-sided 99% upper confidence bound of the mean is below the '
        "bound (Holm–Bonferroni), the positive check; nearly tight bounds need more runs for it. "
        "Privacy: the guarantee of each released output under the replace-one relation (the "
        "solvers' default); for Laplace DP-SGD the released last iterate's Σ_h ε_h (basic "
        "composition of the per-step Laplace releases), which grows with N, next to Theorem 36's "
        "base ε.\n"
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
