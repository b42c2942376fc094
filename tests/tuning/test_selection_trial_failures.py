"""A failing trial does not reveal K or the failure: it is a candidate with score −inf, the
exception is not re-raised, every trial still runs; the trials' event is stated before any runs."""

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dpjax import events as ev
from dpjax import tuning
from dpjax.dp_sgd.optimizers import dp_sgd_optimizer
from dpjax.mechanisms import laplace
from dpjax.tuning import draw_num_trials, private_selection

BASE = ev.GaussianEvent(noise_multiplier=3.0)


def _num_trials(key, *, mean, shape=1.0):
    return draw_num_trials(tuning._host_rng(jax.random.split(key, 3)[0]), mean=mean, shape=shape)


def test_a_raising_trial_is_a_failed_candidate_and_is_not_reraised():
    """Trials on candidate "bad" raise (as a data-dependent failure would): the selection runs
    all max_trials trials, never re-raises, and releases "bad" only as a failed trial."""
    seen_failed = seen_ok = 0
    for seed in range(6):
        calls = [0]

        def trial(key, candidate, calls=calls):
            calls[0] += 1
            if candidate == "bad":
                raise FloatingPointError("non-finite loss on this data")
            return float(candidate), BASE, candidate

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res = private_selection(
                jax.random.key(seed), ["bad", 1, 2], trial, mean=2.0, base_event=BASE,
                max_trials=20,
            )  # fmt: skip
        assert calls[0] == 20
        if res.failed:  # every one of the first K trials drew "bad"
            seen_failed += 1
            assert (res.candidate, res.score, res.output) == ("bad", -math.inf, None)
            assert any(issubclass(w.category, RuntimeWarning) for w in caught)
        else:
            seen_ok += 1
            assert res.candidate in (1, 2) and res.output == res.candidate
            assert not any(issubclass(w.category, RuntimeWarning) for w in caught)
    assert seen_ok >= 1


def test_a_selection_whose_trials_all_raise_returns_a_failed_result():
    def trial(key, candidate):
        raise RuntimeError("boom")

    with pytest.warns(RuntimeWarning, match="selected trial failed"):
        res = private_selection(
            jax.random.key(3), [1, 2], trial, mean=3.0, base_event=BASE, max_trials=12
        )
    assert res.failed and res.score == -math.inf and res.output is None
    assert res.event == ev.RepeatAndSelectEvent(BASE, mean=3.0, shape=1.0, max_trials=12)


def test_a_malformed_return_is_a_failed_trial():
    with pytest.warns(RuntimeWarning):
        res = private_selection(
            jax.random.key(0), [1], lambda k, c: "oops", mean=3.0, base_event=BASE, max_trials=5
        )
    assert res.failed


def test_another_event_is_refused_only_after_every_trial_ran():
    """The check does not stop at the K-th trial (which would show K)."""
    calls = [0]

    def trial(key, candidate):
        calls[0] += 1
        return 1.0, (BASE if calls[0] != 2 else ev.GaussianEvent(noise_multiplier=1.0))

    with pytest.raises(ValueError, match=r"train_and_score\(...\)\[1\]"):
        private_selection(jax.random.key(0), [1], trial, mean=3.0, base_event=BASE, max_trials=9)
    assert calls[0] == 9


def test_an_event_that_cannot_be_compared_is_refused_after_every_trial_ran():
    calls = [0]

    def trial(key, candidate):
        calls[0] += 1
        return 1.0, np.ones(3)  # `!=` of an array against an event would be ambiguous

    with pytest.raises(ValueError, match=r"train_and_score\(...\)\[1\]"):
        private_selection(jax.random.key(0), [1], trial, mean=3.0, base_event=BASE, max_trials=7)
    assert calls[0] == 7


@pytest.mark.parametrize("bad", [None, "gaussian", (), ev.RepeatAndSelectEvent(BASE, 2.0, 1.0)])
def test_base_event_is_checked_before_any_trial_runs(bad):
    calls = [0]

    def trial(key, candidate):
        calls[0] += 1
        return 1.0, BASE

    with pytest.raises(ValueError, match="base_event"):
        private_selection(jax.random.key(0), [1], trial, mean=3.0, base_event=bad)
    assert calls[0] == 0


_WITH_REPLACEMENT = ev.WithReplacementGaussianEvent(
    noise_multiplier=1.0, batch_size=10, dataset_size=1000, count=10
)
_TWO_UNITS = (
    ev.EpsilonDeltaEvent(epsilon=1.0, delta=1e-7, privacy_unit="user:abc"),
    ev.EpsilonDeltaEvent(epsilon=1.0, delta=1e-7),
)


@pytest.mark.parametrize("base", [_WITH_REPLACEMENT, _TWO_UNITS], ids=["pld_only", "two_units"])
def test_a_base_event_the_accountant_cannot_account_is_refused_before_any_trial_runs(base):
    """A selection over a base event with no RDP curve (sampling with replacement is accounted
    by PLD only), or over an example- and a user-level event together, cannot be accounted.
    It was accepted and all 57 trials ran (the private data spent) before the accountant
    refused the released event."""
    calls = [0]

    def trial(key, candidate):
        calls[0] += 1
        return 1.0, base

    with pytest.raises(ValueError, match="base_event"):
        private_selection(jax.random.key(0), [1, 2], trial, mean=3.0, base_event=base)
    assert calls[0] == 0


def _own_sum_trial(data):
    """A trial that noises its own clipped sum (dp_sgd_optimizer(l2_clip_norm=C), under jit)."""

    def train_and_score(key, lr):
        tx = dp_sgd_optimizer(
            optimizer=optax.sgd(lr), noise_multiplier=3.0, l2_clip_norm=1.0, normalizer=4.0,
            key=key,
        )  # fmt: skip
        params = jnp.zeros(2)
        own_sum = jnp.sum(jnp.clip(data, -0.5, 0.5), axis=0)  # full batch, clipped by hand
        update, _ = jax.jit(tx.update)(own_sum, tx.init(params), params)
        return -float(jnp.sum((params + update) ** 2)), BASE

    return train_and_score


def _mechanism_trial(data):
    """A trial that scores with a dpjax mechanism on a statistic of the raw data (eager)."""

    def train_and_score(key, lr):
        noisy = laplace(key, jnp.sum(data), sensitivity=1.0, epsilon=1.0)
        return -float(lr) + 0.0 * float(noisy), BASE

    return train_and_score


@pytest.mark.parametrize("make_trial", [_own_sum_trial, _mechanism_trial], ids=["own_sum", "mech"])
def test_a_trial_refused_for_non_finite_private_data_makes_the_selection_release_nothing(
    make_trial,
):
    """dpjax refuses to noise non-finite private data (own clipped sums, a mechanism's value):
    the refusal goes to the curator and nothing is released. Inside a selection it became a
    failed trial, released as ``failed=True`` and score −inf: with one NaN record in D the
    released result was failed on D and never on D′ = D without it (ε = ∞). Now the selection
    runs all its trials and then raises, releasing nothing, as the run alone does."""
    d_prime = jnp.array([[0.1, 0.2], [0.3, -0.1]])
    d = jnp.concatenate([d_prime, jnp.array([[jnp.nan, 0.0]])])
    kw = dict(mean=2.0, base_event=BASE, max_trials=3)
    ok = private_selection(jax.random.key(0), [0.1, 1.0], make_trial(d_prime), **kw)
    assert not ok.failed and math.isfinite(ok.score)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="train_and_score"):
            private_selection(jax.random.key(0), [0.1, 1.0], make_trial(d), **kw)
