"""The discrete Gaussian's calibration (CKS20 Theorems 7 and 14), event, counts and input rules.

Cross-checks are independent of the code under test: brute-force sums over the exact pmf
(hockey-stick divergence and Rényi divergence of the two shifted laws), dp-accounting's PLD of
the discrete Gaussian, and exact integer projections enumerated by hand.
"""

import importlib
import itertools
import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld

from dpjax import events as ev
from dpjax import mechanisms as M
from dpjax.accounting import PrivacyAccountant
from dpjax.accounting.zcdp import zcdp_epsilon_cks
from dpjax.auditing import exact

dg = importlib.import_module("dpjax.mechanisms.discrete_gaussian")
CASES = [(1, 1), (1, 2), (3, 5), (2, Fraction(37, 10)), (1, 12.5)]


def brute_force_laws(sensitivity, sigma):
    top = int(45 * float(sigma)) + sensitivity + 1
    p = exact.discrete_gaussian_law(0, sigma=sigma, low=-top, high=top)
    q = exact.discrete_gaussian_law(sensitivity, sigma=sigma, low=-top, high=top)
    return p, q


@pytest.mark.parametrize("sensitivity, sigma", CASES)
def test_theorem_7_delta_matches_brute_force_and_dp_accounting(sensitivity, sigma):
    p, q = brute_force_laws(sensitivity, sigma)
    hi, lo = (
        pld.from_discrete_gaussian_mechanism(
            float(sigma),
            sensitivity=sensitivity,
            value_discretization_interval=1e-6,
            pessimistic_estimate=pe,
        )
        for pe in (True, False)
    )
    for eps in (0.0, 0.1, 0.5, 1.0, 2.0, 4.0):
        mine = M.discrete_gaussian_delta(sensitivity=sensitivity, sigma=sigma, epsilon=eps)
        brute = exact.delta_at(p, q, eps)
        assert mine == pytest.approx(brute, rel=1e-9, abs=1e-300), (eps, mine, brute)
        assert mine >= brute  # rounded up
        # dp-accounting's pessimistic / optimistic PLD estimates bracket the exact δ
        assert lo.get_delta_for_epsilon(eps) * (1 - 1e-9) - 1e-15 <= mine
        assert mine <= hi.get_delta_for_epsilon(eps) * (1 + 1e-9) + 1e-15


@pytest.mark.parametrize("sensitivity, sigma", CASES)
def test_exact_epsilon_is_the_smallest_one(sensitivity, sigma):
    for delta in (1e-3, 1e-6, 1e-10):
        eps = M.discrete_gaussian_epsilon(sensitivity=sensitivity, sigma=sigma, delta=delta)
        kw = dict(sensitivity=sensitivity, sigma=sigma)
        assert M.discrete_gaussian_delta(**kw, epsilon=eps) <= delta
        if eps > 0:
            assert M.discrete_gaussian_delta(**kw, epsilon=eps * (1 - 1e-6)) > delta
        # below the zCDP conversion of the same ρ (Theorem 7 is tight, the conversion is not)
        rho = M.discrete_gaussian_rho(**kw)
        assert eps <= zcdp_epsilon_cks(rho=rho, delta=delta) * (1 + 1e-9)


@pytest.mark.parametrize("sensitivity, sigma", CASES)
def test_theorem_14_rho_bounds_the_brute_force_renyi_divergence(sensitivity, sigma):
    # D_α(P‖Q) ≤ αρ for all α > 1, with equality when (α − 1)Δ is an integer (CKS Prop. 5)
    p, q = brute_force_laws(sensitivity, sigma)
    lp, lq = p.log[1:-1], q.log[1:-1]  # the window; the folded tails are < e^{-1000}
    rho = M.discrete_gaussian_rho(sensitivity=sensitivity, sigma=sigma)
    assert rho == pytest.approx(sensitivity**2 / (2 * float(sigma) ** 2), rel=1e-15)
    for alpha in (1.5, 2.0, 3.0, 4.25, 8.0):
        from scipy.special import logsumexp

        renyi = logsumexp(alpha * lp + (1 - alpha) * lq) / (alpha - 1)
        assert renyi <= alpha * rho * (1 + 1e-9) + 1e-12, alpha
        if ((alpha - 1) * sensitivity).is_integer():
            assert renyi == pytest.approx(alpha * rho, rel=1e-9)
    # a wrong ρ (σ 5% larger) is violated at α = 2: the check has power
    wrong = M.discrete_gaussian_rho(sensitivity=sensitivity, sigma=1.05 * float(sigma))
    renyi2 = logsumexp(2 * lp - lq)
    assert renyi2 > 2 * wrong


