"""σ and C stated once, the padding mask that cannot be forgotten, optax.MultiSteps refused.

Each test fails on the code before issue 14 (part B): ``dp_sgd_optimizer`` took C on its own
and accepted any value, ``ClippedGrad`` had no ``batch=`` path, ``optax.MultiSteps`` around a
DP-SGD optimizer was accepted, ``event_for`` did not exist.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy import stats

import dpjax
from dpjax.dp_sgd import PaddedBatch, event_for, noise_releases
from dpjax.dp_sgd.samplers import realised_sampling_rate
from dpjax.events import PoissonSampledGaussianEvent
from tests.helpers import assert_distribution


def linear_loss(w, x, y):
    """Per-example loss with gradient (w·x − y)·x: at w = 0 the gradient is −y·x."""
    return 0.5 * (jnp.dot(w, x) - y) ** 2


def reference_clipped_sum(X, Y, rows, C):
    """Σ_{i in rows} clip_C(−y_i x_i) in float64 NumPy (the gradient at w = 0)."""
    total = np.zeros(X.shape[1])
    for i in rows:
        g = -Y[i] * X[i]
        total += g * min(1.0, C / np.linalg.norm(g))
    return total


# ----------------------------------------------------------------------------- C stated once


def test_clip_norm_different_from_the_clipped_grad_is_refused(key):
    """The issue's footgun: clipped_grad(C=10), dp_sgd_optimizer(C=1) — the real σ was 0.1."""
    grad_fn = dpjax.clipped_grad(linear_loss, l2_clip_norm=10.0)
    with pytest.raises(ValueError, match="l2_clip_norm must be the clip norm of clipped_grad"):
        dpjax.dp_sgd_optimizer(
            optimizer=optax.sgd(1.0),
            clipped_grad=grad_fn,
            l2_clip_norm=1.0,
            noise_multiplier=1.0,
            normalizer=1.0,
            key=key,
        )


def test_neither_clipped_grad_nor_clip_norm_is_refused(key):
    with pytest.raises(ValueError, match="clipped_grad must be"):
        dpjax.dp_sgd_optimizer(
            optimizer=optax.sgd(1.0), noise_multiplier=1.0, normalizer=1.0, key=key
        )
    with pytest.raises(ValueError, match="clipped_grad must be"):
        dpjax.dp_sgd_optimizer(
            optimizer=optax.sgd(1.0),
            clipped_grad=lambda p, x: p,
            noise_multiplier=1.0,
            normalizer=1.0,
            key=key,
        )


def test_noise_scale_is_sigma_times_the_clipped_grad_bound(key):
    """C read from the per-layer grad_fn: sqrt(3² + 4²) = 5, so the noise std is σ·5."""
    params = {"w": jnp.zeros(20_000), "b": jnp.zeros(())}
    grad_fn = dpjax.clipped_grad(
        lambda p, x: jnp.dot(p["w"], x) + p["b"],
        l2_clip_norm={"w": 3.0, "b": 4.0},
        per_layer=True,
    )
    sigma = 0.5
    tx = dpjax.dp_sgd_optimizer(
        optimizer=optax.identity(),
        clipped_grad=grad_fn,
        noise_multiplier=sigma,
        normalizer=1.0,
        key=key,
    )
    assert (tx.l2_clip_norm, tx.noise_multiplier) == (5.0, sigma)
    zeros = jax.tree.map(jnp.zeros_like, params)
    noisy, _ = tx.update(zeros, tx.init(params), params)
    std = sigma * 5.0
    assert_distribution(
        np.asarray(noisy["w"]),
        lambda x: stats.norm.cdf(x, scale=std),
        wrong_cdfs=[lambda x: stats.norm.cdf(x, scale=sigma * 3.0)],
    )


# ----------------------------------------------------------------------------- σ stated once


def test_event_reads_sigma_from_the_optimizer_and_steps_from_the_state(key):
    sampler = dpjax.PoissonSampler(dataset_size=200, sampling_rate=0.05)
    grad_fn = dpjax.clipped_grad(linear_loss, l2_clip_norm=1.0)
    tx = dpjax.dp_sgd_optimizer(
        optimizer=optax.sgd(0.1),
        clipped_grad=grad_fn,
        noise_multiplier=1.3,
        normalizer=sampler.expected_batch_size,
        key=key,
    )
    params = jnp.zeros(2)
    state = tx.init(params)
    update = jax.jit(tx.update)
    for _ in range(3):
        _, state = update(jnp.ones(2), state, params)
    expected = PoissonSampledGaussianEvent(
        noise_multiplier=1.3,
        sampling_rate=0.05,
        count=3,
        dataset_size=200,  # the padded sampler's cap travels with the event (truncation slack)
        max_batch_size=sampler.max_batch_size,
    )
    assert event_for(tx, sampler=sampler, state=state) == expected
    assert event_for(tx, sampler=sampler, steps=3) == expected
    assert noise_releases(state) == 3


