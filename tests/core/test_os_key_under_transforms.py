"""os_key refuses every context where one draw of OS bytes would serve several releases.

The trace check looks at whether the wrapped key is a Tracer. Two contexts slip through:

* ``jax.vmap``: the body runs once, os_key's key does not depend on the batched input, so it is
  a concrete key broadcast to every row: all rows share one noise draw.
* ``jax.ensure_compile_time_eval()`` inside ``jax.jit``: the key is concrete at trace time and
  becomes a constant of the compiled program, so every call releases the same noise.

``jax._src.core.trace_state_clean()`` is False in both (and under jit/scan/grad), which is one
way to detect them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpjax._random import os_key


def _uniform_from_os_key(_):
    return jax.random.uniform(os_key())


@pytest.mark.xfail(strict=True, reason="os_key under vmap returns one key for every row")
def test_os_key_refused_under_vmap():
    with pytest.raises(ValueError, match="os_key"):
        rows = jax.vmap(_uniform_from_os_key)(jnp.zeros(4))
        # what it returned instead: one draw repeated in every row
        assert np.unique(np.asarray(rows)).size == 1


@pytest.mark.xfail(
    strict=True, reason="os_key under ensure_compile_time_eval in jit is a compiled-in constant"
)
def test_os_key_refused_at_compile_time_inside_jit():
    def step():
        with jax.ensure_compile_time_eval():
            key = os_key()
        return jax.random.uniform(key)

    jitted = jax.jit(step)
    with pytest.raises(ValueError, match="os_key"):
        first, second = float(jitted()), float(jitted())
        assert first == second  # what it did instead: the same noise on every call
