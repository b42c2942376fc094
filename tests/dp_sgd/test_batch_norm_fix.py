"""GroupNorm in place of BatchNorm: the nnx fixer and the linen recipe of the tuning guide.

The claims: after ``replace_batch_norm`` no BatchNorm is left (shared ones included), each
example's output depends on that example only (checked against the example run alone), the
layer computes group normalisation (checked against a NumPy reference), ``nnx_loss`` accepts
the fixed model where it refused the original, and bad input raises ``ValueError`` by name.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import dpjax
from dpjax.dp_sgd.norm_layers import group_count, replace_batch_norm


class DenseBN(nnx.Module):
    """A layer, a BatchNorm (shared by two paths), another in a list, a head: the model Opacus
    would fix (dense layers, not convolutions: their initialisers compile ~4x slower on CPU)."""

    def __init__(self, rngs: nnx.Rngs, channels: int = 12):
        self.hidden = nnx.Linear(6, channels, rngs=rngs)
        self.norm = nnx.BatchNorm(channels, rngs=rngs)
        self.blocks = nnx.List([nnx.BatchNorm(channels, rngs=rngs), self.norm])
        self.head = nnx.Linear(channels, 4, rngs=rngs)

    def __call__(self, x):
        return self.head(nnx.relu(self.blocks[0](self.norm(self.hidden(x)))))


def _batch_norms(model) -> list:
    return [n for _, n in nnx.iter_graph(model) if isinstance(n, nnx.BatchNorm)]


def _features(n: int = 5) -> jax.Array:
    return jnp.asarray(np.random.default_rng(3).normal(size=(n, 6)), jnp.float32)


def test_every_batch_norm_is_replaced_and_shared_ones_stay_shared():
    model = DenseBN(nnx.Rngs(0))
    assert len(_batch_norms(model)) == 2
    fixed = replace_batch_norm(model, num_groups=8)
    assert fixed is model and _batch_norms(model) == []
    assert isinstance(model.norm, nnx.GroupNorm) and isinstance(model.blocks[0], nnx.GroupNorm)
    assert model.blocks[1] is model.norm  # one GroupNorm where one BatchNorm was shared
    assert model.norm.num_groups == 6  # 12 channels: largest divisor ≤ 8
    params = nnx.state(model, nnx.Param)
    assert "mean" not in str(jax.tree.structure(nnx.to_pure_dict(nnx.state(model))))
    assert jax.tree.leaves(params)  # the new layers' scale and bias are trainable parameters


def test_each_example_is_normalised_by_its_own_statistics():
    """BatchNorm mixes a batch; after the fix, example i's output is its output run alone."""
    model = DenseBN(nnx.Rngs(0))
    x = _features()
    together = model(x)
    alone = jnp.concatenate([model(x[i : i + 1]) for i in range(len(x))])
    assert not np.allclose(together, alone, atol=1e-3)  # the BatchNorm model mixes examples
    replace_batch_norm(model, num_groups=3)  # groups of 4 features (groups of 1 would output 0)
    together = model(x)
    alone = jnp.concatenate([model(x[i : i + 1]) for i in range(len(x))])
    np.testing.assert_allclose(together, alone, rtol=1e-5, atol=1e-6)


def test_the_new_layer_computes_group_normalisation():
    """Reference: per example, per group of channels, mean and variance over H, W, channels."""
    layer = replace_batch_norm(nnx.BatchNorm(12, epsilon=1e-5, rngs=nnx.Rngs(0)), num_groups=4)
    x = np.random.default_rng(3).normal(size=(2, 6, 6, 12))
    groups = x.reshape(2, 6, 6, 4, 3)
    mean = groups.mean(axis=(1, 2, 4), keepdims=True)
    var = groups.var(axis=(1, 2, 4), keepdims=True)
    expected = ((groups - mean) / np.sqrt(var + 1e-5)).reshape(x.shape)
    np.testing.assert_allclose(layer(jnp.asarray(x, jnp.float32)), expected, atol=2e-5)


def test_nnx_loss_accepts_the_fixed_model_and_clips_per_example():
    model = DenseBN(nnx.Rngs(0))
    x, y = _features(), jnp.arange(5, dtype=jnp.int32) % 4

    def loss(module, example):
        xi, yi = example
        logits = module(xi[None])[0]  # a batch of one: GroupNorm's statistics are this example's
        return optax.softmax_cross_entropy_with_integer_labels(logits, yi)

    with pytest.raises(ValueError, match="BatchNorm"):
        dpjax.dp_sgd.nnx_loss(model, loss)
    fixed = dpjax.dp_sgd.replace_batch_norm(model, num_groups=3)
    loss_fn, params = dpjax.dp_sgd.nnx_loss(fixed, loss)
    grad_fn = dpjax.clipped_grad(lambda p, ex: loss_fn(p, ex, jax.random.key(0)), l2_clip_norm=0.1)
    clipped_sum, info = grad_fn(params, (x, y))
    norms = np.asarray(info.per_example_norms)
    assert norms.shape == (5,) and np.all(norms > 0.1)  # every example clipped: sum norm ≤ 5·C
    total = np.sqrt(sum(float(jnp.sum(g**2)) for g in jax.tree.leaves(clipped_sum)))
    assert total <= 5 * 0.1 * (1 + 1e-5)


@pytest.mark.parametrize(
    ("features", "groups", "expected"), [(64, 32, 32), (48, 32, 24), (3, 32, 3), (7, 4, 1)]
)
def test_group_count_is_the_largest_divisor_not_above_the_request(features, groups, expected):
    assert group_count(features, groups) == expected


def test_bad_input_is_refused_by_name():
    with pytest.raises(ValueError, match="model"):
        replace_batch_norm(nn.BatchNorm())  # a linen module: see the recipe instead
    with pytest.raises(ValueError, match="num_groups"):
        replace_batch_norm(DenseBN(nnx.Rngs(0)), num_groups=0)
    with pytest.raises(ValueError, match="axis"):
        replace_batch_norm(nnx.BatchNorm(4, axis=1, rngs=nnx.Rngs(0)))


class LinenNet(nn.Module):
    """The linen recipe of the tuning guide: the norm layer is a field, swapped by ``clone``."""

    norm: callable = functools.partial(nn.BatchNorm, use_running_average=False)

    @nn.compact
    def __call__(self, x):
        return nn.Dense(4)(nn.relu(self.norm()(nn.Dense(12)(x))))


def test_linen_recipe_clone_with_group_norm_has_no_batch_statistics():
    x = _features()
    model = LinenNet()
    assert "batch_stats" in jax.eval_shape(model.init, jax.random.key(0), x)
    fixed = model.clone(norm=functools.partial(nn.GroupNorm, num_groups=4))
    variables = fixed.init(jax.random.key(0), x)
    assert set(variables) == {"params"}
    together = fixed.apply(variables, x)
    alone = jnp.concatenate([fixed.apply(variables, x[i : i + 1]) for i in range(len(x))])
    np.testing.assert_allclose(together, alone, rtol=1e-5, atol=1e-6)
