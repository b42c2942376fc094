"""Review 2: regression guards (they pass on main) for the traced path of the new plans.

``step`` inside the caller's own ``jax.jit`` cannot raise on a state of another plan; it must
return NaN instead. The ledger words that identify the new plans (BandMF's strategy digest,
adaptive clipping's config, the user grouping's fingerprint) are compared there too.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dpjax
from dpjax.dp_sgd import AdaptiveClip, BandMF

N = 300


def _loss(w, x):
    return 0.5 * jnp.sum((x @ w - 1.0) ** 2)


def _make(**overrides):
    kwargs = dict(
        optimizer=optax.sgd(0.1),
        l2_clip_norm=1.0,
        dataset_size=N,
        batch_size=5,
        steps=6,
        noise_multiplier=1.0,
        delta=1e-5,
        key=jax.random.key(0),
    )
    kwargs.update(overrides)
    return dpjax.make_private(_loss, **kwargs)


_TWO_BANDS = np.tril(np.ones((6, 6))) - np.tril(np.ones((6, 6)), -2)
_PAIRS = {
    "bandmf_strategy": (
        dict(noise=BandMF(bands=2)),
        dict(noise=BandMF(bands=2, strategy=_TWO_BANDS)),  # same b, same shapes, other C
    ),
    "adaptive_quantile": (
        dict(l2_clip_norm=AdaptiveClip(0.5, 0.2, 5.0, 1.0)),
        dict(l2_clip_norm=AdaptiveClip(0.6, 0.2, 5.0, 1.0)),
    ),
    "user_grouping": (  # same U = 100 and k = 3, other partition of the rows
        dict(user_ids=np.repeat(np.arange(100), 3)),
        dict(user_ids=np.tile(np.arange(100), 3)),
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(_PAIRS))
def test_traced_step_of_another_new_plan_returns_nan(name):
    first, other = (_make(**kw) for kw in _PAIRS[name])
    data = jnp.asarray(np.random.default_rng(0).normal(size=(N, 2)), jnp.float32)
    w = jnp.zeros(2, jnp.float32)
    w, state, _ = first.step(w, first.init(w), data)
    same, _, _ = jax.jit(first.step)(w, state, data)
    assert bool(jnp.all(jnp.isfinite(same)))  # the guard does not void its own plan
    w2, _, _ = jax.jit(other.step)(w, state, data)
    assert bool(jnp.all(jnp.isnan(w2)))
