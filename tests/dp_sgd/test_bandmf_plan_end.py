"""A BandMF run ends at its plan: an eager ``step`` past the planned steps is refused by name.

The factorization has n = ``steps`` rows, so a step past the plan has no noise row: ``fit``
refused it, but an eager ``step`` returned NaN parameters (documented as refused). Under your
own ``jax.jit`` the step cannot raise and still voids its release (NaN).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dpjax
from dpjax.dp_sgd import BandMF

STEPS = 4


def _setup():
    x = jax.random.normal(jax.random.key(1), (60, 3))
    data = {"x": x, "y": x[:, 0]}
    private = dpjax.make_private(
        lambda w, ex: 0.5 * (ex["x"] @ w - ex["y"]) ** 2, optimizer=optax.sgd(0.1),
        l2_clip_norm=1.0, dataset_size=60, batch_size=5, steps=STEPS, noise_multiplier=1.0,
        delta=1e-5, key=jax.random.key(0), noise=BandMF(bands=2),
    )  # fmt: skip
    return private, data


def test_an_eager_step_past_the_plan_is_refused():
    private, data = _setup()
    w, state = jnp.zeros(3), private.init(jnp.zeros(3))
    for _ in range(STEPS):
        w, state, _ = private.step(w, state, data)
        assert np.all(np.isfinite(np.asarray(w)))
    with pytest.raises(ValueError, match="steps"):
        private.step(w, state, data)


def test_a_jitted_step_past_the_plan_releases_nothing():
    private, data = _setup()
    w, state = jnp.zeros(3), private.init(jnp.zeros(3))
    step = jax.jit(private.step)
    for _ in range(STEPS):
        w, state, _ = step(w, state, data)
    w, state, _ = step(w, state, data)
    assert np.all(np.isnan(np.asarray(w)))
