"""The float32 normal at one random word per coordinate (issue 24): body map, tail lanes,
blocks with several tail lanes, the overflow term of the δ floor, bit independence, jit/vmap.

The words-level function ``_normal32_of_words(words, fresh)`` is fed chosen words: the body
map is checked against float64 scipy (erfcinv), the tail lanes' conditional law by a KS test
that rejects a 1.05 scale, and the published overflow probability against an exact rational
recomputation.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import mpmath
import numpy as np
import pytest
from jax.extend.random import define_prng_impl
from scipy import special, stats

import dpjax
from dpjax import _random as R
from tests.helpers import assert_distribution

# rounding claims of compiled code: run on the users' -O3 code (tests/conftest.py)
pytestmark = pytest.mark.codegen

BLOCK = 4096
ULP32 = 2.0**-24


def draw_of_words(words, fresh):
    words = jnp.asarray(np.asarray(words, np.uint32))
    fresh = jnp.asarray(np.asarray(fresh, np.uint32))
    return np.asarray(jax.jit(R._normal32_of_words)(words, fresh), np.float64)


def body_words(rng, n):
    """Random words that are not tail lanes (31 magnitude bits not all zero)."""
    words = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    magnitude = np.where(words >> 31 == 1, ~words, words) & np.uint32(0x7FFFFFFF)
    return np.where(magnitude == 0, np.uint32(0x12345678), words)


def exact_body(words):
    """±√2·erfcinv(U), U = (2m + 1)·2⁻³² from the word (float64 reference)."""
    words = np.asarray(words, np.uint64)
    negative = words >> np.uint64(31) == 1
    m = np.where(negative, ~words, words) & np.uint64(0x7FFFFFFF)
    u = (2.0 * m.astype(np.float64) + 1.0) * 2.0**-32
    z = math.sqrt(2.0) * special.erfcinv(u)
    return np.where(negative, -z, z)


def exact_tail(fresh, negative):
    """±Φ̄⁻¹(U/2) with U = (2f + 1)·2⁻⁶⁴, f complemented for a negative lane."""
    f = np.asarray(fresh, np.uint64)
    f = np.where(negative, ~f & np.uint64(0xFFFFFFFF), f)
    z = -stats.norm.ppf((2.0 * f.astype(np.float64) + 1.0) * 2.0**-65)
    return np.where(negative, -z, z)


# ------------------------------------------------------------------------------ body lanes


def test_body_map_is_the_exact_inverse_to_float32_rounding():
    # every magnitude region: m = 1 … 300 (U ≈ 2⁻³¹, the outer refit at w = 20.8), around the
    # branch switch w = 5, m → 2³¹ − 1 (U → 1, z → 0) and 10⁵ random words of both signs
    rng = np.random.default_rng(0)
    m = np.concatenate(
        [
            np.arange(1, 300),
            2**31 - np.arange(1, 300),
            (2.0 ** np.arange(1, 31)).astype(np.int64),
            rng.integers(1, 2**31, 100_000),
        ]
    ).astype(np.uint32)
    words = np.concatenate([m, ~m])  # positive, then the complemented (negative) words
    got = draw_of_words(words, np.zeros(2 * -(-words.size // BLOCK), np.uint32))
    want = exact_body(words)
    rel = np.abs(got - want) / np.abs(want)
    assert rel.max() <= 8 * ULP32, (rel.max() / ULP32, words[rel.argmax()])
    np.testing.assert_array_equal(got[: m.size], -got[m.size :])  # exact mirror symmetry
    # monotone near the top of the body: m = 1, 2, … (larger U) give smaller |Z|
    assert np.all(np.diff(got[:299]) < 0)


def test_law_of_a_large_draw_and_the_power_to_reject_a_wrong_scale():
    n = 2**17
    z = np.asarray(R.normal(jax.random.key(5), (n,), np.float32), np.float64)
    assert_distribution(
        z, stats.norm.cdf, wrong_cdfs=[lambda x: stats.norm.cdf(x / 1.05), stats.logistic.cdf]
    )


# ------------------------------------------------------------------------------ tail lanes


def tail_pattern(rng, blocks, per_block):
    """Body words with ``per_block`` tail lanes (word 0 or ~0) at random positions per block."""
    words = body_words(rng, blocks * BLOCK)
    positions = np.concatenate(
        [b * BLOCK + np.sort(rng.choice(BLOCK, per_block, replace=False)) for b in range(blocks)]
    )
    signs = rng.integers(0, 2, positions.size).astype(bool)
    words[positions] = np.where(signs, np.uint32(0xFFFFFFFF), np.uint32(0))
    return words, positions.reshape(blocks, per_block), signs.reshape(blocks, per_block)


def test_tail_lanes_are_refined_from_their_own_fresh_word_with_the_tail_law():
    rng = np.random.default_rng(1)
    blocks = 256
    words, positions, negative = tail_pattern(rng, blocks, 2)
    fresh = rng.integers(0, 2**32, 2 * blocks, dtype=np.uint64).astype(np.uint32)
    got = draw_of_words(words, fresh)
    # first tail lane of block b reads fresh[b], the last fresh[blocks + b]
    for j in range(2):
        f = fresh[j * blocks : (j + 1) * blocks]
        want = exact_tail(f, negative[:, j])
        np.testing.assert_allclose(got[positions[:, j]], want, rtol=4 * ULP32)
    # conditional law given a tail lane: P[|Z| > t | U ≤ 2⁻³¹] = 2Φ̄(t)·2³¹
    tails = np.abs(got[positions.reshape(-1)])
    assert tails.min() >= 6.2  # Φ̄⁻¹(2⁻³²) = 6.23: beyond every body value

    def tail_cdf(t):
        return np.clip(1.0 - 2.0 * stats.norm.sf(t) * 2.0**31, 0.0, 1.0)

    assert_distribution(tails, tail_cdf, wrong_cdfs=[lambda t: tail_cdf(t / 1.05)])
    # the other lanes are the body map of their own word
    body = np.ones(words.size, bool)
    body[positions.reshape(-1)] = False
    np.testing.assert_allclose(got[body], exact_body(words[body]), rtol=8 * ULP32)


def test_a_block_with_three_tail_lanes_refines_the_first_and_last_only():
    rng = np.random.default_rng(2)
    words = body_words(rng, 2 * BLOCK + 100)  # two full blocks and a partial one
    lanes = [5, 100, 4000, BLOCK + 7, 2 * BLOCK + 99]  # 3 in block 0, 1 in block 1 and 2
    words[lanes] = 0
    fresh = np.arange(1, 7, dtype=np.uint32) * np.uint32(0x01000193)
    got = draw_of_words(words, fresh)
    blocks = 3
    np.testing.assert_allclose(got[5], exact_tail(fresh[0], False), rtol=4 * ULP32)
    np.testing.assert_allclose(got[4000], exact_tail(fresh[blocks + 0], False), rtol=4 * ULP32)
    np.testing.assert_allclose(got[BLOCK + 7], exact_tail(fresh[1], False), rtol=4 * ULP32)
    np.testing.assert_allclose(got[2 * BLOCK + 99], exact_tail(fresh[2], False), rtol=4 * ULP32)
    # the middle lane is the overflow case: the body value at m = 0, Φ̄⁻¹(2⁻³³)
    assert got[100] == pytest.approx(-stats.norm.ppf(2.0**-33), rel=8 * ULP32)
    # every fresh word is read by at most one coordinate
    for j in range(fresh.size):
        changed = fresh.copy()
        changed[j] ^= np.uint32(0x00F0F0F0)
        moved = np.flatnonzero(draw_of_words(words, changed) != got)
        assert moved.size <= 1, (j, moved)
        assert moved.size == (0 if j in (4, 5) else 1), (j, moved)  # blocks 1, 2: one lane


def test_changing_one_body_word_changes_only_its_coordinate():
    rng = np.random.default_rng(3)
    words = body_words(rng, BLOCK + 50)
    words[[10, BLOCK + 3]] = [0, 0xFFFFFFFF]  # tail lanes stay as they are
    fresh = rng.integers(0, 2**32, 4, dtype=np.uint64).astype(np.uint32)
    base = draw_of_words(words, fresh)
    for lane in (0, 11, 4095, BLOCK, BLOCK + 49):
        changed = words.copy()
        changed[lane] ^= np.uint32(0x00010000)  # stays a body word
        moved = np.flatnonzero(draw_of_words(changed, fresh) != base)
        np.testing.assert_array_equal(moved, [lane])


def test_support_reaches_phi_bar_inverse_of_two_to_minus_65_on_both_sides():
    exact = -stats.norm.ppf(2.0**-65)  # 9.1553 (float64 scipy)
    for dtype in (np.float32, jnp.bfloat16, jnp.float16):
        assert R.gaussian_support_max(dtype) == pytest.approx(exact, rel=2 * ULP32)
    # the top value is the atom of one (word, fresh word) pair: f = 1, 2, … give less
    words = np.zeros(1, np.uint32)
    values = [draw_of_words(words, [f, 0])[0] for f in range(4)]
    assert values[0] == pytest.approx(exact, rel=2 * ULP32)
    assert all(v < values[0] for v in values[1:])


# ----------------------------------------------------------------------- the overflow floor


def exact_block_overflow(lanes):
    p = Fraction(1, 2**31)
    return 1 - sum(math.comb(lanes, j) * p**j * (1 - p) ** (lanes - j) for j in range(3))


def exact_overflow(d):
    """η(d) from the exact block probabilities, composed over the blocks in 40 digits."""
    full, rest = divmod(d, BLOCK)
    mpmath.mp.dps = 40
    block, last = (
        mpmath.mpf(x.numerator) / x.denominator for x in map(exact_block_overflow, (BLOCK, rest))
    )
    return 1 - (1 - block) ** full * (1 - last)


@pytest.mark.parametrize("d", [1, 2, 3, 4095, 4096, 669_706, 10**7])
def test_overflow_probability_matches_an_exact_rational_recomputation(d):
    want = float(exact_overflow(d))
    assert R.normal_overflow_probability(d) == pytest.approx(want, rel=1e-9, abs=0)
    assert (want == 0.0) == (d <= 2)
    assert R.normal_overflow_probability(d, np.float64) == 0.0
    assert R.normal_overflow_probability(d, jnp.bfloat16) == R.normal_overflow_probability(d)


def test_published_floor_stays_below_1e_12_per_release_up_to_ten_million_coordinates():
    assert float(exact_block_overflow(BLOCK)) == pytest.approx(1.1556e-18, rel=1e-4, abs=0)
    for d in (1, 669_706, 10**7):
        eta = exact_overflow(d)  # sets 40 digits
        z_max = mpmath.mpf(R.gaussian_support_max(np.float32))
        atom = 1 - (1 - mpmath.mpf(2) ** -64) ** d
        for sigma in (0.5, 1.0):
            got = dpjax.accounting.noise_truncation_delta(
                noise_multiplier=sigma, sampling_rate=1.0, steps=1, num_coordinates=d
            )
            tail = mpmath.ncdf(-(z_max - 1 / mpmath.mpf(sigma)))
            assert got == pytest.approx(float(max(tail, atom) + eta), rel=1e-9, abs=0)
            assert got <= 1e-12


# ------------------------------------------------------------------- keys, jit and vmap


@pytest.mark.slow  # three compiles (eager, jit+vmap): ~5 s on the shared 2-core machine
def test_determinism_jit_and_vmap():
    shape = (3, 5000)
    keys = jax.random.split(jax.random.key(9), 3)
    eager = np.asarray(R.normal(keys[0], shape))
    np.testing.assert_array_equal(eager, np.asarray(R.normal(keys[0], shape)))
    batched = np.asarray(jax.jit(jax.vmap(lambda k: R.normal(k, shape)))(keys))
    np.testing.assert_array_equal(batched[0], eager)  # jit + vmap: the same values
    assert not np.array_equal(batched[0], batched[1])
    assert eager.dtype == np.float32 and np.all(np.isfinite(batched))


def test_small_and_empty_shapes():
    assert R.normal(jax.random.key(0), (0,)).shape == (0,)
    assert R.normal(jax.random.key(0), (2, 0, 3)).shape == (2, 0, 3)
    assert np.isfinite(float(R.normal(jax.random.key(0), ())))


def test_a_draw_too_large_for_int32_lane_positions_is_refused():
    with pytest.raises(ValueError, match="shape must have at most"):
        R.normal(jax.random.key(0), (2**16, 2**15))


def test_tail_quantile_matches_the_exact_normal_quantile_over_the_whole_tail_range():
    # the tail lanes' Φ̄⁻¹(U/2), U/2 ∈ [2⁻⁶⁶, 2⁻³²], both Cephes branches (switch at z = 8,
    # p = e⁻³²): within 4 float32 ulp of the float64 quantile, and monotone decreasing in p
    p = np.geomspace(2.0**-66, 2.0**-32, 20_001).astype(np.float32)
    got = np.asarray(jax.jit(R._tail_quantile)(jnp.asarray(p)), np.float64)
    want = -stats.norm.ppf(p.astype(np.float64))
    assert np.max(np.abs(got - want) / want) <= 4 * ULP32
    assert np.all(np.diff(got) <= 0)
    # a wrong scale or a swapped branch is far outside that tolerance
    assert np.max(np.abs(1.05 * got - want) / want) > 100 * ULP32


# ------------------------------------------------------------------------------------------------
# the float32 normal's ONE bits draw, word by word, at block edges.
#
# A PRNG implementation that returns a chosen word array lets the test see which random word
# each coordinate reads through the public ``normal`` (not only the words-level function): the
# first d words must feed the lanes, word d + b the first tail lane of block b and word
# d + blocks + b its last one, and no word may be read twice, at d = 1, d < 4096, d at and
# around multiples of 4096.
# ------------------------------------------------------------------------------------------------

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
    """Catches two tail lanes of the float32 normal reading the same random word."""
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
