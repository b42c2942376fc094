"""A one-run audit is a test of a claim only when it can refute it (Steinke et al. 2023).

With m canaries and r guesses the one-run bound is at most its value at r correct guesses
out of r; a claim above that value can never be refuted, so ``audit_run`` reports the value and
refuses to call such an audit a test (or, left at its defaults, grows the canaries until it can).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy import special

from dpjax import auditing
from dpjax.auditing import dp_sgd_audit as dsa
from dpjax.auditing.estimators import (
    one_run_epsilon_lower_bound,
    one_run_max_epsilon_lower_bound,
)

DELTA = 1e-5


def _all_correct(m: int, k: int, delta: float) -> float:
    truths = np.zeros(m, bool)
    truths[:k] = True
    guesses = np.zeros(m, int)
    guesses[:k], guesses[k : 2 * k] = 1, -1
    return one_run_epsilon_lower_bound(guesses, truths, m=m, delta=delta).epsilon


def test_max_reachable_bound_of_the_defaults_is_the_all_correct_bound():
    # 1000 canaries, 50 IN + 50 OUT guesses, δ = 1e-5, 95 %: the audit's ceiling
    got = one_run_max_epsilon_lower_bound(m=1000, guesses=100, delta=DELTA, confidence=0.95)
    assert got == pytest.approx(_all_correct(1000, 50, DELTA), abs=1e-9)
    assert got == pytest.approx(3.465, abs=1e-3)
    # δ = 0, closed form: P[Bin(r, expit ε) = r] = expit(ε)^r = 0.05  ⇔  ε = logit(0.05^(1/r))
    closed = float(special.logit(0.05 ** (1 / 100)))
    assert one_run_max_epsilon_lower_bound(m=1000, guesses=100) == pytest.approx(closed, abs=1e-9)


def test_no_outcome_of_the_audit_exceeds_the_max_reachable_bound():
    ceiling = one_run_max_epsilon_lower_bound(m=200, guesses=40, delta=DELTA)
    truths = np.arange(200) < 20
    for wrong in (1, 5, 20):
        guesses = np.zeros(200, int)
        guesses[:20], guesses[20:40] = 1, -1
        guesses[:wrong] = -1  # `wrong` IN canaries guessed OUT
        bound = one_run_epsilon_lower_bound(guesses, truths, m=200, delta=DELTA).epsilon
        assert bound < ceiling


@pytest.mark.parametrize(
    "kwargs, message",
    [(dict(m=0, guesses=1), "m"), (dict(m=10, guesses=11), "guesses"),
     (dict(m=10, guesses=2, confidence=1.0), "confidence")],
)  # fmt: skip
def test_max_reachable_bound_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        one_run_max_epsilon_lower_bound(**kwargs)


def _loss(w, ex):
    return 0.5 * (ex["x"] @ w - ex["y"]) ** 2


def _data():
    x = jax.random.normal(jax.random.key(1), (60, 2))
    return {"x": x, "y": x[:, 0]}


def _no_training(captured):
    """A stand-in for the training: records the run's object, returns null observations."""

    def fake(private, params, data, keys, **_):
        captured["private"] = private
        m = params["canary"].shape[0]
        obs = np.zeros((1, private.steps, m))
        return dsa.CanaryRun(obs, jax.tree.map(lambda a: a[None], params))

    return fake


def _audit(**kwargs):
    common = dict(key=jax.random.key(0), optimizer=optax.sgd(0.1), l2_clip_norm=1.0,
                  batch_size=30, delta=DELTA, steps=5, accounting="rdp")  # fmt: skip
    return auditing.audit_run(_loss, jnp.zeros(2), _data(), **(common | kwargs))


def test_a_claim_above_the_reachable_bound_is_refused_before_training(monkeypatch):
    def trained(*args, **kwargs):
        raise AssertionError("the audit trained before refusing")

    monkeypatch.setattr(dsa, "canary_updates", trained)
    # σ = 0.6: the claim is far above 3.465, the ceiling of 1000 canaries and 50 + 50 guesses
    with pytest.raises(ValueError, match="num_canaries"):
        _audit(num_canaries=1000, noise_multiplier=0.6)
    with pytest.raises(ValueError, match="guesses"):
        _audit(guesses=50, noise_multiplier=0.6)
    with pytest.raises(ValueError, match="num_canaries"):  # even the largest default size
        _audit(noise_multiplier=0.3)


def test_the_audit_reports_its_reachable_bound_and_flags_an_unrefutable_claim(monkeypatch):
    captured = {}
    monkeypatch.setattr(dsa, "canary_updates", _no_training(captured))
    result = _audit(num_canaries=1000, noise_multiplier=0.6, require_refutable=False)
    ceiling = one_run_max_epsilon_lower_bound(m=1000, guesses=100, delta=DELTA)
    assert result.max_epsilon_lower_bound == pytest.approx(ceiling, abs=1e-12)
    assert result.claimed_epsilon > ceiling
    assert not result.can_refute


def test_default_size_grows_until_the_audit_can_refute_the_claim(monkeypatch):
    captured = {}
    monkeypatch.setattr(dsa, "canary_updates", _no_training(captured))
    run = dict(noise_multiplier=1.0, steps=50, batch_size=100)
    # 1000 canaries cannot refute this run's claim (ε ≈ 5.6 > 3.47) ...
    with pytest.raises(ValueError, match="num_canaries"):
        _audit(num_canaries=1000, **run)
    # ... 2000 can (ε ≈ 3.1 at the smaller q, ceiling ≈ 4.14): the defaults pick them
    result = _audit(**run)
    assert result.canaries == 2000 and result.guesses == 100
    ceiling = one_run_max_epsilon_lower_bound(m=2000, guesses=200, delta=DELTA)
    assert result.max_epsilon_lower_bound == pytest.approx(ceiling, abs=1e-12)
    assert result.claimed_epsilon < ceiling and result.can_refute
    assert captured["private"].sampler.dataset_size == 60 + 2000