def test_event_composes_in_the_accountant_and_matches_dp_accounting():
    sigma, k = 4.0, 10
    event = ev.DiscreteGaussianEvent(sigma=sigma, sensitivity=1, count=k)
    acc = PrivacyAccountant([event])
    assert acc.applicable_methods() == ("zcdp",)
    eps = acc.epsilon(1e-6)
    rho = k / (2 * sigma**2)
    assert eps == pytest.approx(zcdp_epsilon_cks(rho=rho, delta=1e-6), rel=1e-12)
    # dp-accounting's PLD of the discrete Gaussian, composed k times: tighter, same order
    ref = pld.from_discrete_gaussian_mechanism(sigma, sensitivity=1).self_compose(k)
    tight = ref.get_epsilon_for_delta(1e-6)
    assert tight <= eps <= 1.3 * tight
    # with a Gaussian event of the same ρ the total ρ adds (zCDP composition)
    acc.record(ev.GaussianEvent(noise_multiplier=sigma, relation="add_or_remove_one"))
    assert acc.epsilon(1e-6) == pytest.approx(
        zcdp_epsilon_cks(rho=(k + 1) / (2 * sigma**2), delta=1e-6), rel=1e-12
    )
    assert ev.event_from_dict(ev.event_to_dict(event)) == event
    with pytest.raises(ValueError, match="pld"):
        PrivacyAccountant([event]).epsilon(1e-6, accounting="pld")
    with pytest.raises(ValueError, match="sigma"):
        ev.DiscreteGaussianEvent(sigma=0.0)


def test_noisy_counts_event_uses_the_relation_sensitivity():
    add = M.noisy_counts_event(sigma=5)
    rep = M.noisy_counts_event(sigma=5, relation="replace_one")
    assert add.sensitivity == 1.0 and rep.sensitivity == pytest.approx(math.sqrt(2.0))
    assert add.relation.value == "add_or_remove_one" and rep.relation.value == "replace_one"
    eps_add = PrivacyAccountant([add]).epsilon(1e-6)
    eps_rep = PrivacyAccountant([rep]).epsilon(1e-6)
    assert eps_rep > eps_add
    with pytest.raises(ValueError, match="sigma"):
        M.noisy_counts_event(sigma=3.7)


def brute_force_projection(y, total):
    best, best_cost = [], None
    for x in itertools.product(range(total + 1), repeat=len(y)):
        if sum(x) != total:
            continue
        cost = sum((a - b) ** 2 for a, b in zip(x, y, strict=True))
        if best_cost is None or cost < best_cost:
            best, best_cost = [x], cost
        elif cost == best_cost:
            best.append(x)
    return best, best_cost


def test_consistent_counts_is_the_integer_projection():
    rng = np.random.default_rng(0)
    for _ in range(60):
        y = rng.integers(-6, 9, size=int(rng.integers(1, 5)))
        total = int(rng.integers(0, 9))
        got = M.consistent_counts(y, total)
        best, cost = brute_force_projection(y.tolist(), total)
        assert got.sum() == total and np.all(got >= 0)
        assert int(np.sum((got - y) ** 2)) == cost, (y, total, got, best)
    keyed = M.consistent_counts(np.array([3, 3, 3]), 7, key=jax.random.key(1))
    assert keyed.sum() == 7 and sorted(keyed.tolist()) == [2, 2, 3]
    with pytest.raises(ValueError, match="total"):
        M.consistent_counts([1, 2], -1)
    with pytest.raises(ValueError, match="noisy"):
        M.consistent_counts(np.array([1.5]), 1)


