"""The experiments at a tiny size: JSON schema, REPORT table, and the main rows' slopes.

The default test runs one row per private-solver family (output perturbation, objective
perturbation, DP-GD, Laplace DP-SGD) at the ``tiny`` scale; the slow test runs every row.
Slopes are checked against the theory with the tiny scale's tolerance (±0.1 around the 95% CI)
and, independently of the CI, within 0.25 of the expected value.
"""

import json
import math

import pytest

from experiments import __main__ as cli
from experiments import rates, registry, report

FAST_ROWS = (
    "output_sc_sharp",
    "objective_sc_logistic",
    "dpgd_convex_linear",
    "laplace_dpsgd_rho0.6_kappa0.9",
)


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


def _check_slopes(rows):
    for row in rows:
        name, slope, expected = row["name"], row["measured_slope"], row["expected_slope"]
        assert row["within_tolerance"], (name, slope, row["ci_low"], row["ci_high"])
        assert abs(slope - expected) < 0.25, (name, slope, expected)
        counted = row["cells"] - row["cells_vacuous"]
        assert row["cells_bound_held"] == counted, name


def test_rates_tiny_schema_slopes_and_bounds(tmp_path):
    summary = rates.run(tmp_path, seed=0, size="tiny", only=FAST_ROWS)
    assert not summary["skipped"]
    records = json.loads((tmp_path / "rates.json").read_text())
    _check_records(records, FAST_ROWS)
    full = json.loads((tmp_path / "rates_experiment.json").read_text())
    assert full["size"] == "tiny" and len(full["rows"]) == len(FAST_ROWS)
    for row in full["rows"]:
        for cell in row["cell_results"]:
            assert cell["runs"] == rates.SCALES["tiny"].datasets * rates.SCALES["tiny"].seeds
            assert cell["mean"] > 0 and cell["ucb99"] >= cell["mean"]
            assert cell["certified"]
    _check_slopes(summary["rows"])
    for name in FAST_ROWS:
        assert (tmp_path / f"rates_{name}.png").stat().st_size > 0
    md = summary["report_md"]
    assert "| method | instance | variable | expected slope | measured slope [95% CI]" in md
    assert md.count("✓") >= len(FAST_ROWS)


def test_bound_rows_are_not_vacuous_at_tiny_scale(tmp_path):
    """The closed-form rows are checked against a finite bound in at least one cell."""
    summary = rates.run(tmp_path, seed=1, size="tiny", only=("output_sc_sharp",))
    row = summary["rows"][0]
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


def test_run_is_reproducible_for_a_seed(tmp_path):
    a = rates.run(tmp_path / "a", seed=3, size="tiny", only=("output_sc_sharp",))
    b = rates.run(tmp_path / "b", seed=3, size="tiny", only=("output_sc_sharp",))
    assert a["records"] == b["records"]


@pytest.mark.slow
def test_every_row_at_tiny_scale(tmp_path):
    summary = rates.run(tmp_path, seed=0, size="tiny")
    assert not summary["skipped"]
    _check_records(summary["records"], [r.name for r in rates.rows()])
    _check_slopes(summary["rows"])


@pytest.mark.slow
def test_cli_all_writes_the_report(tmp_path):
    assert cli.main(["rates", "--size", "tiny", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "rates.json").exists()
