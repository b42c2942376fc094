"""Issue 25's papercuts: each test attacks one fix and fails on the code before it."""

import secrets
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dpjax
from dpjax.accounting import PrivacyAccountant
from dpjax.dp_sgd.samplers import PaddedBatch
from dpjax.erm import PrivateLogisticRegression, losses, solve
from dpjax.erm.estimator import PrivacyLeakWarning
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


# ----------------------------------------------------------------------------- estimator scale


def _breast_cancer():
    datasets = pytest.importorskip("sklearn.datasets")
    return datasets.load_breast_cancer(return_X_y=True)


def test_estimator_without_a_scale_warns_and_reports_every_row_clipped():
    X, y = _breast_cancer()
    clf = PrivateLogisticRegression(epsilon=3.0, classes=[0, 1], random_state=jax.random.key(0))
    with pytest.warns(PrivacyLeakWarning, match="neither data_norm nor bounds"):
        clf.fit(X, y)
    assert clf.clipped_fraction_ == 1.0  # raw features: every row norm is > 1


def test_estimator_with_public_bounds_learns_and_clips_nothing():
    X, y = _breast_cancer()
    # stand-in for published feature ranges (a real release takes them from a data dictionary)
    bounds = (np.floor(X.min(axis=0)), np.ceil(X.max(axis=0)))
    majority = max(np.mean(y), 1.0 - np.mean(y))  # 0.627
    scores = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)
        for k in range(3):
            clf = PrivateLogisticRegression(
                epsilon=3.0, classes=[0, 1], bounds=bounds, random_state=jax.random.key(k)
            ).fit(X, y)
            scores.append(clf.score(X, y))
    assert clf.clipped_fraction_ == 0.0
    # n = 569: a score's sd around the majority rate is ≤ 0.021; require a 6-sd improvement
    assert np.mean(scores) > majority + 6 * 0.021


def test_estimator_scale_maps_and_coefficients_in_original_units():
    rng = np.random.default_rng(0)
    X = rng.uniform(-5.0, 15.0, size=(40, 2))
    y = (X[:, 0] > 5.0).astype(int)
    clf = PrivateLogisticRegression(
        epsilon=5.0, classes=[0, 1], bounds=([-5.0, -5.0], [15.0, 15.0]), data_norm=12.0,
        random_state=jax.random.key(0),
    ).fit(X, y)  # fmt: skip
    centred_norm = np.linalg.norm(X - 5.0, axis=1)
    assert clf.clipped_fraction_ == np.mean(centred_norm > 12.0)
    inside = X[centred_norm <= 12.0]
    np.testing.assert_allclose(
        clf.decision_function(inside), inside @ clf.coef_[0] + clf.intercept_[0], rtol=1e-12
    )
    # (100, 100): box-clipped to (15, 15), then scaled to norm 12 around the centre (5, 5)
    mapped = np.full((1, 2), 5.0 + 10.0 * 12.0 / np.sqrt(200.0))
    np.testing.assert_allclose(
        clf.decision_function(np.array([[100.0, 100.0]])),
        mapped @ clf.coef_[0] + clf.intercept_[0],
        rtol=1e-12,
    )


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(data_norm=0.0), "data_norm"),
        (dict(data_norm=float("inf")), "data_norm"),
        (dict(bounds=(1.0, 1.0)), "bounds"),
        (dict(bounds=(0.0,)), "bounds"),
        (dict(bounds=([0.0, 0.0, 0.0], [1.0, 1.0, 1.0])), "bounds"),
    ],
)
def test_estimator_bad_scale_is_refused(kwargs, name):
    X = np.array([[1.0, 0.2], [0.9, 0.1], [-1.0, 0.0], [-0.8, -0.3]])
    clf = PrivateLogisticRegression(classes=[0, 1], random_state=jax.random.key(0), **kwargs)
    with pytest.raises(ValueError, match=name):
        clf.fit(X, np.array([0, 0, 1, 1]))


