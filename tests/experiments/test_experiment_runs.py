"""The experiments at a tiny size: JSON schema, REPORT table, and the main rows' slopes.

The default test runs one row per private-solver family (output perturbation, objective
perturbation, DP-GD, Laplace DP-SGD) at the ``tiny`` scale; the slow test runs every row.
Slopes are checked against the theory: the fast rows (fixed seed) with the strict verdict, the
95% CI contains the theory's slope; every row with the tiny scale's lenient tolerance (±0.1
around the 95% CI) and, independently of the CI, within 0.25 of the expected value. The CLI
tests check that every subcommand writes (or updates its section of) REPORT.md.
"""

import json
import math
import os
import pathlib
import re
import subprocess
import sys
import types

import numpy as np
import pytest

from experiments import __main__ as cli
from experiments import rates, registry, report

FAST_ROWS = (
    "output_sc_sharp",
    "objective_sc_logistic",
    "dpgd_convex_linear",
    "laplace_dpsgd_rho0.6_kappa0.9",
)


def _laplace_total_epsilon(cell, steps):
    """Σ_{h≤N} ε_h of Theorem 36's schedule, written out independently of dpjax.

    ε_h = Δ₁/θ_h with θ_h = (Σ_{k<h} k^-ρ / h^-ρ + 1)·Δ₁/(ε h^κ): ε_h = ε h^κ/(h^ρ H_{h-1} + 1).
    """
    rho, kappa, eps = cell["rho"], cell["kappa"], cell["base_epsilon"]
    h = np.arange(1, steps + 1, dtype=np.float64)
    past = np.concatenate([[0.0], np.cumsum(h[:-1] ** -rho)])
    return float(np.sum(eps * h**kappa / (h**rho * past + 1.0)))


def _check_records(records, names):
    assert [r["name"] for r in records] == list(names)
    for r in records:
        for key in report.RECORD_KEYS:
            assert key in r, key
        assert r["variable"] in {"n", "d", "epsilon"}
        assert r["cells"] >= 2
        assert 0 <= r["cells_bound_held"] <= r["cells"] - r["cells_vacuous"]
        assert r["cells_bound_established"] <= r["cells_bound_held"]
        assert r["ci_low"] <= r["measured_slope"] <= r["ci_high"]
        inside = r["ci_low"] <= r["expected_slope"] <= r["ci_high"]
        assert r["ci_contains_expected"] == inside
        assert r["privacy"]


def _check_slopes(rows):
    for row in rows:
        name, slope, expected = row["name"], row["measured_slope"], row["expected_slope"]
        assert row["within_tolerance"], (name, slope, row["ci_low"], row["ci_high"])
        assert abs(slope - expected) < 0.25, (name, slope, expected)
        counted = row["cells"] - row["cells_vacuous"]
        assert row["cells_bound_held"] == counted, name


@pytest.fixture(scope="module")
def fast_rows_run(tmp_path_factory):
    """One tiny run of the fast rows (seed 0), shared by the tests that read it."""
    out = tmp_path_factory.mktemp("rates_fast")
    return out, rates.run(out, seed=0, size="tiny", only=FAST_ROWS)


def test_rates_tiny_schema_slopes_and_bounds(fast_rows_run):
    tmp_path, summary = fast_rows_run
    assert not summary["skipped"]
    md = summary["report_md"]
    records = json.loads((tmp_path / "rates.json").read_text())
    _check_records(records, FAST_ROWS)
    full = json.loads((tmp_path / "rates_experiment.json").read_text())
    assert full["size"] == "tiny" and len(full["rows"]) == len(FAST_ROWS)
    for row in full["rows"]:
        for cell in row["cell_results"]:
            assert cell["runs"] == rates.SCALES["tiny"].datasets * rates.SCALES["tiny"].seeds
            assert cell["mean"] > 0 and cell["ucb99"] >= cell["mean"]
            assert cell["mean_ci_low"] <= cell["mean"] <= cell["mean_ci_high"]
            assert cell["certified"]
    _check_slopes(summary["rows"])
    for row in summary["rows"]:
        assert row["ci_contains_expected"], (row["name"], row["ci_low"], row["ci_high"])
    assert summary["verdict"].startswith(f"{len(FAST_ROWS)}/{len(FAST_ROWS)} rows ✓")
    laplace = next(r for r in summary["rows"] if r["name"].startswith("laplace"))
    for cell in laplace["cell_results"]:
        expected = _laplace_total_epsilon(laplace["cell_results"][0], cell["steps"])
        assert cell["privacy_epsilon"] == pytest.approx(expected, rel=1e-9)
        assert cell["privacy_delta"] == 0.0 and cell["base_epsilon"] == 1.0
    assert "Σε_h = " in md and "base ε = 1" in md
    for name in FAST_ROWS:
        assert (tmp_path / f"rates_{name}.png").stat().st_size > 0
    assert "| method | instance | variable | privacy per cell | expected slope" in md
    assert md.count("✓") >= len(FAST_ROWS)


