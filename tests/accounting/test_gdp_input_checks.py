"""The GDP conversions refuse inputs outside their domain with a ValueError naming the argument."""

import math

import numpy as np
import pytest
from scipy import stats

from dpjax.accounting import fdp


@pytest.mark.parametrize("alphas", [-0.1, 1.5, [0.2, float("nan")], [0.5, 2.0]])
def test_gdp_tradeoff_refuses_alpha_outside_unit_interval(alphas):
    with pytest.raises(ValueError, match=r"alphas must be .*\[0, 1\]"):
        fdp.gdp_tradeoff(1.0, alphas)


def test_gdp_tradeoff_endpoints_match_closed_form():
    beta = fdp.gdp_tradeoff(1.0, [0.0, 0.05, 1.0])
    expected = stats.norm.cdf(stats.norm.ppf(1 - np.array([0.0, 0.05, 1.0])) - 1.0)
    np.testing.assert_allclose(beta, expected, rtol=1e-12)


@pytest.mark.parametrize("sigma", [0.01, 0.03])
def test_gdp_mu_refuses_noise_multiplier_whose_exponential_overflows(sigma):
    with pytest.raises(ValueError, match="noise_multiplier must be at least 0.0375"):
        fdp.gdp_mu(noise_multiplier=sigma, sampling_rate=0.01, steps=100)


def test_gdp_mu_just_above_the_floor_is_finite():
    mu = fdp.gdp_mu(noise_multiplier=0.0376, sampling_rate=0.01, steps=1)
    assert math.isfinite(mu) and mu > 1e150


def test_gdp_epsilon_huge_mu_blames_mu():
    with pytest.raises(ValueError, match=r"^mu must be in \[0.0, 1e\+150\]"):
        fdp.gdp_epsilon(mu=1e200, delta=1e-5)


def test_gdp_epsilon_large_mu_still_converts():
    # closed form check at a large but finite μ: δ(ε) at the returned ε equals the target
    eps = fdp.gdp_epsilon(mu=1e3, delta=1e-5)
    assert math.isfinite(eps)
    assert fdp.gdp_delta(mu=1e3, epsilon=eps) == pytest.approx(1e-5, rel=1e-3)
