"""benchmarks.llama_block: the LoRA Llama block's DP step under ghost clipping, and its twin."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks.llama_block import PROJECTIONS, SIZE, frozen_weights, llama_block_model
from dpjax.dp_sgd import ghost
from dpjax.dp_sgd.clipping import clipped_grad

# every shape rule of the full block (GQA 3:1, RoPE on even head dims, SwiGLU), tiny
TINY = {"width": 24, "heads": 6, "kv_heads": 2, "mlp": 40, "seq": 5, "rank": 3}


@pytest.fixture(scope="module")
def tiny():
    model = llama_block_model(**TINY)
    params = jax.tree.map(lambda a: a + 0.1, jax.jit(model.init)(jax.random.key(0)))  # B != 0
    xs, ys = jax.jit(model.data, static_argnums=1)(jax.random.key(1), 4)
    return model, params, xs, ys


def test_every_lora_adapter_is_a_ghost_tap():
    model = llama_block_model(**TINY)  # traced on shapes only: no compile
    params = jax.eval_shape(model.init, jax.random.key(0))
    xs = ys = jax.ShapeDtypeStruct((4, TINY["seq"], TINY["width"]), jnp.float32)
    plan, _ = ghost.plan(model.loss, params, xs, ys)
    assert len(plan.taps) == 2 * len(PROJECTIONS) == len(params)


@pytest.mark.slow  # ~10 s of compiles; the default twin: every adapter is a ghost tap
def test_ghost_clipped_sum_equals_the_per_example_reference(tiny):
    model, params, xs, ys = tiny
    clip = 0.05  # below every example's norm: every example is scaled
    got, info = jax.jit(clipped_grad(model.loss, l2_clip_norm=clip, backend="auto"))(params, xs, ys)
    per_example = jax.jit(jax.vmap(jax.grad(model.loss), in_axes=(None, 0, 0)))(params, xs, ys)
    norms = jnp.sqrt(
        sum(jnp.sum(g * g, axis=tuple(range(1, g.ndim))) for g in per_example.values())
    )
    scale = jnp.minimum(1.0, clip / norms)
    want = jax.tree.map(lambda g: jnp.tensordot(scale, g, axes=1), per_example)
    np.testing.assert_allclose(info.per_example_norms, norms, rtol=1e-5)
    assert float(jnp.min(norms)) > clip
    for name in params:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-7)


def test_full_size_block_has_smollm2_shapes():
    frozen = frozen_weights(SIZE)
    assert frozen["q"].shape == (576, 576) and frozen["k"].shape == (576, 192)
    assert frozen["gate"].shape == (576, 1536) and frozen["down"].shape == (1536, 576)


@pytest.mark.torch  # needs the bench-torch extra: `make test-torch`
def test_torch_twin_computes_the_same_per_sequence_losses(tiny):
    import torch

    from benchmarks import torch_side

    model, params, xs, ys = tiny
    frozen = frozen_weights(SIZE | TINY)
    twin = torch_side.TORCH_MODELS["llama_block"][0](**TINY)
    with torch.no_grad():
        for name in PROJECTIONS:
            layer = getattr(twin, name)
            for weight, value in ((layer.base, frozen[name]), (layer.a, params[f"A_{name}"])):
                weight.weight.copy_(torch.tensor(np.asarray(value).T))
            layer.b.weight.copy_(torch.tensor(np.asarray(params[f"B_{name}"]).T))
        out = twin(torch.tensor(np.asarray(xs)))
        got = torch_side.SequenceMSE("none")(out, torch.tensor(np.asarray(ys))).numpy()
    want = jax.vmap(model.loss, in_axes=(None, 0, 0))(params, xs, ys)
    np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.slow  # compiles; the non-private step's batched loss is the per-example mean
def test_batched_loss_is_the_mean_of_the_per_example_losses(tiny):
    model, params, xs, ys = tiny
    per_example = jax.jit(jax.vmap(model.loss, in_axes=(None, 0, 0)))(params, xs, ys)
    np.testing.assert_allclose(
        jax.jit(model.batch_loss)(params, xs, ys), per_example.mean(), rtol=1e-5
    )
