"""The finetune_lm experiment never fails silently: without the model file it says SKIPPED."""

from __future__ import annotations

from experiments import finetune_lm, registry


def test_missing_model_gives_a_skipped_section_with_the_make_data_hint(tmp_path, monkeypatch,
                                                                      capsys):  # fmt: skip
    monkeypatch.setenv("DPJAX_DATA", str(tmp_path / "empty"))
    summary = finetune_lm.run(tmp_path / "out")
    assert summary["verdict"].startswith("SKIPPED")
    assert "make data" in summary["report_md"] and "SKIPPED" in summary["report_md"]
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in summary["report_md"]
    assert "SKIPPED" in capsys.readouterr().err


def test_registered_and_run_by_make_reproduce():
    assert registry.EXPERIMENTS["finetune_lm"] == "experiments.finetune_lm"
    assert "finetune_lm" in registry.ORDER
