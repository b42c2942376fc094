"""dpjax.erm losses and the certified exact solver, against independent references (scipy)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import optimize

from dpjax.erm import losses, objective, solve


def sphere_data(n, d, seed, w_norm=2.0):
    rng = np.random.default_rng(seed)
    g = rng.normal(size=(n, d))
    X = g / np.linalg.norm(g, axis=1, keepdims=True)
    w0 = rng.normal(size=d)
    w0 *= w_norm / np.linalg.norm(w0)
    y = np.where(rng.random(n) < 1.0 / (1.0 + np.exp(-X @ w0)), 1.0, -1.0)
    return X, y


def numpy_objective(kind, X, y, mu):
    """J written independently in NumPy (the reference for scipy)."""

    def J(w):
        s = y * (X @ w)
        if kind == "logistic":
            vals = np.logaddexp(0.0, -s)
        elif kind == "huber":
            h = 0.5
            vals = np.where(s > 1 + h, 0.0, np.where(s < 1 - h, 1 - s, (1 + h - s) ** 2 / (4 * h)))
        return vals.mean() + 0.5 * mu * w @ w

    return J


@pytest.mark.parametrize(
    "loss, kind", [(losses.logistic, "logistic"), (losses.huber_svm(0.5), "huber")]
)
def test_newton_matches_scipy_and_certifies(loss, kind):
    X, y = sphere_data(300, 4, seed=1)
    mu = 0.05
    res = solve(X, y, loss=loss, mu=mu)
    ref = optimize.minimize(numpy_objective(kind, X, y, mu), np.zeros(4), method="BFGS", tol=1e-12)
    assert bool(res.converged) and float(res.certificate) <= 1e-18
    np.testing.assert_allclose(np.asarray(res.params), ref.x, atol=1e-6)
    assert float(objective(loss, mu, jnp.asarray(X), jnp.asarray(y))(res.params)) <= ref.fun + 1e-12


def test_linear_loss_closed_form():
    X, y = sphere_data(200, 3, seed=2)
    mu = 0.3
    res = solve(X, y, loss=losses.linear, mu=mu)
    np.testing.assert_allclose(np.asarray(res.params), (y[:, None] * X).mean(0) / mu, atol=1e-12)


def test_lbfgs_path_agrees_with_newton():
    X, y = sphere_data(300, 6, seed=3)
    a = solve(X, y, loss=losses.logistic, mu=0.02)
    b = solve(X, y, loss=losses.logistic, mu=0.02, solver="lbfgs")
    assert bool(b.converged)
    np.testing.assert_allclose(np.asarray(a.params), np.asarray(b.params), atol=1e-8)


def _hinge_qp_reference(X, y, mu):
    """min (1/n)Σξ_i + (μ/2)‖w‖², ξ_i ≥ 0, ξ_i ≥ 1 − y_i⟨w, x_i⟩, by SLSQP (independent)."""
    n, d = X.shape

    def f(z):
        return z[d:].mean() + 0.5 * mu * z[:d] @ z[:d]

    cons = [
        {"type": "ineq", "fun": lambda z: z[d:]},
        {"type": "ineq", "fun": lambda z: z[d:] - 1.0 + y * (X @ z[:d])},
    ]
    out = optimize.minimize(
        f,
        np.concatenate([np.zeros(d), np.ones(n)]),
        constraints=cons,
        method="SLSQP",
        options={"ftol": 1e-14, "maxiter": 1000},
    )
    return out.x[:d], out.fun


@pytest.mark.parametrize("label_scale", [1.0, 0.6])
def test_sdca_hinge_matches_qp_and_gap_certificate(label_scale):
    X, y = sphere_data(40, 3, seed=4)
    y = y * np.where(np.arange(40) % 2, label_scale, 1.0)  # also |y| < 1 labels
    mu = 0.1
    res = solve(X, y, loss=losses.hinge, mu=mu)
    w_ref, f_ref = _hinge_qp_reference(X, y, mu)
    J = objective(losses.hinge, mu, jnp.asarray(X), jnp.asarray(y))
    assert bool(res.converged)
    assert float(J(res.params)) <= f_ref + 1e-8
    assert float(J(res.params)) - float(res.certificate) <= f_ref + 1e-8  # weak duality
    # the certificate bounds the distance: ‖ŵ − w*‖ ≤ √(2 gap/μ) (+ SLSQP's own error)
    assert np.linalg.norm(np.asarray(res.params) - w_ref) <= np.sqrt(2 * 1e-11 / mu) + 1e-5


def test_sdca_absolute_regression_is_optimal():
    rng = np.random.default_rng(5)
    X, _ = sphere_data(60, 2, seed=5)
    y = X @ np.array([1.0, -0.5]) + 0.1 * rng.normal(size=60)
    mu = 0.05
    res = solve(X, y, loss=losses.absolute, mu=mu)
    J = objective(losses.absolute, mu, jnp.asarray(X), jnp.asarray(y))
    ref = optimize.minimize(
        lambda w: float(J(jnp.asarray(w))),
        np.zeros(2),
        method="Nelder-Mead",
        options={"xatol": 1e-10, "fatol": 1e-14, "maxiter": 5000},
    )
    assert bool(res.converged)
    assert float(J(res.params)) <= ref.fun + 1e-9


def test_loss_constants_bound_derivatives():
    """L ≥ |∇ℓ| and c ≥ |φ''| on random points (‖x‖ = 1, y = ±1), and they are attained."""
    key = jax.random.key(7)
    s = jnp.linspace(-6.0, 6.0, 2001)
    for loss in (losses.logistic, losses.huber_svm(0.25), losses.linear):
        d1 = jax.vmap(jax.grad(loss.phi))(s)
        d2 = jax.vmap(jax.grad(jax.grad(loss.phi)))(s)
        assert float(jnp.max(jnp.abs(d1))) <= loss.lipschitz + 1e-12
        assert float(jnp.max(jnp.abs(d1))) >= 0.99 * loss.lipschitz
        assert float(jnp.max(jnp.abs(d2))) <= loss.smoothness + 1e-12
    assert losses.huber_svm(0.25).smoothness == 2.0  # 1/(2h)
    assert losses.logistic.smoothness == 0.25
    w = jax.random.normal(key, (3,))
    x = jnp.array([0.6, 0.8, 0.0])
    np.testing.assert_allclose(float(losses.logistic(w, x, -1.0)), np.logaddexp(0, w @ x))
    assert float(losses.hinge(w, x, 1.0)) == max(0.0, 1.0 - float(w @ x))
    assert float(losses.absolute(w, x, 0.3)) == pytest.approx(abs(float(w @ x) - 0.3))
    sq = losses.bounded_squared(radius=2.0, label_bound=0.5)
    assert sq.lipschitz == 2.5 and sq.smoothness == 1.0


def test_solver_refuses_bad_input():
    X, y = sphere_data(20, 2, seed=8)
    with pytest.raises(ValueError, match="mu must be in"):
        solve(X, y, loss=losses.logistic, mu=0.0)
    with pytest.raises(ValueError, match="X must be"):
        solve(2 * X, y, loss=losses.logistic, mu=0.1)
    with pytest.raises(ValueError, match="y must be"):
        solve(X, 3 * y, loss=losses.logistic, mu=0.1)
    with pytest.raises(ValueError, match="solver must be"):
        solve(X, y, loss=losses.hinge, mu=0.1, solver="newton")
    with pytest.raises(ValueError, match="mu must be"):
        solve(X, y, loss=losses.squared, mu=0.5)  # needs μ ≥ B/R = 1
    with pytest.raises(ValueError, match="h must be"):
        losses.huber_svm(0.0)


def test_solver_requires_float64():
    X, y = sphere_data(10, 2, seed=9)
    jax.config.update("jax_enable_x64", False)
    try:
        with pytest.raises(ValueError, match="jax_enable_x64"):
            solve(X, y, loss=losses.logistic, mu=0.1)
    finally:
        jax.config.update("jax_enable_x64", True)


def test_solver_fails_closed_flag_when_iterations_run_out():
    X, y = sphere_data(100, 3, seed=10)
    res = solve(X, y, loss=losses.logistic, mu=1e-3, max_iter=1)
    assert not bool(res.converged)
    assert float(res.certificate) > 1e-18


# ------------------------------------------------------------------------------------------------
# Issue 25's papercuts: each test attacks one fix and fails on the code before it.
# ------------------------------------------------------------------------------------------------

# ----------------------------------------------------------------------------- ERM labels


def test_reference_solve_refuses_zero_one_labels_for_margin_losses():
    """Catches {0, 1} labels silently accepted by a margin loss that needs {-1, +1}."""
    X = jnp.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8], [0.0, -1.0]])
    y01 = jnp.array([1.0, 0.0, 1.0, 0.0])
    with pytest.raises(ValueError, match=r"y must be in \{−1, \+1\}"):
        solve(X, y01, loss=losses.logistic, mu=0.1)
    assert bool(solve(X, 2.0 * y01 - 1.0, loss=losses.logistic, mu=0.1).converged)


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
