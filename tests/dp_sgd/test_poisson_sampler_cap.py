"""PoissonSampler's cap: sized from the run's steps and δ when they are known, so that the
truncation slack fits in δ at accounting time; a cap that cannot fit is refused at construction
(before training), naming ``max_batch_size``."""

import math

import pytest
from scipy import stats

from dpjax.accounting import PrivacyAccountant
from dpjax.dp_sgd import PoissonSampler

N, Q, STEPS, DELTA, SIGMA = 10_000, 0.01, 1_000, 1e-5, 1.0


def _p_bar(cap):
    """P[Binomial(n + 1, q) > cap] from scipy."""
    return stats.binom.sf(cap, N + 1, Q)


def test_cap_sized_from_steps_and_delta_holds_delta():
    sampler = PoissonSampler(dataset_size=N, sampling_rate=Q, steps=STEPS, delta=DELTA)
    event = sampler.event(noise_multiplier=SIGMA, steps=STEPS)
    eps = PrivacyAccountant([event], value_discretization_interval=1e-3).epsilon(DELTA)
    assert 0.5 < eps < 5.0
    cap = sampler.max_batch_size
    # the slack fits in the first share of δ (1e-3·δ, make_private's) at this ε ...
    assert (1 + math.exp(eps)) * STEPS * _p_bar(cap) <= 1e-3 * DELTA
    # ... and for every ε ≤ 10, by the smallest such cap
    assert (1 + math.exp(10.0)) * STEPS * _p_bar(cap) <= 1e-3 * DELTA
    assert (1 + math.exp(10.0)) * STEPS * _p_bar(cap - 1) > 1e-3 * DELTA
    # the former default (overflow 1e-9 per step) cannot hold this δ at any share of it
    default = PoissonSampler(dataset_size=N, sampling_rate=Q).max_batch_size
    assert default < cap
    assert (1 + math.exp(eps)) * STEPS * _p_bar(default) > 0.5 * DELTA


def test_explicit_cap_that_cannot_hold_delta_fails_at_construction():
    with pytest.raises(ValueError, match="max_batch_size"):
        PoissonSampler(
            dataset_size=N, sampling_rate=Q, max_batch_size=140, steps=STEPS, delta=DELTA
        )
    ok = PoissonSampler(
        dataset_size=N, sampling_rate=Q, max_batch_size=200, steps=STEPS, delta=DELTA
    )
    assert ok.max_batch_size == 200


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        (dict(steps=100), "delta"),
        (dict(delta=1e-5), "steps"),
        (dict(steps=0, delta=1e-5), "steps"),
        (dict(steps=100, delta=0.0), "delta"),
        (dict(steps=100, delta=1.5), "delta"),
    ],
)
def test_steps_and_delta_are_checked(kwargs, name):
    with pytest.raises(ValueError, match=name):
        PoissonSampler(dataset_size=N, sampling_rate=Q, **kwargs)
