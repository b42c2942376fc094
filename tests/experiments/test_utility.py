"""`python -m experiments utility --size tiny`: records, CIs, report table, plot, registry."""

import json
import math

import numpy as np
import pytest

pytest.importorskip("sklearn")
pytest.importorskip("diffprivlib")

from experiments import registry, utility  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("utility")
    return out, utility.run(out, size="tiny", seed=0)


def test_registered_and_run_by_all():
    assert registry.EXPERIMENTS["utility"] == "experiments.utility"
    assert "utility" in registry.ORDER


@pytest.mark.slow  # the tiny utility run (~30 s); make reproduce runs it at quick scale
def test_one_record_per_dataset_method_epsilon(tiny):
    out, summary = tiny
    payload = json.loads((out / "utility.json").read_text())
    records = payload["records"]
    spec = utility.SIZES["tiny"]
    keys = {(r["dataset"], r["method"], r["epsilon"]) for r in records}
    assert (
        len(keys)
        == len(records)
        == len(spec["datasets"]) * len(utility.METHODS) * len(spec["epsilons"])
    )
    for r in records:
        assert r["seeds"] == spec["seeds"]
        assert 0.0 <= r["accuracy_mean"] <= 1.0
        assert r["ci_low"] <= r["accuracy_mean"] <= r["ci_high"]
        assert r["pure_epsilon"] == (r["method"] in ("objective_cms", "diffprivlib"))
        assert (r["delta"] == 0.0) == (r["method"] in ("objective_cms", "diffprivlib", "sklearn"))
    assert (out / "utility.png").exists()


@pytest.mark.slow  # the tiny utility run (~30 s); make reproduce runs it at quick scale
def test_report_section_has_the_table_and_the_public_preprocessing(tiny):
    _, summary = tiny
    md = summary["report_md"]
    assert md.startswith("## Utility on real data")
    assert "| diffprivlib LR (pure ε) |" in md and "| objective pert. CMS11 (pure ε) |" in md
    assert "rows clipped to norm 1" in md and "never tuned" in md
    assert "(data set, ε) cells" in md


@pytest.mark.slow  # the tiny utility run (~30 s); make reproduce runs it at quick scale
def test_private_fits_beat_chance_where_the_signal_is_strong(tiny):
    # breast cancer at ε = 1 (n_train = 426): the objective perturbations reached 0.84-0.87
    # over 50 splits in the quick run; 3 splits of sd ≈ 0.05 sit far above majority (0.627).
    _, summary = tiny
    cell = {
        r["method"]: r
        for r in summary["records"]
        if r["dataset"] == "breast_cancer" and r["epsilon"] == 1.0
    }
    assert cell["objective_kst"]["accuracy_mean"] > cell["objective_kst"]["majority"] + 0.1
    assert cell["sklearn"]["accuracy_mean"] > 0.9


def test_mean_ci_against_the_t_table():
    # two values 0 and 1: mean 0.5, sd 1/√2, half-width t_{0.975,1}·sd/√2 = 12.7062/2
    mean, lo, hi = utility.mean_ci(np.array([0.0, 1.0]))
    assert mean == 0.5
    assert hi - mean == pytest.approx(12.7062047 / 2, rel=1e-6)
    assert mean - lo == pytest.approx(hi - mean)


def test_preprocessing_is_public_and_gives_unit_rows():
    X = np.array([[0.0, 16.0], [8.0, 8.0], [100.0, -50.0]])
    rows = utility.public_rows(X, (np.zeros(2), np.full(2, 16.0)))
    assert rows.shape == (3, 3)
    assert np.all(np.linalg.norm(rows, axis=1) <= 1.0 + 1e-12)
    np.testing.assert_allclose(rows[:, -1], utility.INTERCEPT)
    # the map of a row depends on that row only (no statistic of the data set)
    np.testing.assert_array_equal(
        utility.public_rows(X[:1], (np.zeros(2), np.full(2, 16.0))), rows[:1]
    )


def test_comparison_flags_cells_below_diffprivlib():
    def rec(method, mean, half=0.01):
        return dict(dataset="d", epsilon=1.0, method=method, accuracy_mean=mean,
                    ci_low=mean - half, ci_high=mean + half)  # fmt: skip

    records = [rec(m, 0.6) for m in utility.DPJAX_METHODS] + [rec("diffprivlib", 0.7)]
    (row,) = utility.best_vs_diffprivlib(records)
    assert not row["at_least_as_accurate"] and row["worse_beyond_ci"]
    assert math.isclose(row["diffprivlib_mean"], 0.7)
