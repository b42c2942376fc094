"""A failing trial does not reveal K or the failure: it is a candidate with score −inf, the
exception is not re-raised, every trial still runs; the trials' event is stated before any runs."""

import math
import warnings

import jax
import numpy as np
import pytest

from dpjax import events as ev
from dpjax import tuning
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
