"""Streaming correlated noise (matrix factorization): equals the dense C⁻¹Z, O(bands·d) state,
secret buffers stripped from published states, refusal past n."""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dpjax.dp_sgd import add_gaussian_noise, public_opt_state
from dpjax.dp_sgd.matrix_factorization.streaming import (
    CorrelatedNoiseState,
    band_table,
    correlated_noise,
    dense_correlated_noise,
)
from dpjax.dp_sgd.transforms import PublicNoiseState

BLT = collections.namedtuple("BLT", "buf_decay output_scale")
PARAMS = {"w": jnp.zeros((3, 4)), "b": jnp.zeros(5)}
D = 17


def _banded(n: int, bands: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    c = np.zeros((n, n))
    for j in range(bands):
        c[np.arange(j, n), np.arange(n - j)] = rng.uniform(0.3, 1.0, n - j) * (1 if j else 2)
    return c


def _flat(tree) -> np.ndarray:
    return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(tree)])


def _run(tx, n: int, jit: bool = True):
    """Noise of n updates on zero sums, and the Z that add_gaussian_noise(1) draws with the
    same key (the same sampler and key splitting)."""
    update = jax.jit(tx.update) if jit else tx.update
    state = tx.init(PARAMS)
    out = []
    for _ in range(n):
        noisy, state = update(PARAMS, state)
        out.append(_flat(noisy))
    return np.array(out), state


def _z(n: int, seed: int) -> np.ndarray:
    ref = add_gaussian_noise(1.0, key=jax.random.key(seed))
    state, update = ref.init(PARAMS), jax.jit(ref.update)
    zs = []
    for _ in range(n):
        z, state = update(PARAMS, state)
        zs.append(_flat(z))
    return np.array(zs)


def test_banded_stream_equals_dense_solve():
    n, bands = 12, 4
    c = _banded(n, bands)
    tx = correlated_noise(c, noise_multiplier=0.7, l2_clip_norm=3.0, key=jax.random.key(5))
    noise, _ = _run(tx, n)
    dense = 2.1 * dense_correlated_noise(c, _z(n, 5))
    # float32 recurrence vs float64 solve: a few float32 ulps of the largest value
    np.testing.assert_allclose(noise, dense, rtol=0, atol=2e-5 * np.abs(dense).max())
    assert np.abs(dense).max() > 1.0  # the comparison is not vacuous


def test_blt_stream_equals_dense_solve():
    n = 12
    blt = BLT(buf_decay=np.array([0.95, 0.6, 0.1]), output_scale=np.array([-0.2, -0.15, -0.1]))
    tx = correlated_noise(
        blt, noise_multiplier=1.0, l2_clip_norm=1.0, key=jax.random.key(2), steps=n
    )
    noise, state = _run(tx, n)
    dense = dense_correlated_noise(blt, _z(n, 2), steps=n)
    np.testing.assert_allclose(noise, dense, rtol=0, atol=2e-5 * np.abs(dense).max())
    assert jax.tree.map(jnp.shape, state.noise_buffers) == {"w": (3, 3, 4), "b": (3, 5)}


def test_identity_strategy_is_dp_sgd_noise_bit_for_bit():
    """One band, C = I: the noise is add_gaussian_noise(σ·clip)'s, exactly (scale check)."""
    n = 3
    tx = correlated_noise(np.eye(n), noise_multiplier=1.3, l2_clip_norm=0.5, key=jax.random.key(9))
    noise, _ = _run(tx, n)
    ref = add_gaussian_noise(0.65, key=jax.random.key(9))
    state, update = ref.init(PARAMS), jax.jit(ref.update)
    for t in range(n):
        z, state = update(PARAMS, state)
        np.testing.assert_array_equal(noise[t], _flat(z))


def test_state_is_bands_times_d_not_n_times_d():
    n, bands = 200, 3
    tx = correlated_noise(
        _banded(n, bands), noise_multiplier=1.0, l2_clip_norm=1.0, key=jax.random.key(0)
    )
    state = tx.init(PARAMS)
    sizes = [x.size for x in jax.tree.leaves(state.noise_buffers)]
    assert sum(sizes) == (bands - 1) * D
    assert band_table(_banded(n, bands)).shape == (n, bands)


