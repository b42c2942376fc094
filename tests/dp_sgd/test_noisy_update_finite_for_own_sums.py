"""A DP optimizer never releases a non-finite update because of one record.

``dp_sgd_optimizer`` refuses a ``clipped_grad`` built with ``nan_safe=False``, but the other
documented way to build it, ``l2_clip_norm=C`` ("C given: own sums"), accepts the very same
sums: one record whose gradient is NaN (here sqrt of a negative score) makes the noisy update
NaN in every coordinate, so the record's presence in the batch is certain, while
``event_for`` accounts the step as usual. ``accumulate_clipped_sums`` passes it on too.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dpjax
from dpjax.dp_sgd.optimizers import accumulate_clipped_sums, dp_sgd_optimizer


def _loss(w, x):
    return jnp.sqrt(jnp.dot(w, x))  # NaN gradient for a record with w·x < 0


DATA = jnp.array([[1.0, 1.0], [-5.0, 0.0]])  # the second record has a NaN gradient
PARAMS = jnp.ones(2)


def _unsafe_sum():
    grad_fn = dpjax.clipped_grad(_loss, l2_clip_norm=1.0, nan_safe=False)
    clipped_sum, _ = grad_fn(PARAMS, DATA)
    assert not np.all(np.isfinite(np.asarray(clipped_sum)))  # the premise
    return clipped_sum


def _optimizer():
    return dp_sgd_optimizer(
        optimizer=optax.sgd(1.0),
        noise_multiplier=1.0,
        normalizer=2.0,
        key=jax.random.key(0),
        l2_clip_norm=1.0,
    )


@pytest.mark.xfail(
    strict=True, reason="dp_sgd_optimizer(l2_clip_norm=C) releases NaN for a NaN clipped sum"
)
@pytest.mark.parametrize("accumulate", [False, True])
def test_noisy_update_of_own_sums_is_finite_or_refused(accumulate):
    tx = _optimizer()
    if accumulate:
        tx = accumulate_clipped_sums(tx, every_k=1)
    try:
        update, _ = tx.update(_unsafe_sum(), tx.init(PARAMS), PARAMS)
    except ValueError:
        return  # refusing the non-finite sum is fine
    assert np.all(np.isfinite(np.asarray(update)))
