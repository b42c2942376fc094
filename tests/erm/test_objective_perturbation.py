"""Objective perturbation: refusals with reasons, constants of each variant, exactness, bound."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from dpjax import ADD_OR_REMOVE_ONE
from dpjax.erm import bounds, losses, objective, objective_perturbation, solve
from dpjax.erm.objective_perturbation import calibrate
from tests.erm.test_solver import sphere_data
from tests.helpers import assert_distribution

KW = dict(mu=0.1, epsilon=0.5, delta=1e-5)


@pytest.mark.parametrize(
    "loss, reason",
    [
        (losses.hinge, "twice differentiable"),
        (losses.absolute, "median counterexample"),
        (losses.squared, "Lipschitz on all of"),
    ],
)
def test_refuses_losses_the_proof_does_not_cover(loss, reason):
    X, y = sphere_data(20, 2, seed=20)
    with pytest.raises(ValueError, match=reason):
        objective_perturbation(jax.random.key(0), X, y, loss=loss, **KW)


def test_refuses_missing_strong_convexity_and_bad_input():
    X, y = sphere_data(20, 2, seed=21)
    key = jax.random.key(1)
    with pytest.raises(ValueError, match="strong"):
        objective_perturbation(key, X, y, loss=losses.logistic, **{**KW, "mu": 0.0})
    with pytest.raises(ValueError, match="relation"):
        objective_perturbation(key, X, y, loss=losses.logistic, relation=ADD_OR_REMOVE_ONE, **KW)
    with pytest.raises(ValueError, match="epsilon"):
        objective_perturbation(key, X, y, loss=losses.logistic, **{**KW, "epsilon": 0.0})
    with pytest.raises(ValueError, match="delta"):
        objective_perturbation(key, X, y, loss=losses.logistic, **{**KW, "delta": 0.0})
    with pytest.raises(ValueError, match="epsilon must be in \\(0, 1\\)"):
        objective_perturbation(
            key, X, y, loss=losses.logistic, variant="lecture", **{**KW, "epsilon": 2.0}
        )
    with pytest.raises(ValueError, match="variant"):
        objective_perturbation(key, X, y, loss=losses.logistic, variant="amp", **KW)
    with pytest.raises(ValueError, match="continuous Hessian"):
        objective_perturbation(key, X, y, loss=losses.huber_svm(0.5), variant="kst", **KW)


def test_variant_constants_match_the_papers():
    n, L, c, mu, eps, delta = 500, 1.0, 0.25, 0.1, 0.5, 1e-5
    lec = calibrate("lecture", n=n, lipschitz=L, smoothness=c, mu=mu, epsilon=eps, delta=delta)
    assert lec["scale"] ** 2 == pytest.approx(
        8 * L**2 * math.log(1.25 / delta) / eps**2
    )  # objective-perturbation lecture
    assert lec["epsilon"] == pytest.approx(
        eps + math.log(1 + 2 * c / (n * mu) + (c / (n * mu)) ** 2)
    )
    kst = calibrate("kst", n=n, lipschitz=L, smoothness=c, mu=1e-4, epsilon=eps, delta=delta)
    assert kst["scale"] ** 2 == pytest.approx(L**2 * (8 * math.log(2 / delta) + 4 * eps) / eps**2)
    assert 1e-4 + kst["extra"] == pytest.approx(2 * c / (eps * n))  # KST's Δ = 2λ/ε, sum scale
    cms = calibrate("cms", n=n, lipschitz=L, smoothness=c, mu=mu, epsilon=eps, delta=0.0)
    eps_prime = eps - math.log(1 + 2 * c / (n * mu) + c**2 / (n * mu) ** 2)
    assert cms["scale"] == pytest.approx(2 * L / eps_prime) and cms["extra"] == 0.0
    small = calibrate("cms", n=10, lipschitz=L, smoothness=c, mu=1e-3, epsilon=eps, delta=0.0)
    assert small["extra"] == pytest.approx(c / (10 * math.expm1(eps / 4)) - 1e-3)  # Δ branch
    assert small["scale"] == pytest.approx(2 * L / (eps / 2))


def test_tilt_noise_law_on_the_linear_loss():
    """Linear loss: w_p = (mean(y x) − b/n)/μ, so b is recovered exactly; KST σ, rejects 1.5σ."""
    n, d, mu = 100, 2, 0.5
    X, y = sphere_data(n, d, seed=22)
    w_star = (y[:, None] * X).mean(0) / mu
    keys = jax.random.split(jax.random.key(2), 2000)
    res = jax.jit(
        jax.vmap(
            lambda k: objective_perturbation(
                k, X, y, loss=losses.linear, mu=mu, epsilon=1.0, delta=1e-5
            )
        )
    )(keys)
    b = (w_star - np.asarray(res.params)) * mu * n
    sigma = res.noise_scale
    assert_distribution(
        b.ravel(), stats.norm(scale=sigma).cdf, wrong_cdfs=[stats.norm(scale=1.5 * sigma).cdf]
    )


def test_perturbed_problem_is_solved_exactly():
    """The released w_p satisfies the tilted optimality condition to the certificate."""
    n, d = 200, 3
    X, y = sphere_data(n, d, seed=23)
    res = objective_perturbation(jax.random.key(3), X, y, loss=losses.logistic, **KW)
    assert float(res.certificate) <= 1e-18
    grad_j = jax.grad(objective(losses.logistic, KW["mu"], jnp.asarray(X), jnp.asarray(y)))
    g = np.asarray(grad_j(res.params))
    b_over_n = -g  # ∇J(w_p) + b/n = 0
    assert np.linalg.norm(b_over_n) > 0  # noise was added
    assert np.linalg.norm(b_over_n) * n < 10 * res.noise_scale * math.sqrt(d)


@pytest.mark.parametrize(
    "variant, eps",
    [
        ("kst", 1.0),
        ("lecture", 0.5),
        pytest.param("cms", 1.0, marks=pytest.mark.slow),
    ],
)
def test_mean_excess_risk_below_bound(variant, eps):
    n, d, mu = 400, 3, 0.1
    X, y = sphere_data(n, d, seed=24)
    J = objective(losses.logistic, mu, jnp.asarray(X), jnp.asarray(y))
    j_star = float(J(solve(X, y, loss=losses.logistic, mu=mu).params))
    keys = jax.random.split(jax.random.key(4), 200)
    res = jax.jit(
        jax.vmap(
            lambda k: objective_perturbation(
                k, X, y, loss=losses.logistic, mu=mu, epsilon=eps, delta=1e-6, variant=variant
            )
        )
    )(keys)
    excess = np.asarray(jax.vmap(J)(res.params)) - j_star
    upper = excess.mean() + 3 * excess.std() / math.sqrt(excess.size)
    assert upper <= res.excess_risk_bound
    if variant == "lecture":
        expected = bounds.objective_perturbation(
            n=n, d=d, epsilon=eps, delta=1e-6, lipschitz=1.0, mu=mu
        )
        assert res.excess_risk_bound == pytest.approx(expected)  # dσ²/(2n²μ), lecture


def test_tuned_objective_perturbation_bound():
    n, d, eps, delta, L, R = 1000, 4, 1.0, 1e-6, 1.0, 2.0
    sigma = math.sqrt(8 * L**2 * math.log(1.25 / delta)) / eps
    mu = bounds.tuned_mu_objective_perturbation(
        n=n, d=d, epsilon=eps, delta=delta, lipschitz=L, radius=R
    )
    assert mu == pytest.approx(math.sqrt(d) * sigma / (n * R))
    total = 0.5 * mu * R**2 + d * sigma**2 / (2 * n**2 * mu)
    assert bounds.tuned_objective_perturbation(
        n=n, d=d, epsilon=eps, delta=delta, lipschitz=L, radius=R
    ) == pytest.approx(total)


def test_approximate_objective_perturbation_constants_and_bound():
    """L-BFGS to ‖∇‖ ≤ γ, then Gaussian output noise for the residual 2γ/μ (AMP-style)."""
    from dpjax.erm import approximate_objective_perturbation
    from dpjax.mechanisms import analytic_gaussian_sigma

    n, d, mu = 400, 3, 0.1
    X, y = sphere_data(n, d, seed=25)
    J = objective(losses.logistic, mu, jnp.asarray(X), jnp.asarray(y))
    j_star = float(J(solve(X, y, loss=losses.logistic, mu=mu).params))
    keys = jax.random.split(jax.random.key(5), 100)
    res = jax.jit(
        jax.vmap(
            lambda k: approximate_objective_perturbation(
                k, X, y, loss=losses.logistic, mu=mu, epsilon=1.0, delta=1e-6
            )
        )
    )(keys)
    assert res.sensitivity == pytest.approx(2 * 1e-9 / mu)
    ref = analytic_gaussian_sigma(sensitivity=2e-8, epsilon=0.01, delta=1e-8)
    assert res.noise_scale == pytest.approx(ref)
    assert res.event.epsilon == 1.0 and res.event.delta == 1e-6
    assert float(jnp.max(res.certificate)) <= (1e-9) ** 2 / (2 * mu)
    excess = np.asarray(jax.vmap(J)(res.params)) - j_star
    assert excess.mean() + 3 * excess.std() / math.sqrt(excess.size) <= res.excess_risk_bound
