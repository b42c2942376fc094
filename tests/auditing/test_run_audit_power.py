"""A run audit says whether it could refute the claim at all, and checks its arguments first.

With the defaults (1 000 canaries, 50 IN + 50 OUT guesses, δ = 10⁻⁵) the one-run bound can
never exceed 3.47, even with every guess right: a σ/2 bug at a claimed ε of 8.3 was flagged in
0 of 100 runs while the audit looked like a pass.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dpjax import auditing
from dpjax.auditing import dp_sgd_audit


def test_reachable_bound_is_the_all_correct_bound():
    reach = auditing.one_run_max_epsilon(m=1000, guesses=100, delta=1e-5)
    assert 3.46 < reach < 3.47
    truths = np.zeros(1000, bool)
    truths[:50] = True
    guesses = np.zeros(1000, np.int64)
    guesses[:50], guesses[50:100] = 1, -1
    best = auditing.one_run_epsilon_lower_bound(guesses, truths, m=1000, delta=1e-5)
    assert best.epsilon == pytest.approx(reach, rel=1e-9)
    one_wrong = guesses.copy()
    one_wrong[0] = -1
    worse = auditing.one_run_epsilon_lower_bound(one_wrong, truths, m=1000, delta=1e-5)
    assert worse.epsilon < reach
    assert auditing.one_run_max_epsilon(m=10_000, guesses=1000, delta=1e-5) > 5.0


def _loss(w, ex):
    return 0.5 * (ex["x"] @ w - ex["y"]) ** 2


def _audit(**kw):
    x = jax.random.normal(jax.random.key(1), (40, 2))
    args = dict(key=jax.random.key(0), optimizer=optax.sgd(0.1), l2_clip_norm=1.0,
                batch_size=20, delta=1e-5, steps=2, accounting="rdp")  # fmt: skip
    args.update(kw)
    return auditing.audit_run(_loss, jnp.zeros(2), {"x": x, "y": x[:, 0]}, **args)


def test_an_audit_that_cannot_refute_its_claim_says_so():
    with pytest.warns(UserWarning, match="cannot refute"):
        result = _audit(num_canaries=40, noise_multiplier=0.3)
    assert result.max_epsilon <= result.claimed_epsilon
    assert not result.can_refute


def test_a_powerful_enough_audit_can_refute():
    result = _audit(num_canaries=200, guesses=100, noise_multiplier=20.0)
    assert result.max_epsilon > result.claimed_epsilon
    assert result.can_refute


@pytest.mark.parametrize(
    ("kw", "name"),
    [
        (dict(confidence=1.5), "confidence"),
        (dict(confidence=1.0), "confidence"),
        (dict(delta=2.0), "delta"),
        (dict(noise_multiplier=-1.0), "noise_multiplier"),
    ],
)
def test_audit_run_checks_its_arguments_before_training(monkeypatch, kw, name):
    def no_training(*a, **k):
        raise AssertionError("trained before validating the arguments")

    monkeypatch.setattr(dp_sgd_audit, "canary_updates", no_training)
    args = dict(num_canaries=40, noise_multiplier=1.0)
    args.update(kw)
    with pytest.raises(ValueError, match=name):
        _audit(**args)
