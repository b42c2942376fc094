"""Privacy filters and odometers: fully adaptive composition, exact refusal at the budget.

Expected values come from dp-accounting's RDP accountant (composed step by step, outside dpjax)
and closed forms (Gaussian RDP α/(2σ²), the Canonne–Kamath–Steinke conversion), never from the
filter itself.
"""

import math
from fractions import Fraction

import dp_accounting
import numpy as np
import pytest
from dp_accounting import rdp

from dpjax.accounting import (
    BudgetExhaustedError,
    EpsilonDeltaEvent,
    GaussianEvent,
    PoissonSampledGaussianEvent,
    PrivacyFilter,
    PrivacyOdometer,
)

ORDERS = (4.0, 8.0, 16.0, 32.0)
DELTA = 1e-5
Q = 0.05


def dp_accounting_rdp(sigma, q=Q, orders=ORDERS):
    """RDP of one Poisson subsampled Gaussian step, by dp-accounting's own accountant."""
    accountant = rdp.RdpAccountant(orders=list(orders))
    accountant.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)))
    return np.asarray(accountant._rdp, dtype=np.float64)


def adaptive_run(privacy_filter, seed=0, max_steps=10_000):
    """Each step's σ is chosen from a noisy statistic released by the previous step."""
    rng = np.random.default_rng(seed)
    data = rng.normal(size=500)
    sigmas, released = [], 0.0
    for _ in range(max_steps):
        sigma = 1.2 + min(abs(released), 2.0)  # adaptive: a function of the last release
        step = PoissonSampledGaussianEvent(noise_multiplier=sigma, sampling_rate=Q)
        if not privacy_filter.try_spend(step):
            return sigmas, sigma
        sigmas.append(sigma)
        batch = data[rng.random(data.size) < Q]
        released = float(np.clip(batch, -1, 1).sum() + sigma * rng.normal()) / (Q * data.size)
    raise AssertionError("the filter never refused")


def test_adaptive_schedule_stops_exactly_at_budget_of_fully_adaptive_composition():
    # budget: the RDP curve of 60 steps at σ = 1.5 (a planned run); the adaptive run draws
    # σ_t ≥ 1.2 from its own releases, so it may be cheaper or costlier per step
    budget = 60 * dp_accounting_rdp(1.5)
    f = PrivacyFilter.renyi(orders=ORDERS, budget=budget, delta=DELTA)
    sigmas, refused_sigma = adaptive_run(f)
    assert len(set(sigmas)) > 5  # the schedule really was adaptive
    # fully adaptive composition (Feldman & Zrnic 2021, Thm 3.1): Σ_t RDP_t(α) ≤ B(α) at
    # every order, each step's RDP from dp-accounting, summed exactly outside the filter
    per_step = [dp_accounting_rdp(s) for s in sigmas]
    total = [sum(Fraction(float(v[j])) for v in per_step) for j in range(len(ORDERS))]
    assert all(t <= Fraction(float(b)) for t, b in zip(total, budget, strict=True))
    refused = dp_accounting_rdp(refused_sigma)
    assert any(
        t + Fraction(float(c)) > Fraction(float(b))
        for t, c, b in zip(total, refused, budget, strict=True)
    ), "the filter refused a step that fitted the budget"
    np.testing.assert_allclose(f.spent, [float(t) for t in total], rtol=1e-12)
    assert f.releases == len(sigmas) and f.refused == 1
    # the guarantee: the conversion of the budget curve, which bounds the realised run's
    expected = rdp.compute_epsilon(list(ORDERS), list(budget), DELTA)[0]
    assert f.epsilon == pytest.approx(expected, rel=1e-12)
    realised = rdp.compute_epsilon(list(ORDERS), [float(t) for t in total], DELTA)[0]
    assert realised <= f.epsilon


def test_renyi_for_epsilon_budget_is_the_inverse_of_the_cks_conversion():
    alpha, eps = 12.0, 3.0
    f = PrivacyFilter.renyi_for_epsilon(epsilon=eps, delta=DELTA, order=alpha)
    (b,) = f.budget
    # Canonne, Kamath, Steinke 2020, Prop. 12: ε = B + log(1 − 1/α) − log(δα)/(α − 1)
    closed = b + math.log1p(-1 / alpha) - math.log(DELTA * alpha) / (alpha - 1)
    assert closed == pytest.approx(eps, rel=1e-12)
    assert rdp.compute_epsilon([alpha], [b], DELTA)[0] <= eps
    # Gaussian steps (RDP α/(2σ²) in closed form) stop at ⌊B·2σ²/α⌋ exactly
    sigma = 4.0
    step = GaussianEvent(noise_multiplier=sigma)
    taken = 0
    while f.try_spend(step):
        taken += 1
    assert taken == math.floor(Fraction(b) / Fraction(alpha / (2 * sigma**2)))