def test_bound_rows_are_not_vacuous_at_tiny_scale(fast_rows_run):
    """The closed-form rows are checked against a finite bound in at least one cell."""
    row = next(r for r in fast_rows_run[1]["rows"] if r["name"] == "output_sc_sharp")
    assert row["cells_vacuous"] < row["cells"]
    for cell in row["cell_results"]:
        assert math.isfinite(cell["bound"]) and cell["mean"] < cell["bound"]


def test_rows_registry_and_cli_help(capsys):
    names = [r.name for r in rates.rows()]
    assert len(names) == len(set(names))
    main = [r for r in rates.rows() if r.main]
    assert {r.expected_slope for r in main} >= {-1.0, -2.0, -0.5}
    assert registry.ORDER[0] == "rates"
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "rates:" in capsys.readouterr().out


def test_run_is_reproducible_for_a_seed(tmp_path, fast_rows_run):
    """A row alone reproduces its record of the shared run (same seed, row run with others)."""
    again = rates.run(tmp_path, seed=0, size="tiny", only=("output_sc_sharp",))
    first = [r for r in fast_rows_run[1]["records"] if r["name"] == "output_sc_sharp"]
    assert again["records"] == first


@pytest.mark.slow
def test_every_row_at_tiny_scale(tmp_path):
    summary = rates.run(tmp_path, seed=0, size="tiny")
    assert not summary["skipped"]
    _check_records(summary["records"], [r.name for r in rates.rows()])
    _check_slopes(summary["rows"])


