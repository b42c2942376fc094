"""The "Published results" table: measured rows from a results file, the others "not run here"
with the command that runs them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from experiments import published, registry


def _scatternet_json(path, accuracies=(0.9871, 0.9865)):
    runs = [
        dict(dataset="mnist", seed=s, test_accuracy=a, epsilon=2.41, delta=1e-5, steps=560,
             seconds=600.0 + s)
        for s, a in enumerate(accuracies)
    ]  # fmt: skip
    path.write_text(json.dumps(dict(size="full", runs=runs)))
    return path


def test_record_then_render_a_measured_row_and_the_not_run_rows(tmp_path):
    results = tmp_path / "published_results.json"
    rows = published.record(_scatternet_json(tmp_path / "scatternet.json"), results_file=results)
    assert [r["key"] for r in rows] == ["scatternet/mnist"]
    measured = published.load_results(results)
    assert measured[0]["date"] and measured[0]["machine"]
    table = published.table(measured)
    lines = table.splitlines()
    mnist = next(ln for ln in lines if "ScatterNet + linear" in ln and "| MNIST |" in ln)
    # mean ± sd of 98.71 and 98.65 (sd = 0.06/√2 = 0.042), the paper's 98.7, dpjax's ε
    assert "98.68 ± 0.04 (2 seeds)" in mnist and "| 98.7 |" in mnist and "2.410" in mnist
    # 95% CI: 98.68 ± t(0.975, 1)·0.0424/√2 = 98.68 ± 0.38, which holds 98.7; but two seeds
    # are a partial row: no pass
    assert "— (no verdict with 2 seeds: 95% CI [98.30, 99.06] ∋ paper)" in mnist
    assert "✓" not in mnist and "PARTIAL: 2 of 3 seeds" in mnist
    assert "`python -m experiments scatternet --full`" in mnist and "10.0 min" in mnist
    fmnist = next(ln for ln in lines if "ScatterNet + linear" in ln and "Fashion-MNIST" in ln)
    assert "not run here" in fmnist and "scatternet --full" in fmnist
    cnn = next(ln for ln in lines if "end-to-end tanh CNN" in ln and "| MNIST |" in ln)
    assert "not run here: 40 epochs × 3 seeds" in cnn
    assert f"`{published.OPACUS_EXAMPLE_CMD} tb_cnn`" in cnn
    opacus = [ln for ln in lines if published.OPACUS in ln]
    assert len(opacus) == 4 and all("not run here" in ln for ln in opacus)
    assert len(lines) == 2 + len(published.ROWS)


def test_record_replaces_a_row_of_the_same_key(tmp_path):
    results = tmp_path / "published_results.json"
    published.record(_scatternet_json(tmp_path / "scatternet.json"), results_file=results)
    published.record(_scatternet_json(tmp_path / "scatternet.json", (0.97,)), results_file=results)
    (row,) = published.load_results(results)
    assert row["accuracies"] == [97.0]


def test_the_section_reads_the_committed_file(tmp_path, monkeypatch):
    results = tmp_path / "published_results.json"
    published.record(_scatternet_json(tmp_path / "scatternet.json"), results_file=results)
    monkeypatch.setattr(published, "RESULTS_FILE", results)
    monkeypatch.setattr(published, "plot", lambda path, measured: path.name)  # tested below
    summary = published.run(tmp_path / "out")
    assert summary["report_md"].startswith(published.TITLE)
    assert f"]({published.PLOT_FILE})" in summary["report_md"]
    assert "98.68 ± 0.04" in summary["report_md"]
    assert summary["verdict"].startswith("1 measured rows")
    assert "published" in registry.ORDER


def test_no_results_file_renders_every_row_as_not_run(tmp_path):
    table = published.table(published.load_results(tmp_path / "absent.json"))
    body = table.splitlines()[2:]
    assert len(body) == len(published.ROWS) and all("not run here" in ln for ln in body)


def test_record_pools_the_seeds_of_several_runs(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = _scatternet_json(tmp_path / "a" / "scatternet.json", (0.9871,))
    second = _scatternet_json(tmp_path / "b" / "scatternet.json", (0.9865,))
    results = tmp_path / "published_results.json"
    (row,) = published.record(first, second, results_file=results)
    assert row["accuracies"] == [98.71, 98.65] and len(row["wall_seconds"]) == 2


def test_the_verdict_is_the_papers_number_against_dpjaxs_ci():
    """mean ± t(0.975, 2)·sd/√3 of (89.48, 89.49, 89.38): 89.45 ± 4.303·0.0608/1.732."""
    half = 4.302652729911275 * np.std([89.48, 89.49, 89.38], ddof=1) / np.sqrt(3)
    high = np.mean([89.48, 89.49, 89.38]) + half
    assert published.verdict(89.7, [89.48, 89.49, 89.38]).endswith(
        f"{89.7 - high:.2f} pt below the paper"
    )
    assert published.verdict(89.7, [89.48, 89.49, 89.38]).startswith("✗")
    assert published.verdict(89.0, [89.48, 89.49, 89.38]).endswith("above the paper")
    assert published.verdict(89.45, [89.48, 89.49, 89.38]).endswith("∋ paper")
    assert published.verdict(89.45, [89.48]).startswith("—")


def _opacus_mnist_json(path):
    rows = [
        dict(setting="tb_cnn", framework=name, test_accuracy=acc, epsilon=eps,
             accountant=acct, steps=118, epochs=1.007, seed=0, seconds=wall, cpu_seconds=cpu)
        for name, acc, eps, acct, wall, cpu in (
            ("dpjax", 0.9012, 0.41, "dpjax PLD", 90.0, 150.0),
            ("opacus", 0.8876, 0.40, "Opacus prv", 120.0, 210.0),
        )
    ]  # fmt: skip
    path.write_text(json.dumps(dict(size="quick", rows=rows)))
    return path


def test_time_to_accuracy_rows_fill_the_cnn_row_and_the_side_by_side_table(tmp_path):
    """A quick (1 epoch) run beside Opacus fills the end-to-end CNN row with both accuracies
    and both times, labelled reduced (no verdict against the paper), and the time table."""
    results = tmp_path / "published_results.json"
    published.record(_scatternet_json(tmp_path / "scatternet.json"), results_file=results)
    (row,) = published.record(_opacus_mnist_json(tmp_path / "opacus_mnist.json"),
                              results_file=results)  # fmt: skip
    assert row["key"] == "time/tb_cnn" and row["command"] == "python -m experiments opacus_mnist"
    measured = published.load_results(results)
    assert [r["key"] for r in measured] == ["scatternet/mnist", "time/tb_cnn"]
    lines = published.table(measured).splitlines()
    cnn = next(ln for ln in lines if "end-to-end tanh CNN" in ln and "| MNIST |" in ln)
    assert "90.12; Opacus 88.76 (1 seed, 1.01 epoch: reduced)" in cnn
    assert "NOT the paper's protocol" in cnn and "✓" not in cnn and "✗" not in cnn
    assert "dpjax 1.5 min (CPU 2.5 min); Opacus 2.0 min (CPU 3.5 min)" in cnn
    assert len(cnn.split("|")) == len(lines[0].split("|"))  # as many cells as the header
    timing = published.time_table(measured).splitlines()
    assert (
        len(timing) == 4
        and "| dpjax | 90.12 | 0.410 (dpjax PLD) | 118 (1.01) | 90 s" in (timing[2])
    )
    assert "| opacus | 88.76 | 0.400 (Opacus prv) |" in timing[3] and "| 210 s |" in timing[3]
    # dpjax's times over Opacus's: CPU 150/210, wall 90/120
    (ratio,) = [ln for ln in published.time_ratios(measured) if ln]
    assert ratio == ("- tb_cnn (quick, seed 0): dpjax / Opacus = 0.71 in CPU time, "
                     "0.75 in wall time.")  # fmt: skip
    assert ratio in published.markdown(measured)
    assert "### Time to accuracy" in published.markdown(measured)
    assert "### Time to accuracy" not in published.markdown(measured[:1])
    # the measured reason for not running the paper's protocol: 150 CPU-s for 1.007 epoch,
    # scaled to 40 epochs × 3 seeds = 150·120/1.007 s = 4.97 h of CPU; wall 90 s → 2.98 h
    (reason,) = [ln for ln in published.projections(measured) if ln]
    assert "≈ 5.0 h of CPU, ≈ 3.0 h wall" in reason and reason.startswith("- tb_cnn")


def test_record_refuses_an_unknown_results_file(tmp_path):
    other = tmp_path / "other.json"
    other.write_text("{}")
    with pytest.raises(ValueError, match="opacus_mnist.json"):
        published.record(other, results_file=tmp_path / "r.json")


def test_the_plot_has_every_papers_point_and_dpjaxs_at_its_own_epsilon(tmp_path):
    """One point per paper row with a finite ε (the non-private baseline has none), dpjax's
    full rows at their mean and CI, the reduced-scale run marked as such; the PNG is written."""
    results = tmp_path / "published_results.json"
    published.record(_scatternet_json(tmp_path / "scatternet.json"), results_file=results)
    published.record(_opacus_mnist_json(tmp_path / "opacus_mnist.json"), results_file=results)
    points = published.plot_points(published.load_results(results))
    papers = [p for p in points if p["source"] == "paper"]
    assert len(papers) == sum(row["epsilon"] is not None for row in published.ROWS) == 11
    (full,) = [p for p in points if p["source"] == "dpjax"]
    assert full["epsilon"] == 2.41 and full["low"] < full["accuracy"] == 98.68 < full["high"]
    (reduced,) = [p for p in points if p["source"] == "dpjax, reduced"]
    assert (reduced["epsilon"], reduced["accuracy"]) == (0.41, 90.12)
    assert "end-to-end tanh CNN" in reduced["label"]
    pytest.importorskip("matplotlib")
    assert published.plot(tmp_path / "p.png", published.load_results(results)) == "p.png"
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_automatic_clipping_row_renders_beside_the_flat_row_it_is_compared_with(tmp_path):
    """Runs tagged clip_rule="automatic" are recorded under their own key with R, γ, lr and
    their command; the AUTO-S row renders against the paper's 98.7 and, under the table,
    against the measured flat row: difference of means with its 95% Welch interval."""
    flat = _scatternet_json(tmp_path / "scatternet.json", (0.9858, 0.9853, 0.9863))
    (tmp_path / "auto").mkdir()
    auto = tmp_path / "auto" / "scatternet.json"
    runs = [
        dict(dataset="mnist", seed=s, test_accuracy=a, epsilon=2.41, delta=1e-5, steps=560,
             seconds=300.0, clip_rule="automatic", l2_clip_norm=1.0, gamma=0.01,
             learning_rate=0.8)
        for s, a in enumerate((0.9862, 0.9866, 0.9858))
    ]  # fmt: skip
    auto.write_text(json.dumps(dict(size="full", clip_rule="automatic", runs=runs)))
    results = tmp_path / "published_results.json"
    published.record(flat, results_file=results)
    (row,) = published.record(auto, results_file=results)
    assert row["key"] == "scatternet-automatic/mnist" and row["gamma"] == 0.01
    assert "--clip-rule automatic" in row["command"]
    measured = published.load_results(results)
    lines = published.table(measured).splitlines()
    auto_line, fashion = [ln for ln in lines if "automatic clipping (AUTO-S)" in ln]
    assert "98.62 ± 0.04 (3 seeds)" in auto_line and "| 98.7 |" in auto_line
    assert "| MNIST |" in auto_line and "not run here" in fashion and "fashion-mnist`" in fashion
    assert "✓" in auto_line and "2.410" in auto_line and "Bu et al. 2023" in auto_line
    # difference 98.62 − 98.58 = +0.04; Welch interval from the two sample variances
    a, b = np.array([98.62, 98.66, 98.58]), np.array([98.58, 98.53, 98.63])
    from scipy import stats

    va, vb = a.var(ddof=1) / 3, b.var(ddof=1) / 3
    dof = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 2)
    half = stats.t.ppf(0.975, dof) * np.sqrt(va + vb)
    (comparison,) = published.baseline_comparisons(measured)
    assert "difference +0.04 pt" in comparison and "`scatternet/mnist`" in comparison
    assert f"[{0.04 - half:+.2f}, {0.04 + half:+.2f}]" in comparison
    assert "R = 1, γ = 0.01, lr = 0.8" in comparison
    assert "compared with the flat-clipping row" in published.markdown(measured)
    assert published.baseline_comparisons(measured[1:]) == []  # no flat row: no comparison


def _full_opacus_json(path, commit="abc123def4567890"):
    """dpjax at three seeds of σ = 1.3 (Opacus beside at seed 0) and one non-private seed."""
    rows = [
        dict(setting="opacus_example", framework="dpjax", test_accuracy=acc, epsilon=1.05,
             accountant="dpjax PLD", steps=3750, epochs=15.0, seed=seed, seconds=600.0,
             cpu_seconds=300.0)
        for seed, acc in enumerate((0.9461, 0.9470, 0.9452))
    ] + [
        dict(setting="opacus_example", framework="opacus", test_accuracy=0.9448, epsilon=1.1,
             accountant="Opacus prv", steps=3750, epochs=15.0, seed=0, seconds=900.0,
             cpu_seconds=500.0),
        dict(setting="opacus_example_nonprivate", framework="dpjax", test_accuracy=0.9901,
             epsilon=None, accountant="none (non-private)", steps=5000, epochs=20.0, seed=0,
             seconds=60.0, cpu_seconds=30.0),
    ]  # fmt: skip
    path.write_text(json.dumps(dict(size="full", commit=commit, rows=rows)))
    return path


def test_full_opacus_example_runs_fill_their_rows_with_seeds_commit_and_opacus_beside(tmp_path):
    """Full-protocol opacus_mnist runs: dpjax's accuracy row per setting over its seeds (mean,
    CI against the README's number), Opacus's accuracy of the same protocol beside it, the
    code's commit and the machine note; a row with fewer than 3 seeds is marked PARTIAL with
    its reason; the non-private row has ε = ∞."""
    results = tmp_path / "published_results.json"
    why = "1 seed fit in the session"
    rows = published.record(
        _full_opacus_json(tmp_path / "opacus_mnist.json"), results_file=results,
        machine_note="CPU, 2 cores, shared",
        notes={"opacus_mnist/opacus_example_nonprivate": why},
    )  # fmt: skip
    keys = [r["key"] for r in rows]
    assert keys == ["time/opacus_example", "opacus_mnist/opacus_example",
                    "opacus_mnist/opacus_example_nonprivate"]  # fmt: skip
    assert all(r["commit"] == "abc123def4567890" for r in rows)
    assert all(r["machine"].endswith("(CPU, 2 cores, shared)") for r in rows)
    lines = published.table(published.load_results(results)).splitlines()
    (eps_116,) = [ln for ln in lines if published.OPACUS in ln and "| 1.16 |" in ln]
    # mean 94.61, sd 0.09; CI 94.61 ± 4.303·0.09/√3 = [94.39, 94.83] holds 94.63
    assert "94.61 ± 0.09 (3 seeds); Opacus 94.48 (seed 0)" in eps_116
    assert "✓ 95% CI [94.39, 94.83] ∋ paper" in eps_116 and "PARTIAL" not in eps_116
    assert "code abc123def456" in eps_116 and "| 1.050 |" in eps_116
    # runs written before dpjax's side recorded its init ran flax's: the row says so, and its
    # command reruns that init (the setting's default is now PyTorch's, the peer's model)
    assert {r["init"] for r in rows[1:]} == {"flax"} and rows[0]["frameworks"]["dpjax"]["init"]
    assert f"(`{published.OPACUS_EXAMPLE_CMD} opacus_example --init flax`)" in eps_116
    (baseline,) = [ln for ln in lines if "non-private" in ln]
    assert "99.01 (1 seed)" in baseline and f"PARTIAL: 1 of 3 seeds; {why}" in baseline
    assert "| ∞ |" in baseline and "✓" not in baseline and "✗" not in baseline
    others = [ln for ln in lines if published.OPACUS in ln and ("6.86" in ln or "2.91" in ln)]
    assert len(others) == 2 and all("not run here" in ln for ln in others)
    timing = published.time_table(published.load_results(results)).splitlines()
    assert "| opacus_example | full | opacus | 94.48 |" in timing[3]
    assert rows[0]["command"].endswith("opacus_mnist --full --setting opacus_example --seed 0")


def test_seeds_run_at_two_commits_name_both_and_a_note_must_name_a_row(tmp_path):
    (tmp_path / "b").mkdir()
    first = _full_opacus_json(tmp_path / "opacus_mnist.json")
    second = _full_opacus_json(tmp_path / "b" / "opacus_mnist.json", commit="fedcba")
    payload = json.loads(second.read_text())
    for row in payload["rows"]:
        row["seed"] += 10  # other seeds, so the two files pool
    second.write_text(json.dumps(payload))
    rows = published.record(first, second, results_file=tmp_path / "r.json")
    assert {r["commit"] for r in rows} == {"abc123def4567890, fedcba"}
    line = next(ln for ln in published.table(rows).splitlines() if "| 1.16 |" in ln)
    assert "code abc123def456, fedcba |" in line and "(6 seeds)" in line
    with pytest.raises(ValueError, match="notes must name recorded rows"):
        published.record(first, results_file=tmp_path / "r.json", notes={"nope": "x"})


def test_no_projection_for_a_setting_whose_full_protocol_was_run():
    """The reduced run's "would take ≈ h, not run here" line goes once the full row exists."""
    quick = dict(key="time/opacus_example", protocol="quick", epochs=1.0,
                 frameworks=dict(dpjax=dict(cpu_seconds=40.0, wall_seconds=100.0)))  # fmt: skip
    full = dict(key="opacus_mnist/opacus_example", protocol="full")
    (line,) = [ln for ln in published.projections([quick]) if ln]
    assert line.startswith("- opacus_example: the paper's 15 epochs × 3 seeds")
    assert "≈ 0.5 h of CPU" in line  # 40 s · 15 · 3 = 1 800 s
    assert published.projections([quick, full]) == []


