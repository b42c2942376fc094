"""BallsInBinsSampler: each record in exactly one step per epoch, uniformly; fixed padded
shape; the cap's overflow; explicit keys; its event."""

import jax
import numpy as np
import pytest
from scipy import stats

from dpjax.dp_sgd import BallsInBinsSampler


def _rows(batches):
    idx, mask = np.asarray(batches.indices), np.asarray(batches.mask)
    return [idx[s][mask[s]] for s in range(idx.shape[0])]


def test_every_record_is_in_exactly_one_step_of_an_epoch():
    sampler = BallsInBinsSampler(dataset_size=97, steps_per_epoch=5)
    batches = jax.jit(sampler.epoch)(jax.random.key(0))
    assert batches.indices.shape == batches.mask.shape == (5, sampler.max_batch_size)
    assert batches.indices.dtype == np.int32
    used = np.concatenate(_rows(batches))
    assert np.array_equal(np.sort(used), np.arange(97))  # once each, none dropped
    assert np.all(np.asarray(batches.indices)[~np.asarray(batches.mask)] == 0)
    assert sampler.expected_batch_size == pytest.approx(97 / 5)


def test_same_key_same_epoch_fresh_key_fresh_epoch():
    epoch = jax.jit(BallsInBinsSampler(dataset_size=50, steps_per_epoch=4).epoch)
    a, b, c = epoch(jax.random.key(1)), epoch(jax.random.key(1)), epoch(jax.random.key(2))
    assert np.array_equal(a.indices, b.indices) and np.array_equal(a.mask, b.mask)
    assert not np.array_equal(a.indices, c.indices)


def test_a_record_lands_in_each_step_uniformly_and_independently():
    """Over 900 epochs, the pair (step of record 0, step of record 1) is uniform on the 9
    cells (chi-square with 8 d.o.f., critical value at 1e-4): each record's step is uniform and
    independent of the other's. A round-robin assignment (record i to step i mod t) fails."""
    sampler = BallsInBinsSampler(dataset_size=6, steps_per_epoch=3)
    epochs = jax.jit(jax.vmap(sampler.epoch))(jax.random.split(jax.random.key(3), 900))
    idx, mask = np.asarray(epochs.indices), np.asarray(epochs.mask)

    def step_of(record):
        return np.argmax(((idx == record) & mask).any(axis=2), axis=1)

    joint = np.zeros((3, 3))
    np.add.at(joint, (step_of(0), step_of(1)), 1)
    chi2 = ((joint - 100.0) ** 2 / 100.0).sum()
    assert chi2 < stats.chi2.isf(1e-4, df=8)
    sizes = mask.sum(axis=2).ravel()  # Binomial(6, 1/3) batch sizes
    assert abs(sizes.mean() - 2.0) < 5 * np.sqrt(6 * (1 / 3) * (2 / 3) / sizes.size)
    assert np.all(mask.sum(axis=(1, 2)) == 6)


def test_cap_keeps_a_subset_of_the_bin_and_reports_its_overflow():
    sampler = BallsInBinsSampler(dataset_size=40, steps_per_epoch=2, max_batch_size=21)
    batches = jax.jit(sampler.epoch)(jax.random.key(4))
    rows = _rows(batches)
    assert all(len(r) <= 21 and len(set(r.tolist())) == len(r) for r in rows)
    assert len(set(np.concatenate(rows).tolist())) == sum(len(r) for r in rows)
    assert sampler.overflow_probability == pytest.approx(stats.binom.sf(21, 40, 0.5))
    assert sampler.neighbour_overflow_probability == pytest.approx(stats.binom.sf(21, 41, 0.5))
    assert sampler.delta_slack(10, 1.0) == pytest.approx(
        (1 + np.e) * 10 * stats.binom.sf(21, 41, 0.5)
    )


def test_cap_sized_from_the_plan_fits_the_slack_in_delta():
    sampler = BallsInBinsSampler(dataset_size=1000, steps_per_epoch=10, steps=100, delta=1e-5)
    slack = sampler.delta_slack(100, 10.0)
    assert slack <= 1e-3 * 1e-5
    smaller = BallsInBinsSampler(dataset_size=1000, steps_per_epoch=10,
                                 max_batch_size=sampler.max_batch_size - 1)  # fmt: skip
    assert smaller.delta_slack(100, 10.0) > 1e-8  # the cap is the smallest that fits
    event = sampler.event(noise_multiplier=2.0, steps=100)
    assert (event.dataset_size, event.epochs) == (1000, 10)
    assert event.max_batch_size == sampler.max_batch_size
    assert event.overflow_probability == pytest.approx(sampler.neighbour_overflow_probability)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        (dict(dataset_size=0, steps_per_epoch=2), "dataset_size"),
        (dict(dataset_size=10, steps_per_epoch=0), "steps_per_epoch"),
        (dict(dataset_size=10, steps_per_epoch=2, max_batch_size=11), "max_batch_size"),
        (dict(dataset_size=10, steps_per_epoch=2, steps=5), "delta"),
        (dict(dataset_size=1000, steps_per_epoch=10, max_batch_size=110, steps=100, delta=1e-5),
         "max_batch_size"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_by_name(kwargs, name):
    with pytest.raises(ValueError, match=name):
        BallsInBinsSampler(**kwargs)


def test_event_refuses_zero_noise():
    with pytest.raises(ValueError, match="noise_multiplier"):
        BallsInBinsSampler(dataset_size=10, steps_per_epoch=2).event(noise_multiplier=0.0, steps=2)


def test_event_for_reads_the_balls_in_bins_event():
    import jax.numpy as jnp
    import optax

    import dpjax
    from dpjax.dp_sgd import event_for

    sampler = BallsInBinsSampler(dataset_size=12, steps_per_epoch=3)
    grad_fn = dpjax.clipped_grad(lambda w, x: jnp.dot(w, x), l2_clip_norm=1.0)
    tx = dpjax.dp_sgd_optimizer(optimizer=optax.sgd(0.1), clipped_grad=grad_fn,
                                noise_multiplier=1.0, normalizer=sampler.expected_batch_size,
                                key=jax.random.key(6))  # fmt: skip
    event = event_for(tx, sampler=sampler, steps=7)
    assert (event.epochs, event.max_batch_size) == (3, sampler.max_batch_size)


@pytest.mark.slow
def test_an_epochs_clipped_sums_add_up_to_the_data_sum():
    """Each row of an epoch is a padded batch for clipped_grad(mask=...): with a clip norm
    above every gradient, the t clipped sums add up to the sum over the whole data set."""
    import jax.numpy as jnp

    import dpjax

    data = jnp.linspace(-1.0, 1.0, 24).reshape(12, 2)
    sampler = BallsInBinsSampler(dataset_size=12, steps_per_epoch=3)
    grad_fn = dpjax.clipped_grad(lambda w, x: jnp.dot(w, x), l2_clip_norm=10.0)
    batches = sampler.epoch(jax.random.key(5))
    w = jnp.zeros(2)
    sums = [grad_fn(w, data[batches.indices[s]], mask=batches.mask[s])[0] for s in range(3)]
    assert np.allclose(sum(sums), data.sum(axis=0), atol=1e-5)