def test_public_opt_state_strips_buffers_and_key():
    """The buffers are past noise: from them the next noise is predicted (banded C: x_{t+1}
    = (Z_{t+1} − Σ_j C[t+1, t+1−j] x_{t+1−j}) / C[t+1, t+1]). Fails on old main (the state
    was not recognised: public_opt_state refused it)."""
    n, bands = 10, 3
    c = _banded(n, bands)
    tx = optax.chain(
        correlated_noise(c, noise_multiplier=1.0, l2_clip_norm=1.0, key=jax.random.key(1)),
        optax.sgd(0.1),
    )
    state = tx.init(PARAMS)
    for _ in range(4):
        _, state = tx.update(PARAMS, state, PARAMS)
    assert isinstance(state[0], CorrelatedNoiseState)
    # the buffers predict the next noise: its part not from Z_{t+1} is a function of them
    predicted = (
        -sum(
            c[4, 4 - j] * _flat(jax.tree.map(lambda b: b[j - 1], state[0].noise_buffers))
            for j in range(1, bands)
        )
        / c[4, 4]
    )
    noise, _ = tx.update(PARAMS, state, PARAMS)  # sgd(0.1): update = −0.1·noise
    z_part = -_flat(noise) / 0.1 - predicted
    assert np.corrcoef(-_flat(noise) / 0.1, predicted)[0, 1] > 0.2
    assert abs(np.std(z_part) * c[4, 4] - 1.0) < 0.8  # what is left is the fresh Z_{t+1}/C_tt
    public = public_opt_state(state)
    assert public[0] == PublicNoiseState(count=state[0].count)
    names = jax.tree_util.keystr(jax.tree_util.tree_flatten_with_path(public)[0][0][0])
    assert "buffer" not in names and "key" not in names


def test_refuses_past_n_concrete_and_voids_under_jit():
    n = 3
    tx = correlated_noise(
        _banded(n, 2), noise_multiplier=1.0, l2_clip_norm=1.0, key=jax.random.key(0)
    )
    _, state = _run(tx, n)
    with pytest.raises(ValueError, match="state.count"):
        tx.update(PARAMS, state)
    noisy, after = jax.jit(tx.update)(PARAMS, state)
    assert all(bool(jnp.all(jnp.isnan(x))) for x in jax.tree.leaves(noisy))
    assert all(bool(jnp.all(jnp.isnan(x))) for x in jax.tree.leaves(after.noise_buffers))


@pytest.mark.parametrize(
    "strategy, kwargs, match",
    [
        (np.triu(np.ones((3, 3))), {}, "strategy"),
        (np.zeros((3, 3)), {}, "strategy"),
        (np.ones((2, 3)), {}, "strategy"),
        (np.tril(np.ones((4, 4))), {"bands": 2}, "bands"),
        (np.eye(3), {"steps": 4}, "steps"),
        (BLT(np.array([0.5]), np.array([0.1])), {}, "steps"),
        (BLT(np.array([1.0]), np.array([0.1])), {"steps": 3}, "buf_decay"),
    ],
)
def test_bad_strategies_are_refused(strategy, kwargs, match):
    with pytest.raises(ValueError, match=match):
        correlated_noise(
            strategy, noise_multiplier=1.0, l2_clip_norm=1.0, key=jax.random.key(0), **kwargs
        )


def test_per_example_gradients_are_refused():
    tx = correlated_noise(np.eye(3), noise_multiplier=1.0, l2_clip_norm=1.0, key=jax.random.key(0))
    state = tx.init(jnp.zeros(4))
    with pytest.raises(ValueError, match="updates"):
        tx.update(jnp.zeros((8, 4)), state, jnp.zeros(4))


# ----------------------------------------------------------------------------- make_private


def _private(noise, *, n=203, key=0, **kwargs):
    import dpjax

    x = jax.random.normal(jax.random.key(1), (n, 3))
    data = {"x": x, "y": x @ jnp.array([1.0, -2.0, 0.5])}
    args = dict(
        optimizer=optax.sgd(0.1),
        l2_clip_norm=1.0,
        dataset_size=n,
        batch_size=20,
        epochs=2,
        noise_multiplier=1.0,
        delta=1e-5,
        key=jax.random.key(key),
    )
    args.update(kwargs)
    private = dpjax.make_private(
        lambda w, ex: 0.5 * (ex["x"] @ w - ex["y"]) ** 2, noise=noise, **args
    )
    return private, data


