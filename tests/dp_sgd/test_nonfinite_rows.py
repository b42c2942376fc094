"""One NaN row can never make a DP release non-finite.

``dp_sgd_optimizer`` accepted ``clipped_grad(..., nan_safe=False)``: one NaN row then made the
noisy update NaN, which reveals that the record was sampled (certainty) while the event was
accounted as usual.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dpjax


def _loss(w, x):
    return jnp.sum(w * x)


def test_dp_optimizer_refuses_a_clipped_grad_without_the_nan_rule():
    grad_fn = dpjax.clipped_grad(_loss, l2_clip_norm=1.0, nan_safe=False, backend="vmap")
    with pytest.raises(ValueError, match="nan_safe"):
        dpjax.dp_sgd_optimizer(
            optimizer=optax.sgd(0.1), clipped_grad=grad_fn, noise_multiplier=1.0,
            normalizer=4.0, key=jax.random.key(0),
        )  # fmt: skip


@pytest.mark.parametrize("backend", ["vmap", "ghost"])
def test_a_nan_row_leaves_the_accepted_release_finite(backend):
    grad_fn = dpjax.clipped_grad(_loss, l2_clip_norm=1.0, backend=backend)
    tx = dpjax.dp_sgd_optimizer(
        optimizer=optax.sgd(0.1), clipped_grad=grad_fn, noise_multiplier=1.0,
        normalizer=4.0, key=jax.random.key(0),
    )  # fmt: skip
    w = jnp.zeros(3, jnp.float32)
    rows = jnp.ones((4, 3), jnp.float32).at[2, 1].set(jnp.nan)
    s, info = grad_fn(w, rows)
    updates, _ = tx.update(s, tx.init(w), w)
    assert np.all(np.isfinite(np.asarray(updates)))
    assert int(info.num_nonfinite) == 1
