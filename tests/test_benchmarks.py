"""benchmarks/: model registry, PyTorch twins, targets, and the smallest end-to-end run."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from benchmarks import models
from benchmarks.__main__ import TARGETS, targets

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _flax_shapes(name):
    params = models.make_model(name).init(jax.random.key(0))
    return sorted(int(np.prod(x.shape)) for x in jax.tree.leaves(params))


@pytest.mark.torch  # needs the bench-torch extra: `make test-torch` (deselected by `make test`)
@pytest.mark.parametrize("name", ["mlp", "cnn", "cnn_tanh", "logreg", "lora_mlp"])
def test_torch_twin_has_the_same_parameter_shapes(name):
    from benchmarks.torch_side import TORCH_MODELS

    module = TORCH_MODELS[name][0]()
    # trainable ones: the LoRA twin's frozen base layers are constants in the JAX model
    torch_sizes = sorted(p.numel() for p in module.parameters() if p.requires_grad)
    assert torch_sizes == _flax_shapes(name)


def test_tempered_sigmoid_cnn_shapes_follow_papernot():
    params = models.make_model("cnn_tanh").init(jax.random.key(0))
    assert params["Conv_0"]["kernel"].shape == (8, 8, 1, 16)
    assert params["Conv_1"]["kernel"].shape == (4, 4, 16, 32)
    assert params["Dense_0"]["kernel"].shape == (512, 32)  # 28 → 14 → 13 → 5 → 4; 4·4·32
    assert params["Dense_1"]["kernel"].shape == (32, 10)


def test_register_adds_rows_and_replaces_old_ones():
    saved_models, saved_configs = dict(models.MODELS), list(models.CONFIGS)
    try:
        models.register("toy", models.MODELS["mlp"], batches=(8, 16), quick_batches=(8,))
        models.register("toy", models.MODELS["mlp"], batches=(8, 32))
        rows = [c for c in models.CONFIGS if c[0] == "toy"]
        assert rows == [("toy", 8, True), ("toy", 32, True)]
        assert models.make_model("toy").name == "mlp"
    finally:
        models.MODELS.clear()
        models.MODELS.update(saved_models)
        models.CONFIGS[:] = saved_configs


def test_targets_report_status_per_model_and_batch():
    summary = {
        "model": "m",
        "batch": 4,
        "method": "summary",
        "ratios": {"noise_over_draw": 1.2, "dp_over_floor": 1.1, "dpjax_over_opacus": 0.3},
        "cpu_ratios": {"noise_over_draw": 1.0},
    }
    rows = {r["target"]: r for r in targets([summary])}
    assert set(rows) == {"noise_over_draw", "dp_over_floor", "dpjax_over_opacus"}
    assert rows["noise_over_draw"]["status"] == "MISSED"  # 1.2 > 1.15
    assert rows["dp_over_floor"]["status"] == "holds"
    assert rows["dpjax_over_opacus"]["status"] == "holds"
    assert rows["noise_over_draw"]["cpu_ratio"] == 1.0
    assert rows["dp_over_floor"]["cpu_ratio"] is None
    assert TARGETS["dpjax_over_opacus"][0] == 0.5


@pytest.mark.slow
def test_quick_benchmark_runs_end_to_end(tmp_path):
    cmd = [sys.executable, "-m", "benchmarks", "--quick", "--only", "logreg", "--repeats", "1"]
    cmd += ["--no-opacus", "--out", str(tmp_path)]
    env = dict(os.environ, PYTHONPATH=ROOT)
    subprocess.run(cmd, check=True, cwd=ROOT, env=env, capture_output=True, timeout=600)
    payload = json.loads((tmp_path / "bench.json").read_text())
    assert payload["meta"]["device"]["platform"] == "cpu"
    assert "omitted" in payload["meta"]["opacus"]
    got = {t["target"] for t in payload["targets"]}
    assert {"noise_over_draw", "dp_over_floor", "compile_dpjax_over_nonprivate"} <= got
    methods = {r["method"] for r in payload["records"]}
    assert {"nonprivate", "dpjax", "dpjax_clip_only", "draw", "draw_jax"} <= methods
    assert "Opacus columns omitted" in (tmp_path / "bench.md").read_text()
