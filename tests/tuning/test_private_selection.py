"""Private selection: the event's RDP against Papernot & Steinke's closed forms and
dp-accounting, the distribution of K, keys, and refusals."""

import math

import dp_accounting
import jax
import numpy as np
import pytest
from dp_accounting import dp_event as dp_events
from scipy import special

from dpjax import events as ev
from dpjax import tuning
from dpjax.accounting import PrivacyAccountant
from dpjax.accounting.selection import repeat_and_select_rdp
from dpjax.accounting.tight import DEFAULT_RDP_ORDERS
from dpjax.tuning import draw_num_trials, private_selection

SIGMA = 3.0
BASE = ev.GaussianEvent(noise_multiplier=SIGMA)  # RDP ε_λ = λ/(2σ²) exactly


def _gaussian_rdp(orders):
    return np.asarray(orders) / (2 * SIGMA**2)


def _tnb_gamma(shape, mean):
    """Solve E[K] = mean for the truncated negative binomial (independent of dp-accounting)."""

    def mean_of(g):
        if shape == 0:
            return (1 - g) / (g * -math.log(g))
        return shape * (1 - g) / (g * (1 - g**shape))

    lo, hi = 1e-12, 1 - 1e-12
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if mean_of(mid) > mean else (lo, mid)
    return lo


@pytest.mark.parametrize("shape", [1.0, 0.0, 0.5, 3.0])
def test_tnb_rdp_is_theorem_2(shape):
    """ε'_λ = ε_λ + (1+η)(1 − 1/λ̂)ε_λ̂ + (1+η)ln(1/γ)/λ̂ + ln(E[K])/(λ − 1), min over λ̂,
    then monotone in λ (Papernot & Steinke 2022, Theorem 2)."""
    mean = 10.0
    orders = np.asarray(DEFAULT_RDP_ORDERS)
    gamma = 1 / mean if shape == 1 else _tnb_gamma(shape, mean)
    eps = _gaussian_rdp(orders)
    extra = (1 + shape) * np.min((1 - 1 / orders) * eps + math.log(1 / gamma) / orders)
    closed = eps + extra + math.log(mean) / (orders - 1)
    closed = np.minimum.accumulate(closed[::-1])[::-1]
    event = ev.RepeatAndSelectEvent(BASE, mean=mean, shape=shape)
    _, got = repeat_and_select_rdp(event)
    np.testing.assert_allclose(got, closed, rtol=1e-6)
    # The factor (1 + η) and the ln E[K] term matter: without either the curve is lower.
    if shape > 0:
        wrong = eps + extra / (1 + shape) + math.log(mean) / (orders - 1)
        assert np.any(got > wrong * (1 + 1e-3))
    assert np.any(got > (eps + extra) * (1 + 1e-3))


def test_poisson_rdp_is_at_least_theorem_6_with_the_exact_delta():
    mean = 10.0
    orders = np.asarray(DEFAULT_RDP_ORDERS)
    _, got = repeat_and_select_rdp(ev.RepeatAndSelectEvent(BASE, mean=mean, shape=math.inf))
    mu = 1 / SIGMA
    eps_hat = np.log1p(1 / (orders - 1))
    delta_hat = special.ndtr(mu / 2 - eps_hat / mu) - np.exp(eps_hat) * special.ndtr(
        -mu / 2 - eps_hat / mu
    )  # exact Gaussian δ(ε̂) ≤ the RDP-converted δ̂ that dp-accounting uses
    closed = _gaussian_rdp(orders) + mean * delta_hat + math.log(mean) / (orders - 1)
    assert np.all(got >= closed * (1 - 1e-9))
    assert np.median(got / closed) < 1.5


@pytest.mark.parametrize("shape", [math.inf, 1.0, 0.0, 0.5])
def test_accountant_agrees_with_dp_accounting(shape):
    base = ev.PoissonSampledGaussianEvent(noise_multiplier=1.1, sampling_rate=0.01, count=500)
    acc = PrivacyAccountant([ev.RepeatAndSelectEvent(base, mean=8.0, shape=shape)])
    ref = dp_accounting.rdp.RdpAccountant(list(DEFAULT_RDP_ORDERS))
    inner = dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.1))
    ref.compose(
        dp_events.RepeatAndSelectDpEvent(dp_accounting.SelfComposedDpEvent(inner, 500), 8.0, shape)
    )
    assert acc.applicable_methods() == ("rdp",)
    assert acc.epsilon(1e-5) == pytest.approx(ref.get_epsilon(1e-5), rel=0.01)
    one_run = PrivacyAccountant([base]).epsilon(1e-5, accounting="rdp")
    assert one_run < acc.epsilon(1e-5) < 8 * one_run


def test_selection_composes_with_other_events_and_serialises():
    sel = ev.RepeatAndSelectEvent(BASE, mean=5.0, shape=1.0, count=2)
    acc = PrivacyAccountant([sel, ev.GaussianEvent(noise_multiplier=2.0)])
    alone = PrivacyAccountant([sel]).epsilon(1e-6)
    assert acc.epsilon(1e-6) > alone
    with pytest.raises(ValueError, match="RDP only"):
        acc.epsilon(1e-6, accounting="pld")
    again = PrivacyAccountant.from_state_dict(acc.state_dict())
    assert again.events == acc.events