def test_noisy_counts_releases_non_negative_integers(key):
    counts = jnp.array([0, 0, 3, 250, 1000], jnp.int32)
    y = M.noisy_counts(key, counts, sigma=4)
    assert y.dtype == jnp.int32 and bool(jnp.all(y >= 0))
    raw = M.noisy_counts(key, counts, sigma=4, clamp=False)
    np.testing.assert_array_equal(np.asarray(y), np.maximum(np.asarray(raw), 0))
    fixed = M.noisy_counts(key, counts, sigma=4, total=1253)
    assert fixed.sum() == 1253 and np.all(fixed >= 0)


def test_empty_cells_are_biased_upwards_by_clamping(key):
    # the "people born on Mars" cell: true 0, clamped release has mean ≈ E[max(Y, 0)]
    n, sigma = 20_000, 4
    y = np.asarray(M.noisy_counts(key, jnp.zeros(n, jnp.int32), sigma=sigma))
    ks = np.arange(0, 60 * sigma)
    mean = float(np.sum(ks * M.discrete_gaussian_pmf(ks, sigma=sigma)))
    std = math.sqrt(float(np.sum(ks**2 * M.discrete_gaussian_pmf(ks, sigma=sigma))) - mean**2)
    assert abs(y.mean() - mean) < 5 * std / math.sqrt(n)
    assert mean > 0.35 * sigma  # the bias is of order σ, not small


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(sigma=0.5), "sigma must be a finite real number ≥ 1"),
        (dict(sigma=0), "sigma"),
        (dict(sigma=float("nan")), "sigma"),
        (dict(sigma=float("inf")), "sigma must be a finite real"),
        (dict(sigma=3.7), "Fraction\\(37, 10\\)"),
        (dict(sigma=2.0**15), "2\\*\\*28"),
        (dict(sigma=True), "sigma"),
        (dict(sensitivity=1.5), "sensitivity must be a positive integer"),
        (dict(sensitivity=0), "sensitivity"),
    ],
)
def test_bad_parameters_are_refused_by_name(key, kwargs, match):
    kw = dict(sensitivity=1, sigma=3) | kwargs
    with pytest.raises(ValueError, match=match):
        M.discrete_gaussian(key, jnp.zeros(2, jnp.int32), **kw)


def test_bad_values_are_refused_and_out_of_range_ones_clamped_under_jit(key):
    for bad in (jnp.zeros(2, jnp.float32), jnp.array([True, False])):
        with pytest.raises(ValueError, match="value must be an integer array"):
            M.discrete_gaussian(key, bad, sensitivity=1, sigma=3)
    with pytest.raises(ValueError, match="value must be integers in"):
        M.discrete_gaussian(key, jnp.array([2**30 + 1], jnp.int32), sensitivity=1, sigma=3)
    # under jit an int32 near the limit cannot wrap around: it is clamped to 2^30 first
    run = jax.jit(lambda k, v: M.discrete_gaussian(k, v, sensitivity=1, sigma=3))
    big = run(key, jnp.array([2**31 - 1, -(2**31)], jnp.int32))
    ref = run(key, jnp.array([2**30, -(2**30)], jnp.int32))
    np.testing.assert_array_equal(np.asarray(big), np.asarray(ref))
    assert int(big[0]) > 2**29 and int(big[1]) < -(2**29)
    small = M.discrete_gaussian(key, jnp.array([5, 7], jnp.uint8), sensitivity=1, sigma=3)
    assert small.dtype == jnp.int32


def test_sigma_forms_that_are_accepted():
    assert dg.sigma_squared_fraction(3) == 9
    assert dg.sigma_squared_fraction(3.75) == Fraction(225, 16)
    assert dg.sigma_squared_fraction(Fraction(37, 10)) == Fraction(1369, 100)
    assert dg.sigma_squared_fraction(2**14) == 2**28
