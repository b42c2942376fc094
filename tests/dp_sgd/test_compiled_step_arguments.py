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
from dpjax import _noise
from dpjax.dp_sgd.transforms import _gaussian_noise_at_runtime_stddev, add_gaussian_noise
from tests.helpers import float32_at_or_above

N, B = 64, 8


def _data():
    x = np.random.default_rng(0).normal(size=(N, 3)).astype(np.float32)
    return jnp.asarray(x)


def _closed_loss(w0):
    return lambda w, x: jnp.sum((x @ (w0 + w)) ** 2)


def _public_loss(w, x, public):
    return jnp.sum((x @ (public["w0"] + w)) ** 2)


def _private(loss, sigma, key=1, public=None, optimizer=None, cap=None, clipping="ghost"):
    return dpjax.make_private(
        loss, optimizer=optimizer or optax.sgd(0.5), l2_clip_norm=1.0, dataset_size=N,
        batch_size=B, delta=1e-5, key=jax.random.key(key), steps=2, noise_multiplier=sigma,
        clipping=clipping, public=public, max_batch_size=cap,
    )  # fmt: skip


def _step_hlo(private, params, data):
    state = private.init(params)
    stddev = _noise.scale_rounded_up(private._runtime_stddev, np.float64)
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


@pytest.mark.parametrize("x64", [False, True])
def test_runtime_sigma_c_noise_is_bit_identical_to_the_constant_path(x64):
    """σ·C = 0.7·1.1 is no float32 number: both paths round it the same way (no less noise)."""
    sigma_c = 0.7 * 1.1
    with jax.enable_x64(x64):
        updates = {"w": jnp.arange(6.0, dtype=jnp.float32).reshape(2, 3)}
        key = jax.random.key(3)
        const = add_gaussian_noise(sigma_c, key=key)
        runtime = _gaussian_noise_at_runtime_stddev(sigma_c, key=key)
        want, _ = const.update(updates, const.init(updates), updates)
        s = _noise.scale_rounded_up(sigma_c, jax.dtypes.canonicalize_dtype(np.float64))
        got, _ = jax.jit(lambda u, st, s: runtime.update(u, st, u, noise_stddev=s))(
            updates, runtime.init(updates), s
        )
    assert np.asarray(got["w"]).tobytes() == np.asarray(want["w"]).tobytes()


@pytest.mark.parametrize("x64", [False, True])
def test_the_step_never_draws_less_than_the_sigma_c_its_ledger_charges(x64):
    """Zero gradient, SGD(1), σ·C = 1.3, whose nearest float32 is BELOW 1.3: the step's noise is
    the smallest float32 ≥ 1.3 times Z (never the nearest, which is less noise than charged),
    with x64 off (σ·C a float32 argument) and on (a float64 argument, float32 noise)."""
    sigma = 1.3
    assert float(np.float32(sigma)) < sigma  # the case where rounding to nearest loses noise
    with jax.enable_x64(x64):
        private = _private(lambda w, x: 0.0 * jnp.sum(w) * jnp.sum(x), sigma,
                           optimizer=optax.sgd(1.0), clipping="vmap")  # fmt: skip
        w = jnp.zeros((4000,), jnp.float32)
        out, _, _ = private.fit(w, _data(), steps=1, progress=False)
        noise_key, _ = jax.random.split(jax.random.key(1))
        unit = add_gaussian_noise(1.0, key=noise_key)  # 1·Z is Z exactly
        z, _ = unit.update(jnp.zeros_like(w), unit.init(w), w)
    batch = np.float32(private.expected_batch_size)
    charged = -(float32_at_or_above(sigma) * np.asarray(z, np.float32)) / batch
    np.testing.assert_array_equal(np.asarray(out), charged)
    nearest = -(np.float32(sigma) * np.asarray(z, np.float32)) / batch
    assert not np.array_equal(np.asarray(out), nearest)  # teeth: the two roundings differ


def _two_layer_public_loss(w, x, public):
    hidden = jnp.tanh(x @ (public["w0"] + w))
    return jnp.sum((hidden @ public["v"]) ** 2)


def test_ghost_norms_with_public_weights_match_per_example_gradients():
    """Public weights before and after the trained layer: ghost clips as vmap does."""
    rng = np.random.default_rng(2)
    public = {"w0": jnp.asarray(rng.normal(size=(3, 2)), jnp.float32),
              "v": jnp.asarray(3.0 * rng.normal(size=(2, 4)), jnp.float32)}  # fmt: skip
    w = jnp.zeros((3, 2), jnp.float32)
    out = {
        c: _private(_two_layer_public_loss, 1.0, public=public, clipping=c).fit(
            w, _data(), steps=1, progress=False
        )[0]
        for c in ("ghost", "vmap")
    }
    np.testing.assert_allclose(np.asarray(out["ghost"]), np.asarray(out["vmap"]), atol=1e-5)


def _runtime_noise(stddev, key):
    tx = _gaussian_noise_at_runtime_stddev(stddev, key=key)
    # as in the compiled step: the std reaches the update traced, so only the plan's value
    # (the transform's own ``stddev``) can be checked on the host
    step = jax.jit(lambda u, s, sd: tx.update(u, s, None, noise_stddev=sd))
    return tx, lambda updates, state: step(updates, state, jnp.float32(stddev))


def _constant_noise(stddev, key):
    tx = add_gaussian_noise(stddev, key=key)
    return tx, lambda updates, state: tx.update(updates, state, None)


@pytest.mark.parametrize("make", [_runtime_noise, _constant_noise], ids=["runtime", "constant"])
@pytest.mark.parametrize(
    ("stddev", "dtype", "named"),
    [(1e4, jnp.float16, "float16"), (1e-40, jnp.float32, "noise scale")],
    ids=["beyond_float16", "flushed_in_float32"],
)
def test_runtime_and_constant_noise_refuse_the_same_unholdable_std(make, stddev, dtype, named):
    """Both Gaussian paths refuse a std the leaf's dtype cannot hold (float16 overflow) or that
    its noise dtype flushes to zero (1e-40 in float32): the runtime path checks the plan's σ·C."""
    with jax.enable_x64(False):
        tx, update = make(stddev, jax.random.key(0))
        updates = jnp.zeros(4, dtype)
        state = tx.init(updates)
        with pytest.raises(ValueError, match=named):
            update(updates, state)


def test_a_larger_cap_is_the_one_the_accountant_charges_the_overflow_of():
    """The truncation slack is charged for the GIVEN cap: the plan records it and the per-step
    overflow chance is P[Binomial(n + 1, q) > cap] (scipy), smaller than the default cap's."""
    from scipy.stats import binom

    from dpjax.dp_sgd.training.accounting import _overflow

    w0 = {"w0": jnp.ones((3, 2))}
    default = _private(_public_loss, 0.8, public=w0)
    given = default.max_batch_size + 5
    larger = _private(_public_loss, 0.8, public=w0, cap=given)
    assert larger.max_batch_size == larger._plan.max_batch_size == given
    q = larger.sampling_rate
    np.testing.assert_allclose(_overflow(larger._plan), binom.sf(given, N + 1, q), rtol=1e-9)
    assert _overflow(larger._plan) < _overflow(default._plan)
