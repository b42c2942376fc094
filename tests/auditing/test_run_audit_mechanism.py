"""The run audit audits the mechanism ``make_private`` runs: the same keys give the same noises.

The audit rebuilds one state per key from one ``init`` (``states_for_keys``); it must derive the
noise keys exactly as ``make_private(key=k)`` does — with adaptive clipping the count noise and
the gradient noise come from two different streams, with ``noise=BandMF`` the correlated noise
and the row-order record from the run's own key.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dpjax
from dpjax.auditing import dp_sgd_audit as dsa
from dpjax.dp_sgd import BandMF
from dpjax.dp_sgd.adaptive_clip import AdaptiveClip

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
    extra = {"adaptive": dict(l2_clip_norm=ADAPTIVE), "fixed": dict(l2_clip_norm=1.0),
             "bandmf": dict(l2_clip_norm=1.0, noise=BandMF(bands=2))}[variant]  # fmt: skip
    return dpjax.make_private(
        loss, optimizer=dsa.canary_optimizer(optax.sgd(0.5)), dataset_size=N,
        batch_size=BATCH, steps=STEPS, noise_multiplier=1.0, delta=1e-5, key=key,
        clipping="vmap", accounting="rdp", **extra,
    )  # fmt: skip


@pytest.mark.parametrize("variant", ["fixed", "adaptive", "bandmf"])
def test_states_for_keys_are_make_private_inits(variant):
    loss, params, _ = _canaried()
    k = jax.random.key(7)
    own = _private(loss, k, variant).init(params)
    other = _private(loss, jax.random.key(8), variant).init(params)
    stacked = dsa.states_for_keys(other, k[None])
    own_leaves, stacked_leaves = jax.tree.leaves(own), jax.tree.leaves(stacked)
    assert len(own_leaves) == len(stacked_leaves)
    for a, b in zip(own_leaves, stacked_leaves, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b)[0])


def test_adaptive_count_and_gradient_noise_keys_differ_in_the_audited_state():
    loss, params, _ = _canaried()
    stacked = dsa.states_for_keys(_private(loss, jax.random.key(8), "adaptive").init(params),
                                  jax.random.split(jax.random.key(3), 4))  # fmt: skip
    clip, noise = stacked.opt_state[0], stacked.opt_state[1]
    for r in range(4):
        assert not np.array_equal(clip.count_noise.key[r], noise.key[r])


@pytest.mark.parametrize("variant", ["adaptive", "bandmf"])
def test_the_audited_release_is_the_real_steps_release(variant):
    loss, params, data = _canaried()
    k = jax.random.key(11)
    audited = dsa.canary_updates(_private(loss, jax.random.key(99), variant), params, data,
                                 k[None])  # fmt: skip
    real = _private(loss, k, variant)
    p, state = params, real.init(params)
    for t in range(STEPS):
        # the step releases the noisy sum in units of C_t, times C_t/(q·n) (C_t = 1: BandMF)
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
