"""Issue 25's papercuts: each test attacks one fix and fails on the code before it."""

import secrets

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dpjax
from dpjax.accounting import PrivacyAccountant
from dpjax.dp_sgd.samplers import PaddedBatch
from dpjax.erm import losses, solve
from dpjax.events import LaplaceEvent
from dpjax.mechanisms import gaussian, laplace

# ----------------------------------------------------------------------------- loss conventions


def test_clipped_grad_names_make_private_form_for_a_one_pytree_loss():
    loss = lambda w, ex: jnp.dot(w, ex[0]) - ex[1]  # noqa: E731  make_private's form
    grad_fn = dpjax.clipped_grad(loss, l2_clip_norm=1.0)
    with pytest.raises(ValueError, match=r"loss_fn.*loss_fn\(params, \*example\).*make_private"):
        grad_fn(jnp.zeros(2), jnp.ones((4, 2)), jnp.ones(4))


def test_make_private_with_clipped_grad_form_names_both_conventions():
    n = 200
    data = (jnp.ones((n, 2)), jnp.ones(n))
    private = dpjax.make_private(
        lambda w, x, y: jnp.dot(w, x) - y,  # clipped_grad's form given to make_private
        optimizer=optax.sgd(0.1),
        l2_clip_norm=1.0,
        dataset_size=n,
        batch_size=20,
        steps=1,
        noise_multiplier=1.0,
        delta=1e-5,
        key=jax.random.key(0),
    )
    with pytest.raises(ValueError, match=r"make_private calls loss_fn\(params, example"):
        private.fit(jnp.zeros(2), data, progress=False)


def test_clipped_grad_keeps_type_errors_from_inside_the_loss():
    def loss(w, x):
        return jnp.dot(w, x) + "not a number"

    with pytest.raises(TypeError):
        dpjax.clipped_grad(loss, l2_clip_norm=1.0)(jnp.zeros(2), jnp.ones((3, 2)))


# ----------------------------------------------------------------------------- os_key


@pytest.mark.parametrize("x64", [True, False])
def test_os_key_10000_draws_full_width_and_distinct(x64):
    with jax.enable_x64(x64):
        data = np.stack([np.asarray(jax.random.key_data(dpjax.os_key())) for _ in range(10_000)])
    assert data.shape == (10_000, 2) and data.dtype == np.uint32
    # 64 random bits per key: collisions among 10⁴ keys have probability < 3e-12
    assert len({row.tobytes() for row in data}) == 10_000
    # every one of the 64 bits is used: each is set in 50% ± 5 sd (sd = 0.5%) of the keys
    bits = np.unpackbits(data.view(np.uint8), axis=1).mean(axis=0)
    assert np.all(np.abs(bits - 0.5) < 5 * 0.5 / np.sqrt(10_000))


def test_os_key_wraps_the_os_words_without_truncation(monkeypatch):
    words = np.array([0xFFFFFFFF, 0x80000001], np.uint32)  # a seed ≥ 2⁶³
    monkeypatch.setattr(secrets, "token_bytes", lambda n: words.tobytes()[:n])
    with jax.enable_x64(False):
        key = dpjax.os_key()
    np.testing.assert_array_equal(np.asarray(jax.random.key_data(key)), words)


def test_os_key_other_impl_gets_all_its_words():
    data = np.asarray(jax.random.key_data(dpjax.os_key("rbg")))
    assert data.shape == (4,) and data.dtype == np.uint32


# ----------------------------------------------------------------------------- accountant


def test_accountant_state_with_empty_orders_is_a_clear_error():
    acc = PrivacyAccountant([LaplaceEvent(noise_multiplier=1.0)])
    state = acc.state_dict()
    state["orders"] = []
    with pytest.raises(ValueError, match=r"orders must be a non-empty sequence"):
        PrivacyAccountant.from_state_dict(state)
    with pytest.raises(ValueError, match=r"orders must be a non-empty sequence"):
        PrivacyAccountant(orders=())


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
    jitted, eager = _grad_of_rows(dtype, n, rows)
    assert jitted == 1.5 and eager == 1.5


def test_padded_batch_small_dtype_out_of_range_and_repeats_still_caught():
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


# ----------------------------------------------------------------------------- huge sensitivity


@pytest.mark.parametrize(
    "mechanism, kwargs",
    [(gaussian, dict(delta=1e-5)), (laplace, {})],
)
@pytest.mark.parametrize("dtype, sensitivity", [(jnp.float32, 1e300), (jnp.float16, 1e4)])
def test_noise_that_overflows_the_value_dtype_is_refused(mechanism, kwargs, dtype, sensitivity):
    value = jnp.zeros(3, dtype)
    with pytest.raises(ValueError, match=r"sensitivity must be at most .* value \+ noise overflow"):
        mechanism(jax.random.key(0), value, sensitivity=sensitivity, epsilon=1.0, **kwargs)


@pytest.mark.parametrize("mechanism, kwargs", [(gaussian, dict(delta=1e-5)), (laplace, {})])
def test_largest_admissible_sensitivity_releases_finite_noise(mechanism, kwargs):
    value = jnp.zeros(1000, jnp.float32)
    with pytest.raises(ValueError) as info:
        mechanism(jax.random.key(1), value, sensitivity=1e300, epsilon=1.0, **kwargs)
    limit = float(str(info.value).split("at most ")[1].split(" ")[0])
    out = mechanism(jax.random.key(1), value, sensitivity=0.99 * limit, epsilon=1.0, **kwargs)
    assert np.all(np.isfinite(np.asarray(out)))
    assert float(jnp.max(jnp.abs(out))) > 1e-3 * float(jnp.finfo(jnp.float32).max)


def test_value_near_dtype_max_counts_in_the_limit():
    big = jnp.full(2, 3e38, jnp.float32)
    with pytest.raises(ValueError, match="sensitivity must be at most"):
        gaussian(jax.random.key(2), big, sensitivity=1e37, epsilon=1.0, delta=1e-5)


# ----------------------------------------------------------------------------- ERM labels


def test_reference_solve_refuses_zero_one_labels_for_margin_losses():
    X = jnp.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8], [0.0, -1.0]])
    y01 = jnp.array([1.0, 0.0, 1.0, 0.0])
    with pytest.raises(ValueError, match=r"y must be in \{−1, \+1\}"):
        solve(X, y01, loss=losses.logistic, mu=0.1)
    assert bool(solve(X, 2.0 * y01 - 1.0, loss=losses.logistic, mu=0.1).converged)
