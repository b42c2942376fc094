"""The non-finite rule survives ``data_parallel``: a sharded clipped sum built with
``nan_safe=False`` is refused by the DP optimizer too, and the accepted sharded path keeps a NaN
row out of the release (the wrapper used to hide the rule from the optimizer's check)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dpjax


def _loss(w, x):
    return jnp.sum(w * x)


def _optimizer(grad_fn):
    return dpjax.dp_sgd_optimizer(
        optimizer=optax.sgd(0.1), clipped_grad=grad_fn, noise_multiplier=1.0,
        normalizer=8.0, key=jax.random.key(0),
    )  # fmt: skip


def test_dp_optimizer_refuses_a_sharded_clipped_grad_without_the_nan_rule():
    grad_fn = dpjax.clipped_grad(_loss, l2_clip_norm=1.0, nan_safe=False, backend="vmap")
    sharded = dpjax.data_parallel(grad_fn)
    assert sharded.nan_safe is False
    with pytest.raises(ValueError, match="nan_safe"):
        _optimizer(sharded)


def test_a_nan_row_leaves_the_accepted_sharded_release_finite():
    sharded = dpjax.data_parallel(dpjax.clipped_grad(_loss, l2_clip_norm=1.0, backend="vmap"))
    tx = _optimizer(sharded)
    w = jnp.zeros(3, jnp.float32)
    rows = jnp.ones((8, 3), jnp.float32).at[5, 1].set(jnp.nan)
    s, info = jax.jit(sharded)(w, rows)
    updates, _ = tx.update(s, tx.init(w), w)
    assert np.all(np.isfinite(np.asarray(updates)))
    assert int(info.num_nonfinite) == 1
