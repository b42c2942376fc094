"""dp_sgd_optimizer builder and gradient accumulation (noise once per logical batch)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy import stats

import dpjax
from tests.helpers import assert_distribution


def loss(params, x, y):
    return 0.5 * (jnp.dot(params["w"], x) + params["b"] - y) ** 2


@pytest.fixture
def data(key):
    kx, ky = jax.random.split(key)
    X = 2.0 * jax.random.normal(kx, (24, 5))
    Y = jax.random.normal(ky, (24,))
    return {"w": jnp.zeros(5), "b": jnp.zeros(())}, X, Y


def test_noise_free_dpsgd_is_sgd_on_the_normalised_clipped_sum(key, data):
    params, X, Y = data
    grad_fn = dpjax.clipped_grad(loss, l2_clip_norm=1.0)
    tx = dpjax.dp_sgd_optimizer(
        optimizer=optax.sgd(0.5), noise_multiplier=0.0, l2_clip_norm=1.0, normalizer=20.0, key=key
    )
    s, _ = grad_fn(params, X, Y)
    updates, _ = tx.update(s, tx.init(params), params)
    for u, g in zip(jax.tree.leaves(updates), jax.tree.leaves(s), strict=True):
        np.testing.assert_allclose(u, -0.5 * np.asarray(g) / 20.0, rtol=1e-12)


@pytest.mark.parametrize(
    "optimizer", [optax.sgd(0.1), optax.sgd(0.1, momentum=0.9), optax.adam(1e-2)]
)
def test_dpsgd_trains_under_jit_with_any_optimizer(key, data, optimizer):
    params, X, Y = data
    Y = X @ jnp.arange(5.0) + 1.0
    grad_fn = dpjax.clipped_grad(loss, l2_clip_norm=5.0)
    tx = dpjax.dp_sgd_optimizer(
        optimizer=optimizer, noise_multiplier=0.1, l2_clip_norm=5.0, normalizer=24.0, key=key
    )

    @jax.jit
    def step(params, state):
        s, _ = grad_fn(params, X, Y)
        updates, state = tx.update(s, state, params)
        return optax.apply_updates(params, updates), state

    state = tx.init(params)
    start = float(jnp.mean(jax.vmap(loss, (None, 0, 0))(params, X, Y)))
    with jax.numpy_dtype_promotion("standard"):  # optax.adam mixes int counts and floats
        for _ in range(200):
            params, state = step(params, state)
    end = float(jnp.mean(jax.vmap(loss, (None, 0, 0))(params, X, Y)))
    assert end < 0.2 * start


def test_accumulation_adds_noise_once_per_logical_batch(key, data):
    params, X, Y = data
    k = 4
    grad_fn = dpjax.clipped_grad(loss, l2_clip_norm=1.0)

    def private(key):
        return dpjax.dp_sgd_optimizer(
            optimizer=optax.sgd(1.0),
            noise_multiplier=1.0,
            l2_clip_norm=1.0,
            normalizer=24.0,
            key=key,
        )

    acc = dpjax.accumulate_clipped_sums(private(key), every_k=k)
    state = acc.init(params)
    update = jax.jit(acc.update)
    outs = []
    for chunk in range(k):
        rows = slice(6 * chunk, 6 * (chunk + 1))
        s, _ = grad_fn(params, X[rows], Y[rows])
        u, state = update(s, state, params)
        outs.append(u)
    for u in outs[:-1]:  # nothing released before the logical batch is complete
        assert all(np.all(np.asarray(leaf) == 0.0) for leaf in jax.tree.leaves(u))
    noise_state = state.inner_state[0]
    assert int(noise_state.count) == 1  # one release → the accountant counts 1 step, not k
    assert int(state.micro_step) == 0
    # identical to one big batch through the same private optimizer and key
    big = private(key)
    s_big, _ = grad_fn(params, X, Y)
    u_big, _ = big.update(s_big, big.init(params), params)
    for a, b in zip(jax.tree.leaves(outs[-1]), jax.tree.leaves(u_big), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-14)


def test_accumulated_noise_has_the_single_release_scale(key):
    sigma, C, normaliser, k = 2.0, 0.5, 8.0, 3
    inner = dpjax.dp_sgd_optimizer(
        optimizer=optax.identity(),
        noise_multiplier=sigma,
        l2_clip_norm=C,
        normalizer=normaliser,
        key=key,
    )
    acc = dpjax.accumulate_clipped_sums(inner, every_k=k)
    params = jnp.zeros(4000)
    state = acc.init(params)
    update = jax.jit(acc.update)
    releases = []
    for _ in range(2 * k):
        u, state = update(params, state, params)
        releases.append(np.asarray(u))
    first, second = releases[k - 1], releases[2 * k - 1]
    std = sigma * C / normaliser  # NOT sqrt(k) times larger: noise once per logical batch
    for noise in (first, second):
        assert_distribution(
            noise,
            lambda x: stats.norm.cdf(x, scale=std),
            wrong_cdfs=[
                lambda x: stats.norm.cdf(x, scale=1.5 * std),
                lambda x: stats.norm.cdf(x, scale=std / 1.5),
            ],
        )
    assert not np.array_equal(first, second)


def test_accumulation_with_every_k_one_is_the_inner_optimizer(key):
    inner = dpjax.dp_sgd_optimizer(
        optimizer=optax.sgd(1.0), noise_multiplier=1.0, l2_clip_norm=1.0, normalizer=1.0, key=key
    )
    acc = dpjax.accumulate_clipped_sums(inner, every_k=1)
    p = jnp.ones(3)
    a, _ = acc.update(p, acc.init(p), p)
    b, _ = inner.update(p, inner.init(p), p)
    np.testing.assert_allclose(a, b, rtol=1e-12)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(noise_multiplier=-1.0, l2_clip_norm=1.0, normalizer=1.0), "noise_multiplier"),
        (dict(noise_multiplier=1.0, l2_clip_norm=0.0, normalizer=1.0), "l2_clip_norm"),
        (dict(noise_multiplier=1.0, l2_clip_norm=1.0, normalizer=0.0), "normalizer"),
        (dict(noise_multiplier=1.0, l2_clip_norm=1.0, normalizer=-3.0), "normalizer"),
    ],
)
def test_dpsgd_validates(key, kwargs, name):
    with pytest.raises(ValueError, match=name):
        dpjax.dp_sgd_optimizer(optimizer=optax.sgd(1.0), key=key, **kwargs)


def test_dpsgd_refuses_a_non_optimizer(key):
    with pytest.raises(ValueError, match="optimizer"):
        dpjax.dp_sgd_optimizer(
            optimizer=0.1, noise_multiplier=1.0, l2_clip_norm=1.0, normalizer=1.0, key=key
        )


def test_accumulation_validates(key):
    inner = dpjax.dp_sgd_optimizer(
        optimizer=optax.sgd(1.0), noise_multiplier=1.0, l2_clip_norm=1.0, normalizer=1.0, key=key
    )
    with pytest.raises(ValueError, match="every_k"):
        dpjax.accumulate_clipped_sums(inner, every_k=0)


# ------------------------------------------------------------------------------------------------
# the DP-SGD training API: each test pins a violation found
# in review and fails without its fix.
# ------------------------------------------------------------------------------------------------


def test_event_for_warns_when_releases_accumulate_independent_micro_draws():
    """k independent Poisson draws at rate q/k accumulated into one release are NOT one draw at
    rate q: event_for(tx, sampler=micro_sampler) would account rate q/k with T/k releases and
    under-state ε. The tell-tale is a normaliser (q·n) that is not the micro sampler's q·n/k."""
    import warnings

    import optax

    logical = dpjax.PoissonSampler(dataset_size=1000, sampling_rate=0.04)
    micro = dpjax.PoissonSampler(dataset_size=1000, sampling_rate=0.01)
    grad_fn = dpjax.clipped_grad(lambda w, x: jnp.dot(w, x), l2_clip_norm=1.0)
    inner = dpjax.dp_sgd_optimizer(
        optimizer=optax.sgd(0.1),
        clipped_grad=grad_fn,
        noise_multiplier=1.0,
        normalizer=logical.expected_batch_size,
        key=jax.random.key(0),
    )
    tx = dpjax.accumulate_clipped_sums(inner, every_k=4)
    with pytest.warns(UserWarning, match="micro_batches"):
        dpjax.dp_sgd.event_for(tx, sampler=micro, steps=10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        event = dpjax.dp_sgd.event_for(tx, sampler=logical, steps=10)
    assert event.sampling_rate == logical.sampling_rate
