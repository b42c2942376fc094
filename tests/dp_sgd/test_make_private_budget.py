"""make_private(budget=filter): every step charged before it runs, a clean stop at the budget.

The expected costs are dp-accounting's RDP of PoissonSampledDpEvent(q, GaussianDpEvent(σ)) at
the realised q, composed outside dpjax.
"""

import math
import warnings
from fractions import Fraction

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from dp_accounting import rdp

from dpjax.accounting import BudgetExhaustedError, PrivacyFilter
from dpjax.dp_sgd import make_private

N, DIM, DELTA = 60, 3, 1e-5
ORDERS = (4.0, 8.0, 16.0)


def square_loss(w, ex):
    return 0.5 * (ex["x"] @ w - ex["y"]) ** 2


def data():
    x = np.random.default_rng(3).normal(size=(N, DIM))
    return {"x": jnp.asarray(x), "y": jnp.asarray(x @ np.array([1.0, -2.0, 0.5]))}


def one_step_rdp(sigma, q):
    accountant = rdp.RdpAccountant(orders=list(ORDERS))
    accountant.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)))
    return np.asarray(accountant._rdp, dtype=np.float64)


def private_with(budget, sigma, steps, seed):
    return make_private(
        square_loss,
        optimizer=optax.sgd(0.2),
        l2_clip_norm=1.0,
        dataset_size=N,
        batch_size=6,
        steps=steps,
        noise_multiplier=sigma,
        delta=DELTA,
        key=jax.random.key(seed),
        clipping="vmap",
        accounting="rdp",
        budget=budget,
    )


def test_fit_stops_before_the_step_the_shared_filter_refuses():
    # budget: 7.5 steps at σ = 1.2 (q = 0.1). Earlier releases from the same data (two
    # subsampled Gaussian steps, the second's σ chosen from the first's noisy output) are
    # charged first; then a run whose σ is chosen from them must stop when the next step
    # would not fit
    budget = 7.5 * one_step_rdp(1.2, 0.1)
    f = PrivacyFilter.renyi(orders=ORDERS, budget=budget, delta=DELTA)
    rng = np.random.default_rng(0)
    sigmas = [1.2]
    sigmas.append(1.0 + min(abs(rng.normal(scale=sigmas[0])), 1.0))  # from a noisy release
    for sigma in sigmas:
        assert f.try_spend([float(v) for v in one_step_rdp(sigma, 0.1)])
    sigma = 1.0 + min(abs(rng.normal(scale=sigmas[1])), 1.0)
    private = private_with(f, sigma, 50, seed=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        w, state, history = private.fit(jnp.zeros(DIM), data(), progress=False)
    assert any("privacy budget exhausted" in str(c.message) for c in caught)
    assert "privacy budget exhausted" in history["stopped_early"]
    # the steps that fit: dp-accounting's per-step RDP at the realised q, summed exactly
    earlier = [sum(Fraction(float(one_step_rdp(s, 0.1)[j])) for s in sigmas) for j in range(3)]
    cost = one_step_rdp(sigma, private.sampling_rate)
    left = [Fraction(float(b)) - e for b, e in zip(budget, earlier, strict=True)]
    fit = min(math.floor(r / Fraction(float(c))) for r, c in zip(left, cost, strict=True))
    assert 0 < fit < 50
    assert int(state.step) == fit == f.releases - 2
    np.testing.assert_allclose(f.spent, [float(e) for e in earlier] + fit * cost, rtol=1e-12)
    # the report is the filter's: ε of the budget curve, δ with the truncation slack
    public = private.public_state(state)
    assert public.epsilon == pytest.approx(
        rdp.compute_epsilon(list(ORDERS), list(budget), DELTA)[0], rel=1e-12
    )
    assert history["epsilon_guarantee"] == public.epsilon
    assert DELTA <= public.delta == f.delta_total <= DELTA * (1 + 1e-3)
    # a step past the budget: refused, nothing ran, nothing charged
    with pytest.raises(BudgetExhaustedError):
        private.step(w, state, data())
    assert f.releases == 2 + fit
    # fit from the exhausted state: stops before its first step, returns the state unchanged
    with pytest.warns(UserWarning, match="privacy budget exhausted before step"):
        w3, state3, history3 = private.fit(w, data(), state=state, progress=True)
    assert int(state3.step) == fit and history3["step"] == [] and f.releases == 2 + fit
    np.testing.assert_array_equal(w3, w)


def test_budget_arguments_are_checked():
    f = PrivacyFilter.renyi(orders=ORDERS, budget=[1.0, 1.0, 1.0], delta=DELTA)
    with pytest.raises(ValueError, match="^budget must be"):
        private_with("not a filter", 1.0, 5, seed=2)
    with pytest.raises(ValueError, match="^budget must be"):  # basic (ε, δ) cannot charge σ
        private_with(PrivacyFilter.basic(epsilon=1.0, delta=DELTA), 1.0, 5, seed=2)
    with pytest.raises(ValueError, match="^budget must be"):
        make_private(
            square_loss,
            optimizer=optax.sgd(0.2),
            l2_clip_norm=1.0,
            dataset_size=N,
            batch_size=6,
            steps=5,
            target_epsilon=2.0,
            delta=DELTA,
            key=jax.random.key(2),
            accounting="rdp",
            budget=f,
        )
    assert f.releases == 0


def test_a_step_jitted_over_a_closed_over_state_is_refused():
    # a user loop `jax.jit(lambda w, d: private.step(w, state, d))` sees a concrete state at
    # trace time: the charge happened once, when jit traced it, and every later call (new
    # params, new data: a new release) would run uncharged. Traced params or data are refused.
    f = PrivacyFilter.renyi(orders=ORDERS, budget=[10.0, 10.0, 10.0], delta=DELTA)
    private = private_with(f, 1.0, 5, seed=4)
    w0 = jnp.zeros(DIM)
    state = private.init(w0)
    jitted = jax.jit(lambda w, d: private.step(w, state, d)[0])
    with pytest.raises(ValueError, match="^params must be a concrete params"):
        jitted(w0, data())
    assert f.releases == 0


def test_every_epsilon_fit_shows_is_the_filters_guarantee():
    # with a shared filter, the ε of this object's own steps leaves out everything charged
    # before (and is no guarantee of an adaptive interaction): the history, the CSV log and
    # the progress bar must show the filter's ε, never that smaller number
    from dpjax.dp_sgd import CSVLogger

    f = PrivacyFilter.renyi(orders=ORDERS, budget=8.0 * one_step_rdp(1.2, 0.1), delta=DELTA)
    assert f.try_spend([float(v) for v in 4.0 * one_step_rdp(1.2, 0.1)])  # earlier releases
    private = private_with(f, 1.2, 2, seed=5)
    logged = []
    _, state, history = private.fit(
        jnp.zeros(DIM),
        data(),
        progress=False,
        callbacks=[CSVLogger(lambda step, values: logged.append(values["epsilon"]))],
    )
    assert int(state.step) == 2
    assert private.epsilon(state) < f.epsilon  # the plan's ε of 2 steps: not the guarantee
    assert history["epsilon"] == [f.epsilon] * len(history["step"])
    assert logged and logged == [f.epsilon] * len(logged)
