"""DP-GD / DP-SGD / Laplace DP-SGD for convex ERM: exactness without noise, calibration, bounds."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpjax import ADD_OR_REMOVE_ONE, REPLACE_ONE, laplace_dp_sgd_event
from dpjax.accounting import dp_sgd_epsilon, zcdp_rho_for_epsilon
from dpjax.erm import dp_gd, dp_sgd, laplace_dp_sgd, losses, objective, solve
from dpjax.erm._common import prepare_data
from dpjax.erm.iterative import default_steps, noisy_gradient_descent
from dpjax.events import GaussianEvent, PoissonSampledGaussianEvent
from tests.erm.test_solver import sphere_data


def test_zero_noise_unclipped_gd_matches_exact_solver():
    """The DP-GD hot path with σ = 0 and C = ∞ is plain GD: it converges to solve()'s w*."""
    n, d, mu, steps = 200, 3, 0.1, 400
    X, y = sphere_data(n, d, seed=30)
    Xp, yp = prepare_data(X, y, losses.logistic)
    eta = 1.0 / (losses.logistic.smoothness + mu)
    _, w_last = noisy_gradient_descent(
        jax.random.key(0),
        Xp,
        yp,
        loss=losses.logistic,
        mu=mu,
        radius=1e6,
        steps=steps,
        l2_clip_norm=1e9,
        noise_multiplier=0.0,
        normalizer=float(Xp.shape[0]),
        step_sizes=jnp.full(steps, eta),
        weights=jnp.full(steps, 1.0 / steps),
    )
    w_star = solve(X, y, loss=losses.logistic, mu=mu).params
    np.testing.assert_allclose(np.asarray(w_last), np.asarray(w_star), atol=1e-9)


def test_dp_gd_calibration_and_event():
    n, d, eps, delta = 200, 3, 1.0, 1e-5
    X, y = sphere_data(n, d, seed=31)
    res = dp_gd(
        jax.random.key(1),
        X,
        y,
        loss=losses.logistic,
        epsilon=eps,
        delta=delta,
        radius=5.0,
        steps=50,
    )
    rho = zcdp_rho_for_epsilon(epsilon=eps, delta=delta)
    # ρ = T Δ²/(2σ²) with Δ = 2L (replace-one) on the sum (lecture on ML under DP, zCDP)
    assert 50 * (2.0) ** 2 / (2 * (res.noise_scale * n) ** 2) == pytest.approx(rho, rel=1e-9)
    assert res.event == GaussianEvent(
        noise_multiplier=math.sqrt(50 / (2 * rho)), count=50, relation=REPLACE_ONE
    )
    assert res.sensitivity == 2.0
    assert default_steps(n=n, d=d, rho=rho) == math.ceil(n**2 * rho / (2 * d))


@pytest.mark.parametrize("mu", [0.0, 0.1])
def test_dp_gd_mean_excess_below_bound(mu):
    n, d, radius = 200, 3, 10.0
    X, y = sphere_data(n, d, seed=32)
    J = objective(losses.logistic, mu, jnp.asarray(X), jnp.asarray(y))
    # min over the ball ‖w‖ ≤ 10: the regularised solution (μ' small) lies inside the ball
    ref = solve(X, y, loss=losses.logistic, mu=max(mu, 1e-6)).params
    assert float(jnp.linalg.norm(ref)) < radius
    keys = jax.random.split(jax.random.key(2), 40)
    res = jax.jit(
        jax.vmap(
            lambda k: dp_gd(
                k,
                X,
                y,
                loss=losses.logistic,
                epsilon=1.0,
                delta=1e-5,
                radius=radius,
                mu=mu,
                steps=300,
            )
        )
    )(keys)
    excess = np.asarray(jax.vmap(J)(res.params)) - float(J(ref))
    upper = excess.mean() + 3 * excess.std() / math.sqrt(excess.size)
    assert upper <= res.excess_risk_bound
    assert np.all(np.linalg.norm(np.asarray(res.params), axis=1) <= radius + 1e-9)


@pytest.mark.slow  # the noise calibration (dpjax.accounting) takes ~6 s
def test_dp_sgd_event_matches_accountant():
    n, d = 200, 3
    X, y = sphere_data(n, d, seed=33)
    res = dp_sgd(
        jax.random.key(3),
        X,
        y,
        loss=losses.hinge,
        epsilon=2.0,
        delta=1e-5,
        radius=5.0,
        sampling_rate=0.1,
        steps=30,
        mu=0.1,
        accounting="rdp",
        dataset_size=n,
    )
    assert isinstance(res.event, PoissonSampledGaussianEvent)
    assert res.event.relation == ADD_OR_REMOVE_ONE and res.event.count == 30
    spent = dp_sgd_epsilon(
        noise_multiplier=res.event.noise_multiplier,
        delta=1e-5,
        sampling_rate=0.1,
        steps=30,
        method="rdp",
    )
    assert spent <= 2.0 + 1e-9 and spent >= 1.9
    assert res.noise_scale == pytest.approx(res.event.noise_multiplier * 1.0 / (0.1 * n))
    assert np.isfinite(np.asarray(res.params)).all() and math.isfinite(res.excess_risk_bound)


def test_laplace_dp_sgd_reuses_the_shared_event():
    n, d = 100, 2
    X, y = sphere_data(n, d, seed=34)
    res = laplace_dp_sgd(
        jax.random.key(4),
        X,
        y,
        loss=losses.logistic,
        epsilon=1.0,
        steps=20,
        rho=0.5,
        kappa=0.8,
        mu=0.1,
    )
    expected = laplace_dp_sgd_event(
        l1_sensitivity=2.0 * math.sqrt(d), epsilon=1.0, rho=0.5, kappa=0.8, steps=20
    )
    assert res.event == expected
    assert res.params.shape == (d,) and np.isfinite(np.asarray(res.params)).all()


def test_iterative_solvers_refuse_bad_input():
    X, y = sphere_data(20, 2, seed=35)
    key = jax.random.key(5)
    kw = dict(loss=losses.logistic, epsilon=1.0, delta=1e-5, radius=1.0)
    for bad, match in [
        ({"epsilon": 0.0}, "epsilon"),
        ({"delta": 0.0}, "delta"),
        ({"radius": -1.0}, "radius"),
        ({"mu": -0.1}, "mu"),
        ({"steps": 0}, "steps"),
        ({"output": "best"}, "output"),
    ]:
        with pytest.raises(ValueError, match=match):
            dp_gd(key, X, y, **{**kw, **bad})
    with pytest.raises(ValueError, match="sampling_rate"):
        dp_sgd(key, X, y, **kw, sampling_rate=1.5, steps=10, dataset_size=len(X))
    # add/remove-one: len(X) is private, so the public normaliser must be given
    with pytest.raises(ValueError, match="dataset_size"):
        dp_sgd(key, X, y, **kw, sampling_rate=0.5, steps=10)
    with pytest.raises(ValueError, match="dataset_size"):
        dp_gd(key, X, y, **kw, relation="add_or_remove_one")
    with pytest.raises(ValueError, match="rho"):
        laplace_dp_sgd(key, X, y, loss=losses.logistic, epsilon=1.0, steps=10, rho=1.5)
