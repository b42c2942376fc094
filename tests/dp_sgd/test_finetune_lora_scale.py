"""LoRA's scale α: a merged model computes the adapted one, and a bad α is refused by name."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpjax.dp_sgd import finetune as ft

ALPHA = 8.0


def _adapted():
    k1, k2, k3, k4 = jax.random.split(jax.random.key(0), 4)
    params = {
        "dense_0": {"kernel": jax.random.normal(k1, (3, 4)), "bias": jnp.ones(4)},
        "head": {"kernel": jax.random.normal(k2, (4, 2))},
    }
    params = ft.add_lora(k3, params, rank=2)
    # "trained" adapters: B moved away from 0
    for i, name in enumerate(("dense_0", "head")):
        shape = params[name]["lora_b"].shape
        params[name]["lora_b"] = jax.random.normal(jax.random.fold_in(k4, i), shape)
    return params


def _forward(p, x, **alpha):
    return ft.lora_dense(p["head"], jnp.tanh(ft.lora_dense(p["dense_0"], x, **alpha)), **alpha)


def test_merged_model_computes_the_adapted_model_at_its_alpha():
    params = _adapted()
    x = jax.random.normal(jax.random.key(1), (5, 3))
    merged = ft.merge_lora(params, alpha=ALPHA)
    assert "lora_a" not in merged["head"]
    np.testing.assert_allclose(
        np.asarray(_forward(merged, x)), np.asarray(_forward(params, x, alpha=ALPHA)),
        rtol=1e-6, atol=1e-6,
    )  # fmt: skip
    # the closed form of one layer: x·W₀ + b + (α/r)·x·A·B
    layer = params["dense_0"]
    want = (
        x @ layer["kernel"] + layer["bias"] + (ALPHA / 2) * (x @ layer["lora_a"]) @ layer["lora_b"]
    )
    got = ft.lora_dense(merged["dense_0"], x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)


def test_merge_without_the_training_alpha_is_refused():
    # the parameters do not record α: a merge at a default α = 1 computed another model
    with pytest.raises(ValueError, match="alpha"):
        ft.merge_lora(_adapted())


@pytest.mark.parametrize("alpha", [float("nan"), 0.0, -1.0, float("inf")])
def test_bad_alpha_is_refused_everywhere(alpha):
    params = _adapted()
    layer = params["dense_0"]
    x = jnp.ones((1, 3))
    with pytest.raises(ValueError, match="alpha"):
        ft.lora_dense(layer, x, alpha=alpha)
    with pytest.raises(ValueError, match="alpha"):
        ft.lora_apply(layer["kernel"], layer["lora_a"], layer["lora_b"], x, alpha)
    with pytest.raises(ValueError, match="alpha"):
        ft.merge_lora(params, alpha=alpha)


def test_alpha_under_jit_is_used_as_given():
    params = _adapted()
    x = jnp.ones((2, 3))
    jitted = jax.jit(lambda a: ft.lora_dense(params["dense_0"], x, alpha=a))(ALPHA)
    np.testing.assert_allclose(
        np.asarray(jitted), np.asarray(ft.lora_dense(params["dense_0"], x, alpha=ALPHA)),
        rtol=1e-6,
    )  # fmt: skip
