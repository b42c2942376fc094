"""Accounting edge cases: q = 1 by the exact Gaussian, PLD grid limits, parameter coercion,
and the fixed-batch relation message of the accountant."""

import math
import time
import warnings

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from dp_accounting.pld import pld_privacy_accountant as pld
from dp_accounting.pld import privacy_loss_distribution as pld_lib

import dpjax.accounting as acc
from dpjax.accounting import tight
from dpjax.mechanisms import gaussian_epsilon

ADD = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE


# --- q = 1: one Gaussian with σ/√T, exactly -------------------------------------------------


@pytest.mark.parametrize("sigma, steps", [(3.0, 100), (10.0, 1000), (30.0, 50)])
def test_full_batch_is_the_exact_gaussian_and_matches_dp_accounting_pld(sigma, steps):
    eps = acc.dp_sgd_epsilon(noise_multiplier=sigma, sampling_rate=1.0, steps=steps, delta=1e-5)
    exact = gaussian_epsilon(sigma=sigma / math.sqrt(steps), sensitivity=1.0, delta=1e-5)
    assert exact <= eps <= exact * (1 + 1e-9)  # an upper bound, tight
    # dp-accounting's own (pessimistic) PLD of T Gaussian releases, at a moderate T.
    p = pld.PLDAccountant(ADD, 1e-4)
    p.compose(dp_accounting.GaussianDpEvent(sigma), steps)
    assert eps == pytest.approx(p.get_epsilon(1e-5), rel=1e-3)


def test_full_batch_at_huge_step_counts_answers_fast():
    # Old: PLD grid of μ(μ + 20)/1e-4 points at μ = √T/σ: 21 s at T = 1000, MemoryError at 1e5.
    for steps in (1000, 100_000, 10**8):
        start = time.perf_counter()
        eps = acc.dp_sgd_epsilon(noise_multiplier=1.0, sampling_rate=1.0, steps=steps, delta=1e-5)
        assert time.perf_counter() - start < 1.0
        exact = gaussian_epsilon(sigma=1.0 / math.sqrt(steps), sensitivity=1.0, delta=1e-5)
        assert eps == pytest.approx(exact, rel=1e-9) and eps >= exact
    rep = acc.dp_sgd_epsilon(
        noise_multiplier=2.0, sampling_rate=1.0, steps=100_000, delta=1e-5, relation="replace_one"
    )
    # replace-one moves the sum by 2C: σ/(2C√T)
    exact = gaussian_epsilon(sigma=1.0 / math.sqrt(100_000), sensitivity=1.0, delta=1e-5)
    assert rep == pytest.approx(exact, rel=1e-9)


def test_calibration_and_max_steps_agree_with_the_exact_gaussian_at_full_batch():
    target, delta, steps = 1.0, 1e-5, 100_000
    sigma = acc.calibrate_noise_multiplier(
        target_epsilon=target, delta=delta, sampling_rate=1.0, steps=steps, rtol=1e-4
    )
    # σ/√T is Balle–Wang's σ for one release at (1, 1e-5): 3.7306 (literature).
    assert sigma / math.sqrt(steps) == pytest.approx(3.7306, rel=1e-3)
    assert gaussian_epsilon(sigma=sigma / math.sqrt(steps), sensitivity=1.0, delta=delta) <= target
    kw = dict(noise_multiplier=300.0, sampling_rate=1.0, delta=delta)
    t_max = acc.max_steps(target_epsilon=target, **kw)
    # Exact: largest T with ε(σ/√T) ≤ 1, i.e. σ/√T ≥ 3.7306 → T = ⌊(300/3.7306…)²⌋.
    assert gaussian_epsilon(sigma=300.0 / math.sqrt(t_max), sensitivity=1.0, delta=delta) <= 1.0
    assert gaussian_epsilon(sigma=300.0 / math.sqrt(t_max + 1), sensitivity=1.0, delta=delta) > 1.0
    assert (
        acc.dp_sgd_epsilon(steps=t_max, **kw) <= target < acc.dp_sgd_epsilon(steps=t_max + 1, **kw)
    )


def test_accountant_full_batch_event_uses_the_exact_gaussian():
    events = [
        acc.PoissonSampledGaussianEvent(noise_multiplier=1.0, sampling_rate=1.0, count=100_000),
        acc.GaussianEvent(noise_multiplier=50.0, count=3, relation="add_or_remove_one"),
    ]
    accountant = acc.PrivacyAccountant(events)
    mu = math.sqrt(100_000 + 3 / 50.0**2)
    exact = gaussian_epsilon(sigma=1.0 / mu, sensitivity=1.0, delta=1e-5)
    start = time.perf_counter()
    assert accountant.epsilon(1e-5, accounting="pld") == pytest.approx(exact, rel=1e-9)
    assert accountant.epsilon(1e-5) <= accountant.epsilon(1e-5, accounting="pld")
    assert time.perf_counter() - start < 5.0


