"""f-DP: μ-GDP conversions (one home), the CLT μ (an approximation), trade-off curves from PLD."""

import math

import numpy as np
import pytest
from scipy import special

from dpjax import auditing
from dpjax import events as ev
from dpjax.accounting import (
    PrivacyAccountant,
    gdp_delta,
    gdp_epsilon,
    gdp_mu,
    gdp_mu_clt_approximation,
    gdp_tradeoff,
    tradeoff_curve,
)
from dpjax.accounting.tight import _gaussian_delta_upper


def test_clt_mu_formula():
    # μ = q·√(T(e^{1/σ²} − 1)) (Bu, Dong, Long, Su 2020), evaluated by hand at σ = 1.
    assert gdp_mu(noise_multiplier=1.0, sampling_rate=0.01, steps=1000) == pytest.approx(
        0.01 * math.sqrt(1000 * (math.e - 1.0)), rel=1e-14
    )
    assert gdp_mu is gdp_mu_clt_approximation
    got = gdp_mu(noise_multiplier=2.0, sampling_rate=0.1, steps=50)
    assert got == pytest.approx(0.1 * math.sqrt(50 * (math.exp(0.25) - 1.0)), rel=1e-14)
    assert got != pytest.approx(0.1 * math.sqrt(50 * math.exp(0.25)), rel=1e-3)  # no "− 1"
    with pytest.raises(ValueError, match="sampling_rate"):
        gdp_mu(noise_multiplier=1.0, sampling_rate=1.5, steps=10)


@pytest.mark.parametrize("mu,eps", [(0.5, 0.0), (1.0, 1.0), (3.0, 2.0), (0.2, 5.0)])
def test_gdp_delta_is_the_gaussian_profile_and_auditing_uses_it(mu, eps):
    assert gdp_delta(mu=mu, epsilon=eps) == pytest.approx(
        _gaussian_delta_upper(mu, eps), rel=1e-9, abs=1e-300
    )
    assert auditing.gdp_delta(eps, mu) == gdp_delta(mu=mu, epsilon=eps)
    d = gdp_delta(mu=mu, epsilon=eps)
    if d > 1e-300:
        assert gdp_epsilon(mu=mu, delta=d) == pytest.approx(eps, abs=1e-7)
        assert auditing.gdp_epsilon(mu, d) == gdp_epsilon(mu=mu, delta=d)


def test_tradeoff_of_a_gaussian_is_g_mu_from_below():
    alphas = np.linspace(0.0, 1.0, 201)
    beta = tradeoff_curve(ev.GaussianEvent(noise_multiplier=2.0), alphas)
    exact = gdp_tradeoff(0.5, alphas)
    assert np.all(beta <= exact + 1e-9)  # a valid lower bound
    assert np.max(exact - beta) < 5e-3  # and tight up to the ε grid
    assert np.all(np.diff(beta) <= 1e-12)


def test_tradeoff_of_dp_sgd_and_where_the_clt_is_optimistic():
    """Few steps at a large rate: at small α the CLT GDP curve lies ABOVE the PLD's (valid)
    curve, i.e. it claims more privacy than holds (Bu et al.'s approximation is no guarantee)."""
    q, sigma, steps = 0.2, 1.0, 10
    alphas = np.geomspace(1e-5, 1e-2, 30)
    acc = PrivacyAccountant(
        [ev.PoissonSampledGaussianEvent(noise_multiplier=sigma, sampling_rate=q, count=steps)],
        value_discretization_interval=1e-3,
    )
    beta = tradeoff_curve(acc, alphas)
    clt = gdp_tradeoff(gdp_mu(noise_multiplier=sigma, sampling_rate=q, steps=steps), alphas)
    assert np.min(clt - beta) > 0.0
    assert np.max(clt - beta) > 2e-3
    # ε(δ) read from the GDP approximation undercuts the accountant here.
    mu = gdp_mu(noise_multiplier=sigma, sampling_rate=q, steps=steps)
    assert gdp_epsilon(mu=mu, delta=1e-5) < acc.epsilon(1e-5)


def test_tradeoff_refuses_what_pld_cannot_account():
    sel = ev.RepeatAndSelectEvent(ev.GaussianEvent(2.0), mean=3.0, shape=1.0)
    with pytest.raises(ValueError, match="RDP only"):
        tradeoff_curve([sel], [0.1])
    with pytest.raises(ValueError, match="alphas"):
        tradeoff_curve(ev.GaussianEvent(2.0), [1.5])


def test_gdp_tradeoff_is_the_normal_shift():
    a = np.array([0.01, 0.2, 0.7])
    np.testing.assert_allclose(
        gdp_tradeoff(1.3, a), special.ndtr(special.ndtri(1 - a) - 1.3), rtol=1e-14
    )
