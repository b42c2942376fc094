"""benchmarks/: model registry, PyTorch twins, targets, and the smallest end-to-end run."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import models
from benchmarks.__main__ import TARGETS, targets

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _flax_shapes(name):
    params = jax.eval_shape(models.make_model(name).init, jax.random.key(0))  # shapes only
    return sorted(int(np.prod(x.shape)) for x in jax.tree.leaves(params))


@pytest.mark.torch  # needs the bench-torch extra: `make test-torch` (deselected by `make test`)
@pytest.mark.parametrize(
    "name",
    ["mlp", "cnn", "cnn_im2col", "cnn_tanh", "logreg", "lora_mlp", "transformer", "llama_block"],
)
def test_torch_twin_has_the_same_parameter_shapes(name):
    from benchmarks.torch_side import TORCH_MODELS

    module = TORCH_MODELS[name][0]()
    # trainable ones: the LoRA twin's frozen base layers are constants in the JAX model
    torch_sizes = sorted(p.numel() for p in module.parameters() if p.requires_grad)
    assert torch_sizes == _flax_shapes(name)


# a transformer small enough for a per-example reference; every shape rule of the full one
SMALL_TF = {"vocab": 64, "width": 32, "heads": 4, "layers": 2, "seq": 8}


@pytest.fixture(scope="module")
def small_tf():
    """The JAX model, its params and a batch of int32 token ids / next-token targets."""
    from benchmarks.transformer import transformer_model

    model = transformer_model(**SMALL_TF)
    params = model.init(jax.random.key(0))
    xs, ys = model.data(jax.random.key(1), 6)
    return model, params, xs, ys


@pytest.fixture(scope="module")
def dpjax_clipped_step(small_tf):
    """dpjax's step without noise on ``small_tf`` and the per-sequence gradient norms."""
    from benchmarks.steps import make_step

    model, params, xs, ys = small_tf
    per_sequence = jax.vmap(jax.grad(model.loss), in_axes=(None, 0, 0))
    norms = jax.jit(lambda p: jax.vmap(_global_norm)(per_sequence(p, xs, ys)))(params)
    return make_step(model, "dpjax_clip_only")(params, jax.random.key(3), xs, ys), norms


def _global_norm(tree):
    return jax.numpy.sqrt(sum(jax.numpy.sum(x * x) for x in jax.tree.leaves(tree)))


def _torch_state(params):
    """flax nnx params -> the twin's state_dict (kernels transposed, heads flattened)."""
    import torch

    state = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        keys = [str(getattr(k, "key", getattr(k, "idx", None))) for k in path]
        keys = [k for k in keys if k != "None"]  # drop the Variable's ``.value`` attribute
        x = np.asarray(leaf)
        if keys[-1] == "kernel":  # (in, out) Linear, (W, H, D) q/k/v, (H, D, W) out
            x = x.reshape(x.shape[0], -1) if keys[-2] != "out" else x.reshape(-1, x.shape[-1])
            x = x.T
        elif keys[-1] == "bias":
            x = x.reshape(-1)
        name = {"kernel": "weight", "scale": "weight", "embedding": "weight"}.get(keys[-1])
        state[".".join(keys[:-1] + [name or keys[-1]])] = torch.tensor(np.ascontiguousarray(x))
    return state


def _torch_twin(params, xs, ys):
    import torch

    from benchmarks.torch_side import _transformer

    twin = _transformer(**SMALL_TF)
    twin.load_state_dict(_torch_state(params), strict=True)
    as_long = lambda a: torch.tensor(np.asarray(a), dtype=torch.long)  # noqa: E731
    return twin, as_long(xs), as_long(ys)


@pytest.mark.torch
def test_transformer_twin_has_the_jax_parameter_count():
    from benchmarks.steps import num_params
    from benchmarks.torch_side import TORCH_MODELS

    module = TORCH_MODELS["transformer"][0]()
    jax_count = num_params(jax.eval_shape(models.make_model("transformer").init, jax.random.key(0)))
    assert sum(p.numel() for p in module.parameters() if p.requires_grad) == jax_count
    assert all(p.dtype.is_floating_point and p.dtype.itemsize == 4 for p in module.parameters())