def test_event_of_accumulated_sums_counts_logical_batches(key):
    sampler = dpjax.PoissonSampler(dataset_size=200, sampling_rate=0.05)
    inner = dpjax.dp_sgd_optimizer(
        optimizer=optax.sgd(0.1),
        clipped_grad=dpjax.clipped_grad(linear_loss, l2_clip_norm=1.0),
        noise_multiplier=0.9,
        normalizer=sampler.expected_batch_size,
        key=key,
    )
    tx = dpjax.accumulate_clipped_sums(inner, every_k=4)
    params = jnp.zeros(2)
    state = tx.init(params)
    update = jax.jit(tx.update)
    for _ in range(8):  # 8 micro-batches = 2 releases
        _, state = update(jnp.ones(2), state, params)
    assert event_for(tx, sampler=sampler, state=state).count == 2


def test_event_for_refuses_what_it_cannot_read(key):
    sampler = dpjax.PoissonSampler(dataset_size=200, sampling_rate=0.05)
    tx = dpjax.dp_sgd_optimizer(
        optimizer=optax.sgd(0.1),
        clipped_grad=dpjax.clipped_grad(linear_loss, l2_clip_norm=1.0),
        noise_multiplier=1.0,
        normalizer=10.0,
        key=key,
    )
    with pytest.raises(ValueError, match="optimizer must be"):
        event_for(optax.sgd(0.1), sampler=sampler, steps=3)
    with pytest.raises(ValueError, match="steps must be"):
        event_for(tx, sampler=sampler, steps=3, state=tx.init(jnp.zeros(2)))
    with pytest.raises(ValueError, match="state must be"):
        event_for(tx, sampler=sampler, state=tx.init(jnp.zeros(2)))  # no release yet


# ----------------------------------------------------------------------------- the padding mask


@pytest.fixture
def dataset(key):
    kx, ky = jax.random.split(key)
    X = jax.random.normal(kx, (40, 3))
    Y = jax.random.normal(ky, (40,)) + 2.0
    return X, Y


def test_padded_batch_path_counts_each_selected_example_once(key, dataset):
    """The issue's footgun: x[b.indices] without mask counts example 0 once per padding slot.

    Through ``batch=`` the sum is the reference sum over the selected examples only.
    """
    X, Y = dataset
    sampler = dpjax.PoissonSampler(dataset_size=40, sampling_rate=0.1)
    padded = sampler.sample(key)
    mask = np.asarray(padded.mask)
    selected = np.asarray(padded.indices)[mask]
    assert (~mask).sum() >= 1 and 0 not in selected  # padding present; example 0 not drawn
    grad_fn = dpjax.clipped_grad(linear_loss, l2_clip_norm=1.0)
    w = jnp.zeros(3)
    s, info = grad_fn(w, X, Y, batch=padded)
    expected = reference_clipped_sum(np.asarray(X), np.asarray(Y), selected, 1.0)
    np.testing.assert_allclose(np.asarray(s), expected, rtol=1e-12, atol=1e-12)
    norms = np.abs(np.asarray(Y)[selected]) * np.linalg.norm(np.asarray(X)[selected], axis=1)
    assert int(info.num_clipped) == int(np.sum(norms > 1.0))
    # the raw gather without mask is what the documented path avoids: it adds example 0
    raw, _ = grad_fn(w, X[padded.indices], Y[padded.indices])
    assert not np.allclose(np.asarray(raw), expected)
    # jitted, as in a training step
    s_jit, _ = jax.jit(lambda w, b: grad_fn(w, X, Y, batch=b))(w, padded)
    np.testing.assert_allclose(np.asarray(s_jit), expected, rtol=1e-12, atol=1e-12)


def test_padded_batch_misuse_is_refused(key, dataset):
    X, Y = dataset
    padded = dpjax.PoissonSampler(dataset_size=40, sampling_rate=0.1).sample(key)
    grad_fn = dpjax.clipped_grad(linear_loss, l2_clip_norm=1.0)
    w = jnp.zeros(3)
    with pytest.raises(ValueError, match="batch must be passed by keyword"):
        grad_fn(w, padded, X, Y)
    with pytest.raises(ValueError, match="mask must be None when batch is passed"):
        grad_fn(w, X, Y, batch=padded, mask=padded.mask)
    with pytest.raises(ValueError, match="batch must be a dpjax.dp_sgd.PaddedBatch"):
        grad_fn(w, X, Y, batch=padded.indices)
    # a sampler over more rows than the data passed: a real index beyond the data is refused
    big = PaddedBatch(jnp.array([3, 45, 0]), jnp.array([True, True, False]))
    with pytest.raises(ValueError, match=r"batch.indices must be in \[0, 40\)"):
        grad_fn(w, X, Y, batch=big)


