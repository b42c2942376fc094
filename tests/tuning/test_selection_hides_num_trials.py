"""Private selection hides K: every call runs the same public number of trials, whatever K is,
and the cap on K is charged on δ (P[K > K_max] through the coupling slack)."""

import math

import dp_accounting
import jax
import numpy as np
import pytest
from dp_accounting import dp_event as dp_events
from dp_accounting.rdp import rdp_privacy_accountant as _dp_rdp
from scipy import stats

from dpjax import events as ev
from dpjax import tuning
from dpjax.accounting import PrivacyAccountant, TruncationSlackError
from dpjax.accounting.num_trials import max_trials_for, num_trials_mean, num_trials_tail
from dpjax.accounting.padded_slack import TRUNCATION_DELTA_SHARES
from dpjax.accounting.tight import DEFAULT_RDP_ORDERS
from dpjax.tuning import draw_num_trials, private_selection

BASE = ev.GaussianEvent(noise_multiplier=3.0)


def _num_trials(key, *, mean, shape):
    """K as private_selection draws it from ``key`` (its first split, on the host)."""
    return draw_num_trials(tuning._host_rng(jax.random.split(key, 3)[0]), mean=mean, shape=shape)


@pytest.mark.parametrize(("distribution", "shape"), [("geometric", 1.0), ("poisson", math.inf)])
def test_every_selection_runs_the_same_public_number_of_trials(distribution, shape):
    """The number of trial calls (the work, hence the wall time) is max_trials for every K."""
    calls, ks = [], set()
    for seed in range(12):
        key = jax.random.key(seed)
        count = [0]

        def trial(k, c, count=count):
            count[0] += 1
            return float(c), BASE

        res = private_selection(
            key, [1, 2, 3], trial, mean=4.0, distribution=distribution, base_event=BASE,
            max_trials=25,
        )  # fmt: skip
        calls.append(count[0])
        ks.add(_num_trials(key, mean=4.0, shape=shape))
        assert res.event.max_trials == 25
    assert calls == [25] * 12
    assert len(ks) >= 3  # K did vary over these seeds (it is what the call count used to show)


def test_default_number_of_trials_is_public_and_recorded():
    count = [0]

    def trial(k, c):
        count[0] += 1
        return 1.0, BASE

    res = private_selection(jax.random.key(0), [1], trial, mean=3.0, base_event=BASE)
    k_max = max_trials_for(mean=3.0, shape=1.0)
    assert count[0] == k_max == res.event.max_trials
    # geometric, γ = 1/3: P[K > k] = (2/3)^k, so K_max = ⌈ln 1e-10 / ln(2/3)⌉ = 57
    assert k_max == math.ceil(math.log(1e-10) / math.log(2 / 3)) == 57


def _tnb_tail_by_sum(k_max, mean, shape):
    """P[K > k_max] of the truncated negative binomial, summed from its definition."""
    gamma = _dp_rdp._gamma_truncated_negative_binomial(shape, mean)  # dp-accounting's map
    k = np.arange(1, 5_000)  # the rest of the tail is below 1e-30 at E[K] = 5
    if shape == 0:
        w = (1 - gamma) ** k / k
    else:
        w = np.exp(
            math.lgamma(1) + np.array([math.lgamma(i + shape) - math.lgamma(i + 1) for i in k])
            - math.lgamma(shape) + k * math.log(1 - gamma)
        )  # fmt: skip
    return w[k > k_max].sum() / w.sum()


