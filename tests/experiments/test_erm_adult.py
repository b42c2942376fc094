"""The Adult experiment never skips silently, and its claim checks can fail."""

from __future__ import annotations

import pytest

from experiments import erm_adult, registry


def test_missing_adult_files_give_a_skipped_section_with_the_hint(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DPJAX_DATA", str(tmp_path / "empty"))
    summary = erm_adult.run(tmp_path / "out", size="tiny")
    assert summary["verdict"].startswith("SKIPPED")
    assert "make data" in summary["report_md"] and "adult.data" in summary["report_md"]
    assert "SKIPPED" in capsys.readouterr().err
    assert "erm_adult" in registry.EXPERIMENTS


def _records(objective: float, output: float, clean: float = 0.15, half: float = 0.005):
    rows = []
    for eps in (0.1, 1.0):
        for method, mean in (("non_private", clean), ("output", output), ("objective", objective)):
            width = 0.0 if method == "non_private" else half
            cell = dict(loss="logistic", lam=1e-3, method=method, epsilon=eps, error_mean=mean)
            rows.append(cell | dict(ci_low=mean - width, ci_high=mean + width))
    return rows


@pytest.mark.parametrize(
    "objective, output, le, approach",
    [
        (0.152, 0.155, True, True),  # the paper's picture
        (0.158, 0.145, False, True),  # objective worse beyond the CIs
        (0.154, 0.151, True, True),  # worse by less than the CIs: a tie, not a violation
        (0.152, 0.190, True, False),  # output far from non-private at the largest ε
    ],
)
def test_claims_are_checked_cell_by_cell(objective, output, le, approach):
    (check,) = erm_adult.claims(_records(objective, output))
    assert check["objective_le_output"] is le
    assert check["approach_non_private"] is approach