def test_estimator_delta_at_least_one_over_n_warns_naming_n():
    X = np.tile(np.array([[0.5, 0.1], [-0.5, 0.0]]), (50, 1))
    y = np.tile([1, 0], 50)
    clf = PrivateLogisticRegression(
        epsilon=1.0, delta=0.01, classes=[0, 1], data_norm=1.0, random_state=jax.random.key(0)
    )
    with pytest.warns(PrivacyLeakWarning, match=r"1/n = 1/100"):
        clf.fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)
        clf.set_params(delta=1e-5, random_state=jax.random.key(1)).fit(X, y)


# ----------------------------------------------------------------------------- pure ε, released


def test_estimator_objective_pure_epsilon_covers_the_released_iterate():
    """The AGD iterate alone is not ε-DP (its step count jumps with ‖b‖); the estimator now
    releases it plus gamma-norm noise for the residual 2τ, spending 1% of ε on it."""
    X = np.tile(np.array([[0.5, 0.1], [-0.5, 0.0], [0.2, -0.4]]), (40, 1))
    y = np.tile([1, 0, 1], 40)
    eps = 2.0
    clf = PrivateLogisticRegression(
        epsilon=eps, delta=0.0, classes=[0, 1], data_norm=1.0, random_state=jax.random.key(0)
    ).fit(X, y)
    res = clf.result_
    mu_total = clf.mu_ + res.extra_regularization
    assert res.sensitivity == pytest.approx(2e-9 / mu_total, rel=1e-12)  # Δ_o = 2τ
    assert res.noise_scale == pytest.approx(res.sensitivity / (0.01 * eps), rel=1e-12)
    assert res.event.epsilon == eps and res.event.delta == 0.0


def test_accelerated_solve_meets_tau_on_both_sides_of_a_step_count_jump():
    """The premise of the output-noise argument: ‖ŵ − w_p‖ ≤ τ for every b, also where K(‖b‖)
    changes by one (the place where b ↦ ŵ is discontinuous)."""
    from dpjax.erm.accelerated import accelerated_steps, smoothness_bound
    from dpjax.erm.objective_perturbation import tilted_minimiser
    from dpjax.erm.solver import solve_prepared

    rng = np.random.default_rng(3)
    X = rng.normal(size=(60, 3))
    X = jnp.asarray(X / np.linalg.norm(X, axis=1, keepdims=True))
    y = jnp.asarray(np.where(rng.normal(size=60) > 0, 1.0, -1.0))
    mu, tau = 0.05, 1e-6
    beta = smoothness_bound(loss_smoothness=losses.logistic.smoothness, mu=mu)
    root_kappa = np.sqrt(beta / mu)
    # K(R) = ⌈√κ ln((1+κ)R²/τ²)⌉ jumps at R_m = τ·sqrt(e^{m/√κ}/(1+κ)); R = (L + ‖b‖/n)/μ
    m = int(np.ceil(root_kappa * np.log((1 + beta / mu) * (3.0 / mu) ** 2 / tau**2)))
    r_jump = tau * np.sqrt(np.exp(m / root_kappa) / (1.0 + beta / mu))
    direction = jnp.asarray([0.6, -0.8, 0.0])
    counts = []
    for side in (1.0 - 1e-6, 1.0 + 1e-6):
        tilt = direction * (mu * r_jump * side - 1.0)  # ‖tilt‖ = ‖b‖/n
        radius = (1.0 + float(jnp.linalg.norm(tilt))) / mu
        counts.append(accelerated_steps(mu=mu, beta=beta, radius=radius, accuracy=tau))
        w_hat = tilted_minimiser(X, y, loss=losses.logistic, mu=mu, tilt=tilt, accuracy=tau)
        exact = solve_prepared(X, y, loss=losses.logistic, mu=mu, tilt=tilt, tol=1e-26)
        assert float(exact.certificate) <= 1e-26
        assert float(jnp.linalg.norm(w_hat.params - exact.params)) <= tau
    assert counts[1] == counts[0] + 1  # the two tilts straddle a jump of K