@pytest.mark.torch
def test_transformer_twin_computes_the_jax_per_sequence_loss(small_tf):
    import torch

    from benchmarks.torch_side import SequenceCrossEntropy

    model, params, xs, ys = small_tf
    twin, txs, tys = _torch_twin(params, xs, ys)
    want = np.asarray(jax.jit(jax.vmap(model.loss, in_axes=(None, 0, 0)))(params, xs, ys))
    with torch.no_grad():
        got = SequenceCrossEntropy("none")(twin(txs), tys).numpy()
        mean = SequenceCrossEntropy()(twin(txs), tys).item()
    # float32 losses ~4.2 agree to ~1 ulp (5e-7) here; measured: torch's LayerNorm ε = 1e-5
    # moves them by 6e-5, exact instead of tanh GELU by 8e-5, no causal mask or another head
    # split by > 0.3
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    assert mean == pytest.approx(float(jax.jit(model.batch_loss)(params, xs, ys)), abs=1e-5)
    with pytest.raises(ValueError, match="reduction"):
        SequenceCrossEntropy("avg")(twin(txs), tys)


@pytest.mark.torch
@pytest.mark.parametrize("mode", ["hooks", "functorch", "ew", "ghost"])
def test_opacus_mode_takes_dpjax_clipped_step_on_the_transformer(
    mode, small_tf, dpjax_clipped_step
):
    """Without noise, Opacus's step on the twin = dpjax's clip-only step on the same weights:
    per-SEQUENCE clipping to C, mean over the batch, SGD. Every sequence's norm is > 2C, so
    each per-sequence gradient's direction is checked (its scale: the loss test); positions
    fed without a batch axis fail every mode (checked when this test was written)."""
    from benchmarks.steps import CLIP
    from benchmarks.torch_side import OPACUS_MODES, SequenceCrossEntropy, opacus_step

    assert mode in OPACUS_MODES
    _, params, xs, ys = small_tf
    want, norms = dpjax_clipped_step
    assert float(norms.min()) > 2 * CLIP  # every sequence is clipped: the update sees the unit
    twin, txs, tys = _torch_twin(params, xs, ys)
    opacus_step(twin, SequenceCrossEntropy(), txs, tys, mode, noise_multiplier=0.0)()
    got = {k.removeprefix("_module."): v for k, v in twin.state_dict().items()}
    before, after = _torch_state(params), _torch_state(want)
    deltas = {name: (new - before[name]).numpy() for name, new in after.items()}
    largest = max(np.abs(d).max() for d in deltas.values())
    for name, delta_want in deltas.items():
        delta_got = (got[name] - before[name]).numpy()
        # float32 sums over ≤ 10⁴ terms: ~1e-5 relative; attention's key bias has a zero
        # gradient (softmax ignores a shift), so its update is rounding noise ≪ 1e-6·largest
        atol = 1e-3 * np.abs(delta_want).max() + 1e-6 * largest
        np.testing.assert_allclose(delta_got, delta_want, rtol=0, atol=atol, err_msg=name)


def test_tempered_sigmoid_cnn_shapes_follow_papernot():
    # shapes only: traced, never run (running the init eagerly took ~30 s on the loaded machine)
    params = jax.eval_shape(models.make_model("cnn_tanh").init, jax.random.key(0))
    assert params["Conv_0"]["kernel"].shape == (8, 8, 1, 16)
    assert params["Conv_1"]["kernel"].shape == (4, 4, 16, 32)
    assert params["Dense_0"]["kernel"].shape == (512, 32)  # 28 → 14 → 13 → 5 → 4; 4·4·32
    assert params["Dense_1"]["kernel"].shape == (32, 10)


@pytest.mark.slow  # compiles both pools and their gradients (~7 s on the loaded 2-core CPU)
def test_slice_max_pool_is_flax_max_pool_in_value_and_gradient():
    """The tempered-sigmoid CNN's pool: ``nn.max_pool(x, (2, 2), strides=(1, 1))``, by value
    and gradient (random normal input: no ties, where the two split the gradient differently);
    a pool with the wrong offsets or window fails both."""
    import flax.linen as nn

    x = jax.random.normal(jax.random.key(0), (3, 9, 8, 4))
    w = jax.random.normal(jax.random.key(1), (3, 8, 7, 4))
    flax_pool = lambda x: nn.max_pool(x, (2, 2), strides=(1, 1))  # noqa: E731
    values = jax.jit(lambda x: (models.max_pool_2x2_stride1(x), flax_pool(x)))(x)
    np.testing.assert_array_equal(*values)
    pools = (models.max_pool_2x2_stride1, flax_pool)
    grads = jax.jit(lambda x: [jax.grad(lambda x, f=f: jnp.sum(w * f(x)))(x) for f in pools])(x)
    np.testing.assert_array_equal(grads[0], grads[1])