@pytest.mark.slow
def test_cli_rates_writes_its_report_section(tmp_path, capsys):
    assert cli.main(["rates", "--size", "tiny", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "rates.json").exists()
    sections = cli.read_sections((tmp_path / "REPORT.md").read_text())
    assert list(sections) == ["rates"] and "| CI ∋ theory |" in sections["rates"]
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.match(r"\[experiments\] rates: \d+/17 rows ✓ \(95% CI contains", last), last


def test_laplace_rows_report_the_released_iterates_total_epsilon():
    """Issue 16's number: (ρ, κ) = (0.5, 1), N = 2^14 gives Σε_h ≈ 8286 at base ε = 1."""
    cell = {"rho": 0.5, "kappa": 1.0, "base_epsilon": 1.0}
    total = rates.cells.laplace_released_epsilon(0.5, 1.0, 1.0, 2**14)
    assert total == pytest.approx(_laplace_total_epsilon(cell, 2**14), rel=1e-9)
    assert round(total) == 8286
    cells = [
        {"privacy_epsilon": e, "privacy_delta": 0.0, "base_epsilon": 1.0} for e in (536.0, 8286.4)
    ]
    assert report.privacy_summary(cells) == "Σε_h = 536…8286 (base ε = 1), δ = 0"
    plain = [{"privacy_epsilon": 1.0, "privacy_delta": 1e-6}] * 2
    assert report.privacy_summary(plain) == "(ε, δ) = (1, 1.0e-06)"


def _record(slope, low, high, expected, tolerance=0.1, held=3, vacuous=0):
    return {
        "method": "m",
        "instance": "i",
        "variable": "d",
        "expected_slope": expected,
        "bound_slope": expected,
        "measured_slope": slope,
        "ci_low": low,
        "ci_high": high,
        "ci_contains_expected": low <= expected <= high,
        "within_tolerance": low - tolerance <= expected <= high + tolerance,
        "tolerance": tolerance,
        "privacy": "(ε, δ) = (1, 1.0e-06)",
        "cells": 3,
        "cells_bound_held": held,
        "cells_bound_established": held,
        "cells_vacuous": vacuous,
    }


def test_a_ci_that_excludes_the_theory_slope_is_not_a_match():
    """Issue 16's d-row: +0.03 [+0.01, +0.05] against 0 passed the ±0.1 verdict; now it fails."""
    d_row = _record(0.03, 0.01, 0.05, 0.0)
    good = _record(-1.02, -1.1, -0.95, -1.0)
    assert d_row["within_tolerance"] and not report.row_ok(d_row)
    assert report.row_ok(good)
    assert not report.row_ok(_record(-1.02, -1.1, -0.95, -1.0, held=2))
    line = report.verdict_line([d_row, good])
    assert line.startswith("1/2 rows ✓ (95% CI contains the theory's slope")
    assert "2/2 within the CI widened by ±0.1" in line
    table = report.markdown_table([d_row, good], 0.1)
    d_line = next(x for x in table.splitlines() if "+0.03 [+0.01, +0.05]" in x)
    assert d_line.endswith("| ✗ | ✓ | ✗ |")  # CI ∋ theory, within ±0.1, ok


def test_tiny_scale_fits_at_least_three_points_per_row():
    tiny = rates.SCALES["tiny"]
    for row in rates.rows():
        assert len(row.settings(tiny)) >= 3, row.name


def test_rows_are_titled_in_words_without_lecture_file_codes():
    code = re.compile(r"\b00[0-4]\b|[0-9a-f]{16}")
    for row in rates.rows():
        assert row.title, row.name
        for text in (row.method, row.title, row.note, row.plot_note):
            assert not code.search(text), (row.name, text)


def test_every_cli_option_has_help_text():
    parser = cli.build_parser()
    for action in parser._actions:
        assert action.help, action.dest


@pytest.fixture
def fake_experiments(monkeypatch):
    """Two registered experiments that only return a report section (like experiments.utility)."""
    calls = {}

    def make(name):
        module = types.ModuleType(f"fake_{name}")
        module.DESCRIPTION = f"fake {name}"

        def run(out_dir, *, full=False, seed=0):
            calls[name] = calls.get(name, 0) + 1
            (out_dir / f"{name}.json").write_text("{}")
            return {"report_md": f"## {name} section\n\nrun {calls[name]}\n"}

        module.run = run
        monkeypatch.setitem(sys.modules, f"fake_{name}", module)
        return f"fake_{name}"

    experiments = {"alpha": make("alpha"), "beta": make("beta")}
    monkeypatch.setattr(registry, "EXPERIMENTS", experiments)
    monkeypatch.setattr(registry, "ORDER", ("alpha", "beta"))
    return calls


def test_a_single_subcommand_writes_and_updates_its_report_section(
    tmp_path, fake_experiments, capsys
):
    report_path = tmp_path / "REPORT.md"
    assert cli.main(["beta", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"report: {report_path.resolve()}" in out
    assert "beta wrote in" in out and "beta.json" in out
    assert cli.read_sections(report_path.read_text()) == {"beta": "## beta section\n\nrun 1"}
    assert cli.main(["alpha", "--out", str(tmp_path)]) == 0
    assert cli.main(["beta", "--out", str(tmp_path)]) == 0
    text = report_path.read_text()
    sections = cli.read_sections(text)
    assert sections == {"alpha": "## alpha section\n\nrun 1", "beta": "## beta section\n\nrun 2"}
    assert text.index("## alpha") < text.index("## beta")  # registry order, not run order
    assert text.count("# dpjax reproduction report") == 1


def test_all_rewrites_the_report_with_every_section(tmp_path, fake_experiments):
    (tmp_path / "REPORT.md").write_text(
        cli.render_report({"stale": "## an experiment no longer registered"})
    )
    assert cli.main(["all", "--out", str(tmp_path)]) == 0
    sections = cli.read_sections((tmp_path / "REPORT.md").read_text())
    assert list(sections) == ["alpha", "beta"]


def test_an_unknown_experiment_fails_before_writing(tmp_path, fake_experiments, capsys):
    """An unknown name is an argparse error (exit 2, the valid names), not a traceback."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(["gamma", "--out", str(tmp_path / "out")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'gamma'" in err and "'alpha'" in err and "'beta'" in err
    assert not (tmp_path / "out").exists()


def test_jobs_runs_all_in_worker_processes_and_keeps_the_report_order(tmp_path):
    """``python -m experiments all --jobs 2`` (what ``make reproduce`` runs): every experiment
    runs once in a spawned worker (which must be able to import the worker function although
    the CLI is ``__main__``), and REPORT.md holds the sections in registry order."""
    package = tmp_path / "fakepkg_jobs"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name, pause in (("slow_one", 0.5), ("quick_one", 0.0)):
        (package / f"{name}.py").write_text(
            "import os, time\n"
            f"DESCRIPTION = 'fake {name}'\n"
            "def run(out_dir, *, full=False, seed=0):\n"
            f"    time.sleep({pause})\n"
            f"    (out_dir / '{name}.pid').write_text(str(os.getpid()))\n"
            f"    return {{'report_md': '## {name}', 'verdict': '{name} ok'}}\n"
        )
    out = tmp_path / "out"
    driver = tmp_path / "driver.py"
    driver.write_text(
        "import os, runpy, sys\n"
        "if __name__ == '__main__':\n"
        "    from experiments import registry\n"
        "    names = ('slow_one', 'quick_one')\n"
        "    registry.EXPERIMENTS = {n: f'fakepkg_jobs.{n}' for n in names}\n"
        "    registry.ORDER = names\n"
        f"    sys.argv = ['experiments', 'all', '--jobs', '2', '--out', {str(out)!r}]\n"
        "    print('driver', os.getpid())\n"
        "    runpy.run_module('experiments', run_name='__main__')\n"
    )
    root = pathlib.Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(root)]))
    done = subprocess.run(
        [sys.executable, str(driver)], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    sections = cli.read_sections((out / "REPORT.md").read_text())
    assert list(sections) == ["slow_one", "quick_one"]
    driver_pid = done.stdout.split("driver ")[1].split()[0]
    pids = {(out / f"{n}.pid").read_text() for n in ("slow_one", "quick_one")}
    assert driver_pid not in pids  # ran in workers, not in the CLI's process
    assert done.stdout.rstrip().splitlines()[-2:] == [
        "[experiments] slow_one: slow_one ok",
        "[experiments] quick_one: quick_one ok",
    ]


def test_jobs_must_be_positive(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["all", "--jobs", "0", "--out", str(tmp_path / "out")])
    assert exit_.value.code == 2
    assert "argument --jobs: must be >= 1; got 0" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
