"""The automatic-clipping experiment: registered, its table picks each arm's best grid value."""

import jax
import pytest

from experiments import auto_clip, registry


def test_registered_and_best_rows():
    assert registry.EXPERIMENTS["auto_clip"] == "experiments.auto_clip"
    assert "auto_clip" in registry.ORDER
    rows = [
        dict(arm=arm, epochs=3.0, target_epsilon=1.0, epsilon=1.0, clip=c, learning_rate=0.5,
             accuracy_mean=acc, ci_low=acc - 0.01, ci_high=acc + 0.01)
        for arm, c, acc in [("flat", 0.1, 0.7), ("flat", 1.0, 0.9), ("automatic", 1.0, 0.8)]
    ]  # fmt: skip
    best = auto_clip.best_rows(rows)
    assert [(r["arm"], r["accuracy_mean"]) for r in best] == [("automatic", 0.8), ("flat", 0.9)]
    text = auto_clip.markdown(dict(rows=rows, gamma=0.01), "tiny")
    assert "| flat | C = 1 |" in text and "| automatic | lr = 0.5 |" in text


@pytest.mark.slow
def test_tiny_run(tmp_path):
    with jax.numpy_dtype_promotion("standard"):  # as the fine-tuning runs' tests (x64 counters)
        out = auto_clip.run(tmp_path, size="tiny")
    assert (tmp_path / "auto_clip.json").exists()
    arms = {r["arm"] for r in out["rows"]}
    assert arms == {"flat", "automatic"} and len(out["rows"]) == 2 * len(auto_clip.GRID)
    assert all(0.0 <= r["accuracy_mean"] <= 1.0 for r in out["rows"])
