"""Data-parallel DP-SGD over the 4 forced CPU devices agrees with one device; noise once."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy import stats

import dpjax
from tests.helpers import assert_distribution


def loss(params, x, y):
    h = jnp.tanh(x @ params["w1"])
    return 0.5 * (h @ params["w2"] - y) ** 2


@pytest.fixture
def data(key):
    k1, k2, k3, k4 = jax.random.split(key, 4)
    params = {"w1": jax.random.normal(k1, (6, 8)), "w2": jax.random.normal(k2, (8,))}
    X = jax.random.normal(k3, (30, 6))  # 30 is not a multiple of 4: padding exercised
    Y = jax.random.normal(k4, (30,))
    return params, X, Y


def test_four_devices_are_available():
    assert jax.device_count() >= 4


# The vmap backend's sharded sum is also exercised by default in the full-step agreement test
# below; its exact-sum twin runs in the slow suite (as for the empty batch).
@pytest.mark.parametrize("method", [pytest.param("vmap", marks=pytest.mark.slow), "auto"])
def test_sharded_clipped_sum_equals_single_device(data, method):
    params, X, Y = data
    mask = jnp.asarray(np.arange(30) % 7 != 3)
    X = X.at[5, 0].set(jnp.nan)
    grad_fn = dpjax.clipped_grad(loss, l2_clip_norm=0.5, backend=method)
    sharded = dpjax.data_parallel(grad_fn)
    assert sharded.num_shards == jax.device_count()
    assert sharded.sensitivity(dpjax.REPLACE_ONE) == grad_fn.sensitivity(dpjax.REPLACE_ONE) == 1.0
    s1, i1 = jax.jit(grad_fn)(params, X, Y, mask=mask)
    s4, i4 = jax.jit(sharded)(params, X, Y, mask=mask)
    for a, b in zip(jax.tree.leaves(s4), jax.tree.leaves(s1), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(i4.per_example_norms, i1.per_example_norms, rtol=1e-12)
    assert int(i4.num_nonfinite) == int(i1.num_nonfinite) == 1
    assert int(i4.num_clipped) == int(i1.num_clipped)


def test_full_dpsgd_step_agrees_single_vs_multi_device(key, data):
    params, X, Y = data
    grad_fn = dpjax.clipped_grad(loss, l2_clip_norm=1.0, backend="vmap")
    sharded = dpjax.data_parallel(grad_fn)

    def run(fn):
        tx = dpjax.dp_sgd_optimizer(
            optimizer=optax.sgd(0.1),
            noise_multiplier=1.0,
            l2_clip_norm=1.0,
            normalizer=30.0,
            key=key,
        )

        @jax.jit
        def step(p, state):
            s, _ = fn(p, X, Y)
            updates, state = tx.update(s, state, p)
            return optax.apply_updates(p, updates), state

        p, state = params, tx.init(params)
        for _ in range(3):
            p, state = step(p, state)
        return p

    single, multi = run(grad_fn), run(sharded)
    for a, b in zip(jax.tree.leaves(multi), jax.tree.leaves(single), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


def test_noise_is_added_once_not_per_device(key):
    """Zero gradients → the release is pure noise with std σC (not σC·√4 or σC/√4)."""
    params = {"w1": jnp.zeros((40, 50)), "w2": jnp.zeros(50)}
    X, Y = jnp.zeros((8, 40)), jnp.zeros(8)
    sharded = dpjax.data_parallel(dpjax.clipped_grad(loss, l2_clip_norm=2.0, backend="vmap"))
    tx = dpjax.dp_sgd_optimizer(
        optimizer=optax.identity(), noise_multiplier=0.7, l2_clip_norm=2.0, normalizer=1.0, key=key
    )

    @jax.jit
    def release(p):
        s, _ = sharded(p, X, Y)
        return tx.update(s, tx.init(p), p)[0]

    samples = np.concatenate([np.ravel(u) for u in jax.tree.leaves(release(params))])
    std = 0.7 * 2.0
    assert_distribution(
        samples,
        lambda x: stats.norm.cdf(x, scale=std),
        wrong_cdfs=[
            lambda x: stats.norm.cdf(x, scale=1.5 * std),
            lambda x: stats.norm.cdf(x, scale=std / 1.5),
        ],
    )


def test_explicit_mesh_is_supported(data):
    params, X, Y = data
    mesh = jax.make_mesh((4,), ("data",))  # explicit axis types by default
    grad_fn = dpjax.clipped_grad(loss, l2_clip_norm=0.5, backend="vmap")
    sharded = dpjax.data_parallel(grad_fn, mesh=mesh, axis_name="data")
    s1, i1 = grad_fn(params, X, Y)
    with jax.set_mesh(mesh):
        s4, i4 = jax.jit(sharded)(params, X, Y)
    for a, b in zip(jax.tree.leaves(s4), jax.tree.leaves(s1), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(i4.per_example_norms, i1.per_example_norms, rtol=1e-12)


def test_data_parallel_validates(data):
    with pytest.raises(ValueError, match="grad_fn"):
        dpjax.data_parallel(jax.grad(loss))
    grad_fn = dpjax.clipped_grad(loss, l2_clip_norm=1.0)
    with pytest.raises(ValueError, match="axis_name"):
        dpjax.data_parallel(grad_fn, mesh=jax.make_mesh((4,), ("x",)), axis_name="batch")


@pytest.mark.parametrize("method", [pytest.param("vmap", marks=pytest.mark.slow), "auto"])
def test_empty_batch_gives_a_zero_sum(data, method):
    """A (0, d) batch (finding 8: backend="auto" raised ZeroDivisionError) sums to zero."""
    params, X, Y = data
    sharded = dpjax.data_parallel(dpjax.clipped_grad(loss, l2_clip_norm=0.5, backend=method))
    s, info = sharded(params, X[:0], Y[:0])
    assert all(np.all(np.asarray(v) == 0.0) for v in jax.tree.leaves(s))
    assert info.per_example_norms.shape == (0,) and int(info.num_nonfinite) == 0
