"""Adversarial review of key handling in the noise transforms (these checks HOLD).

* a checkpoint (flax to_bytes / from_bytes) restored into ``tx.init`` continues the stream bit
  for bit, for threefry, rbg and unsafe_rbg keys (the impl comes from the transform's key);
* no two coordinates of one release, no two dtype groups, no two consecutive releases, and no
  two states of a vmapped batch share noise.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpjax.dp_sgd import transforms

serialization = pytest.importorskip("flax.serialization")


@pytest.mark.parametrize("impl", ["threefry2x32", "rbg", "unsafe_rbg"])
@pytest.mark.parametrize("make", ["gaussian", "laplace"])
def test_restored_state_continues_the_stream(impl, make):
    key = jax.random.key(11, impl=impl)
    if make == "gaussian":
        tx = transforms.add_gaussian_noise(1.0, key=key)
    else:
        tx = transforms.add_laplace_dp_sgd_noise(
            l1_sensitivity=1.0, epsilon=1.0, rho=0.5, kappa=0.0, key=key
        )
    params = jnp.zeros(4, jnp.float32)
    first, state = tx.update(params, tx.init(params))
    second, _ = tx.update(params, state)
    restored = serialization.from_bytes(tx.init(params), serialization.to_bytes(state))
    again, _ = tx.update(params, restored)
    np.testing.assert_array_equal(np.asarray(again), np.asarray(second))
    assert not np.any(np.asarray(second) == np.asarray(first))  # not a replay


def test_no_shared_noise_across_coordinates_groups_steps_or_batched_states():
    tx = transforms.add_gaussian_noise(1.0, key=jax.random.key(12))
    tree = {"a": jnp.zeros(64, jnp.float32), "b": jnp.zeros(64, jnp.float64)}
    state = tx.init(tree)
    out1, state1 = tx.update(tree, state)
    out2, _ = tx.update(tree, state1)
    values = np.concatenate(
        [np.asarray(v, np.float64) for out in (out1, out2) for v in jax.tree.leaves(out)]
    )
    assert np.unique(values).size == values.size  # 256 continuous draws, all distinct
    batch = jax.vmap(lambda s: tx.update(tree, s)[0])(
        jax.tree.map(lambda x: jnp.stack([x, x]), state)
    )
    np.testing.assert_array_equal(np.asarray(batch["a"][0]), np.asarray(batch["a"][1]))
    # identical states give identical noise: the only replay risk is the caller's (a vmapped
    # batch must carry distinct keys); distinct states give distinct noise:
    states = jax.vmap(lambda k: tx.init(tree)._replace(key=jax.random.key_data(k)))(
        jax.random.split(jax.random.key(13), 2)
    )
    distinct = jax.vmap(lambda s: tx.update(tree, s)[0])(states)
    assert not np.any(np.asarray(distinct["a"][0]) == np.asarray(distinct["a"][1]))
