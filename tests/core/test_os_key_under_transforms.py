"""os_key refuses every context where one draw of OS bytes would serve several releases.

The first guard looked at whether the wrapped key is a Tracer. Two contexts slipped through:

* ``jax.vmap``: the body runs once, os_key's key does not depend on the batched input, so it is
  a concrete key broadcast to every row: all rows share one noise draw (for a dpjax mechanism
  the vmap guard refuses that, but not for a user's own ``jax.random`` draw).
* ``jax.ensure_compile_time_eval()`` inside ``jax.jit``: the key is concrete at trace time and
  becomes a constant of the compiled program, so every call releases the same noise.

os_key now refuses whenever the current trace is not the eager one (any transformation).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpjax._random import os_key


def _uniform_from_os_key(_):
    return jax.random.uniform(os_key())


def test_os_key_refused_under_vmap():
    with pytest.raises(ValueError, match="os_key"):
        rows = jax.vmap(_uniform_from_os_key)(jnp.zeros(4))
        # what it returned instead: one draw repeated in every row
        assert np.unique(np.asarray(rows)).size == 1


def test_os_key_refused_at_compile_time_inside_jit():
    def step():
        with jax.ensure_compile_time_eval():
            key = os_key()
        return jax.random.uniform(key)

    jitted = jax.jit(step)
    with pytest.raises(ValueError, match="os_key"):
        first, second = float(jitted()), float(jitted())
        assert first == second  # what it did instead: the same noise on every call


def _scan(f):
    return lambda x: jax.lax.scan(lambda c, row: (c, f(row)), 0.0, x)[1]


def _cond(f):
    return lambda x: jax.lax.cond(True, f, f, x)


def _grad(f):
    return lambda x: jax.grad(lambda s: f(s) * s)(x[0])


@pytest.mark.parametrize(
    "transform",
    [_scan, _cond, _grad, jax.pmap, lambda f: jax.jit(jax.vmap(f))],
    ids=["scan", "cond", "grad", "pmap", "jit-vmap"],
)
def test_os_key_refused_under_other_transforms(transform):
    with pytest.raises(ValueError, match="os_key must be called at the top level"):
        transform(_uniform_from_os_key)(jnp.zeros(1))


def test_os_key_allowed_eagerly_and_under_top_level_compile_time_eval():
    """The guard does not refuse the intended use: eager calls (also under a top-level
    ensure_compile_time_eval, which is eager) give fresh keys, one per row when split."""
    with jax.ensure_compile_time_eval():
        first = np.asarray(jax.random.key_data(os_key()))
    rows = jax.vmap(jax.random.uniform)(jax.random.split(os_key(), 4))
    assert np.unique(np.asarray(rows)).size == 4
    assert not np.array_equal(first, np.asarray(jax.random.key_data(os_key())))