def test_spend_raises_and_charges_nothing_when_refused():
    f = PrivacyFilter.zcdp(rho=1.0, delta=DELTA)
    step = GaussianEvent(noise_multiplier=2.0)  # ρ = 1/8 (Δ = 1)
    for _ in range(8):
        f.spend(step)
    before = f.spent
    with pytest.raises(BudgetExhaustedError, match="refused"):
        f.spend(step)
    assert f.spent == before == (1.0,) and f.releases == 8
    # ρ-zCDP → (ε, δ): never above Bun & Steinke's ρ + 2√(ρ log(1/δ))
    assert 0 < f.epsilon <= 1.0 + 2 * math.sqrt(math.log(1 / DELTA))


def test_basic_filter_sums_epsilons_and_deltas():
    f = PrivacyFilter.basic(epsilon=1.0, delta=3e-6)
    release = EpsilonDeltaEvent(epsilon=0.3, delta=1e-6)
    accepted = [f.try_spend(release) for _ in range(5)]
    assert accepted == [True, True, True, False, False]
    assert f.try_spend((0.1, 0.0))  # a cheaper release still fits: 0.9 + 0.1 ≤ 1
    assert not f.try_spend((0.0, 1e-12))  # δ budget used up
    assert (f.epsilon, f.delta_total) == (1.0, 3e-6)


def test_no_release_past_the_budget_even_by_rounding():
    """After spending exactly the budget, a tiny cost must be refused: in floating point
    1.0 + 2⁻⁶⁰ == 1.0, so a float running total would accept such costs forever."""
    f = PrivacyFilter.basic(epsilon=1.0, delta=0.0)
    assert f.try_spend((1.0, 0.0))
    assert not f.try_spend((2.0**-60, 0.0))
    g = PrivacyFilter.renyi(orders=[8.0], budget=[0.3], delta=DELTA)
    assert [g.try_spend([0.1]) for _ in range(3)] == [True, True, False]  # 3·fl(0.1) > fl(0.3)


@pytest.mark.parametrize("kind", ["renyi", "zcdp", "basic"])
def test_filter_never_allows_a_release_past_the_budget(kind):
    rng = np.random.default_rng({"renyi": 1, "zcdp": 2, "basic": 3}[kind])
    for _ in range(40):
        if kind == "renyi":
            budget = rng.uniform(0.1, 2.0, size=3)
            f = PrivacyFilter.renyi(orders=[2.0, 8.0, 32.0], budget=budget, delta=DELTA)
        elif kind == "zcdp":
            budget = rng.uniform(0.1, 2.0, size=1)
            f = PrivacyFilter.zcdp(rho=budget[0], delta=DELTA)
        else:
            budget = np.array([rng.uniform(0.1, 2.0), rng.uniform(1e-7, 1e-5)])
            f = PrivacyFilter.basic(epsilon=budget[0], delta=budget[1])
        exact_budget = [Fraction(float(b)) for b in budget]
        spent = [Fraction(0)] * budget.size
        for _ in range(40):
            # costs of every scale, exact fractions of the budget among them
            cost = budget * rng.choice([rng.uniform(0, 0.3), 1 / rng.integers(1, 8), 0.0])
            cost = [float(c) for c in cost]
            after = [s + Fraction(c) for s, c in zip(spent, cost, strict=True)]
            fits = all(a <= b for a, b in zip(after, exact_budget, strict=True))
            assert f.try_spend(cost) == fits
            if fits:
                spent = after
            assert all(s <= b for s, b in zip(spent, exact_budget, strict=True))
        assert f.remaining == tuple(
            pytest.approx(float(b - s), abs=1e-15) for b, s in zip(exact_budget, spent, strict=True)
        )


