"""Time to accuracy beside Opacus: both frameworks get the same model, preprocessing and step
count; without torch the experiment says so. Tiny synthetic fixtures only (no MNIST files)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from experiments import opacus_mnist, registry


def test_both_frameworks_run_the_same_number_of_steps_as_the_papers_epochs():
    """⌈epochs·n/b⌉: one epoch at the quick scale, the papers' 40 and 15 epochs at full."""
    assert opacus_mnist.steps_for("tb_cnn", "quick", 60_000) == 118  # 60 000/512 = 117.2
    assert opacus_mnist.steps_for("opacus_example", "quick", 60_000) == 250  # q = 0.004
    assert opacus_mnist.steps_for("tb_cnn", "full", 60_000) == 4688
    assert opacus_mnist.steps_for("opacus_example", "full", 60_000) == 3750
    example = opacus_mnist.SETTINGS["opacus_example"]
    assert example["batch_size"] / 60_000 == 0.004 and example["noise_multiplier"] == 1.3
    assert (example["l2_clip_norm"], example["learning_rate"], example["momentum"]) == (
        1.5, 0.25, 0.0,
    )  # fmt: skip


def test_preprocessing_is_to_tensor_then_the_examples_normalisation():
    x = np.array([[[0, 255]]], np.uint8)
    np.testing.assert_allclose(opacus_mnist.images(x, False), [[[0.0, 1.0]]])
    np.testing.assert_allclose(
        opacus_mnist.images(x, True), [[[-0.1307 / 0.3081, (1 - 0.1307) / 0.3081]]], rtol=1e-6
    )


def test_without_torch_the_section_says_skipped_and_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    summary = opacus_mnist.run(tmp_path)
    assert summary["verdict"].startswith("SKIPPED")
    assert "bench-torch" in summary["report_md"]
    assert not (tmp_path / "opacus_mnist.json").exists()
    assert "opacus_mnist" in registry.BY_NAME_ONLY and "opacus_mnist" not in registry.ORDER


def _synthetic(setting: str, n_train: int = 300, n_test: int = 100) -> dict:
    rng = np.random.default_rng(0)

    def part(n):
        y = rng.integers(0, 10, n)
        x = rng.integers(0, 50, (n, 28, 28)).astype(np.uint8)
        for k in range(10):
            x[y == k, 2 * k : 2 * k + 3, :] = 255
        return opacus_mnist.images(x, opacus_mnist.SETTINGS[setting]["normalise"]), y

    xtr, ytr = part(n_train)
    xte, yte = part(n_test)
    return dict(xtr=xtr, ytr=ytr.astype(np.int32), xte=xte, yte=yte)


