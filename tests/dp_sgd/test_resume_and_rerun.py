"""Re-running from one checkpoint: ``continue_from(state, key=new_key)`` draws fresh noise.

Two continuations of one checkpoint on data sets that differ in one record (an
unlearning-style re-run after deleting it) released with the SAME key streams differ by the
noise-free difference of their clipped sums whenever the record was sampled. Re-keyed, their
difference carries the noise of both runs. The default ``continue_from(state)`` (a plain
resume) continues the key streams, as documented next to the checkpoint recipe.
"""

import math
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dpjax
from dpjax.dp_sgd.transforms import NoiseState

N, D, LR, SIGMA, CLIP = 40, 2000, 1.0, 1.0, 1.0
ROOT = Path(__file__).resolve().parents[2]


def build(key, noise_multiplier=SIGMA, optimizer=None):
    return dpjax.make_private(
        lambda w, ex: jnp.dot(w, ex), optimizer=optimizer or optax.sgd(LR), l2_clip_norm=CLIP,
        dataset_size=N, batch_size=8, steps=6, noise_multiplier=noise_multiplier, delta=1e-5,
        key=jax.random.key(key),
    )  # fmt: skip


def datasets(deleted_record):
    """D: every row the vector g (‖g‖ = 0.5 < C); D′: ``deleted_record`` deleted (zeroed: the
    zero-out neighbour make_private accounts), so S_D − S_D′ = g when it is sampled, else 0."""
    g = jnp.full(D, 0.5 / math.sqrt(D), jnp.float32)
    data = jnp.tile(g, (N, 1))
    return data, data.at[deleted_record].set(0.0), np.asarray(g, np.float64)


def checkpoint():
    """A run's state after 3 steps (the checkpoint both re-runs start from) and its params."""
    data, _, _ = datasets(0)
    p = build(0)
    w, state, _ = p.fit(jnp.zeros(D, jnp.float32), data, steps=3, progress=False)
    return w, state


def rerun(w, state, data, key=None):
    """One more step from the checkpoint under a new object of the same plan (its own key is
    not used: the state's keys continue, or ``key`` replaces them); the parameter change."""
    p = build(100)
    resumed = p.continue_from(state) if key is None else p.continue_from(state, key=key)
    w1, _, _ = p.step(w, resumed, data)
    return np.asarray(w1, np.float64) - np.asarray(w, np.float64)


def next_batch(state):
    """The records of the next batch of ``state`` (its sample key derived as the step does)."""
    p = build(100)
    _, sample_key, _ = jax.random.split(jax.random.wrap_key_data(state.key), 3)
    batch = p.sampler.sample(sample_key)
    return np.asarray(batch.indices)[np.asarray(batch.mask)]


def checkpoint_and_a_sampled_record():
    """The checkpoint and a record its next batch (old keys) includes: the deleted one."""
    w, state = checkpoint()
    records = next_batch(state)
    assert records.size > 0
    return w, state, int(records[0])


def test_rerun_with_the_same_keys_releases_the_noise_free_difference():
    """Documented default: ``continue_from(state)`` continues the key streams (a resume). Two
    re-runs from one checkpoint on D and D′ then differ by exactly the noise-free difference
    −lr·(S_D − S_D′)/(q·n) = −lr·g/(q·n): the deleted record's contribution, with no noise."""
    w, state, record = checkpoint_and_a_sampled_record()
    data, deleted, g = datasets(record)
    diff = rerun(w, state, data) - rerun(w, state, deleted)
    noise_free = -LR * g / build(100).expected_batch_size
    np.testing.assert_allclose(diff, noise_free, rtol=1e-4, atol=1e-9)


def test_rekeyed_reruns_from_one_checkpoint_differ_by_noise():
    """``continue_from(state, key=new_key)``: two re-runs from one checkpoint (new keys) on D
    and D′ differ from the noise-free difference by the noise of both runs: RMS
    sqrt(2)·σ·C·lr/(q·n) over 2000 coordinates (tolerance 6 standard errors, 9.5 %), far above
    the float rounding of the same-key re-run."""
    w, state, record = checkpoint_and_a_sampled_record()
    data, deleted, g = datasets(record)
    normaliser = build(100).expected_batch_size
    a = rerun(w, state, data, key=jax.random.key(7))
    b = rerun(w, state, deleted, key=jax.random.key(8))
    residual = (a - b) - (-LR * g / normaliser)  # sampled by the new keys or not: noise dominates
    rms = math.sqrt(float(np.mean(residual**2)))
    expected = math.sqrt(2.0) * SIGMA * CLIP * LR / normaliser
    assert abs(rms / expected - 1.0) <= 6.0 / math.sqrt(2 * D), (rms, expected)


def test_rekeyed_state_replaces_every_key_and_keeps_the_rest():
    """Re-keying replaces the sampling key and every noise state's key data (the gradient
    noise; adaptive clipping's count noise too), keeps counts, step, ledger and ε, and a
    second re-run with the same new key is the same run (the key, not the object, fixes it)."""
    _, state = checkpoint()
    p = build(100)
    rekeyed = p.continue_from(state, key=jax.random.key(5))
    assert not np.array_equal(np.asarray(rekeyed.key), np.asarray(state.key))
    old = [x for x in jax.tree.leaves(state.opt_state, is_leaf=_is_ns) if _is_ns(x)]
    new = [x for x in jax.tree.leaves(rekeyed.opt_state, is_leaf=_is_ns) if _is_ns(x)]
    assert len(old) == len(new) == 1
    for o, n in zip(old, new, strict=True):
        assert not np.array_equal(np.asarray(o.key), np.asarray(n.key))
        assert int(o.count) == int(n.count) == 3
    assert int(rekeyed.step) == 3
    np.testing.assert_array_equal(np.asarray(rekeyed.plan), np.asarray(state.plan))
    assert p.epsilon(rekeyed) == p.epsilon(state)
    again = build(101).continue_from(state, key=jax.random.key(5))
    np.testing.assert_array_equal(np.asarray(again.key), np.asarray(rekeyed.key))