@pytest.mark.parametrize(
    ("build", "name"),
    [
        (lambda: PrivacyFilter.renyi(orders=[8.0], budget=[0.0], delta=DELTA), "budget"),
        (lambda: PrivacyFilter.renyi(orders=[8.0], budget=[-1.0], delta=DELTA), "budget"),
        (lambda: PrivacyFilter.renyi(orders=[8.0], budget=[1.0], delta=0.0), "delta"),
        (lambda: PrivacyFilter.renyi(orders=[8.0], budget=[1.0], delta=1.0), "delta"),
        (lambda: PrivacyFilter.renyi(orders=[1.0], budget=[1.0], delta=DELTA), "orders"),
        (lambda: PrivacyFilter.renyi_for_epsilon(epsilon=0.0, delta=DELTA, order=8), "epsilon"),
        (lambda: PrivacyFilter.renyi_for_epsilon(epsilon=1.0, delta=1.5, order=8), "delta"),
        # at α = 2 and δ = 1e-5 the conversion alone costs ≈ 11: ε = 1 leaves B ≤ 0
        (lambda: PrivacyFilter.renyi_for_epsilon(epsilon=1.0, delta=DELTA, order=2), "epsilon"),
        (lambda: PrivacyFilter.zcdp(rho=0.0, delta=DELTA), "rho"),
        (lambda: PrivacyFilter.zcdp(rho=1.0, delta=-0.1), "delta"),
        (lambda: PrivacyFilter.basic(epsilon=-1.0, delta=0.0), "epsilon"),
        (lambda: PrivacyFilter.basic(epsilon=1.0, delta=1.0), "delta"),
        (lambda: PrivacyOdometer(delta=0.0), "delta"),
        (lambda: PrivacyOdometer(delta=1e-5, orders=[0.5]), "orders"),
    ],
)
def test_bad_budgets_raise_value_error_naming_the_argument(build, name):
    with pytest.raises(ValueError, match=rf"^{name} must be"):
        build()


def test_costs_the_currency_cannot_bound_are_refused():
    subsampled = PoissonSampledGaussianEvent(noise_multiplier=1.0, sampling_rate=0.1)
    with pytest.raises(ValueError, match="^cost must be"):
        PrivacyFilter.zcdp(rho=1.0, delta=DELTA).try_spend(subsampled)
    with pytest.raises(ValueError, match="^cost must be"):
        PrivacyFilter.basic(epsilon=1.0, delta=DELTA).try_spend(subsampled)
    with pytest.raises(ValueError, match="^cost must be"):
        PrivacyFilter.renyi(orders=[8.0], budget=[1.0], delta=DELTA).try_spend([float("nan")])


def test_odometer_matches_the_time_uniform_gaussian_bound():
    orders = (2.0, 8.0, 32.0)
    odo = PrivacyOdometer(delta=DELTA, orders=orders)
    assert odo.epsilon == 0.0
    sigmas = [3.0, 5.0, 2.0, 8.0]
    for t, sigma in enumerate(sigmas, start=1):
        odo.record(GaussianEvent(noise_multiplier=sigma))
        # Gaussian RDP α/(2σ²), summed; Ville + union over k = 3 orders: log(3/δ)/(α − 1)
        expected = min(
            sum(a / (2 * s**2) for s in sigmas[:t]) + math.log(3 / DELTA) / (a - 1) for a in orders
        )
        assert odo.epsilon == pytest.approx(expected, rel=1e-12)
        assert odo.epsilon >= expected
    assert odo.history == sorted(odo.history) and len(odo.history) == 4
    # never below the fixed-time (non-adaptive) RDP conversion of the same curve
    curve = [sum(a / (2 * s**2) for s in sigmas) for a in orders]
    assert odo.epsilon >= rdp.compute_epsilon(list(orders), curve, DELTA)[0]


def test_a_restored_filter_keeps_what_was_spent_before_the_restart():
    # a run that restarts from a checkpoint must not get its budget back: the filter's exact
    # spent totals and reserved δ survive a JSON round trip, and it refuses where the
    # original would (exactly: dyadic costs, the last one fills the budget to the bit)
    import json

    f = PrivacyFilter.zcdp(rho=0.5, delta=DELTA)
    assert f.try_spend(0.125) and f.try_spend(0.25)
    f.reserve_delta(1e-9)
    g = PrivacyFilter.from_state_dict(json.loads(json.dumps(f.state_dict())))
    assert g.spent == f.spent and g.releases == 2 and g.delta_total == f.delta_total
    assert g.max_releases(0.125) == f.max_releases(0.125) == 1
    assert not g.try_spend(0.126) and g.try_spend(0.125) and not g.try_spend(1e-300)
    bad = dict(f.state_dict(), spent=["1/1"])  # spent past the budget ρ = 0.5
    with pytest.raises(ValueError, match="^state must be"):
        PrivacyFilter.from_state_dict(bad)


def test_the_odometer_never_records_a_negative_rdp_value():
    # the evaluated RDP of a weak subsampled Gaussian rounds slightly below 0 at some orders
    # (a divergence is ≥ 0): the odometer, like the filter, charges it as 0, never as a credit
    event = PoissonSampledGaussianEvent(noise_multiplier=1e8, sampling_rate=1e-9)
    odo = PrivacyOdometer(delta=DELTA)
    odo.record(event)
    assert min(odo.spent) >= 0.0