def test_a_one_seed_row_is_plotted_as_one_seed_without_a_ci(tmp_path):
    one = dict(key="opacus_mnist/opacus_example", protocol="full", accuracies=[94.24],
               epsilon=0.834)  # fmt: skip
    (point,) = [p for p in published.plot_points([one]) if p["source"] != "paper"]
    assert point["source"] == "dpjax, 1 seed" and "low" not in point
    assert (point["epsilon"], point["accuracy"]) == (0.834, 94.24)
    pytest.importorskip("matplotlib")
    assert published.plot(tmp_path / "p.png", [one]) == "p.png"


def test_an_accuracy_row_records_its_init_and_its_per_epoch_curves(tmp_path):
    """Runs with init "torch" (the setting's default) and their test curves: the row holds
    both and the plain command; runs of two inits never pool into one row."""
    path = _full_opacus_json(tmp_path / "opacus_mnist.json")
    payload = json.loads(path.read_text())
    payload["rows"] = [r | dict(init="torch", curve=[97.0, 99.01]) for r in payload["rows"]
                       if r["setting"] == "opacus_example_nonprivate"]  # fmt: skip
    path.write_text(json.dumps(payload))
    (row,) = published.record(path, results_file=tmp_path / "r.json")
    assert row["init"] == "torch" and row["curves"] == [[97.0, 99.01]]
    assert row["command"] == f"{published.OPACUS_EXAMPLE_CMD} opacus_example_nonprivate"
    payload["rows"].append(payload["rows"][0] | dict(seed=1, init="flax"))
    path.write_text(json.dumps(payload))
    with pytest.raises(ValueError, match="one init"):
        published.record(path, results_file=tmp_path / "r.json")


