"""Unit tests of the ε lower-bound estimators against closed forms and scipy references."""

import math

import numpy as np
import pytest
from scipy import special, stats

from dpjax import auditing as A
from dpjax import mechanisms as M


def test_clopper_pearson_matches_scipy_exact_interval():
    # one-sided bound at level 1-a == upper end of the two-sided exact interval at 1-2a
    for k, n in [(0, 50), (3, 50), (17, 200), (200, 200)]:
        ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.9, method="exact")
        assert float(A.clopper_pearson_upper(k, n, 0.05)) == pytest.approx(ci.high, abs=1e-12)
        assert float(A.clopper_pearson_lower(k, n, 0.05)) == pytest.approx(ci.low, abs=1e-12)


def test_clopper_pearson_zero_successes_closed_form():
    # P[Bin(n, p) = 0] = (1-p)^n = a  =>  p = 1 - a^(1/n)
    assert float(A.clopper_pearson_upper(0, 1000, 0.025)) == pytest.approx(1 - 0.025 ** (1 / 1000))


def test_epsilon_from_rates_hand_values():
    assert float(A.epsilon_from_rates(0.1, 0.2)) == pytest.approx(math.log(8.0))
    assert float(A.epsilon_from_rates(0.1, 0.2, delta=0.1)) == pytest.approx(math.log(7.0))
    assert float(A.epsilon_from_rates(0.5, 0.5)) == 0.0  # random guessing proves nothing
    assert float(A.epsilon_from_rates(0.0, 0.3)) == math.inf  # perfect separation


def test_gdp_mu_from_exact_gaussian_rates():
    mu, t = 0.7, 0.2  # N(0,1) vs N(mu,1), threshold t
    a, b = stats.norm.sf(t), stats.norm.cdf(t - mu)
    assert float(A.gdp_mu_from_rates(a, b)) == pytest.approx(mu, rel=1e-12)


@pytest.mark.parametrize("mu, eps", [(0.3, 0.5), (1.0, 1.0), (2.0, 10.0), (0.1, 0.0)])
def test_gdp_delta_equals_balle_wang_profile(mu, eps):
    # independent code: the Gaussian mechanism's exact profile with sigma/Delta = 1/mu
    ref = M.gaussian_delta(sigma=1.0 / mu, sensitivity=1.0, epsilon=eps)
    assert A.gdp_delta(eps, mu) == pytest.approx(ref, rel=1e-10, abs=1e-300)


def test_gdp_mu_for_is_inverse_of_analytic_sigma():
    for eps, delta in [(1.0, 1e-5), (10.0, 1e-5), (0.5, 1e-6)]:
        sigma = M.analytic_gaussian_sigma(sensitivity=1.0, epsilon=eps, delta=delta)
        assert A.gdp_mu_for(eps, delta) == pytest.approx(1.0 / sigma, rel=1e-8)
        assert A.gdp_epsilon(1.0 / sigma, delta) == pytest.approx(eps, rel=1e-8)


def test_gdp_epsilon_literature_value():
    # literature.md §3.3: sigma = 1/eps at eps=1 ("ignores delta") is 4.38-DP at delta=1e-5
    assert A.gdp_epsilon(1.0, 1e-5) == pytest.approx(4.38, abs=0.005)


def test_direct_bound_on_known_laplace_pair_is_valid_and_tight():
    rng = np.random.default_rng(7)
    s0, s1 = rng.laplace(0, 1, 40_000), rng.laplace(1, 1, 40_000)  # exactly 1-DP pair
    b = A.direct_epsilon_lower_bound(s0, s1)
    assert 0.8 < b.epsilon <= 1.0
    assert b.n_eval == 20_000 and b.fpr_upper >= b.fpr and b.fnr_upper >= b.fnr


def test_direct_bound_coverage_over_repetitions():
    # 200 small audits of an exactly 1-DP pair: P[eps_LB > 1] <= 5% each; binomial 1e-4 tail
    rng = np.random.default_rng(11)
    exceed = sum(
        A.direct_epsilon_lower_bound(rng.laplace(0, 1, 1000), rng.laplace(1, 1, 1000)).epsilon > 1.0
        for _ in range(200)
    )
    assert exceed <= stats.binom.isf(1e-4, 200, 0.05)


def test_direct_bound_identical_distributions_is_small():
    rng = np.random.default_rng(3)
    b = A.direct_epsilon_lower_bound(rng.normal(size=20_000), rng.normal(size=20_000))
    assert b.epsilon < 0.15