def test_gaussian_epsilon_upper_is_safe_in_floating_point():
    for mu in (1e-3, 0.3, 1.0, 10.0, 300.0, 3e4):
        for delta in (1e-12, 1e-5, 0.3):
            eps = tight.gaussian_epsilon_upper(mu, delta)
            assert tight._gaussian_delta_upper(mu, eps) <= delta
            ref = gaussian_epsilon(sigma=1.0 / mu, sensitivity=1.0, delta=delta)
            assert eps == pytest.approx(ref, rel=1e-9, abs=1e-12)
    assert tight.gaussian_epsilon_upper(1.0, 0.0) == math.inf


# --- PLD grid limits ---------------------------------------------------------------------------


def test_grid_estimate_flags_settings_that_ran_out_of_memory():
    heavy = acc.PoissonSampledGaussianEvent(noise_multiplier=0.2, sampling_rate=0.5, count=10**5)
    # The per-step estimate alone (6.9e5 > 2^19 points at 1e-4) rules it out before building.
    assert tight.pld_grid_points([heavy], 1e-4) > tight.MAX_PLD_GRID_POINTS
    # One step fits (5e4 points) but 1e5 compositions need 1.7e7 (dp-accounting's own bound).
    long = acc.PoissonSampledGaussianEvent(noise_multiplier=2.0, sampling_rate=0.5, count=10**5)
    assert tight.pld_grid_points([long], 1e-4) > 1e7 > tight.MAX_PLD_GRID_POINTS
    usual = acc.PoissonSampledGaussianEvent(noise_multiplier=1.0, sampling_rate=0.01, count=1000)
    points = tight.pld_grid_points([usual], 1e-4)
    assert 1e5 < points <= tight.MAX_PLD_GRID_POINTS  # ≈ 2.5e5 (measured with dp-accounting)
    tiny_sigma = acc.PoissonSampledGaussianEvent(noise_multiplier=1e-4, sampling_rate=0.5)
    with pytest.raises(ValueError, match="accounting='rdp'"):
        tight.plan_pld([tiny_sigma], 1e-4)


def test_step_estimate_bounds_dp_accounting_grid():
    # The analytic per-step estimate must not under-count what dp-accounting builds.
    for sigma, q in [(1.0, 0.01), (2.0, 0.5), (0.8, 0.9)]:
        event = acc.PoissonSampledGaussianEvent(noise_multiplier=sigma, sampling_rate=q)
        built = tight._cached_step_pld("poisson", sigma, q, event.relation, 1e-3)
        size = max(built._pmf_remove.size, built._pmf_add.size)
        assert size <= tight._step_points(event, 1e-3) <= 1.5 * size + 100


@pytest.mark.slow
def test_large_settings_answer_within_30_seconds():
    cases = [
        dict(noise_multiplier=0.5, sampling_rate=0.5, steps=100_000),
        dict(noise_multiplier=0.3, sampling_rate=0.9, steps=10_000),
        dict(noise_multiplier=1.0, sampling_rate=1.0, steps=100_000),
    ]
    for kw in cases:
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", tight.PLDGridCoarsenedWarning)
            eps = acc.dp_sgd_epsilon(delta=1e-5, **kw)
        assert time.perf_counter() - start < 30.0 and math.isfinite(eps)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tight.PLDGridCoarsenedWarning)
        sigma = acc.calibrate_noise_multiplier(
            target_epsilon=2.0, delta=1e-5, sampling_rate=0.5, steps=100_000
        )
    assert time.perf_counter() - start < 30.0
    assert (
        acc.dp_sgd_epsilon(noise_multiplier=sigma, sampling_rate=0.5, steps=100_000, delta=1e-5)
        <= 2.0
    )


def test_coarsened_pld_warns_and_stays_an_upper_bound(monkeypatch):
    # The coarsening mechanism, at a lowered limit (the real limits are checked above): the
    # grid of 200 steps at 1e-4 does not fit 2^15 points, so the interval is coarsened.
    monkeypatch.setattr(tight, "MAX_PLD_GRID_POINTS", 2**15)
    event = dict(noise_multiplier=1.0, sampling_rate=0.05, steps=200)
    with pytest.warns(tight.PLDGridCoarsenedWarning, match="coarsened"):
        coarse = acc.dp_sgd_epsilon(delta=1e-5, **event)
    monkeypatch.undo()
    fine = acc.dp_sgd_epsilon(delta=1e-5, **event)
    # A valid upper bound is at least dp-accounting's OPTIMISTIC PLD (a lower estimate of the
    # true ε) at the fine grid, and only a little looser than the fine pessimistic one.
    optimistic = pld_lib.from_gaussian_mechanism(
        standard_deviation=1.0,
        sampling_prob=0.05,
        value_discretization_interval=1e-4,
        pessimistic_estimate=False,
        use_connect_dots=False,
    ).self_compose(200)
    assert optimistic.get_epsilon_for_delta(1e-5) <= fine <= coarse <= 1.1 * fine


