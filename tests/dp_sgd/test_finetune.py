"""Private fine-tuning of part of a model: partition, LoRA, bias-only, and the experiment."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dpjax
from dpjax.dp_sgd import finetune as ft


def _mlp(key, d_in=8, hidden=16, classes=3):
    k1, k2 = jax.random.split(key)
    return {
        "dense_0": {"kernel": jax.random.normal(k1, (d_in, hidden)), "bias": jnp.ones(hidden)},
        "head": {"kernel": jax.random.normal(k2, (hidden, classes)), "bias": jnp.zeros(classes)},
    }


def _loss(params, example):
    h = jnp.tanh(ft.lora_dense(params["dense_0"], example["x"], alpha=2.0))
    out = ft.lora_dense(params["head"], h, alpha=2.0)
    return optax.softmax_cross_entropy_with_integer_labels(out, example["y"])


def _data(n=64, d_in=8):
    x = jax.random.normal(jax.random.key(5), (n, d_in))
    return {"x": x, "y": jnp.arange(n) % 3}


def _private(loss, n, *, sigma=1.0, lr=0.1, steps=3, clipping="auto", key=3):
    return dpjax.make_private(
        loss, optimizer=optax.sgd(lr), l2_clip_norm=1.0, dataset_size=n, batch_size=n // 4,
        steps=steps, noise_multiplier=sigma, delta=1e-3, key=jax.random.key(key),
        clipping=clipping, accounting="rdp",
    )  # fmt: skip


def _bits(tree):
    return [np.asarray(leaf).tobytes() for leaf in jax.tree.leaves(tree)]


def test_partition_splits_every_leaf_once_and_combine_inverts_it():
    params = _mlp(jax.random.key(0))
    trainable, frozen = ft.partition(params, ft.any_of(ft.is_bias, ft.under("head")))
    assert ft.num_params(trainable) == 16 + 16 * 3 + 3
    assert ft.num_params(frozen) == 8 * 16
    assert trainable["dense_0"]["kernel"] is None and frozen["head"]["kernel"] is None
    assert _bits(ft.combine(trainable, frozen)) == _bits(params)
    assert jax.tree.structure(ft.combine(trainable, frozen)) == jax.tree.structure(params)


def test_partition_refuses_an_empty_selection_and_a_bad_rank():
    with pytest.raises(ValueError, match="predicate"):
        ft.partition(_mlp(jax.random.key(0)), lambda path, leaf: False)
    with pytest.raises(ValueError, match="rank"):
        ft.add_lora(jax.random.key(0), _mlp(jax.random.key(0)), 0)
    with pytest.raises(ValueError, match="params"):
        ft.add_lora(jax.random.key(0), {"w": jnp.ones((2, 2))}, 1)


@pytest.mark.slow  # ~6 s of CPU (make_private's ghost step compiles); vmap: the noise test
def test_frozen_params_are_bit_identical_after_private_fit_with_ghost_clipping():
    """Real gradients reach the frozen kernel's layer; it must come back bit for bit (the
    vmap backend is attacked by the zero-gradient noise test below)."""
    clipping = "ghost"
    data = _data()
    params = ft.add_lora(jax.random.key(1), _mlp(jax.random.key(0)), 2)
    trainable, frozen = ft.partition(params, ft.any_of(ft.is_lora, ft.under("head")))
    private = _private(ft.trainable_loss(_loss, frozen), 64, clipping=clipping)
    trained, state, _ = private.fit(trainable, data, progress=False)
    after = ft.combine(trained, frozen)
    assert _bits(after["dense_0"]["kernel"]) == _bits(params["dense_0"]["kernel"])
    assert _bits(after["dense_0"]["bias"]) == _bits(params["dense_0"]["bias"])
    for leaf, before in zip(jax.tree.leaves(trained), jax.tree.leaves(trainable), strict=True):
        assert not np.array_equal(leaf, before)  # every trainable leaf got noise (σ = 1)
    assert int(state.step) == 3


def test_noise_is_added_to_the_trainable_coordinates_only_at_sigma_c_over_qn():
    """A zero-gradient LoRA run: the update is −lr·noise/(q·n), N(0, (σC/(qn))²) in the
    d = num_params(adapters) coordinates, and nothing anywhere else."""
    d_in, hidden, rank, n, sigma = 64, 64, 8, 400, 2.0
    params = ft.add_lora(jax.random.key(1), _mlp(jax.random.key(0), d_in, hidden), rank)
    trainable, frozen = ft.partition(params, ft.is_lora)

    def zero_loss(p, example):
        return 0.0 * _loss(p, example)

    private = _private(
        ft.trainable_loss(zero_loss, frozen), n, sigma=sigma, lr=1.0, steps=1, clipping="vmap"
    )
    trained, _, _ = private.fit(trainable, _data(n, d_in), progress=False)
    moved = np.concatenate([
        (np.asarray(a, np.float64) - np.asarray(b, np.float64)).ravel()
        for a, b in zip(jax.tree.leaves(trained), jax.tree.leaves(trainable), strict=True)
    ])  # fmt: skip
    d = ft.num_params(trainable)
    assert moved.size == d == d_in * rank + rank * hidden + hidden * rank + rank * 3
    expected = (sigma * 1.0 / private.expected_batch_size) ** 2
    # sample variance of d i.i.d. normals: relative standard error sqrt(2/d) (≈ 0.04 here);
    # 5 standard errors accept the right scale and reject 1.5× or 1/1.5× the variance
    tol = 5 * math.sqrt(2 / d)
    assert abs(np.mean(moved**2) / expected - 1) < tol
    assert tol < 0.5
    assert abs(np.mean(moved)) < 5 * math.sqrt(expected / d)
    after = ft.combine(trained, frozen)
    for layer in ("dense_0", "head"):
        for name in ("kernel", "bias"):
            assert _bits(after[layer][name]) == _bits(params[layer][name])


def test_lora_forward_is_the_pretrained_layer_plus_alpha_over_r_a_b():
    k = jax.random.split(jax.random.key(0), 4)
    w0, a = jax.random.normal(k[0], (5, 7)), jax.random.normal(k[1], (5, 3))
    b, x = jax.random.normal(k[2], (3, 7)), jax.random.normal(k[3], (4, 5))
    got = ft.lora_apply(w0, a, b, x, alpha=6.0)
    w0_, a_, b_, x_ = (np.asarray(v, np.float64) for v in (w0, a, b, x))
    want = x_ @ (w0_ + 6.0 / 3 * a_ @ b_)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    layer = {"kernel": w0, "bias": jnp.ones(7), "lora_a": a, "lora_b": b}
    merged = ft.merge_lora({"l": layer}, alpha=6.0)["l"]
    assert set(merged) == {"kernel", "bias"}
    np.testing.assert_allclose(ft.lora_dense(merged, x), want + 1.0, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ft.lora_dense(layer, x, alpha=6.0), want + 1.0, rtol=1e-5,
                               atol=1e-5)  # fmt: skip


def test_add_lora_starts_at_the_pretrained_function():
    params = _mlp(jax.random.key(0))
    adapted = ft.add_lora(jax.random.key(1), params, 4, layers=lambda path, _: path[0] != "head")
    assert "lora_a" not in adapted["head"] and adapted["dense_0"]["lora_a"].shape == (8, 4)
    assert not np.any(np.asarray(adapted["dense_0"]["lora_b"]))
    ex = {"x": jnp.ones(8), "y": jnp.asarray(1)}
    assert float(_loss(adapted, ex)) == float(_loss(params, ex))


def test_ghost_clipping_treats_the_adapters_as_dense_layers_and_matches_vmap():
    from dpjax.dp_sgd import ghost

    data = _data()
    params = ft.add_lora(jax.random.key(1), _mlp(jax.random.key(0)), 2)
    trainable, frozen = ft.partition(params, ft.any_of(ft.is_lora, ft.under("head")))
    trainable = jax.tree.map(lambda v: v + 0.3, trainable)  # B ≠ 0: adapters get gradients
    loss = ft.trainable_loss(_loss, frozen)
    plan, _ = ghost.plan(loss, trainable, data)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(trainable)]
    tapped = {paths[i] for i in plan.tapped_leaves}
    assert {"['dense_0']['lora_a']", "['dense_0']['lora_b']", "['head']['kernel']"} <= tapped
    s_vmap, i_vmap = dpjax.clipped_grad(loss, l2_clip_norm=1.0, backend="vmap")(trainable, data)
    s_ghost, i_ghost = dpjax.clipped_grad(loss, l2_clip_norm=1.0, backend="ghost")(trainable, data)
    np.testing.assert_allclose(i_ghost.per_example_norms, i_vmap.per_example_norms, rtol=1e-4)
    for a, b in zip(jax.tree.leaves(s_ghost), jax.tree.leaves(s_vmap), strict=True):
        np.testing.assert_allclose(a, b, rtol=5e-3, atol=5e-3)  # the shrink f differs by ~1e-3


def test_trainable_loss_passes_the_dropout_key_when_the_loss_takes_one():
    trainable, frozen = ft.partition({"w": jnp.ones(2), "bias": jnp.zeros(())}, ft.is_bias)

    def with_rng(p, example, rng):
        return p["bias"] + jax.random.uniform(rng) + p["w"] @ example

    wrapped = ft.trainable_loss(with_rng, frozen)
    assert "rng" in __import__("inspect").signature(wrapped).parameters
    k = jax.random.key(0)
    assert float(wrapped(trainable, jnp.ones(2), rng=k)) == float(
        with_rng({"w": jnp.ones(2), "bias": jnp.zeros(())}, jnp.ones(2), k)
    )
    assert "rng" not in __import__("inspect").signature(ft.trainable_loss(_loss, frozen)).parameters


def test_bias_and_last_layer_predicates_select_what_they_say():
    params = _mlp(jax.random.key(0))
    names = lambda tree: sorted(  # noqa: E731
        jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(tree)
    )
    assert names(ft.partition(params, ft.is_bias)[0]) == ["['dense_0']['bias']", "['head']['bias']"]
    assert names(ft.partition(params, ft.under("head"))[0]) == [
        "['head']['bias']", "['head']['kernel']"]  # fmt: skip


@pytest.mark.slow
def test_experiment_tiny_run_reports_every_mode_with_its_dimension(tmp_path):
    pytest.importorskip("sklearn")
    from experiments import finetune

    with jax.numpy_dtype_promotion("standard"):  # optax.adam mixes an int count into a power
        out = finetune.run(tmp_path, size="tiny")
    modes = {r["mode"]: r for r in out["rows"]}
    assert set(modes) == set(finetune.MODES)
    assert modes["scratch"]["d"] == modes["full"]["d"] > modes["lora"]["d"]
    assert modes["lora"]["d"] > modes["bias"]["d"] > modes["last_layer"]["d"] == 64 * 5 + 5
    assert all(r["epsilon"] <= 1.0 for r in out["rows"])
    assert "private fine-tuning from a public model beats scratch at ε = 1" in out["report_md"]
    assert (tmp_path / "finetune.json").is_file()
    assert "### A small transformer on synthetic public text" in out["report_md"]
    assert {r["mode"] for r in out["text_rows"]} == set(finetune.MODES)
    assert (tmp_path / "finetune_text.json").is_file()


@pytest.mark.slow
def test_lora_example_runs_as_written():
    import pathlib
    import subprocess
    import sys

    pytest.importorskip("sklearn")
    out = subprocess.run(
        [sys.executable, "-m", "examples.lora_finetune"],
        cwd=pathlib.Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    assert "LoRA: d = " in out.stdout and "ε = " in out.stdout
