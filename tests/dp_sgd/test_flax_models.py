"""flax.linen and flax.nnx models under clipped_grad / dp_sgd_optimizer, and the digits example."""

import subprocess
import sys
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import dpjax

ROOT = Path(__file__).resolve().parents[2]


def reference_clipped_sum(loss_fn, params, x, y, C):
    """Independent reference: vmap(grad), then clip and sum in NumPy (float64)."""
    grads = jax.vmap(jax.grad(loss_fn), in_axes=(None, 0, 0))(params, x, y)
    leaves, treedef = jax.tree.flatten(grads)
    flat = np.concatenate([np.asarray(g, np.float64).reshape(len(x), -1) for g in leaves], axis=1)
    norms = np.linalg.norm(flat, axis=1)
    total = (np.minimum(1.0, C / norms)[:, None] * flat).sum(axis=0)
    return total, norms


def flatten(tree):
    return np.concatenate([np.asarray(g, np.float64).ravel() for g in jax.tree.leaves(tree)])


@pytest.fixture
def digits_batch(key):
    x = jax.random.uniform(key, (16, 64), dtype=jnp.float32)
    y = jnp.arange(16, dtype=jnp.int32) % 10
    return x, y


class LinenMLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(10)(jnp.tanh(nn.Dense(32)(x)))


@pytest.mark.parametrize("method", ["vmap", "auto"])
def test_linen_model(key, digits_batch, method):
    x, y = digits_batch
    model = LinenMLP()
    params = model.init(key, x[:1])["params"]

    def loss_fn(p, xi, yi):
        logits = model.apply({"params": p}, xi)
        return optax.softmax_cross_entropy_with_integer_labels(logits, yi)

    grad_fn = dpjax.clipped_grad(loss_fn, l2_clip_norm=0.5, backend=method)
    s, info = jax.jit(grad_fn)(params, x, y)
    ref, norms = reference_clipped_sum(loss_fn, params, x, y, 0.5)
    np.testing.assert_allclose(flatten(s), ref, rtol=2e-4, atol=1e-6)
    np.testing.assert_allclose(info.per_example_norms, norms, rtol=1e-4)
    assert jax.tree.structure(s) == jax.tree.structure(params)


class NnxMLP(nnx.Module):
    def __init__(self, rngs):
        self.l1 = nnx.Linear(64, 32, rngs=rngs)
        self.l2 = nnx.Linear(32, 10, rngs=rngs)

    def __call__(self, x):
        return self.l2(jnp.tanh(self.l1(x)))


def test_nnx_model_trains_with_split_merge(key, digits_batch):
    x, y = digits_batch
    model = NnxMLP(nnx.Rngs(0))
    graphdef, state = nnx.split(model, nnx.Param)

    def loss_fn(st, xi, yi):
        logits = nnx.merge(graphdef, st)(xi)
        return optax.softmax_cross_entropy_with_integer_labels(logits, yi)

    grad_fn = dpjax.clipped_grad(loss_fn, l2_clip_norm=1.0)
    s, _ = jax.jit(grad_fn)(state, x, y)
    ref, _ = reference_clipped_sum(loss_fn, state, x, y, 1.0)
    np.testing.assert_allclose(flatten(s), ref, rtol=2e-4, atol=1e-6)

    tx = dpjax.dp_sgd_optimizer(
        optimizer=optax.sgd(0.5), noise_multiplier=0.5, l2_clip_norm=1.0, normalizer=16.0, key=key
    )

    @jax.jit
    def step(st, opt_state):
        clipped_sum, _ = grad_fn(st, x, y)
        updates, opt_state = tx.update(clipped_sum, opt_state, st)
        return optax.apply_updates(st, updates), opt_state

    opt_state = tx.init(state)
    losses = []
    for _ in range(30):
        losses.append(float(jnp.mean(jax.vmap(loss_fn, (None, 0, 0))(state, x, y))))
        state, opt_state = step(state, opt_state)
    nnx.update(model, state)
    final = float(
        jnp.mean(jax.vmap(lambda xi, yi: loss_fn(nnx.state(model, nnx.Param), xi, yi))(x, y))
    )
    assert final < 0.7 * losses[0]


def test_digits_example_reaches_sensible_accuracy_and_reports_epsilon():
    pytest.importorskip("sklearn")
    dp_accounting = pytest.importorskip("dp_accounting")
    from dpjax.dp_sgd.private import SLACK_FRACTION
    from examples.flax_digits import train

    result = train(
        target_epsilon=None, noise_multiplier=1.5, epochs=None, steps=200, learning_rate=0.2, seed=1
    )
    assert result["test_accuracy"] > 0.8  # chance is 0.1; 450 steps at ε = 3 reach ~0.93
    # ε cross-checked against dp_accounting's PLD accountant directly, at the δ left after the
    # truncation slack (make_private sets aside SLACK_FRACTION·δ for it)
    q, T = result["sampling_rate"], result["steps"]
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(1.5)), T
    )
    accountant = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    ref = accountant.compose(event).get_epsilon(1e-5 * (1 - SLACK_FRACTION))
    assert result["epsilon"] == pytest.approx(ref, rel=0.02)
    assert result["delta"] == 1e-5
    assert isinstance(result["event"], dpjax.accounting.PoissonSampledGaussianEvent)
    assert result["event"].count == T and result["event"].sampling_rate == q
    assert result["history"]["epsilon"][-1] == result["epsilon"]


@pytest.mark.slow
def test_example_runs_as_a_script():
    out = subprocess.run(
        [sys.executable, "examples/flax_digits.py", "--epochs", "1", "--no-progress"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert "test accuracy" in out.stdout and "ε =" in out.stdout
