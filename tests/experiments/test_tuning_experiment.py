"""The tuning experiment: its calibrations, the sampler table, and (slow) a tiny run."""

import json

import pytest

from experiments import registry, tuning


def test_calibration_spends_the_target_and_naive_tuning_spends_more():
    cal = tuning.calibrate(3.0, 9)
    assert 2.7 <= cal["selection_epsilon"] <= 3.0
    assert cal["naive_epsilon_spent"] > 2 * 3.0  # nine runs of ε = 3 each
    assert cal["sigma_selection"] > cal["sigma_one_run"]


def test_sampler_table_orders_the_samplers():
    rows = {(r["sampler"], r["relation"]): r["epsilon"] for r in tuning.sampler_table()}
    poisson_ar = rows[("Poisson", "add/remove")]
    poisson_r1 = rows[("Poisson", "replace-one")]
    with_repl = rows[("with replacement (b draws)", "replace-one")]
    assert poisson_ar < poisson_r1 < with_repl
    bib = ("balls-in-bins (t = n/b steps per epoch)", "add/remove")
    assert poisson_ar < rows[bib] < rows[(bib[0], "replace-one")]  # the bound: no amplification
    assert "tuning" in registry.EXPERIMENTS and "tuning" in registry.ORDER


def test_sampler_table_monte_carlo_rows_are_labelled_estimates():
    rows = tuning._monte_carlo_rows(1000, 50, 2.0, 100, 2000)
    assert [r["sampler"].split(":")[0] for r in rows] == ["balls-in-bins", "Poisson"]
    assert all(r["note"].startswith("ESTIMATE, not a guarantee") for r in rows)


@pytest.mark.slow
def test_tiny_run_writes_json_plot_and_section(tmp_path):
    summary = tuning.run(tmp_path, size="tiny", seed=0)
    data = json.loads((tmp_path / "tuning.json").read_text())
    assert {r["method"] for r in data["rows"]} == {"naive", "private_selection", "oracle"}
    assert "Private hyperparameter tuning" in summary["report_md"]
    for r in data["rows"]:
        assert r["ci_low"] <= r["accuracy_mean"] <= r["ci_high"]