# (model, the flax kernels of its convolutions as (f, f, C_in, C_out) — a Dense on im2col
# patches holds its (f·f·C_in, C_out) kernel —, the (h, w, c) grid flattened before the first
# dense layer)
CNN_TWINS = [
    ("cnn_tanh", [(8, 8, 1, 16), (4, 4, 16, 32)], (4, 4, 32)),
    ("cnn_im2col", [(5, 5, 1, 16), (4, 4, 16, 32)], (5, 5, 32)),
]


@pytest.mark.torch
@pytest.mark.parametrize("name, convs, grid", CNN_TWINS)
def test_cnn_twin_computes_the_jax_loss(name, convs, grid):
    """The JAX model and its torch twin (``nn.Conv2d``, ``nn.MaxPool2d``) on the same weights
    give the same per-example losses: kernels (f, f, I, O) -> OIHW, the first dense layer's
    rows reordered from flax's (h, w, c) flatten to torch's (c, h, w)."""
    import torch

    from benchmarks.torch_side import TORCH_MODELS

    model = models.make_model(name)
    params = model.init(jax.random.key(0))
    xs, ys = model.data(jax.random.key(1), 16)
    leaves = [np.asarray(x) for x in jax.tree.leaves(params)]  # (bias, kernel) per layer
    weights = []
    for i, (bias, kernel) in enumerate(zip(leaves[::2], leaves[1::2], strict=True)):
        if i < len(convs):
            kernel = kernel.reshape(convs[i]).transpose(3, 2, 0, 1)
        elif i == len(convs):
            out = kernel.shape[1]
            kernel = kernel.reshape(*grid, out).transpose(3, 2, 0, 1).reshape(out, -1)
        else:
            kernel = kernel.T
        weights += [kernel, bias]
    twin = TORCH_MODELS[name][0]()
    keys = list(twin.state_dict())
    state = {k: torch.tensor(np.ascontiguousarray(w)) for k, w in zip(keys, weights, strict=True)}
    twin.load_state_dict(state, strict=True)
    with torch.no_grad():
        logits = twin(torch.tensor(np.asarray(xs).transpose(0, 3, 1, 2)))
        got = torch.nn.functional.cross_entropy(
            logits, torch.tensor(np.asarray(ys), dtype=torch.long), reduction="none"
        ).numpy()
    want = np.asarray(jax.jit(jax.vmap(model.loss, in_axes=(None, 0, 0)))(params, xs, ys))
    # float32 losses ~2.3 from sums of ≤ 800 terms: agree to ~1e-6 (a pool with another
    # offset or the dense layer flattened in (h, w, c) order moves them by > 1e-2)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)


@pytest.mark.slow  # ~2 s of flax tracing; the twin test checks cnn_im2col against torch too
def test_im2col_cnn_is_the_conv_cnn():
    """``cnn_im2col`` (convolutions as patches @ kernel) computes ``cnn`` (flax ``nn.Conv``)
    on the same weights: the conv kernels (f, f, I, O) flattened to (f·f·I, O)."""
    conv, dense = models.make_model("cnn"), models.make_model("cnn_im2col")
    params = conv.init(jax.random.key(0))
    xs, ys = conv.data(jax.random.key(1), 8)
    as_dense = {
        f"Dense_{i}": {
            "kernel": layer["kernel"].reshape(-1, layer["kernel"].shape[-1]),
            "bias": layer["bias"],
        }
        for i, layer in enumerate(
            [params["Conv_0"], params["Conv_1"], params["Dense_0"], params["Dense_1"]]
        )
    }
    assert jax.tree.structure(as_dense) == jax.tree.structure(dense.init(jax.random.key(0)))
    per_example = lambda m, p: jax.vmap(m.loss, in_axes=(None, 0, 0))(p, xs, ys)  # noqa: E731
    np.testing.assert_allclose(
        per_example(dense, as_dense), per_example(conv, params), rtol=2e-6, atol=0
    )


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
