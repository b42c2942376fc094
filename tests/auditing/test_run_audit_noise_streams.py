"""The run audit replays ``make_private``'s own noise for adaptive clipping and BandMF runs.

``states_for_keys`` must derive a BandMF run's correlated-noise key and row-order record as
``make_private(key=k)`` does (the generic re-keying missed them: every audited run drew the same
noise), and ``canary_updates`` must read an adaptive step's release in units of that step's
C_t: the audited observations are then the real step's release on the same keys.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dpjax
from dpjax.auditing import dp_sgd_audit as dsa
from dpjax.dp_sgd import AdaptiveClip, BandMF

REPLAYED_KEY = 11  # the key of the real run the audited BandMF run 0 replays
N, BATCH, STEPS = 40, 4, 4
ADAPTIVE = AdaptiveClip(target_quantile=0.5, learning_rate=0.2, count_noise_multiplier=2.0,
                        initial=1.0)  # fmt: skip


def _loss(w, ex):
    return jnp.logaddexp(0.0, -ex["y"] * (ex["x"] @ w))


def _canaried():
    x = jax.random.normal(jax.random.key(5), (N - 2, 2))
    data = {"x": x, "y": jnp.sign(x[:, 0])}
    return dsa.add_gradient_canaries(_loss, jnp.zeros(2), data, [True, False], l2_clip_norm=1.0)


def _private(loss, key, variant):
    extra = {"adaptive": dict(l2_clip_norm=ADAPTIVE),
             "bandmf": dict(l2_clip_norm=1.0, noise=BandMF(bands=2))}[variant]  # fmt: skip
    return dpjax.make_private(
        loss, optimizer=dsa.canary_optimizer(optax.sgd(0.5)), dataset_size=N,
        batch_size=BATCH, steps=STEPS, noise_multiplier=1.0, delta=1e-5, key=key,
        clipping="vmap", accounting="rdp", **extra,
    )  # fmt: skip


def test_bandmf_states_for_keys_are_make_private_inits():
    loss, params, _ = _canaried()
    k = jax.random.key(7)
    own = _private(loss, k, "bandmf").init(params)
    other = _private(loss, jax.random.key(8), "bandmf").init(params)
    stacked = dsa.states_for_keys(other, k[None])
    own_leaves, stacked_leaves = jax.tree.leaves(own), jax.tree.leaves(stacked)
    assert len(own_leaves) == len(stacked_leaves)
    for a, b in zip(own_leaves, stacked_leaves, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b)[0])


@pytest.fixture(scope="module")
def bandmf_audit():
    """One audited BandMF run on two keys, shared by the tests that read it (one compile):
    run 0 on the key the real-step test replays, run 1 on another key."""
    loss, params, data = _canaried()
    keys = jnp.concatenate([jax.random.key(REPLAYED_KEY)[None], jax.random.key(3)[None]])
    return dsa.canary_updates(_private(loss, jax.random.key(99), "bandmf"), params, data, keys)


def test_bandmf_audited_runs_draw_different_noise(bandmf_audit):
    run = bandmf_audit
    # canary 1 is OUT (a zero row): its observations are the noise alone
    first, second = run.observations[0, :, 1], run.observations[1, :, 1]
    assert np.all(np.isfinite(run.observations))
    assert not np.allclose(first, second, rtol=0.0, atol=1e-3)


@pytest.mark.parametrize("variant", ["adaptive", "bandmf"])
def test_the_audited_release_is_the_real_steps_release(variant, request):
    loss, params, data = _canaried()
    k = jax.random.key(REPLAYED_KEY)
    if variant == "bandmf":  # its run 0 is on k
        audited = request.getfixturevalue("bandmf_audit")
    else:
        audited = dsa.canary_updates(
            _private(loss, jax.random.key(99), variant), params, data, k[None]
        )
    real = _private(loss, k, variant)
    p, state = params, real.init(params)
    for t in range(STEPS):
        # the step releases the noisy sum in units of C_t, times C_t/(q·n) (C = 1: BandMF)
        clip = float(state.opt_state[0].clip_norm) if variant == "adaptive" else 1.0
        p_next, state, _ = real.step(p, state, data)
        x = -(np.asarray(p_next["canary"]) - np.asarray(p["canary"])) * BATCH / clip
        np.testing.assert_allclose(audited.observations[0, t], x, rtol=1e-5, atol=1e-5)
        p = p_next
    final = jax.tree.map(lambda a: a[0], audited.final_params)
    for a, b in zip(jax.tree.leaves(final), jax.tree.leaves(p), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_audit_run_audits_an_adaptive_run():
    x = jax.random.normal(jax.random.key(1), (100, 2))
    result = dsa.audit_run(
        _loss, jnp.zeros(2), {"x": x, "y": jnp.sign(x[:, 0])}, key=jax.random.key(0),
        optimizer=optax.sgd(0.1), l2_clip_norm=ADAPTIVE, batch_size=100, delta=1e-5,
        num_canaries=100, guesses=50, steps=5, noise_multiplier=3.0, accounting="rdp",
        clipping="vmap",
    )  # fmt: skip
    assert result.can_refute and result.canaries == 100
    assert 0.0 <= result.white_box.epsilon <= result.claimed_epsilon
