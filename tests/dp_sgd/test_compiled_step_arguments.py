"""make_private's compiled step takes σ·C and the public pytree as ARGUMENTS: one compiled
step serves every σ, public weights are never constants of it, never trained, clipped or
noised, and the noise is still exactly σ·C of the plan the ledger records."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dpjax
from dpjax.dp_sgd.transforms import add_gaussian_noise

N, B = 64, 8


def _data():
    x = np.random.default_rng(0).normal(size=(N, 3)).astype(np.float32)
    return jnp.asarray(x)


def _closed_loss(w0):
    return lambda w, x: jnp.sum((x @ (w0 + w)) ** 2)


def _public_loss(w, x, public):
    return jnp.sum((x @ (public["w0"] + w)) ** 2)


def _private(loss, sigma, key=1, public=None, optimizer=None, cap=None):
    return dpjax.make_private(
        loss, optimizer=optimizer or optax.sgd(0.5), l2_clip_norm=1.0, dataset_size=N,
        batch_size=B, delta=1e-5, key=jax.random.key(key), steps=2, noise_multiplier=sigma,
        clipping="ghost", public=public, max_batch_size=cap,
    )  # fmt: skip


def _step_hlo(private, params, data):
    state = private.init(params)
    stddev = np.asarray(private._runtime_stddev, jax.dtypes.canonicalize_dtype(np.float64))
    lowered = private._jitted_step.lower(
        params, state.step, state.key, state.opt_state, data, None, stddev, private.public
    )
    return lowered.as_text()


def test_two_sigmas_compile_to_the_same_step():
    w = jnp.zeros((3, 2), jnp.float32)
    w0 = {"w0": jnp.ones((3, 2), jnp.float32)}
    data = _data()
    cap = _private(_public_loss, 0.8, public=w0).max_batch_size  # the larger ε: larger cap
    assert _private(_public_loss, 2.5, public=w0).max_batch_size < cap
    one = _step_hlo(_private(_public_loss, 0.8, public=w0, cap=cap), w, data)
    two = _step_hlo(_private(_public_loss, 2.5, public=w0, cap=cap), w, data)
    assert one == two


def test_a_given_cap_below_the_slack_cap_is_refused():
    need = _private(_public_loss, 0.8, public={"w0": jnp.ones((3, 2))}).max_batch_size
    with pytest.raises(ValueError, match="max_batch_size"):
        _private(_public_loss, 0.8, public={"w0": jnp.ones((3, 2))}, cap=need - 1)
    with pytest.raises(ValueError, match="max_batch_size"):
        _private(_public_loss, 0.8, public={"w0": jnp.ones((3, 2))}, cap=N + 1)


def test_public_weights_are_arguments_not_constants():
    w = jnp.zeros((3, 2), jnp.float32)
    data = _data()
    a = {"w0": jnp.full((3, 2), 0.25, jnp.float32)}
    b = {"w0": jnp.full((3, 2), -7.0, jnp.float32)}
    assert _step_hlo(_private(_public_loss, 1.0, public=a), w, data) == _step_hlo(
        _private(_public_loss, 1.0, public=b), w, data
    )


@pytest.mark.slow  # default twins: the two HLO tests above
def test_the_noise_is_sigma_times_c_of_the_plan():
    """Zero gradient, SGD(1): θ₁ = −σC·Z/(q·n) with Z the noise of make_private's noise key."""
    sigma = 1.7
    private = _private(lambda w, x: 0.0 * jnp.sum(w) * jnp.sum(x), sigma,
                       optimizer=optax.sgd(1.0))  # fmt: skip
    w = jnp.zeros((5000,), jnp.float32)
    out, state, _ = private.fit(w, _data(), steps=1, progress=False)
    noise_key, _ = jax.random.split(jax.random.key(1))
    reference = add_gaussian_noise(sigma * 1.0, key=noise_key)
    z, _ = reference.update(jnp.zeros_like(w), reference.init(w), w)
    expected = -np.asarray(z) / private.expected_batch_size
    np.testing.assert_array_equal(np.asarray(out), expected.astype(np.float32))
    assert private.noise_multiplier == sigma
    # teeth: the std is σC/(q·n), not another σ
    assert np.std(np.asarray(out)) * private.expected_batch_size == pytest.approx(sigma, rel=0.05)


@pytest.mark.slow
def test_public_weights_give_the_closed_over_update_and_are_not_trained():
    w0 = jnp.asarray(np.random.default_rng(1).normal(size=(3, 2)), jnp.float32)
    w = jnp.zeros((3, 2), jnp.float32)
    data = _data()
    closed = _private(_closed_loss(w0), 1.0).fit(w, data, progress=False)[0]
    passed = _private(_public_loss, 1.0, public={"w0": w0}).fit(w, data, progress=False)[0]
    np.testing.assert_allclose(np.asarray(passed), np.asarray(closed), rtol=1e-6, atol=1e-7)
    other = _private(_public_loss, 1.0, public={"w0": w0 + 1.0}).fit(w, data, progress=False)[0]
    assert not np.allclose(np.asarray(other), np.asarray(passed))  # teeth: public is used
    assert jax.tree.structure(passed) == jax.tree.structure(w)  # only params come back


def test_public_needs_a_loss_that_takes_it_and_numeric_leaves():
    with pytest.raises(ValueError, match="public"):
        _private(_closed_loss(jnp.ones((3, 2))), 1.0, public={"w0": jnp.ones((3, 2))})
    with pytest.raises(ValueError, match="public"):
        _private(_public_loss, 1.0, public={"w0": "weights"})
