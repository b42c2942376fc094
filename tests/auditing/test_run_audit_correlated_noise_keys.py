"""The audit harness runs a banded-MF (correlated noise) run with the keys make_private derives.

``states_for_keys`` builds R independent runs from one ``init`` state by re-deriving the noise
key of each run as ``make_private(key=k_r)`` would (``noise_key, train_key = split(k_r)``).
It re-keyed only ``NoiseState``; a BandMF run keeps its key in a ``CorrelatedNoiseState``,
which kept the ONE key of the ``make_private`` object for all R runs: every run drew the same
correlated noise (the vmapped step then voided the release: NaN parameters), so a canary audit
of BandMF audited a different mechanism.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dpjax.auditing.dp_sgd_audit import states_for_keys
from dpjax.dp_sgd import BandMF, make_private
from dpjax.dp_sgd.matrix_factorization.streaming import CorrelatedNoiseState

N = 60


def _linear(w, x):
    return x @ w


def _correlated_keys(opt_state):
    leaves = jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, CorrelatedNoiseState))
    return [np.asarray(s.key) for s in leaves if isinstance(s, CorrelatedNoiseState)]


def test_each_run_gets_the_noise_key_make_private_derives():
    private = make_private(
        _linear,
        optimizer=optax.sgd(0.1),
        l2_clip_norm=1.0,
        dataset_size=N,
        batch_size=5,
        steps=6,
        noise_multiplier=1.0,
        delta=1e-5,
        key=jax.random.key(0),
        noise=BandMF(bands=2),
    )
    w0 = jnp.zeros(2, jnp.float32)
    run_keys = jax.random.split(jax.random.key(5), 3)
    states = states_for_keys(private.init(w0), run_keys)
    (keys,) = _correlated_keys(states.opt_state)
    for r, k in enumerate(run_keys):
        noise_key, _ = jax.random.split(k)
        np.testing.assert_array_equal(keys[r], np.asarray(jax.random.key_data(noise_key)))
    data = jnp.asarray(np.random.default_rng(0).normal(size=(N, 2)), jnp.float32)
    params = np.asarray(jax.vmap(lambda s: private.step(w0, s, data)[0])(states))
    assert np.all(np.isfinite(params))
    assert len({tuple(row) for row in params.tolist()}) == 3  # three independent runs
