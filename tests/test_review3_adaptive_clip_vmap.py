"""Review 3 (adversarial): the adaptive clip's count noise under a vmap over per-example counts.

``next_clip_norm`` is public (the pieces path). ``jax.vmap(next_clip_norm, in_axes=(None,
None, 0))`` over per-example centred counts draws ONE count noise (the state is not batched)
and adds it to every row: the differences of the released fractions are the rows' exact count
differences. The noise transforms refuse this (vmap guard); the count release must too.
"""

import jax
import jax.numpy as jnp
import pytest

from dpjax.dp_sgd.adaptive_clip import AdaptiveClip, init_adaptive_clip, next_clip_norm

CONFIG = AdaptiveClip(
    target_quantile=0.5, learning_rate=0.2, count_noise_multiplier=10.0, initial=1.0
)


def _release(state, count):
    return next_clip_norm(CONFIG, state, count, expected_batch_size=8.0)[1]


def test_a_vmap_over_per_example_counts_with_one_state_is_refused():
    state = init_adaptive_clip(CONFIG, key=jax.random.key(0))
    counts = jnp.array([0.5, -0.5, 0.5], jnp.float32)
    with pytest.raises(ValueError, match="updates"):
        jax.vmap(_release, in_axes=(None, 0))(state, counts)


@pytest.mark.slow
def test_one_release_and_a_vmap_over_runs_still_work():
    state = init_adaptive_clip(CONFIG, key=jax.random.key(0))
    one = _release(state, jnp.float32(0.5))
    assert bool(jnp.isfinite(one))
    keys = jax.random.split(jax.random.key(1), 3)
    states = jax.vmap(lambda k: init_adaptive_clip(CONFIG, key=k))(keys)
    runs = jax.vmap(_release)(states, jnp.array([0.5, 0.5, 0.5], jnp.float32))
    assert bool(jnp.all(jnp.isfinite(runs))) and len(set(runs.tolist())) == 3