def test_a_scatternet_cnn_run_is_recorded_under_its_own_row(tmp_path):
    """The CNN head's runs become ``scatternet-cnn/<data set>`` with their command, never the
    linear head's row."""
    path = _scatternet_json(tmp_path / "scatternet.json", (0.987, 0.986, 0.988))
    payload = json.loads(path.read_text())
    for r in payload["runs"]:
        r["head"] = "cnn"
    path.write_text(json.dumps(payload))
    (row,) = published.record(path, results_file=tmp_path / "r.json")
    assert row["key"] == "scatternet-cnn/mnist"
    assert row["command"] == "python -m experiments.scatternet --full --head cnn --dataset mnist"
    cnn = next(r for r in published.ROWS if r["key"] == row["key"])
    assert cnn["model"] == "ScatterNet + CNN" and cnn["published"] == 98.7


def test_each_scatternet_row_of_one_file_keeps_its_own_command(tmp_path):
    """A file with CNN-head runs before linear-head runs: the linear row's command is the plain
    one, not the command of the row recorded before it."""
    path = _scatternet_json(tmp_path / "scatternet.json", (0.987, 0.986, 0.988))
    payload = json.loads(path.read_text())
    payload["runs"] = [dict(r, head="cnn") for r in payload["runs"]] + payload["runs"]
    path.write_text(json.dumps(payload))
    rows = {r["key"]: r for r in published.record(path, results_file=tmp_path / "r.json")}
    assert sorted(rows) == ["scatternet-cnn/mnist", "scatternet/mnist"]
    assert rows["scatternet/mnist"]["command"] == "python -m experiments scatternet --full"
    assert "--head cnn" in rows["scatternet-cnn/mnist"]["command"]