@pytest.mark.parametrize("shape", [1.0, 0.0, 0.5, 3.0, math.inf])
def test_tail_of_the_number_of_trials_matches_its_definition(shape):
    mean, k_max = 5.0, 30
    got = num_trials_tail(k_max, mean=mean, shape=shape)
    if shape == math.inf:
        expected = 1 - sum(math.exp(-mean) * mean**k / math.factorial(k) for k in range(k_max + 1))
    elif shape == 1.0:
        expected = (1 - 1 / mean) ** k_max  # geometric, γ = 1/E[K]
    else:
        expected = _tnb_tail_by_sum(k_max, mean, shape)
    assert got == pytest.approx(expected, rel=1e-6)
    # the E[K] that slacks scale with: never below the mean asked for, and that mean to 1e-8
    assert mean <= num_trials_mean(mean=mean, shape=shape) <= mean * (1 + 1e-8)
    rng = np.random.default_rng(1)  # the sampler draws from the same distribution
    draws = np.array([draw_num_trials(rng, mean=mean, shape=shape) for _ in range(8_000)])
    cut = 8  # a tail frequent enough to estimate: P[K > 8]
    p = num_trials_tail(cut, mean=mean, shape=shape)
    se = math.sqrt(p * (1 - p) / draws.size)
    assert abs((draws > cut).mean() - p) < 5 * se


def _uncapped_epsilon(mean, shape, delta):
    acc = dp_accounting.rdp.RdpAccountant(list(DEFAULT_RDP_ORDERS))
    acc.compose(dp_events.RepeatAndSelectDpEvent(dp_accounting.GaussianDpEvent(3.0), mean, shape))
    return acc.get_epsilon(delta)


def test_the_cap_on_k_is_charged_its_tail_on_delta():
    """ε of a capped selection = uncapped RDP ε at δ(1 − f) for the first share f of δ that
    holds (1 + e^ε)·P[K > K_max], with P[K > K_max] = (1 − 1/E[K])^K_max (geometric)."""
    delta, mean = 1e-6, 5.0
    k_max = 55  # tail 0.8^55 = 4.6e-6 > δ: no share of δ holds it
    with pytest.raises(TruncationSlackError, match="max_trials"):
        PrivacyAccountant([ev.RepeatAndSelectEvent(BASE, mean, 1.0, max_trials=k_max)]).epsilon(
            delta
        )
    k_max = 90  # tail 0.8^90 = 1.9e-9: fits in 1e-1·δ, not in 1e-2·δ at ε ≈ 2.76
    tail = 0.8**k_max
    got = PrivacyAccountant([ev.RepeatAndSelectEvent(BASE, mean, 1.0, max_trials=k_max)]).epsilon(
        delta
    )
    shares = [
        f
        for f in TRUNCATION_DELTA_SHARES
        if (1 + math.exp(_uncapped_epsilon(mean, 1.0, delta * (1 - f)))) * tail <= f * delta
    ]
    assert shares[0] == 0.1  # the case the test is built for
    assert got == pytest.approx(_uncapped_epsilon(mean, 1.0, delta * 0.9), rel=1e-9)
    assert got > _uncapped_epsilon(mean, 1.0, delta)  # the cap is not free
    # a cap far in the tail costs (almost) nothing: the first share
    far = PrivacyAccountant([ev.RepeatAndSelectEvent(BASE, mean, 1.0, max_trials=200)])
    assert far.epsilon(delta) == pytest.approx(_uncapped_epsilon(mean, 1.0, delta * 0.999))


def test_capped_event_round_trips_and_old_records_read_as_uncapped():
    sel = ev.RepeatAndSelectEvent(BASE, mean=5.0, shape=1.0, max_trials=40)
    assert ev.event_from_dict(ev.event_to_dict(sel)) == sel
    old = {k: v for k, v in ev.event_to_dict(sel).items() if k != "max_trials"}
    assert ev.event_from_dict(old).max_trials is None
    with pytest.raises(ValueError, match="max_trials"):
        ev.RepeatAndSelectEvent(BASE, mean=5.0, shape=1.0, max_trials=0)
    with pytest.raises(ValueError, match="max_trials"):
        private_selection(
            jax.random.key(0), [1], lambda k, c: (1.0, BASE), mean=3.0, base_event=BASE,
            max_trials=-1,
        )  # fmt: skip
    assert stats.geom.sf(40, 0.2) == pytest.approx(num_trials_tail(40, mean=5.0, shape=1.0))
