"""Many small releases at once: ``jax.jit(jax.vmap(mechanism))`` over distinct keys.

A vmapped scalar float32 Gaussian release used to pad every row to one block of 4096 lanes for
the sampler's tail-lane search (4096x the work of a scalar row). A draw below one block is now
searched on its own lanes: the draws are bit-identical to before (pinned below), the released
law is unchanged (KS against N(v, σ²) / Laplace(v, b) rejecting a 25% wrong scale, a
second-moment test rejecting a 15% wrong one), and the per-row key guard still refuses a shared
key and voids repeated keys under ``jit``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from dpjax import _random
from dpjax import mechanisms as M
from tests.helpers import assert_distribution

ROWS = 4000
KEYS = jax.random.split(jax.random.key(11), ROWS)
GAUSS = {"sensitivity": 1.0, "epsilon": 1.0, "delta": 1e-5}
LAPLACE = {"sensitivity": 1.0, "epsilon": 1.0}


def _vmapped(mechanism, kwargs):
    return jax.jit(jax.vmap(lambda k, v: mechanism(k, v, **kwargs)))


def _values() -> jax.Array:
    return jnp.linspace(-3.0, 3.0, ROWS, dtype=jnp.float32)


def test_vmapped_scalar_normal_draws_are_bit_identical_to_the_padded_search():
    """Bit patterns drawn before the change (keys split from key(7), rows 0-3 and the last
    two of 3000; all-zero / all-one words: the tail lanes and a 3-tail-lane block)."""
    keys = jax.random.split(jax.random.key(7), 3000)
    with jax.enable_x64(False):
        draws = jax.jit(jax.vmap(lambda k: _random.normal(k, (), jnp.float32)))(keys)
        bits = np.asarray(draws).view(np.uint32)
        zero = np.asarray(_random.normal(_random.constant_bits_key(0), (5,), jnp.float32))
        ones = np.asarray(_random.normal(_random.constant_bits_key(0xFFFFFFFF), (1,)))
    pinned = [0xBF8E9919, 0xBEE88433, 0x3F5204D3, 0x3F3C0593]
    assert [int(b) for b in bits[:4]] == pinned
    assert [int(b) for b in bits[-2:]] == [0x3E884119, 0xBF05ACA2]
    top, body = np.float32(9.155294), np.float32(6.3379607)  # Φ̄⁻¹(2⁻⁶⁵), Φ̄⁻¹(2⁻³³)
    np.testing.assert_array_equal(zero, [top, body, body, body, top])
    np.testing.assert_array_equal(ones, [-top])


def test_a_vmapped_scalar_draw_is_not_padded_to_a_block_per_row():
    """The compiled program of 64 vmapped scalar draws holds no 64 x 4096 lane array."""
    program = (
        jax.jit(jax.vmap(lambda k: _random.normal(k, (), jnp.float32)))
        .lower(jax.random.split(jax.random.key(0), 64))
        .as_text()
    )
    assert "64x4096" not in program and "4096x" not in program


@pytest.mark.parametrize("name", ["gaussian", "laplace"])
def test_vmapped_scalar_releases_follow_the_calibrated_law(name):
    with jax.enable_x64(False):
        if name == "gaussian":
            scale = M.gaussian_sigma(**GAUSS)
            out = _vmapped(M.gaussian, GAUSS)(KEYS, _values())
            law = stats.norm
        else:
            scale = LAPLACE["sensitivity"] / LAPLACE["epsilon"]
            out = _vmapped(M.laplace, LAPLACE)(KEYS, _values())
            law = stats.laplace
        noise = (np.asarray(out, np.float64) - np.asarray(_values(), np.float64)) / scale
    assert out.dtype == jnp.float32 and np.all(np.isfinite(noise))
    assert_distribution(noise, law.cdf, wrong_cdfs=[lambda x: law.cdf(x / 1.25)])
    assert abs(noise.mean()) <= 5.0 * law.std() / math.sqrt(ROWS)
    # second moment: 5 standard errors of the mean of Z² (sd √(E Z⁴ − (E Z²)²)/√n), and
    # the same draws read at a 15% wrong scale fall outside it
    var, fourth = law.var(), law.moment(4)
    tolerance = 5.0 * math.sqrt(fourth - var**2) / math.sqrt(ROWS)
    assert abs(np.mean(noise**2) - var) <= tolerance
    assert abs(np.mean((noise / 1.15) ** 2) - var) > tolerance


@pytest.mark.parametrize("name", ["gaussian", "laplace"])
def test_vmapped_scalar_releases_keep_the_key_guard(name):
    mechanism, kwargs = (M.gaussian, GAUSS) if name == "gaussian" else (M.laplace, LAPLACE)
    values = _values()[:8]
    with jax.enable_x64(False):
        shared = jax.jit(jax.vmap(lambda k, v: mechanism(k, v, **kwargs), in_axes=(None, 0)))
        with pytest.raises(ValueError, match="key"):
            shared(KEYS[0], values)
        repeated = jax.random.wrap_key_data(jnp.tile(jax.random.key_data(KEYS[0]), (8, 1)))
        voided = np.asarray(_vmapped(mechanism, kwargs)(repeated, values))
    assert np.all(np.isnan(voided))