def _is_ns(x):
    return isinstance(x, NoiseState)


def test_rekeying_an_adaptive_run_rekeys_the_count_noise():
    """Adaptive clipping has two noise streams (gradient, count): both are re-keyed."""
    clip = dpjax.dp_sgd.AdaptiveClip(
        target_quantile=0.5, learning_rate=0.2, count_noise_multiplier=5.0, initial=1.0
    )
    p = dpjax.make_private(
        lambda w, ex: jnp.dot(w, ex), optimizer=optax.sgd(0.1), l2_clip_norm=clip,
        dataset_size=N, batch_size=8, steps=4, noise_multiplier=1.0, delta=1e-5,
        key=jax.random.key(0),
    )  # fmt: skip
    _, state, _ = p.fit(jnp.zeros(3), jnp.ones((N, 3)), steps=2, progress=False)
    q = dpjax.make_private(
        lambda w, ex: jnp.dot(w, ex), optimizer=optax.sgd(0.1), l2_clip_norm=clip,
        dataset_size=N, batch_size=8, steps=4, noise_multiplier=1.0, delta=1e-5,
        key=jax.random.key(1),
    )  # fmt: skip
    rekeyed = q.continue_from(state, key=jax.random.key(9))
    old = [x for x in jax.tree.leaves(state.opt_state, is_leaf=_is_ns) if _is_ns(x)]
    new = [x for x in jax.tree.leaves(rekeyed.opt_state, is_leaf=_is_ns) if _is_ns(x)]
    assert len(old) == len(new) == 2
    keys = {tuple(np.asarray(x.key).tolist()) for x in old + new}
    assert len(keys) == 4  # all distinct: nothing kept, the two new streams differ
    q.step(jnp.zeros(3), rekeyed, jnp.ones((N, 3)))


def test_rekeying_under_another_plan_appends_the_phase():
    """``continue_from(state, key=...)`` under another plan opens the new phase and re-keys."""
    _, state = checkpoint()
    p = build(100, noise_multiplier=2.0)
    rekeyed = p.continue_from(state, key=jax.random.key(3))
    assert np.asarray(rekeyed.plan).shape[0] == 2
    assert not np.array_equal(np.asarray(rekeyed.key), np.asarray(state.key))


def test_rekeying_refuses_another_prng_implementation_and_non_keys():
    _, state = checkpoint()
    with pytest.raises(ValueError, match="key"):
        build(100).continue_from(state, key=jax.random.key(1, impl="rbg"))
    with pytest.raises(TypeError, match="key"):
        build(101).continue_from(state, key=1234)


def test_checkpoint_recipe_says_how_to_rerun():
    """The guide's checkpoint recipe names the safe re-run (a new key on resume)."""
    guide = (ROOT / "docs" / "guides" / "dp_sgd.md").read_text()
    found = re.search(r"continue_from\(\w+, key=", guide)
    assert found
    at = found.start()
    assert "checkpoint" in guide[max(0, at - 1500) : at + 1500].lower()


def test_rekeying_a_banded_mf_run_keeps_its_buffers_and_row_record():
    """BandMF: the correlated noise state's key is replaced; its past-noise buffers, count and
    the keyed record of the data's row order are kept, and the re-keyed run steps on the same
    rows (its next noise differs from the same-key continuation)."""
    band = dpjax.dp_sgd.BandMF(bands=2)
    x = jax.random.normal(jax.random.key(1), (60, 3))

    def make(key):
        return dpjax.make_private(
            lambda w, ex: jnp.dot(ex, w), optimizer=optax.sgd(0.1), l2_clip_norm=1.0,
            dataset_size=60, batch_size=6, steps=6, noise_multiplier=1.0, delta=1e-5,
            key=jax.random.key(key), noise=band,
        )  # fmt: skip

    w, state, _ = make(0).fit(jnp.zeros(3), x, steps=3, progress=False)
    same, fresh = make(1), make(2)
    rekeyed = fresh.continue_from(state, key=jax.random.key(9))
    old, new = state.opt_state[0], rekeyed.opt_state[0]
    assert not np.array_equal(np.asarray(old.key), np.asarray(new.key))
    assert int(old.count) == int(new.count) == 3
    for a, b in zip(jax.tree.leaves(old.noise_buffers), jax.tree.leaves(new.noise_buffers)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for a, b in zip(jax.tree.leaves(old.row_order), jax.tree.leaves(new.row_order)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    w_same, _, _ = same.step(w, same.continue_from(state), x)
    w_fresh, _, _ = fresh.step(w, rekeyed, x)
    assert np.all(np.isfinite(np.asarray(w_fresh)))
    assert not np.array_equal(np.asarray(w_same), np.asarray(w_fresh))