def test_gdp_bound_recovers_mu_and_rejects_wrong_scale():
    rng = np.random.default_rng(5)
    s0, s1 = rng.normal(0, 1, 200_000), rng.normal(0.5, 1, 200_000)  # 0.5-GDP
    b = A.gdp_epsilon_lower_bound(s0, s1, delta=1e-5, assume_gaussian_tradeoff=True)
    assert 0.45 < b.mu <= 0.5
    assert b.epsilon == pytest.approx(A.gdp_epsilon(b.mu, 1e-5))
    assert b.mu > 0.5 / 1.5  # a 1.5x larger noise scale (mu/1.5) is rejected


def test_one_run_p_value_delta_zero_is_binomial_tail():
    q = special.expit(1.0)
    assert A.one_run_p_value(1000, 100, 80, 1.0) == pytest.approx(stats.binom.sf(79, 100, q))


def test_one_run_all_correct_closed_form():
    # r = v = 100, delta = 0: p = q^100 = 0.05  =>  eps = logit(0.05^(1/100))
    g = np.ones(100)
    b = A.one_run_epsilon_lower_bound(g, np.ones(100, bool), confidence=0.95)
    assert b.epsilon == pytest.approx(special.logit(0.05 ** (1 / 100)), rel=1e-6)


def test_one_run_delta_term_only_weakens_the_bound():
    g, t = np.ones(100), np.ones(100, bool)
    b0 = A.one_run_epsilon_lower_bound(g, t, m=1000)
    b1 = A.one_run_epsilon_lower_bound(g, t, m=1000, delta=1e-5)
    assert 0 < b1.epsilon < b0.epsilon


def test_one_run_randomized_response():
    # canaries guessed through eps-randomised response: correct w.p. e^eps/(1+e^eps)
    rng = np.random.default_rng(1)
    truths = rng.random(5000) < 0.5
    for true_eps, claim, should_exceed in [(1.0, 1.0, False), (3.0, 1.0, True)]:
        correct = rng.random(5000) < special.expit(true_eps)
        guesses = np.where(correct == truths, 1, -1)
        b = A.one_run_epsilon_lower_bound(guesses, truths)
        assert (b.epsilon > claim) == should_exceed


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: A.direct_epsilon_lower_bound(np.zeros(10), np.ones(10), delta=1.0), "delta"),
        (
            lambda: A.direct_epsilon_lower_bound(np.zeros(10), np.ones(10), confidence=1.0),
            "confidence",
        ),
        (lambda: A.direct_epsilon_lower_bound(np.zeros(2), np.ones(10)), "scores_d"),
        (
            lambda: A.gdp_epsilon_lower_bound(
                np.zeros(10), np.full(10, np.nan), delta=1e-5, assume_gaussian_tradeoff=True
            ),
            "scores_dprime",
        ),
        (
            lambda: A.gdp_epsilon_lower_bound(
                np.zeros(10), np.ones(10), delta=0.0, assume_gaussian_tradeoff=True
            ),
            "delta",
        ),
        (lambda: A.gdp_mu_for(-1.0, 1e-5), "epsilon"),
        (lambda: A.one_run_p_value(10, 5, 6, 1.0), "v <= r <= m"),
        (lambda: A.clopper_pearson_upper(1, 10, 0.0), "alpha"),
    ],
)
def test_bad_arguments_name_themselves(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# --- issue 13 finding 9: the GDP estimator false-alarms on non-Gaussian mechanisms -------------


def _laplace_pair(n=20_000, seed=0):
    rng = np.random.default_rng(seed)
    return rng.laplace(0, 1, n), rng.laplace(1, 1, n)  # exactly 1-DP (ε = 1, δ = 0) pair


def test_gdp_estimator_refused_without_stated_assumption():
    # On the exactly 1-DP Laplace pair the old estimator reported ε_LB ≈ 4.3 > 1 at δ = 1e-5.
    s0, s1 = _laplace_pair()
    for flag in ({}, {"assume_gaussian_tradeoff": False}, {"assume_gaussian_tradeoff": 1}):
        with pytest.raises(ValueError, match="assume_gaussian_tradeoff must be True.*Gaussian"):
            A.gdp_epsilon_lower_bound(s0, s1, delta=1e-5, **flag)


def test_gdp_estimator_with_assumption_is_labelled_heuristic():
    s0, s1 = _laplace_pair()
    b = A.gdp_epsilon_lower_bound(s0, s1, delta=1e-5, assume_gaussian_tradeoff=True)
    assert b.is_heuristic and "Gaussian" in b.conditional_on and "heuristic" in b.conditional_on
    # Why the label matters: the assumption is false here and the "bound" exceeds the true ε = 1.
    assert b.epsilon > 1.0
    d = A.direct_epsilon_lower_bound(s0, s1, delta=1e-5)  # assumption-free: stays below ε = 1
    assert not d.is_heuristic and d.conditional_on is None and d.epsilon <= 1.0


def test_direct_and_one_run_bounds_are_unconditional():
    b = A.one_run_epsilon_lower_bound(np.ones(100), np.ones(100, bool))
    assert not b.is_heuristic
