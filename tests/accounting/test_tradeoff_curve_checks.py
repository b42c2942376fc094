"""The trade-off curve runs the accountant's checks and pays a padded sampler's truncation.

``tradeoff_curve`` returned the UNCAPPED curve for a padded sampler (cap 55 at q = 0.05, 100
steps), composed a replace-one with an add/remove-one event (0.447 where the replace-one
value is 0.170), and composed user-level with example-level events as one unit.
"""

from __future__ import annotations

import dp_accounting
import numpy as np
import pytest

from dpjax import events as ev
from dpjax.accounting import PrivacyAccountant, tradeoff_curve

ALPHAS = [1e-6, 1e-3, 0.1]


def _capped(**kw):
    args = dict(noise_multiplier=1.0, sampling_rate=0.05, count=100, dataset_size=1000,
                max_batch_size=55)  # fmt: skip
    args.update(kw)
    return ev.PoissonSampledGaussianEvent(**args)


def _dp_accounting_truncated_beta(event, alphas, value_discretization_interval=1e-4):
    """β(α) from dp-accounting's own truncated-Poisson PLD (independent of dpjax's code)."""
    dp_event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.TruncatedSubsampledGaussianDpEvent(
            dataset_size=event.dataset_size + 1,
            sampling_probability=event.sampling_rate,
            truncated_batch_size=event.max_batch_size,
            noise_multiplier=event.noise_multiplier,
        ),
        event.count,
    )
    acc = dp_accounting.pld.PLDAccountant(
        dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
        value_discretization_interval=value_discretization_interval,
    )
    acc.compose(dp_event)
    eps = np.linspace(0.0, 12.0, 1201)
    deltas = np.asarray(acc._pld.get_delta_for_epsilon(eps), np.float64)  # vectorised
    a = np.asarray(alphas).reshape(-1, 1)
    first = 1.0 - deltas - np.exp(eps) * a
    second = np.exp(-eps) * (1.0 - deltas - a)
    return np.max(np.maximum(np.maximum(first, second), 0.0), axis=1)


def test_padded_sampler_curve_is_the_truncated_analysis_not_the_uncapped_one():
    """A coarse PLD grid (1e-3) on both sides: dpjax against dp-accounting (~1 s of CPU).

    The slow twin below compares both at the default grid, 1e-4 (~12 s).
    """
    coarse = 1e-3
    capped = _capped()
    got = tradeoff_curve(PrivacyAccountant([capped], value_discretization_interval=coarse), ALPHAS)
    uncapped = tradeoff_curve(
        PrivacyAccountant(
            [capped.untruncated(slack_paid_separately=True)], value_discretization_interval=coarse
        ),
        ALPHAS,
    )
    reference = _dp_accounting_truncated_beta(capped, ALPHAS, coarse)
    assert np.all(got < uncapped - 1e-3)  # the cap costs privacy (0.514 vs 0.737 at α = 0.1)
    np.testing.assert_allclose(got, reference, atol=2e-3)
    assert np.all(got <= reference + 2e-3)


@pytest.mark.slow
def test_padded_sampler_curve_at_the_default_grid_is_the_truncated_analysis():
    capped = _capped()
    got = tradeoff_curve(capped, ALPHAS)
    uncapped = tradeoff_curve(capped.untruncated(slack_paid_separately=True), ALPHAS)
    reference = _dp_accounting_truncated_beta(capped, ALPHAS)
    assert np.all(got < uncapped - 1e-3)  # the cap costs privacy (0.514 vs 0.737 at α = 0.1)
    np.testing.assert_allclose(got, reference, atol=2e-3)
    assert np.all(got <= reference + 2e-3)


def test_replace_one_padded_sampler_pays_the_slack():
    capped = _capped(relation="replace_one", count=3, max_batch_size=80)
    got = tradeoff_curve(capped, ALPHAS)
    assert np.all(
        got <= tradeoff_curve(capped.untruncated(slack_paid_separately=True), ALPHAS) + 1e-12
    )


def test_mixed_relations_are_refused():
    add_remove = ev.GaussianEvent(noise_multiplier=1.0, relation="add_or_remove_one")
    replace = ev.GaussianEvent(noise_multiplier=1.0, relation="replace_one")
    with pytest.raises(ValueError, match="relation"):
        tradeoff_curve([replace, add_remove], ALPHAS)


def test_user_and_example_level_events_are_refused_together():
    example = ev.PoissonSampledGaussianEvent(noise_multiplier=1.0, sampling_rate=0.1, count=5)
    user = ev.PoissonSampledGaussianEvent(
        noise_multiplier=1.0, sampling_rate=0.1, count=5, privacy_unit="user:abc"
    )
    with pytest.raises(ValueError, match="privacy_unit"):
        tradeoff_curve([example, user], ALPHAS)


def test_as_event_keeps_the_privacy_unit():
    """PrivacyAccountant([example_acc.as_event(δ), user_acc.as_event(δ)]) was accepted and
    reported ε 8.65 "per example"."""
    example_acc = PrivacyAccountant(
        [ev.PoissonSampledGaussianEvent(noise_multiplier=1.0, sampling_rate=0.1, count=50)]
    )
    user_acc = PrivacyAccountant(
        [
            ev.PoissonSampledGaussianEvent(
                noise_multiplier=1.0, sampling_rate=0.1, count=50, privacy_unit="user:abc"
            )
        ]
    )
    user_event = user_acc.as_event(1e-5)
    assert user_event.privacy_unit == "user:abc"
    assert example_acc.as_event(1e-5).privacy_unit == "example"
    with pytest.raises(ValueError, match="privacy_unit"):
        PrivacyAccountant([example_acc.as_event(1e-5), user_event])
    again = ev.event_from_dict(ev.event_to_dict(user_event))
    assert again == user_event
