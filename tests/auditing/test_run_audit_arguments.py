"""``audit_run`` checks its arguments before it trains: a bad one fails at once, not after it."""

import contextlib

import jax
import jax.numpy as jnp
import optax
import pytest

from dpjax import PrivacyLeakWarning, auditing
from dpjax.auditing import dp_sgd_audit as dsa


def _loss(w, ex):
    return 0.5 * (ex["x"] @ w - ex["y"]) ** 2


@pytest.mark.parametrize(
    "bad, message",
    [(dict(confidence=1.5), "confidence"), (dict(confidence=0.0), "confidence"),
     (dict(noise_multiplier=0.0), "noise_multiplier"), (dict(delta=0.0), "delta")],
)  # fmt: skip
def test_bad_arguments_are_refused_before_any_training(monkeypatch, bad, message):
    def trained(*args, **kwargs):
        raise AssertionError("the audit trained before checking its arguments")

    monkeypatch.setattr(dsa, "canary_updates", trained)
    x = jax.random.normal(jax.random.key(1), (40, 2))
    kwargs = dict(key=jax.random.key(0), optimizer=optax.sgd(0.1), l2_clip_norm=1.0,
                  batch_size=20, delta=1e-5, num_canaries=100, guesses=50, steps=2,
                  noise_multiplier=4.0, accounting="rdp")  # fmt: skip
    not_private = bad.get("noise_multiplier") == 0.0  # make_private warns, then audit_run refuses
    with pytest.warns(PrivacyLeakWarning) if not_private else contextlib.nullcontext():
        with pytest.raises(ValueError, match=message):
            auditing.audit_run(_loss, jnp.zeros(2), {"x": x, "y": x[:, 0]}, **(kwargs | bad))
