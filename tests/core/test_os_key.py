"""``dpjax.os_key`` gives fresh OS randomness per call, or refuses.

Inside ``jax.jit`` the OS bytes were read once, at trace time, and compiled in as a constant:
``jit(lambda v: laplace(os_key(), v, ...))`` released 0.144644 and 1.144644 for inputs 0 and 1,
so the difference of two releases was noise-free.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import dpjax
from dpjax import mechanisms


def test_os_key_refuses_to_run_inside_jit():
    release = jax.jit(lambda v: mechanisms.laplace(dpjax.os_key(), v, sensitivity=1.0, epsilon=1.0))
    with pytest.raises(ValueError, match="outside jax.jit"):
        release(jnp.float32(0.0))


@pytest.mark.parametrize(
    ("transform", "match"),
    [(jax.vmap, "one key shared"), (lambda f: jax.jit(jax.vmap(f)), "os_key")],
    ids=["vmap", "jit-vmap"],
)
def test_one_os_key_never_serves_every_row_of_a_vmap(transform, match):
    """Under a bare vmap the key is concrete, drawn once for all rows: the mechanisms' vmap
    guard refuses it; under jit, os_key itself refuses."""
    release = transform(
        lambda v: mechanisms.laplace(dpjax.os_key(), v, sensitivity=1.0, epsilon=1.0)
    )
    with pytest.raises(ValueError, match=match):
        release(jnp.zeros(3, jnp.float32))


def test_os_key_passed_into_jit_gives_fresh_noise_per_call():
    release = jax.jit(lambda k, v: mechanisms.laplace(k, v, sensitivity=1.0, epsilon=1.0))
    a = float(release(dpjax.os_key(), jnp.float32(0.0)))
    b = float(release(dpjax.os_key(), jnp.float32(1.0)))
    assert b - a != 1.0  # the difference carries noise (equality has probability ~0)
    assert dpjax.os_key() is not None
