"""``dpjax.os_key`` gives fresh OS randomness per call, or refuses.

Inside ``jax.jit`` the OS bytes were read once, at trace time, and compiled in as a constant:
``jit(lambda v: laplace(os_key(), v, ...))`` released 0.144644 and 1.144644 for inputs 0 and 1,
so the difference of two releases was noise-free.
"""

from __future__ import annotations

import secrets

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dpjax
from dpjax import mechanisms


def test_os_key_refuses_to_run_inside_jit():
    release = jax.jit(lambda v: mechanisms.laplace(dpjax.os_key(), v, sensitivity=1.0, epsilon=1.0))
    with pytest.raises(ValueError, match="os_key must be called at the top level"):
        release(jnp.float32(0.0))


@pytest.mark.parametrize(
    ("transform", "match"),
    [(jax.vmap, "os_key"), (lambda f: jax.jit(jax.vmap(f)), "os_key")],
    ids=["vmap", "jit-vmap"],
)
def test_one_os_key_never_serves_every_row_of_a_vmap(transform, match):
    """Under a bare vmap the key is concrete, drawn once for all rows (the mechanisms' vmap
    guard would refuse it too); os_key itself refuses under vmap and under jit."""
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


# ------------------------------------------------------------------------------------------------
# Issue 25's papercuts: each test attacks one fix and fails on the code before it.
# ------------------------------------------------------------------------------------------------

# ----------------------------------------------------------------------------- os_key


@pytest.mark.parametrize("x64", [True, False])
def test_os_key_10000_draws_full_width_and_distinct(x64):
    """Catches os_key drawing fewer than 64 random bits (repeated or narrow keys)."""
    with jax.enable_x64(x64):
        data = np.stack([np.asarray(jax.random.key_data(dpjax.os_key())) for _ in range(10_000)])
    assert data.shape == (10_000, 2) and data.dtype == np.uint32
    # 64 random bits per key: collisions among 10⁴ keys have probability < 3e-12
    assert len({row.tobytes() for row in data}) == 10_000
    # every one of the 64 bits is used: each is set in 50% ± 5 sd (sd = 0.5%) of the keys
    bits = np.unpackbits(data.view(np.uint8), axis=1).mean(axis=0)
    assert np.all(np.abs(bits - 0.5) < 5 * 0.5 / np.sqrt(10_000))


def test_os_key_wraps_the_os_words_without_truncation(monkeypatch):
    """Catches os_key truncating an OS seed at or above 2^63 when x64 is off."""
    words = np.array([0xFFFFFFFF, 0x80000001], np.uint32)  # a seed ≥ 2⁶³
    monkeypatch.setattr(secrets, "token_bytes", lambda n: words.tobytes()[:n])
    with jax.enable_x64(False):
        key = dpjax.os_key()
    np.testing.assert_array_equal(np.asarray(jax.random.key_data(key)), words)


def test_os_key_other_impl_gets_all_its_words():
    """Catches os_key filling only part of the key data of a wider PRNG implementation (rbg)."""
    data = np.asarray(jax.random.key_data(dpjax.os_key("rbg")))
    assert data.shape == (4,) and data.dtype == np.uint32