@pytest.mark.slow  # default-run budget; CI runs it in make test-slow
def test_data_parallel_accepts_the_padded_batch(key, dataset):
    X, Y = dataset
    padded = dpjax.PoissonSampler(dataset_size=40, sampling_rate=0.2).sample(key)
    grad_fn = dpjax.clipped_grad(linear_loss, l2_clip_norm=1.0, backend="vmap")
    single, _ = grad_fn(jnp.zeros(3), X, Y, batch=padded)
    sharded, _ = dpjax.data_parallel(grad_fn)(jnp.zeros(3), X, Y, batch=padded)
    np.testing.assert_allclose(np.asarray(sharded), np.asarray(single), rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- MultiSteps


def _private_optimizers(key):
    k1, k2, k3 = jax.random.split(key, 3)
    grad_fn = dpjax.clipped_grad(linear_loss, l2_clip_norm=1.0)
    dp = dpjax.dp_sgd_optimizer(
        optimizer=optax.sgd(0.1),
        clipped_grad=grad_fn,
        noise_multiplier=1.0,
        normalizer=8.0,
        key=k1,
    )
    accumulated = dpjax.accumulate_clipped_sums(
        dpjax.dp_sgd_optimizer(
            optimizer=optax.sgd(0.1),
            clipped_grad=grad_fn,
            noise_multiplier=1.0,
            normalizer=8.0,
            key=k2,
        ),
        every_k=2,
    )
    laplace = dpjax.laplace_dp_sgd_optimizer(
        l1_sensitivity=1.0, epsilon=1.0, rho=0.5, kappa=0.8, key=k3
    )
    return {"dp_sgd": dp, "accumulated": accumulated, "laplace": laplace}


@pytest.mark.parametrize("name", ["dp_sgd", "accumulated", "laplace"])
@pytest.mark.parametrize("jit", [False, True])
def test_multisteps_around_a_private_optimizer_is_refused(key, name, jit):
    wrapped = optax.MultiSteps(_private_optimizers(key)[name], every_k_schedule=4)
    init = jax.jit(wrapped.init) if jit else wrapped.init
    with pytest.raises(ValueError, match="accumulate_clipped_sums"):
        init(jnp.zeros(2))


def test_multisteps_update_is_refused_too(key):
    """A state built elsewhere does not let MultiSteps.update through either."""
    tx = _private_optimizers(key)["dp_sgd"]
    plain = optax.MultiSteps(optax.sgd(0.1), every_k_schedule=2).init(jnp.zeros(2))
    state = plain._replace(inner_opt_state=tx.init(jnp.zeros(2)))  # tx.init outside MultiSteps
    wrapped = optax.MultiSteps(tx, every_k_schedule=2)
    with pytest.raises(ValueError, match="accumulate_clipped_sums"):
        wrapped.update(jnp.ones(2), state, jnp.zeros(2))


def test_plain_optax_chains_around_the_optimizer_still_work(key):
    tx = optax.chain(_private_optimizers(key)["dp_sgd"], optax.scale(1.0))
    params = jnp.zeros(2)
    u, _ = tx.update(jnp.ones(2), tx.init(params), params)
    assert u.shape == (2,)


# ----------------------------------------------------------------------------- ERM from the parts


@pytest.mark.slow  # compiles a DP-SGD run (~20 s on a loaded 2-core machine)
def test_erm_dp_sgd_records_the_rate_the_sampler_realises(key):
    """Below 2⁻¹² the Poisson sampler realises ⌊q·2⁶⁴⌋/2⁶⁴ ≤ q; the event must say so."""
    from dpjax.erm import dp_sgd, losses
    from tests.erm.test_solver import sphere_data

    q = 1e-4
    assert realised_sampling_rate(q) < q
    X, y = sphere_data(50, 2, seed=3)
    res = dp_sgd(
        key,
        X,
        y,
        loss=losses.logistic,
        epsilon=1.0,
        delta=1e-5,
        radius=1.0,
        sampling_rate=q,
        steps=3,
        dataset_size=50,
        accounting="rdp",
    )
    assert res.event.sampling_rate == realised_sampling_rate(q)
    assert res.sensitivity == 1.0  # grad_fn.sensitivity(add/remove-one) = C = L = 1
