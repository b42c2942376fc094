"""Private selection over a padded Poisson sampler's run: accounted with the truncation slack
E[K]·Σ count·p̄ on δ (coupling), and ``untruncated()`` refuses to drop the slack silently."""

import functools
import math

import dp_accounting
import pytest
from dp_accounting import dp_event as dp_events
from scipy import stats

from dpjax import events as ev
from dpjax.accounting import PrivacyAccountant, TruncationSlackError
from dpjax.accounting.padded_slack import TRUNCATION_DELTA_SHARES
from dpjax.accounting.selection import repeat_and_select_rdp
from dpjax.accounting.tight import DEFAULT_RDP_ORDERS
from dpjax.dp_sgd import PoissonSampler

N, Q, SIGMA, STEPS, MEAN, DELTA = 10_000, 0.01, 1.1, 100, 5.0, 1e-5


def _padded(cap):
    return PoissonSampler(dataset_size=N, sampling_rate=Q, max_batch_size=cap).event(
        noise_multiplier=SIGMA, steps=STEPS
    )


def _overflow(cap):
    """p̄ = P[Binomial(n + 1, q) > cap], from scipy (not from the event)."""
    return stats.binom.sf(cap, N + 1, Q)


@functools.cache
def _uncapped_selection_accountant():
    inner = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(SIGMA)), STEPS
    )
    acc = dp_accounting.rdp.RdpAccountant(list(DEFAULT_RDP_ORDERS))
    acc.compose(dp_events.RepeatAndSelectDpEvent(inner, MEAN, 1.0))
    return acc


def _uncapped_selection_epsilon(delta):
    """dp-accounting's RDP ε of a selection over the UNtruncated run."""
    return _uncapped_selection_accountant().get_epsilon(delta)


def _expected(mass):
    """ε at δ(1 − f) for the first share f of δ that holds (1 + e^ε)·mass."""
    for f in TRUNCATION_DELTA_SHARES:
        eps = _uncapped_selection_epsilon(DELTA * (1 - f))
        if (1 + math.exp(eps)) * mass <= f * DELTA:
            return f, eps
    return None, math.inf


def test_selection_over_a_padded_run_is_accounted_with_its_slack():
    """Each trial is within total variation count·p̄ of the untruncated run, so the selection
    is within E[K]·count·p̄ of the untruncated selection (union bound, K independent)."""
    cap = 170  # T·p̄ = 5.5e-9 fits in 1e-2·δ, E[K]·T·p̄ = 2.8e-8 only in 1e-1·δ
    mass = MEAN * STEPS * _overflow(cap)
    share, eps = _expected(mass)
    share_without_mean, _ = _expected(STEPS * _overflow(cap))
    assert share is not None and share != share_without_mean  # the case the test is built for
    acc = PrivacyAccountant([ev.RepeatAndSelectEvent(_padded(cap), mean=MEAN, shape=1.0)])
    assert acc.applicable_methods() == ("rdp",)
    assert acc.epsilon(DELTA) == pytest.approx(eps, rel=1e-9)


def test_selection_over_a_padded_run_whose_slack_cannot_fit_is_refused():
    cap = 150  # E[K]·T·p̄ = 5.4e-4 ≫ δ
    assert MEAN * STEPS * _overflow(cap) > DELTA
    acc = PrivacyAccountant([ev.RepeatAndSelectEvent(_padded(cap), mean=MEAN, shape=1.0)])
    with pytest.raises(TruncationSlackError, match="max_batch_size"):
        acc.epsilon(DELTA)


def test_selection_composes_with_a_padded_run_and_pays_both_slacks():
    cap = 180
    run = _padded(cap)
    sel = ev.RepeatAndSelectEvent(run, mean=MEAN, shape=1.0)
    both = PrivacyAccountant([sel, run]).epsilon(DELTA)
    alone = PrivacyAccountant([sel]).epsilon(DELTA)
    assert both > alone


def test_untruncated_refuses_to_drop_the_slack():
    padded = _padded(150)
    with pytest.raises(ValueError, match="slack_paid_separately"):
        padded.untruncated()
    plain = padded.untruncated(slack_paid_separately=True)
    assert not plain.truncated and plain.noise_multiplier == SIGMA
    assert plain.untruncated() is plain  # nothing to drop: no refusal


def test_rdp_curve_of_a_selection_with_a_slack_is_refused():
    """The slack is an (ε, δ) term: a bare RDP curve of such a selection would omit it."""
    with pytest.raises(ValueError, match="PrivacyAccountant"):
        repeat_and_select_rdp(ev.RepeatAndSelectEvent(_padded(150), mean=MEAN, shape=1.0))
    with pytest.raises(ValueError, match="PrivacyAccountant"):
        repeat_and_select_rdp(
            ev.RepeatAndSelectEvent(ev.GaussianEvent(2.0), mean=MEAN, shape=1.0, max_trials=50)
        )
