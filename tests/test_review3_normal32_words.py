"""Review 3 (adversarial): the float32 normal's ONE bits draw, word by word, at block edges.

A PRNG implementation that returns a chosen word array lets the test see which random word
each coordinate reads through the public ``normal`` (not only the words-level function): the
first d words must feed the lanes, word d + b the first tail lane of block b and word
d + blocks + b its last one, and no word may be read twice, at d = 1, d < 4096, d at and
around multiples of 4096.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.random import define_prng_impl

from dpjax import _random as R
from tests.core.test_random_normal32 import body_words, exact_body, exact_tail

BLOCK = 4096
_NAMES = itertools.count()


def _key_of_words(words: np.ndarray) -> jax.Array:
    """A key whose one bits draw of shape (len(words),) returns ``words``."""
    table = np.asarray(words, np.uint32)

    def random_bits(key, bit_width, shape):
        del key
        assert bit_width == 32 and shape == table.shape, (bit_width, shape)
        return jnp.asarray(table)

    impl = define_prng_impl(
        key_shape=(1,),
        seed=lambda seed: jnp.zeros((1,), jnp.uint32),
        split=lambda key, shape: jnp.zeros((*shape, 1), jnp.uint32),
        random_bits=random_bits,
        fold_in=lambda key, data: key,
        name=f"review3_words_{next(_NAMES)}",
    )
    return jax.random.key(0, impl=impl)


@pytest.mark.parametrize("d", [1, 2, 4095, 4096, 4097, 8191, 8192, 8193, 12289])
def test_each_tail_lane_reads_its_own_word_of_the_one_draw(d):
    rng = np.random.default_rng(d)
    blocks = -(-d // BLOCK)
    lanes = body_words(rng, d)
    fresh = rng.integers(1, 2**32 - 1, 2 * blocks, dtype=np.uint64).astype(np.uint32)
    fresh[0] = 0  # the top of the support, +9.155 or -9.155
    expected = exact_body(lanes)
    for b in range(blocks):
        first, last = b * BLOCK, min(b * BLOCK + BLOCK - 1, d - 1)
        lanes[first] = 0 if b % 2 == 0 else 0xFFFFFFFF
        expected[first] = exact_tail(fresh[b], lanes[first] != 0)
        if last != first:
            lanes[last] = 0xFFFFFFFF if b % 2 == 0 else 0
            expected[last] = exact_tail(fresh[blocks + b], lanes[last] != 0)
    z = np.asarray(R.normal(_key_of_words(np.concatenate([lanes, fresh])), (d,)), np.float64)
    assert np.all(np.isfinite(z))
    np.testing.assert_allclose(z, expected, rtol=8 * 2.0**-24, atol=2.0**-40)
    assert abs(z[0]) == pytest.approx(9.155, abs=1e-3)  # fresh[0] = 0 reached the top


def test_tail_values_through_the_float32_rounding_of_the_fresh_word_are_monotone():
    """U = (float32(f) + ½)·2⁻⁶³ rounds f to 24 bits: over every rounding boundary and both
    ends the tail stays finite, non-increasing in f, within [Φ̄⁻¹(2⁻³²), 9.155], and above
    every body value (the body's largest, m = 1, is Φ̄⁻¹(1.5·2⁻³²))."""
    edges = [0, 1, 2, 2**24 - 1, 2**24, 2**24 + 1, 2**31, 2**32 - 129, 2**32 - 128, 2**32 - 1]
    grid = np.unique(
        np.concatenate([np.asarray(edges), np.linspace(0, 2**32 - 1, 4001).astype(np.int64)])
    ).astype(np.uint32)
    sample = grid[:: max(1, grid.size // 64)]
    normal32 = jax.jit(R._normal32_of_words)
    # one positive tail lane (word 0) whose block's first fresh word is f
    z = np.array([float(normal32(jnp.zeros(1, jnp.uint32), jnp.array([f, f]))[0]) for f in sample])
    tail = np.asarray(
        jax.jit(R._tail_quantile)(
            ((grid.astype(np.float32) + np.float32(0.5)) * np.float32(2.0**-63)) * np.float32(0.5)
        ),
        np.float64,
    )
    assert np.all(np.isfinite(tail))
    assert np.all(np.diff(tail) <= 0.0)
    body_top = float(exact_body(np.array([1], np.uint32))[0])
    assert tail.min() > body_top
    assert tail.max() == pytest.approx(9.155, abs=1e-3)
    # the public words-level path gives the same values as the direct quantile
    np.testing.assert_array_equal(z, tail[:: max(1, grid.size // 64)])
