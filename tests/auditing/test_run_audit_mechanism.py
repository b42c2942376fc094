"""The run audit runs the mechanism ``make_private`` runs: same keys, same noises.

For an adaptive-clipping run the harness used to give the count noise and the gradient noise
the SAME key (every ``NoiseState`` re-keyed alike), so the audited mechanism had equal noises
where ``make_private`` draws independent ones.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

import dpjax
from dpjax.auditing import dp_sgd_audit as dsa


def _loss(w, ex):
    return 0.5 * (ex["x"] @ w - ex["y"]) ** 2


def _private(key, l2_clip_norm):
    return dpjax.make_private(
        _loss, optimizer=optax.sgd(0.1), l2_clip_norm=l2_clip_norm, dataset_size=100,
        batch_size=10, steps=2, noise_multiplier=1.0, delta=1e-5, key=key,
        clipping="vmap", accounting="rdp",
    )  # fmt: skip


def test_adaptive_states_for_keys_are_make_private_inits():
    config = dpjax.dp_sgd.AdaptiveClip(
        target_quantile=0.5, learning_rate=0.2, count_noise_multiplier=2.0, initial=1.0
    )
    params = jnp.zeros(2)
    k = jax.random.key(7)
    own = _private(k, config).init(params)
    stacked = dsa.states_for_keys(_private(jax.random.key(8), config).init(params), k[None])
    for a, b in zip(jax.tree.leaves(own), jax.tree.leaves(stacked), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b)[0])
    clip, grad_noise, _ = jax.tree.map(lambda a: a[0], stacked.opt_state)
    assert not np.array_equal(np.asarray(clip.count_noise.key), np.asarray(grad_noise.key))