@pytest.mark.parametrize("shape", [math.inf, 1.0, 0.0, 2.0])
def test_number_of_trials_has_the_accounted_mean(shape):
    rng = np.random.default_rng(0)
    mean, m = 6.0, 20_000
    draws = np.array([draw_num_trials(rng, mean=mean, shape=shape) for _ in range(m)])
    se = draws.std() / math.sqrt(m)
    assert abs(draws.mean() - mean) < 5 * se
    assert abs(draws.mean() - 1.2 * mean) > 5 * se  # the test rejects a wrong scale
    if shape != math.inf:
        assert draws.min() >= 1


def _num_trials(key, *, mean, shape):
    """K as private_selection draws it from ``key`` (its first split, on the host)."""
    return draw_num_trials(tuning._host_rng(jax.random.split(key, 3)[0]), mean=mean, shape=shape)


def test_selection_picks_the_best_of_the_first_k_trials_with_fresh_keys():
    seen, scores = [], []

    def train_and_score(key, candidate):
        seen.append(np.asarray(jax.random.key_data(key)).tobytes())
        scores.append(float(candidate) + 0.01 * len(scores))  # later trials a bit better
        return scores[-1], BASE, f"model-{candidate}"

    key = jax.random.key(1)
    res = private_selection(
        key, [3, 1, 4, 1, 5], train_and_score, mean=4.0, base_event=BASE, max_trials=40
    )
    k = _num_trials(key, mean=4.0, shape=1.0)
    assert 1 <= k < 40 and len(seen) == len(set(seen)) == 40
    assert res.score == max(scores[:k]) and res.output == f"model-{res.candidate}"
    assert res.score != max(scores)  # the trials after the K-th are not candidates
    assert res.event == ev.RepeatAndSelectEvent(BASE, mean=4.0, shape=1.0, max_trials=40)
    assert not hasattr(res, "num_trials") and not res.failed  # K stays secret


def test_selection_refuses_trials_without_or_with_differing_events():
    with pytest.raises(ValueError, match="same event|base_event"):
        private_selection(
            jax.random.key(0), [1], lambda k, c: (1.0, None), mean=3.0, base_event=BASE
        )
    events = iter([ev.GaussianEvent(2.0), ev.GaussianEvent(3.0)] * 50)
    with pytest.raises(ValueError, match=r"train_and_score\(...\)\[1\]"):
        private_selection(
            jax.random.key(0), [1], lambda k, c: (1.0, next(events)), mean=3.0,
            base_event=ev.GaussianEvent(2.0), max_trials=20,
        )  # fmt: skip
    with pytest.raises(ValueError, match="shape"):
        private_selection(
            jax.random.key(0),
            [1],
            lambda k, c: (1.0, BASE),
            mean=3.0,
            base_event=BASE,
            distribution="truncated_negative_binomial",
        )
    with pytest.raises(ValueError, match="mean"):
        private_selection(
            jax.random.key(0), [1], lambda k, c: (1.0, BASE), mean=0.5, base_event=BASE
        )


def test_poisson_selection_with_no_trial_is_still_charged():
    for seed in range(60):
        res = private_selection(
            jax.random.key(seed),
            [1],
            lambda k, c: (1.0, BASE),
            mean=1.0,
            distribution="poisson",
            base_event=BASE,
        )
        assert res.event == ev.RepeatAndSelectEvent(
            BASE, mean=1.0, shape=math.inf, max_trials=res.event.max_trials
        )
        if res.candidate is None:
            assert res.score is None
            return
    pytest.fail("P[K = 0] = e^-1: 60 draws without a K = 0 has probability < 1e-11")


def test_a_trial_may_be_a_composition_of_events():
    score_event = ev.GaussianEvent(noise_multiplier=5.0)
    sel = ev.RepeatAndSelectEvent((BASE, score_event), mean=10.0, shape=1.0)
    orders = np.asarray(DEFAULT_RDP_ORDERS)
    eps = orders / (2 * SIGMA**2) + orders / (2 * 5.0**2)
    closed = eps + 2 * np.min((1 - 1 / orders) * eps + math.log(10.0) / orders)
    closed = np.minimum.accumulate((closed + math.log(10.0) / (orders - 1))[::-1])[::-1]
    np.testing.assert_allclose(repeat_and_select_rdp(sel)[1], closed, rtol=1e-6)
    assert ev.event_from_dict(ev.event_to_dict(sel)) == sel
    res = private_selection(
        jax.random.key(2),
        [1, 2],
        lambda k, c: (c, [BASE, score_event]),
        mean=3.0,
        base_event=[BASE, score_event],
        max_trials=30,
    )
    assert res.event == ev.RepeatAndSelectEvent(
        (BASE, score_event), mean=3.0, shape=1.0, max_trials=30
    )
