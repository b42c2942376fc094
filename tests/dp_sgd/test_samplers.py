"""Samplers: Poisson inclusion law, padding, truncation, shuffling, and the events they justify."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dpjax
from dpjax.dp_sgd.samplers import PaddedBatch
from dpjax.events import FixedBatchGaussianEvent, PoissonSampledGaussianEvent
from tests.helpers import mean_tolerance


def binom_sf_exact(m, n, q):
    """P[Binomial(n, q) > m] by direct summation (independent of scipy)."""
    return math.fsum(math.comb(n, k) * q**k * (1 - q) ** (n - k) for k in range(m + 1, n + 1))


def draw_many(sampler, key, trials):
    keys = jax.random.split(key, trials)
    batches = jax.jit(jax.vmap(sampler.sample))(keys)
    return np.asarray(batches.indices), np.asarray(batches.mask)


def test_poisson_inclusion_is_independent_with_rate_q(key):
    n, q, trials = 200, 0.1, 4000
    sampler = dpjax.PoissonSampler(dataset_size=n, sampling_rate=q)
    indices, mask = draw_many(sampler, key, trials)
    sizes = mask.sum(axis=1)
    sd = math.sqrt(n * q * (1 - q))
    assert abs(sizes.mean() - n * q) < mean_tolerance(sd, trials)
    assert abs(sizes.std() - sd) < 0.1 * sd
    counts = np.zeros(n)
    for idx, m in zip(indices, mask, strict=True):
        real = idx[m]
        assert len(np.unique(real)) == len(real)  # no duplicates in a batch
        counts[real] += 1
    # every index included with frequency q (5 standard errors, Bonferroni-loose)
    se = math.sqrt(q * (1 - q) / trials)
    assert np.all(np.abs(counts / trials - q) < 5.5 * se)
    assert np.all(indices[~mask] == 0)


def test_poisson_default_cap_and_shape(key):
    n, q = 1000, 0.05
    sampler = dpjax.PoissonSampler(dataset_size=n, sampling_rate=q)
    m = sampler.max_batch_size
    assert binom_sf_exact(m, n, q) <= 1e-9 < binom_sf_exact(m - 1, n, q)
    assert sampler.overflow_probability == pytest.approx(binom_sf_exact(m, n, q), rel=1e-6)
    # Truncation slack (1 + e^ε)·T·p̄ with p̄ the overflow chance of an n + 1 record neighbour
    # (the old T·p was not what the coupling argument supports).
    p_bar = binom_sf_exact(m, n + 1, q)
    assert p_bar >= binom_sf_exact(m, n, q)
    assert sampler.delta_slack(1000, 2.0) == pytest.approx((1 + math.e**2) * 1000 * p_bar, rel=1e-6)
    batch = sampler.sample(key)
    assert batch.indices.shape == (m,) and batch.mask.shape == (m,)
    assert batch.indices.dtype == jnp.int32 and batch.mask.dtype == jnp.bool_
    assert sampler.expected_batch_size == 50.0


def test_poisson_truncation_keeps_a_uniform_subset(key):
    n, q, cap, trials = 40, 0.5, 5, 4000
    sampler = dpjax.PoissonSampler(dataset_size=n, sampling_rate=q, max_batch_size=cap)
    assert sampler.overflow_probability > 0.99
    indices, mask = draw_many(sampler, key, trials)
    assert np.all(mask)  # overflow: every slot holds a real example
    counts = np.bincount(indices.ravel(), minlength=n) / trials
    p = cap / n  # each index kept with probability cap/n by symmetry
    se = math.sqrt(p * (1 - p) / trials)
    assert np.all(np.abs(counts - p) < 5.5 * se)


def test_poisson_rate_one_is_full_batch(key):
    sampler = dpjax.PoissonSampler(dataset_size=7, sampling_rate=1.0)
    batch = sampler.sample(key)
    assert sampler.max_batch_size == 7
    assert np.all(np.asarray(batch.mask))
    assert sorted(np.asarray(batch.indices).tolist()) == list(range(7))


def test_poisson_event():
    sampler = dpjax.PoissonSampler(dataset_size=1000, sampling_rate=0.01)
    ev = sampler.event(noise_multiplier=1.1, steps=500)
    assert isinstance(ev, PoissonSampledGaussianEvent)
    assert (ev.noise_multiplier, ev.sampling_rate, ev.count) == (1.1, 0.01, 500)
    assert ev.relation == dpjax.ADD_OR_REMOVE_ONE


def test_shuffled_epoch_is_a_partial_permutation(key):
    sampler = dpjax.ShuffledBatchSampler(dataset_size=23, batch_size=5)
    batches = np.asarray(sampler.epoch(key))
    assert batches.shape == (4, 5)
    assert len(np.unique(batches)) == 20 and batches.min() >= 0 and batches.max() < 23
    k1, k2 = jax.random.split(key)
    assert not np.array_equal(np.asarray(sampler.epoch(k1)), np.asarray(sampler.epoch(k2)))
    assert sampler.expected_batch_size == 5.0


def test_shuffled_batches_are_uniform_subsets(key):
    n, b, trials = 12, 3, 3000
    sampler = dpjax.ShuffledBatchSampler(dataset_size=n, batch_size=b)
    epochs = np.asarray(jax.jit(jax.vmap(sampler.epoch))(jax.random.split(key, trials)))
    first = epochs[:, 0, :]
    freq = np.bincount(first.ravel(), minlength=n) / trials
    p = b / n
    assert np.all(np.abs(freq - p) < 5.5 * math.sqrt(p * (1 - p) / trials))


def test_shuffled_event():
    sampler = dpjax.ShuffledBatchSampler(dataset_size=100, batch_size=10)
    ev = sampler.event(noise_multiplier=0.9, steps=30)
    assert isinstance(ev, FixedBatchGaussianEvent)
    assert (ev.batch_size, ev.dataset_size, ev.count) == (10, 100, 30)
    assert ev.relation == dpjax.REPLACE_ONE
    assert ev.sampling == "shuffle"


def test_uniform_batches_are_uniform_subsets(key):
    n, b, trials = 12, 3, 3000
    sampler = dpjax.UniformBatchSampler(dataset_size=n, batch_size=b)
    batches = np.asarray(jax.jit(jax.vmap(sampler.sample))(jax.random.split(key, trials)))
    assert batches.shape == (trials, b)
    assert all(len(set(row)) == b for row in batches)
    freq = np.bincount(batches.ravel(), minlength=n) / trials
    p = b / n
    assert np.all(np.abs(freq - p) < 5.5 * math.sqrt(p * (1 - p) / trials))
    ev = sampler.event(noise_multiplier=1.0, steps=7)
    assert isinstance(ev, FixedBatchGaussianEvent) and ev.sampling == "independent"
    assert ev.relation == dpjax.REPLACE_ONE and ev.count == 7
    with pytest.raises(ValueError, match="batch_size"):
        dpjax.UniformBatchSampler(dataset_size=3, batch_size=4)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(dataset_size=0, sampling_rate=0.1), "dataset_size"),
        (dict(dataset_size=10, sampling_rate=0.0), "sampling_rate"),
        (dict(dataset_size=10, sampling_rate=1.5), "sampling_rate"),
        (dict(dataset_size=10, sampling_rate=0.5, max_batch_size=0), "max_batch_size"),
        (dict(dataset_size=10, sampling_rate=0.5, max_batch_size=11), "max_batch_size"),
    ],
)
def test_poisson_validates(kwargs, name):
    with pytest.raises(ValueError, match=name):
        dpjax.PoissonSampler(**kwargs)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(dataset_size=10, batch_size=0), "batch_size"),
        (dict(dataset_size=10, batch_size=11), "batch_size"),
        (dict(dataset_size=-1, batch_size=1), "dataset_size"),
    ],
)
def test_shuffled_validates(kwargs, name):
    with pytest.raises(ValueError, match=name):
        dpjax.ShuffledBatchSampler(**kwargs)


def test_events_validate_noise_multiplier():
    with pytest.raises(ValueError, match="noise_multiplier"):
        dpjax.PoissonSampler(dataset_size=10, sampling_rate=0.5).event(
            noise_multiplier=0.0, steps=1
        )


def test_sampler_events_are_accepted_by_the_accountant():
    from dpjax.accounting import PrivacyAccountant, dp_sgd_epsilon
    from dpjax.accounting.tight import TRUNCATION_DELTA_SHARES

    poisson = dpjax.PoissonSampler(dataset_size=1000, sampling_rate=0.02)
    ev = poisson.event(noise_multiplier=1.2, steps=100)
    eps = PrivacyAccountant([ev]).epsilon(1e-5, accounting="pld")
    # The padded sampler's truncation slack (1 + e^ε)·T·p̄ is paid from δ: ε is that of exact
    # Poisson sampling at δ·(1 − f) for the first share f whose slack fits in f·δ.
    fits = [
        f
        for f in TRUNCATION_DELTA_SHARES
        if poisson.delta_slack(100, eps) <= f * 1e-5
        and eps
        == dp_sgd_epsilon(noise_multiplier=1.2, sampling_rate=0.02, steps=100, delta=1e-5 * (1 - f))
    ]
    assert fits
    ref = dp_sgd_epsilon(noise_multiplier=1.2, sampling_rate=0.02, steps=100, delta=1e-5)
    assert eps > ref
    for sampler in (
        dpjax.ShuffledBatchSampler(dataset_size=1000, batch_size=20),
        dpjax.UniformBatchSampler(dataset_size=1000, batch_size=20),
    ):
        acc = PrivacyAccountant([sampler.event(noise_multiplier=1.2, steps=100)])
        assert acc.relation == dpjax.REPLACE_ONE
        assert 0 < acc.epsilon(1e-5, accounting="rdp") < math.inf


# ------------------------------------------------------------------------------------------------
# Issue 25's papercuts: each test attacks one fix and fails on the code before it.
# ------------------------------------------------------------------------------------------------

# ----------------------------------------------------------------------------- PaddedBatch dtypes


def _grad_of_rows(dtype, n, rows):
    grad_fn = dpjax.clipped_grad(lambda w, x: jnp.dot(w, x), l2_clip_norm=1.0)
    X = jnp.zeros((n, 1), jnp.float32).at[jnp.asarray(rows)].set(0.5)  # norms < C: no clip
    batch = PaddedBatch(jnp.asarray(rows, dtype), jnp.ones((len(rows),), bool))
    jitted = jax.jit(lambda w, x, b: grad_fn(w, x, batch=b)[0])
    return float(jitted(jnp.zeros(1, jnp.float32), X, batch)[0]), float(
        grad_fn(jnp.zeros(1, jnp.float32), X, batch=batch)[0][0]
    )


@pytest.mark.parametrize(
    "dtype, n, rows",
    [
        (jnp.uint8, 256, [1, 2, 255]),  # n wraps to 0 in uint8; 255 is the dtype's max
        (jnp.uint8, 300, [50, 100, 200]),  # 300 wraps to 44
        (jnp.uint16, 70_000, [5000, 9, 65535]),
        (jnp.int8, 300, [1, 2, 127]),  # 300 does not fit int8
        (jnp.int16, 70_000, [1, 32767, 3]),
        (jnp.int32, 300, [1, 2, 299]),
    ],
)
def test_padded_batch_small_index_dtypes_count_every_real_row(dtype, n, rows):
    """Catches uint8/int8 padded-batch indices wrapping around and dropping real rows."""
    jitted, eager = _grad_of_rows(dtype, n, rows)
    assert jitted == 1.5 and eager == 1.5


def test_padded_batch_small_dtype_out_of_range_and_repeats_still_caught():
    """Catches small-dtype batch indices escaping the range and repeat checks."""
    grad_fn = dpjax.clipped_grad(lambda w, x: jnp.dot(w, x), l2_clip_norm=1.0)
    X = jnp.full((100, 1), 0.5, jnp.float32)
    w = jnp.zeros(1, jnp.float32)
    out = PaddedBatch(jnp.array([3, 200], jnp.uint8), jnp.ones((2,), bool))
    with pytest.raises(ValueError, match=r"batch.indices must be in \[0, 100\)"):
        grad_fn(w, X, batch=out)
    neg = PaddedBatch(jnp.array([3, -1], jnp.int8), jnp.ones((2,), bool))
    assert float(jax.jit(lambda b: grad_fn(w, X, batch=b)[0][0])(neg)) == 0.5
    X256 = jnp.full((256, 1), 0.5, jnp.float32)
    twice = PaddedBatch(jnp.array([255, 255], jnp.uint8), jnp.ones((2,), bool))
    assert float(jax.jit(lambda b: grad_fn(w, X256, batch=b)[0][0])(twice)) == 0.5