def test_cyclic_sampler_draws_step_t_from_part_t_mod_b():
    from dpjax.dp_sgd import CyclicPoissonSampler, PoissonSampler

    part = PoissonSampler(dataset_size=51, sampling_rate=20 / 51, max_batch_size=45)
    sampler = CyclicPoissonSampler(part, parts=4, dataset_size=203)  # 203 = 4·51 − 1
    sample = jax.jit(sampler.sample_at)
    seen = set()
    for t in range(12):
        batch = sample(jax.random.key(t), t)
        idx = np.asarray(batch.indices)[np.asarray(batch.mask)]
        assert np.all(idx % 4 == t % 4) and np.all(idx < 203) and idx.size > 0
        seen |= set(idx.tolist())
    assert sampler.sampling_rate == pytest.approx(20 / 51)
    assert sampler.expected_batch_size == pytest.approx(20.0)
    assert {200, 201, 202} & seen  # the last slots of the parts are records too
    with pytest.raises(ValueError, match="part_sampler"):
        CyclicPoissonSampler(part, parts=4, dataset_size=300)


@pytest.mark.slow
def test_band_mf_epsilon_is_dp_sgd_over_rounds():
    import dp_accounting

    from dpjax.dp_sgd import BandMF

    private, data = _private(BandMF(bands=4))
    assert private.steps == 21
    eps = private.epsilon(private.steps)
    # ⌈21/4⌉ = 6 rounds of Poisson sampling at q = 20/51 with σ = 1 (C has column norm 1),
    # accounted at δ(1 − 10⁻³) (the padded sampler's slack share)
    pld = dp_accounting.pld.PLDAccountant()
    event = dp_accounting.PoissonSampledDpEvent(
        private.sampling_rate, dp_accounting.GaussianDpEvent(1.0)
    )
    pld.compose(event, 6)
    assert eps == pytest.approx(pld.get_epsilon(1e-5 * (1 - 1e-3)), rel=0.01)
    # charging T = 21 steps at that rate (the DP-SGD event of the same sampler) is far larger
    dp_sgd = dp_accounting.pld.PLDAccountant()
    dp_sgd.compose(event, 21)
    assert dp_sgd.get_epsilon(1e-5) > 1.5 * eps
    assert private.event().count == 6


@pytest.mark.slow
def test_band_mf_trains_and_publishes_no_buffers():
    from dpjax.dp_sgd import BandMF

    private, data = _private(BandMF(bands=3), steps=6, epochs=None)
    w, state, _ = private.fit(jnp.zeros(3), data, progress=False)
    assert np.all(np.isfinite(np.asarray(w))) and int(state.step) == 6
    assert isinstance(state.opt_state[0], CorrelatedNoiseState)
    public = private.public_state(state)
    assert public.opt_state[0] == PublicNoiseState(count=state.opt_state[0].count)


def test_resume_under_another_strategy_is_refused():
    """The ledger records the strategy: a state of BandMF(3) is not stepped by BandMF(2), by a
    BandMF(3) with another C, or by DP-SGD (each would charge the wrong ε). Fails without the
    ledger words (the plans were equal: same σ, q, C, n, cap)."""
    from dpjax.dp_sgd import BandMF

    kw = dict(steps=6, epochs=None, batch_size=5, n=120)
    first, data = _private(BandMF(bands=3), **kw)
    state = first.init(jnp.zeros(3))
    other_c = lambda n, b: np.eye(n) + 0.5 * np.eye(n, k=-1)  # noqa: E731
    for noise in (BandMF(bands=2), BandMF(bands=3, strategy=other_c), None):
        other, _ = _private(noise, key=5, **kw)
        with pytest.raises(ValueError, match="another plan"):
            other.step(jnp.zeros(3), state, data)
        with pytest.raises(ValueError, match="correlated noise"):
            other.continue_from(state)  # the buffers would carry over into another strategy


def test_band_mf_bad_arguments():
    from dpjax.dp_sgd import BandMF

    with pytest.raises(ValueError, match="noise"):
        _private("banded")
    with pytest.raises(ValueError, match="batch_size"):
        _private(BandMF(bands=20))  # parts of 11 records < batch 20
    with pytest.raises(ValueError, match="bands"):
        BandMF(bands=0)


def test_checkpoint_resume_continues_the_noise_stream():
    """A state saved with flax.serialization and restored into tx.init(params) continues the
    same noise (keys and buffers restored); re-creating the transform with the same key and
    starting again would replay step 0's noise instead."""
    serialization = pytest.importorskip("flax.serialization")
    n = 6
    tx = correlated_noise(
        _banded(n, 3), noise_multiplier=1.0, l2_clip_norm=1.0, key=jax.random.key(4)
    )
    update = jax.jit(tx.update)
    state = tx.init(PARAMS)
    for _ in range(3):
        _, state = update(PARAMS, state)
    blob = serialization.to_bytes(state)
    expected, _ = update(PARAMS, state)
    restored = serialization.from_bytes(tx.init(PARAMS), blob)
    resumed, _ = update(PARAMS, restored)
    np.testing.assert_array_equal(_flat(resumed), _flat(expected))
    replay, _ = update(PARAMS, tx.init(PARAMS))
    assert not np.allclose(_flat(replay), _flat(expected))