@pytest.mark.torch
def test_the_torch_and_flax_models_have_the_same_layers():
    """Same parameter shapes (up to the layout: OIHW vs HWIO, out×in vs in×out) and output."""
    import jax
    import torch
    from flax import nnx

    for setting in opacus_mnist.SETTINGS:
        jax_model = opacus_mnist.build_jax_model(setting, jax.random.key(0))
        torch_model = opacus_mnist.build_torch_model(setting)
        jax_sizes = sorted(
            int(np.size(v)) for v in jax.tree.leaves(nnx.state(jax_model, nnx.Param))
        )
        torch_sizes = sorted(p.numel() for p in torch_model.parameters())
        assert jax_sizes == torch_sizes
        assert torch_model(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
        assert jax_model(np.zeros((2, 28, 28, 1), np.float32)).shape == (2, 10)


@pytest.mark.torch
def test_smoke_scale_runs_both_frameworks_with_the_same_steps():
    data = _synthetic("opacus_example")
    rows = opacus_mnist.measure("opacus_example", "smoke", data=data)
    assert [r["framework"] for r in rows] == ["dpjax", "opacus"]
    for row in rows:
        assert row["steps"] == 3 and row["seconds"] > 0 and row["cpu_seconds"] > 0
        assert 0 < row["epsilon"] < float("inf") and 0 <= row["test_accuracy"] <= 1
    assert "| dpjax |" in opacus_mnist.markdown(rows) and "| opacus |" in opacus_mnist.markdown(
        rows
    )


def test_the_readmes_other_rows_have_its_commands_settings():
    """Opacus's examples/mnist_README.md: ``-n=45 --lr=.25 --sigma=.7 -c=1.5``, ``-n 60
    --lr=.15 --sigma=1.1 -c=1.0`` and ``--disable-dp --n=20 --lr=.1``, all at -sr=0.004."""
    settings = opacus_mnist.SETTINGS
    got = {
        name: tuple(settings[name][k] for k in
                    ("epochs", "learning_rate", "noise_multiplier", "l2_clip_norm", "published"))
        for name in ("opacus_example_sigma0.7", "opacus_example_sigma1.1",
                     "opacus_example_nonprivate")
    }  # fmt: skip
    assert got == {
        "opacus_example_sigma0.7": (45, 0.25, 0.7, 1.5, 97.09),
        "opacus_example_sigma1.1": (60, 0.15, 1.1, 1.0, 96.78),
        "opacus_example_nonprivate": (20, 0.1, None, None, 98.94),
    }
    assert opacus_mnist.steps_for("opacus_example_sigma0.7", "full", 60_000) == 45 * 250
    assert opacus_mnist.steps_for("opacus_example_sigma1.1", "full", 60_000) == 60 * 250
    assert opacus_mnist.steps_for("opacus_example_nonprivate", "full", 60_000) == 20 * 250
    assert not opacus_mnist.is_private("opacus_example_nonprivate")
    assert opacus_mnist.is_private("opacus_example_sigma0.7")
    assert opacus_mnist.DEFAULT_SETTINGS == ("tb_cnn", "opacus_example")


def test_shuffled_batches_visit_each_example_once_an_epoch():
    """n = 10, batch 3: 3 batches an epoch (one example dropped), 7 steps = 2 epochs + 1."""
    order = opacus_mnist.shuffled_batches(10, 3, 7, seed=0)
    assert order.shape == (7, 3)
    for epoch in (order[:3], order[3:6]):
        assert len(set(epoch.ravel())) == 9 and set(epoch.ravel()) <= set(range(10))
    assert not np.array_equal(order[:3], order[3:6])  # reshuffled each epoch
    np.testing.assert_array_equal(order, opacus_mnist.shuffled_batches(10, 3, 7, seed=0))
    with pytest.raises(ValueError, match="batch_size"):
        opacus_mnist.shuffled_batches(10, 11, 1, seed=0)


def test_run_refuses_an_unknown_setting_or_framework(tmp_path):
    with pytest.raises(ValueError, match="settings must be in"):
        opacus_mnist.run(tmp_path, settings=("opacus_example_sigma9",))
    with pytest.raises(ValueError, match="frameworks"):
        opacus_mnist.run(tmp_path, frameworks=("tensorflow",))


@pytest.mark.torch
def test_the_non_private_baseline_trains_without_noise_in_both_frameworks():
    data = _synthetic("opacus_example_nonprivate")
    rows = opacus_mnist.measure("opacus_example_nonprivate", "smoke", data=data)
    for row in rows:
        assert row["steps"] == 3 and row["epsilon"] is None
        assert row["accountant"] == "none (non-private)" and 0 <= row["test_accuracy"] <= 1
    assert "| ∞ (none (non-private)) |" in opacus_mnist.markdown(rows)


def test_the_torch_init_draws_pytorchs_default_laws_and_flax_its_own():
    """init="torch": every weight and bias in ±1/√fan_in (PyTorch's Conv2d/Linear default,
    kaiming_uniform(a=√5)), spread like U(±1/√fan_in) (sd bound/√3); init="flax": LeCun
    normal (sd 1/√fan_in, √3 times wider) and zero biases. fc1 has 16 384 weights: the sample
    sd's relative standard error is ≈ 0.4 %, so 5 % tolerances separate the two laws."""
    import jax
    from flax import nnx

    fan_in = {"conv1": 64, "conv2": 256, "fc1": 512, "fc2": 32}
    shapes = {"conv1": (8, 8, 1, 16), "conv2": (4, 4, 16, 32), "fc1": (512, 32), "fc2": (32, 10)}
    models = {init: opacus_mnist.build_jax_model("opacus_example_nonprivate", jax.random.key(0),
                                                 init) for init in opacus_mnist.INITS}  # fmt: skip
    for layer, fan in fan_in.items():
        bound = 1 / np.sqrt(fan)
        torch_layer = getattr(models["torch"], layer)
        kernel, bias = np.asarray(torch_layer.kernel.value), np.asarray(torch_layer.bias.value)
        assert kernel.shape == shapes[layer] and bias.shape == shapes[layer][-1:]
        assert np.abs(kernel).max() <= bound and np.abs(bias).max() <= bound
        assert np.abs(bias).max() > 0.3 * bound  # drawn, not zero
        flax_layer = getattr(models["flax"], layer)
        assert np.all(np.asarray(flax_layer.bias.value) == 0)
        if kernel.size >= 1024:
            assert np.std(kernel) == pytest.approx(bound / np.sqrt(3), rel=0.05)
            assert np.abs(kernel).max() > 0.95 * bound
            assert np.std(np.asarray(flax_layer.kernel.value)) == pytest.approx(bound, rel=0.05)
    assert opacus_mnist.SETTINGS["opacus_example_nonprivate"]["init"] == "torch"
    with pytest.raises(ValueError, match="init must be one of"):
        opacus_mnist.build_jax_model("opacus_example", jax.random.key(0), "kaiming")
    assert len(nnx.state(models["torch"], nnx.Param)) == 4


def _copy_torch_weights(torch_model, jax_model):
    """torch (OIHW kernels, out×in matrices, NCHW flatten) → flax (HWIO, in×out, NHWC)."""
    import jax.numpy as jnp

    sd = {k: v.detach().numpy() for k, v in torch_model.state_dict().items()}
    fc1 = sd["7.weight"].reshape(32, 32, 4, 4).transpose(2, 3, 1, 0).reshape(512, 32)
    kernels = {
        "conv1": sd["0.weight"].transpose(2, 3, 1, 0),
        "conv2": sd["3.weight"].transpose(2, 3, 1, 0),
        "fc1": fc1,
        "fc2": sd["9.weight"].T,
    }
    for (name, kernel), bias in zip(kernels.items(), ("0.bias", "3.bias", "7.bias", "9.bias")):
        getattr(jax_model, name).kernel.value = jnp.asarray(kernel)
        getattr(jax_model, name).bias.value = jnp.asarray(sd[bias])


@pytest.mark.torch
def test_from_the_same_weights_the_non_private_sgd_step_is_torchs():
    """torch's initial weights copied into the flax model: the same logits, then the same
    parameters after plain SGD steps on the same batches (float32 tolerance): the dpjax
    baseline's step is Opacus's, only the initial weights and the random stream differ."""
    import jax
    import jax.numpy as jnp
    import torch

    import dpjax

    setting = "opacus_example_nonprivate"
    data = _synthetic(setting, n_train=120)
    torch.manual_seed(0)
    torch_model = opacus_mnist.build_torch_model(setting)
    jax_model = opacus_mnist.build_jax_model(setting, jax.random.key(0))
    _copy_torch_weights(torch_model, jax_model)
    x, y = data["xtr"], data["ytr"]
    torch_x, torch_y = torch.from_numpy(x[:, None]), torch.from_numpy(y.astype(np.int64))
    np.testing.assert_allclose(np.asarray(jax_model(jnp.asarray(x[..., None]))),
                               torch_model(torch_x).detach().numpy(), atol=1e-5)  # fmt: skip
    loss_fn, params = dpjax.dp_sgd.nnx_loss(jax_model, opacus_mnist._jax_example_loss)
    sgd = torch.optim.SGD(torch_model.parameters(), lr=0.1)
    mean_loss = lambda p, b: jnp.mean(  # noqa: E731
        jax.vmap(loss_fn, (None, 0, None))(p, {"x": x[b], "y": y[b]}, jax.random.key(0))
    )
    for rows in opacus_mnist.shuffled_batches(len(y), 40, 3, seed=0):
        sgd.zero_grad()
        torch.nn.CrossEntropyLoss()(torch_model(torch_x[rows]), torch_y[rows]).backward()
        sgd.step()
        grads = jax.grad(mean_loss)(params, rows)
        params = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)
    from flax import nnx

    nnx.update(jax_model, params)
    np.testing.assert_allclose(np.asarray(jax_model(jnp.asarray(x[..., None]))),
                               torch_model(torch_x).detach().numpy(), atol=1e-4)  # fmt: skip