# --- coercion at the boundary ------------------------------------------------------------------


def test_numpy_and_0d_rates_become_python_floats():
    q32 = np.float32(0.01)
    ref = acc.dp_sgd_epsilon(noise_multiplier=1.0, sampling_rate=float(q32), steps=100, delta=1e-5)
    for rate in (q32, np.asarray(q32), jnp.asarray(0.01, dtype=jnp.float32)):
        eps = acc.dp_sgd_epsilon(noise_multiplier=1.0, sampling_rate=rate, steps=100, delta=1e-5)
        assert eps == ref  # bit-identical: no float32 arithmetic reached dp-accounting
        event = acc.PoissonSampledGaussianEvent(noise_multiplier=1.0, sampling_rate=rate)
        assert type(event.sampling_rate) is float and event.sampling_rate == float(q32)
    steps = acc.max_steps(
        noise_multiplier=jnp.asarray(3.0),
        target_epsilon=np.float32(2.0),
        delta=1e-5,
        sampling_rate=jnp.asarray(1.0),
    )
    assert steps == acc.max_steps(
        noise_multiplier=3.0, target_epsilon=2.0, delta=1e-5, sampling_rate=1.0
    )


@pytest.mark.parametrize("bad", [True, "0.01", np.ones(2)])
def test_bool_str_and_arrays_are_refused_by_name(bad):
    with pytest.raises(ValueError, match="sampling_rate"):
        acc.dp_sgd_epsilon(noise_multiplier=1.0, sampling_rate=bad, steps=10, delta=1e-5)
    with pytest.raises(ValueError, match="noise_multiplier"):
        acc.PoissonSampledGaussianEvent(noise_multiplier=bad, sampling_rate=0.1)


def test_tracers_are_refused_by_name():
    def eps(q):
        return acc.dp_sgd_epsilon(noise_multiplier=1.0, sampling_rate=q, steps=10, delta=1e-5)

    with pytest.raises(TypeError, match="sampling_rate.*public constants"):
        jax.jit(eps)(0.1)
    with pytest.raises(TypeError, match="delta"):
        jax.jit(lambda d: acc.PrivacyAccountant([acc.GaussianEvent(1.0)]).epsilon(d))(1e-5)


# --- accountant: fixed-size batches under add/remove-one ---------------------------------------


def test_fixed_batch_event_under_add_remove_is_refused_with_the_relation_named():
    add_fixed = acc.FixedBatchGaussianEvent(
        noise_multiplier=2.0, batch_size=50, dataset_size=1000, relation="add_or_remove_one"
    )
    with pytest.raises(ValueError, match=r"event\.relation must be 'replace_one'.*PoissonSampler"):
        acc.PrivacyAccountant([add_fixed])
    with pytest.raises(ValueError, match=r"event\.relation must be 'replace_one'"):
        acc.pld_epsilon([add_fixed], 1e-5)


def test_closed_forms_return_python_floats_for_numpy_inputs():
    # NumPy 2 keeps float32 in `np.float32 * float`: the result must not carry it.
    eps, dlt = acc.amplification_by_subsampling(
        epsilon=1.0, delta=np.float32(1e-5), sampling_rate=np.float32(0.01)
    )
    assert type(eps) is float and type(dlt) is float
    assert dlt == float(np.float32(0.01)) * float(np.float32(1e-5))
    assert type(acc.zcdp_epsilon_bun_steinke(rho=np.float32(0.01), delta=1e-5)) is float
    step = acc.advanced_composition_step_epsilon(
        target_epsilon=np.float32(0.5), steps=100, delta_prime=1e-5
    )
    assert type(step) is float


def test_accountant_falls_back_when_the_pld_grid_cannot_be_built():
    tiny = acc.PoissonSampledGaussianEvent(noise_multiplier=1e-4, sampling_rate=0.5)
    accountant = acc.PrivacyAccountant([tiny])
    with pytest.raises(tight.PLDGridTooLargeError):
        accountant.epsilon(1e-5, accounting="pld")
    assert accountant.epsilon(1e-5) == accountant.epsilon(1e-5, accounting="rdp")