def test_band_mf_is_refused_at_user_level_and_with_adaptive_clipping():
    from dpjax.dp_sgd import AdaptiveClip, BandMF

    with pytest.raises(ValueError, match="noise"):
        _private(BandMF(bands=2), user_ids=np.arange(203) // 2)
    clip = AdaptiveClip(
        target_quantile=0.5, learning_rate=0.2, count_noise_multiplier=5.0, initial=1.0
    )
    with pytest.raises(ValueError, match="noise"):
        _private(BandMF(bands=2), l2_clip_norm=clip)


@pytest.mark.parametrize(
    "dtype", [jnp.bfloat16, pytest.param(jnp.float16, marks=pytest.mark.slow)]
)  # float16 shares bfloat16's float32 draw-and-cast path: its twin runs in the slow suite
def test_low_precision_updates_get_float32_correlated_noise(dtype):
    """bf16/fp16 models: the correlated noise is drawn and solved in float32 (the sound
    sampler's law and reach, not the 128-value bf16 draw) and cast back once, like
    add_gaussian_noise: every release equals add_gaussian_noise's on C = I, and a banded
    stream has far more than 2⁸ distinct values."""
    params = jnp.zeros(4096, dtype)
    ident = correlated_noise(
        np.eye(2), noise_multiplier=1.0, l2_clip_norm=1.0, key=jax.random.key(4)
    )
    ref = add_gaussian_noise(1.0, key=jax.random.key(4))
    s_mf, s_ref = ident.init(params), ref.init(params)
    for _ in range(2):
        a, s_mf = jax.jit(ident.update)(params, s_mf)
        b, s_ref = jax.jit(ref.update)(params, s_ref)
        assert a.dtype == dtype
        np.testing.assert_array_equal(np.asarray(a, np.float64), np.asarray(b, np.float64))
    banded = correlated_noise(
        _banded(6, 3), noise_multiplier=1.0, l2_clip_norm=1.0, key=jax.random.key(4)
    )
    state = banded.init(params)
    for _ in range(3):
        out, state = jax.jit(banded.update)(params, state)
    assert jax.tree.leaves(state.noise_buffers)[0].dtype == jnp.float32
    assert np.unique(np.asarray(out, np.float64)).size > 256


def test_float16_updates_refuse_a_noise_std_they_cannot_hold():
    """σ·clip = 3·10⁴ on float16 updates: the float32 noise cast back to float16 made 553 of
    20 000 coordinates ±inf (one step, C = I) where add_gaussian_noise refuses the std. Now
    refused the same way (float32 updates take it: the bf16/f32 tests above)."""
    tx = correlated_noise(np.eye(2), noise_multiplier=1.0, l2_clip_norm=3e4, key=jax.random.key(0))
    half = jnp.zeros(64, jnp.float16)
    with pytest.raises(ValueError, match="stddev"):
        tx.update(half, tx.init(half), half)
    with pytest.raises(ValueError, match="stddev"):
        jax.jit(tx.update)(half, tx.init(half), half)


def test_float32_updates_refuse_a_noise_std_their_noise_dtype_flushes():
    """σ·clip = 1e-40 is subnormal in float32: the correlated noise would be flushed to (almost)
    zero, as in the i.i.d. and sharded transforms, so it is refused the same way, also under
    jit (the std is a constant of the transform)."""
    tx = correlated_noise(
        np.eye(2), noise_multiplier=1e-40, l2_clip_norm=1.0, key=jax.random.key(0)
    )
    single = jnp.zeros(64, jnp.float32)
    with pytest.raises(ValueError, match="noise scale"):
        tx.update(single, tx.init(single), single)
    with pytest.raises(ValueError, match="noise scale"):
        jax.jit(tx.update)(single, tx.init(single), single)
    wide = jnp.zeros(64, jnp.float64)  # float64 noise holds 1e-40 as a normal number
    noisy, _ = tx.update(wide, tx.init(wide), wide)
    assert 0.0 < float(jnp.max(jnp.abs(noisy))) < 1e-38
