"""Output perturbation: sensitivity, noise scale and law, events, bounds, jit/vmap, bad input."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from dpjax import ADD_OR_REMOVE_ONE, REPLACE_ONE
from dpjax.erm import bounds, losses, objective, output_perturbation, solve
from dpjax.events import EpsilonDeltaEvent, GaussianEvent
from dpjax.mechanisms import analytic_gaussian_sigma
from tests.erm.test_solver import sphere_data
from tests.helpers import assert_distribution


@pytest.mark.parametrize("loss", [losses.logistic, losses.hinge, losses.linear])
def test_argmin_sensitivity_holds_on_random_neighbours(loss):
    """‖w*(D) − w*(D′)‖ ≤ 2L/(μn) on random and adversarial replace-one neighbours."""
    n, mu = 60, 0.2
    X, y = sphere_data(n, 3, seed=11)
    w = np.asarray(solve(X, y, loss=loss, mu=mu).params)
    bound = 2 * loss.lipschitz / (mu * n)
    rng = np.random.default_rng(12)
    worst = 0.0
    for trial in range(6):
        i = int(rng.integers(n))
        X2, y2 = X.copy(), y.copy()
        if trial % 2:
            X2[i], y2[i] = -X[i], -y[i]  # the adversarial replacement
        else:
            g = rng.normal(size=3)
            X2[i], y2[i] = g / np.linalg.norm(g), rng.choice([-1.0, 1.0])
        w2 = np.asarray(solve(X2, y2, loss=loss, mu=mu).params)
        worst = max(worst, float(np.linalg.norm(w - w2)))
    assert worst <= bound * (1 + 1e-6)
    assert worst >= 0.1 * bound  # the check is not vacuous


def test_add_remove_sensitivity_with_public_normaliser():
    n, mu = 50, 0.2
    X, y = sphere_data(n + 1, 3, seed=13)
    w_big = np.asarray(solve(X, y, loss=losses.logistic, mu=mu, normalizer=n).params)
    w_small = np.asarray(solve(X[:n], y[:n], loss=losses.logistic, mu=mu, normalizer=n).params)
    assert np.linalg.norm(w_big - w_small) <= losses.logistic.lipschitz / (mu * n)


def test_linear_loss_attains_the_sensitivity():
    """On the linear loss the bound 2L/(μn) is attained exactly (the audit canary)."""
    n, mu = 40, 0.5
    X, y = sphere_data(n, 2, seed=14)
    X2, y2 = X.copy(), y.copy()
    X2[0] = -X[0]
    w1 = np.asarray(solve(X, y, loss=losses.linear, mu=mu).params)
    w2 = np.asarray(solve(X2, y2, loss=losses.linear, mu=mu).params)
    np.testing.assert_allclose(np.linalg.norm(w1 - w2), 2 / (mu * n), rtol=1e-12)


def test_noise_scale_equals_formula():
    n, d, mu, eps, delta = 200, 3, 0.1, 0.5, 1e-5
    X, y = sphere_data(n, d, seed=15)
    key = jax.random.key(0)
    sens = 2 * 1.0 / (mu * n)
    classic = output_perturbation(
        key, X, y, loss=losses.logistic, mu=mu, epsilon=eps, delta=delta, calibration="classic"
    )
    expected = 2 * 1.0 * math.sqrt(2 * math.log(1.25 / delta)) / (eps * mu * n)  # lecture's σ
    assert classic.noise_scale == pytest.approx(expected, rel=1e-6)
    assert classic.sensitivity == pytest.approx(sens, rel=1e-6)
    analytic = output_perturbation(key, X, y, loss=losses.logistic, mu=mu, epsilon=eps, delta=delta)
    ref = analytic_gaussian_sigma(sensitivity=sens, epsilon=eps, delta=delta)
    assert analytic.noise_scale == pytest.approx(ref, rel=1e-6)
    assert analytic.noise_scale < classic.noise_scale
    assert isinstance(analytic.event, GaussianEvent)
    assert analytic.event.noise_multiplier == pytest.approx(ref / sens, rel=1e-6)
    add_remove = output_perturbation(
        key,
        X,
        y,
        loss=losses.logistic,
        mu=mu,
        epsilon=eps,
        delta=delta,
        relation=ADD_OR_REMOVE_ONE,
        normalizer=n,
    )
    assert add_remove.sensitivity == pytest.approx(sens / 2, rel=1e-6)
    assert add_remove.event.relation == ADD_OR_REMOVE_ONE


def test_gaussian_noise_law_under_vmap():
    """params − w* ~ N(0, σ²) per coordinate (linear loss: w* in closed form); rejects 1.5σ."""
    n, d, mu = 100, 2, 0.5
    X, y = sphere_data(n, d, seed=16)
    w_star = (y[:, None] * X).mean(0) / mu
    keys = jax.random.split(jax.random.key(1), 2000)
    run = jax.jit(
        jax.vmap(
            lambda k: output_perturbation(
                k, X, y, loss=losses.linear, mu=mu, epsilon=1.0, delta=1e-5
            )
        )
    )
    res = run(keys)
    sigma = res.noise_scale
    z = (np.asarray(res.params) - w_star).ravel()
    assert_distribution(
        z, stats.norm(scale=sigma).cdf, wrong_cdfs=[stats.norm(scale=1.5 * sigma).cdf]
    )


def test_cms_pure_noise_norm_is_gamma():
    """CMS11 Alg. 1: ‖b‖ ~ Gamma(d, rate β = ε/Δ); rejects a 1.5× scale."""
    n, d, mu, eps = 100, 3, 0.5, 2.0
    X, y = sphere_data(n, d, seed=17)
    w_star = (y[:, None] * X).mean(0) / mu
    keys = jax.random.split(jax.random.key(2), 2000)
    res = jax.vmap(
        lambda k: output_perturbation(
            k, X, y, loss=losses.linear, mu=mu, epsilon=eps, delta=0.0, variant="cms"
        )
    )(keys)
    scale = res.noise_scale
    assert scale == pytest.approx(2 / (mu * n) / eps, rel=1e-6)
    norms = np.linalg.norm(np.asarray(res.params) - w_star, axis=1)
    assert_distribution(
        norms, stats.gamma(d, scale=scale).cdf, wrong_cdfs=[stats.gamma(d, scale=1.5 * scale).cdf]
    )
    assert res.event == EpsilonDeltaEvent(epsilon=eps, delta=0.0, relation=REPLACE_ONE)


@pytest.mark.parametrize(
    "loss, variant",
    [
        (losses.logistic, "gaussian"),
        (losses.hinge, "gaussian"),
        pytest.param(losses.logistic, "cms", marks=pytest.mark.slow),
    ],
)
def test_mean_excess_risk_below_bound(loss, variant):
    n, d, mu = 400, 3, 0.1
    X, y = sphere_data(n, d, seed=18)
    J = objective(loss, mu, jnp.asarray(X), jnp.asarray(y))
    j_star = float(J(solve(X, y, loss=loss, mu=mu).params))
    keys = jax.random.split(jax.random.key(3), 300)
    res = jax.jit(
        jax.vmap(
            lambda k: output_perturbation(
                k, X, y, loss=loss, mu=mu, epsilon=1.0, delta=1e-6, variant=variant
            )
        )
    )(keys)
    excess = np.asarray(jax.vmap(J)(res.params)) - j_star
    upper = excess.mean() + 3 * excess.std() / math.sqrt(excess.size)
    assert upper <= res.excess_risk_bound
    assert excess.mean() >= 0.0


def test_bound_functions_match_closed_forms():
    n, d, eps, delta, L, mu = 1000, 4, 0.5, 1e-6, 1.0, 0.1
    sigma = 2 * L * math.sqrt(2 * math.log(1.25 / delta)) / (eps * mu * n)
    assert bounds.output_perturbation(
        n=n, d=d, epsilon=eps, delta=delta, lipschitz=L, mu=mu
    ) == pytest.approx(L * sigma * math.sqrt(d) + mu * d * sigma**2 / 2)
    assert bounds.output_perturbation_pure(
        n=n, d=d, epsilon=eps, lipschitz=L, mu=mu
    ) == pytest.approx(2 * L * d / (n * mu * eps) + 2 * d * (d + 1) / (mu * n**2 * eps**2))
    s = math.sqrt(d * math.log(1.25 / delta)) / (eps * n)
    mu_star = bounds.tuned_mu_output_perturbation(
        n=n, d=d, epsilon=eps, delta=delta, lipschitz=L, radius=2.0
    )
    assert mu_star == pytest.approx(math.sqrt(2 * 2 * math.sqrt(2) * s) / 2.0)
    tuned = bounds.tuned_output_perturbation(
        n=n, d=d, epsilon=eps, delta=delta, lipschitz=L, radius=2.0
    )
    assert tuned >= 2**1.25 * L * 2.0 * math.sqrt(s)  # leading term + lower-order term
    assert tuned <= 1.2 * 2**1.25 * L * 2.0 * math.sqrt(s)


def test_output_perturbation_refuses_bad_input():
    X, y = sphere_data(20, 2, seed=19)
    key = jax.random.key(4)
    kw = dict(loss=losses.logistic, mu=0.1, epsilon=1.0, delta=1e-5)
    for bad, match in [
        ({"epsilon": -1.0}, "epsilon"),
        ({"delta": 1.0}, "delta"),
        ({"mu": 0.0}, "mu"),
        ({"delta": 0.0}, "delta"),
        ({"variant": "x"}, "variant"),
        ({"relation": "x"}, "relation"),
    ]:
        with pytest.raises(ValueError, match=match):
            output_perturbation(key, X, y, **{**kw, **bad})
    with pytest.raises(ValueError, match="epsilon must be in \\(0, 1\\)"):
        output_perturbation(key, X, y, **{**kw, "epsilon": 2.0}, calibration="classic")
    with pytest.raises(ValueError, match="X must be"):
        output_perturbation(key, 3 * X, y, **kw)
    with pytest.raises(ValueError, match="accuracy"):
        output_perturbation(key, X, y, **kw, accuracy=0.0)
    with pytest.raises(ValueError, match="smoothing"):
        output_perturbation(key, X, y, **{**kw, "loss": losses.hinge}, smoothing=-1.0)
