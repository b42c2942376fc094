r"""Gaussian and Laplace samplers with a far-reaching tail.

``jax.random.normal`` maps a uniform on a 2⁻²³ grid through √2·erfinv: in float32 its support
is [−5.42, +5.22] (bfloat16: [−2.89, +2.52], 128 values). Under DP-SGD the missing tail is a δ
floor (:func:`dpjax.accounting.noise_truncation_delta`) that exceeds the usual δ = 1e-5 at common
settings. The samplers here resolve the uniform down to 2⁻⁶⁴.

Two words per coordinate (Laplace, exponential, Gumbel, and the float64 normal):

* one bit is the sign (the top bit; a negative coordinate reads the other bits complemented,
  so all-zero words give the largest positive and all-one words the largest negative value),
  the other 63 bits give a uniform U on the midpoint grid
  {(k + ½)·2⁻⁶³ : 0 ≤ k < 2⁶³} ⊂ (0, 1], so P[U ≤ u] = u up to one cell (2⁻⁶³);
* Gaussian: |Z| = −ndtri(U/2) (Φ̄⁻¹ evaluated where it is accurate: in the tail, not through
  erfinv(1 − tiny)); Laplace: |L| = −log U.

float32 normal: one word per coordinate (the cost of ``jax.random.normal``), refined in the tail.

* Body: sign = top bit as above; the 31 magnitude bits m give U = (2m + 1)·2⁻³², the midpoint
  of the cell (m·2⁻³¹, (m + 1)·2⁻³¹], and |Z| = √2·erfinv(1 − U) = Φ̄⁻¹(U/2), evaluated as
  (1 − U)·√2·P(w), w = −log(U·(2 − U)), with U and 1 − U each formed from the integer bits
  (no cancellation) and P Giles' float32 erfinv polynomial (centre) / a refit (outer branch,
  up to w = 20.8): within 8 float32 ulp of the exact map (6.1 ulp measured).
* Tail lanes: m = 0 (probability 2⁻³¹: the word is all-zero or all-one). The coordinates are
  cut in blocks of 4096; each block draws two fresh words, for its first and its last tail
  lane: U = (2f + 1)·2⁻⁶⁴ ∈ [2⁻⁶⁴, 2⁻³¹] (f complemented when negative), |Z| = −ndtri(U/2).
  So U's cell (0, 2⁻³¹] is split into 2³² cells of 2⁻⁶³ and the law is the two-word sampler's,
  on a grid of 2⁻³¹ cells in the body. The lane words and the fresh words are one
  ``jax.random.bits`` draw of d + 2·⌈d/4096⌉ words (the first d for the lanes, the rest for
  the tails): every random word is read by at most one coordinate.
* Overflow: a block with ≥ 3 tail lanes (probability 1.2·10⁻¹⁸ per block) leaves the middle
  ones at the body value Φ̄⁻¹(2⁻³³) = 6.338; that event's probability per draw,
  :func:`normal_overflow_probability`, is part of the published δ floor (2.8·10⁻¹⁵ at d = 10⁷).

Support (measured by feeding all-zero / all-one words, U = 2⁻⁶⁴; :func:`gaussian_support_max`):
|Z| ≤ Φ̄⁻¹(2⁻⁶⁵) = 9.155 (float32 and float64), |L| ≤ 64·ln 2 = 44.36. δ floor
(:func:`dpjax.accounting.noise_truncation_delta`): per release at least
q·max(Φ̄(9.155 − 1/σ), 1 − (1 − 2⁻⁶⁴)^d) for d coordinates — the top value is an atom of mass
2⁻⁶⁴ on every coordinate — (plus the float32 overflow term) which is below 1e-12 at σ ≥ 0.5
for d ≤ 1.8·10⁷. Noise is drawn in at least float32 (bfloat16,
float16 and integer leaves get float32 noise, :func:`noise_dtype`); the callers add it in that
dtype and cast the sum to the leaf's dtype afterwards (post-processing).

Porosity: these are still FLOATING-POINT samplers. Their outputs lie on an irregular grid, so
``x + Z`` on D takes values that ``x' + Z`` on D′ cannot (Mironov 2012, "On significance of the
least significant bits for differential privacy", CCS): an attacker who sees the exact float can
tell D from D′ with a probability no noise scale removes. DP-SGD's guarantee is stated for the
model trained with the real-number mechanism; releases of real data to untrusted parties need
OS-seeded keys and non-porous noise (:func:`dpjax.mechanisms.discrete_laplace`).
The float32 normal's grid (measured on windows of 64 float32 ulps, every attainable output
enumerated): near 0 it is denser than the two-word sampler's (U and 1 − U from the integer
bits: ≥ 20% of the float32 values below |z| = 0.01 where the two-word sampler reaches < 2%;
70–100% up to |z| = 3.4 against 3–90%), beyond |z| ≈ 3.6 sparser (2⁻³¹ cells: under 30%
beyond 4, none of a 64-ulp window beyond 5; mass 3·10⁻⁴). Mass-weighted, the share of float32
values within reach of a draw that the draw cannot produce is 9% against 49% before.
"""

from __future__ import annotations

import functools
import math
import secrets
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

try:  # the current trace, public in jax.extend.core; absent: os_key refuses (_at_top_level)
    from jax.extend.core import find_top_trace
except ImportError:  # pragma: no cover - a JAX this code was not written for
    find_top_trace = None

__all__ = [
    "noise_dtype",
    "normal",
    "laplace",
    "exponential",
    "gumbel",
    "legacy_gaussian_support_max",
    "gaussian_tail",
    "gaussian_support_max",
    "normal_overflow_probability",
    "laplace_support_max",
    "constant_bits_key",
    "os_key",
]

_WIDE = (np.dtype(np.float32), np.dtype(np.float64))


def noise_dtype(dtype: Any) -> Any:
    """The dtype noise for a leaf of ``dtype`` is drawn and added in: at least float32.

    float32 and float64 stay; bfloat16 / float16 (and other narrow floats) → float32; integer
    and bool leaves → JAX's default float (float64 under x64, else float32).
    """
    dtype = np.dtype(dtype)
    if dtype in _WIDE:
        return dtype
    if jnp.issubdtype(dtype, jnp.floating):
        return np.dtype(np.float32)
    return np.dtype(jnp.result_type(float))


def _check_wide(dtype: Any) -> Any:
    dtype = np.dtype(dtype)
    if dtype not in _WIDE:
        raise ValueError(
            f"dtype must be float32 or float64 (draw in noise_dtype(leaf dtype)); got {dtype}"
        )
    return dtype


_LOW31 = 0x7FFFFFFF


def _sign_and_flip(word: jax.Array, xp: Any = jnp) -> tuple[jax.Array, jax.Array]:
    """Sign = the top bit of ``word``; flip = all-ones where negative, so that a negative
    coordinate reads its magnitude bits complemented: all-one words give −(largest magnitude),
    mirroring all-zero words → +(largest magnitude). The law is unchanged (~ is a bijection).
    ``xp``: ``jax.numpy``, or ``numpy`` for the same arithmetic on the host."""
    negative = (word >> xp.uint32(31)) == xp.uint32(1)
    flip = xp.where(negative, xp.uint32(0xFFFFFFFF), xp.uint32(0))
    return negative, flip


def _unit_and_sign(key: jax.Array, shape: tuple[int, ...], dtype: Any):
    """Two words per coordinate: the sign bit and U = (k + ½)·2⁻⁶³ ∈ (0, 1] from the 63-bit k.

    U is rounded to ``dtype`` (float32 keeps 24 significant bits — exact near 0, where the tail
    lives); its smallest value is 2⁻⁶⁴, so P[U ≤ u] = u up to one 2⁻⁶³ cell.
    """
    dtype = _check_wide(dtype)
    hi, lo = jax.random.bits(key, (2, *shape), jnp.uint32)
    return _unit_and_sign_of_words(hi, lo, dtype)


def unit_and_sign_on_host(key: jax.Array, shape: tuple[int, ...]) -> tuple[Any, Any]:
    """:func:`_unit_and_sign` in float64 on the host (numpy), whatever ``jax_enable_x64`` says:
    the same words of ``key``, the same U and sign as ``_unit_and_sign(key, shape, float64)``.
    ``key`` must be concrete (an eager call)."""
    hi, lo = np.asarray(jax.random.bits(key, (2, *shape), jnp.uint32))
    return _unit_and_sign_of_words(hi, lo, np.float64, xp=np)


def _unit_and_sign_of_words(hi: jax.Array, lo: jax.Array, dtype: Any, xp: Any = jnp):
    """:func:`_unit_and_sign` of given words: ``hi`` gives the sign and the top 31 bits of k,
    ``lo`` its low 32 bits (elementwise). ``xp``: as for :func:`_sign_and_flip`."""
    negative, flip = _sign_and_flip(hi, xp)
    u = (
        ((hi ^ flip) & xp.uint32(_LOW31)).astype(dtype) * xp.asarray(2.0**-31, dtype)
        + (lo ^ flip).astype(dtype) * xp.asarray(2.0**-63, dtype)
        + xp.asarray(2.0**-64, dtype)
    )
    return xp.minimum(u, xp.asarray(1.0, dtype)), negative


# Draws of at least _MIN_CHUNKED coordinates run their word -> sample transform in a loop over
# chunks of at most _CHUNK coordinates (at least two chunks): speed only, see _sample_words.
_CHUNK = 2**20
_MIN_CHUNKED = 2**11


def _sample_words(
    key: jax.Array,
    shape: tuple[int, ...],
    dtype: Any,
    transform: Callable[[jax.Array, jax.Array, Any], jax.Array],
) -> jax.Array:
    """``transform(hi, lo, dtype)`` of the two random words of every coordinate of ``shape``.

    The words are ``jax.random.bits(key, (2, *shape))`` in every case. A draw of at least
    ``_MIN_CHUNKED`` coordinates applies the (elementwise) transform in a ``lax.map`` over
    ≥ 2 chunks of the flattened words (the last zero-padded, the padding cut off), which gives
    bit-identical values: XLA cannot fuse a loop's body into the consumers of its result, so
    the transform (the inverse-normal chain: three rational branches) is compiled ONCE and
    its result materialised once. Without the loop XLA fused a copy of the chain into every
    consumer, e.g. into each of the 38 leaf slices of a transformer's one flat noise draw
    (:func:`dpjax._noise.tree_iid_noise_like`), so compile time grew with the number of leaves
    (measured).
    """
    dtype = _check_wide(dtype)
    hi, lo = jax.random.bits(key, (2, *shape), jnp.uint32)
    size = math.prod(shape)
    if size < _MIN_CHUNKED:
        return transform(hi, lo, dtype)
    chunks = max(2, -(-size // _CHUNK))
    width = -(-size // chunks)

    def rows(words: jax.Array) -> jax.Array:
        return jnp.pad(words.reshape(-1), (0, chunks * width - size)).reshape(chunks, width)

    out = jax.lax.map(lambda words: transform(*words, dtype), (rows(hi), rows(lo)))
    return out.reshape(-1)[:size].reshape(shape)


def _signed(magnitude: jax.Array, negative: jax.Array) -> jax.Array:
    return jnp.where(negative, -magnitude, magnitude)


def _normal_of_words(hi: jax.Array, lo: jax.Array, dtype: Any) -> jax.Array:
    u, negative = _unit_and_sign_of_words(hi, lo, dtype)
    half = jnp.asarray(0.5, u.dtype)
    return _signed(jnp.maximum(-jax.scipy.special.ndtri(u * half), 0.0), negative)


# --------------------------------------------------------------- float32 normal: one word a lane
#
# Body: one 32-bit word per coordinate, |Z| = Φ̄⁻¹(U/2) at the midpoint U = (2m + 1)·2⁻³² of the
# word's 31 magnitude bits m, evaluated with an erfinv polynomial in w = −log(U·(2 − U)) (no
# 1 − U cancellation). Tail: a lane with m = 0 (the whole word all-zero or all-one, probability
# 2⁻³¹) takes U = (2f + 1)·2⁻⁶⁴ from one fresh word f instead; each block of _BLOCK lanes has
# _REFINED_PER_BLOCK fresh words, for its first and its last tail lane.

_BLOCK = 4096
_REFINED_PER_BLOCK = 2
_TAIL_LANE_PROBABILITY = 2.0**-31  # P[m = 0]: the 31 magnitude bits all zero
_MAX_FLOAT32_DRAW = 2**31 - 2**21  # lane positions, and the padded out-of-range ones, in int32

# Giles (2010), "Approximating the erfinv function" (GPU Computing Gems), single precision,
# central branch (w < 5): erfinv(x) = x·P₁(w − 2.5).
_ERFINV_CENTRAL = (
    2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
    -0.00125372503, -0.00417768164, 0.246640727, 1.50140941,
)  # fmt: skip
# Outer branch (5 ≤ w ≤ −log(2⁻³¹·(2 − 2⁻³¹)) = 20.8): erfinv(x) = x·P₂(√w − 3.4080787),
# refitted here (Giles' own outer branch covers w ≤ 16, float32's 1 − 2⁻²⁴, and is 2.7·10³
# ulp off at w = 20.8): least squares in float64 on 4000 Chebyshev nodes of √w ∈ [√5, 4.58]
# against mpmath; max error 3.4 float32 ulp when evaluated in float32.
_ERFINV_OUTER_CENTRE = 3.4080787
_ERFINV_OUTER = (
    4.3777221435448155e-05, -1.06109446278424e-05, -0.00031989970011636615,
    0.0006979035679250956, -0.0009408313198946416, 0.001416829414665699,
    -0.0025345184840261936, 0.003915557637810707, 1.0067107677459717, 3.2429161071777344,
)  # fmt: skip


# Tail lanes: Φ̄⁻¹(p) for p = U/2 ∈ [2⁻⁶⁶, 2⁻³²] from the two far-tail branches of Cephes'
# ndtri (S. L. Moshier, Cephes Math Library; the rational fits ``jax.scipy.special.ndtri``
# uses, highest degree first): z = √(−2 log p), Φ̄⁻¹(p) = z − log(z)/z − P(1/z)/(Q(1/z)·z),
# (P₁, Q₁) for z < 8 (p > e⁻³²), (P₂, Q₂) beyond. Written out (Horner, unrolled) rather than
# calling ndtri, which also compiles its central branch and six ``jnp.polyval`` loops for
# lanes that never reach them (measured: 15% of the sampler's compiled program). Same
# accuracy: ≤ 3.1 float32 ulp from the exact quantile on 2·10⁴ points of [2⁻⁶⁶, 2⁻³²], as
# ndtri; the two agree bit for bit on 99.4% of them and within 2 ulp on the rest.
_NDTRI_P1 = (
    4.05544892305962419923e0, 3.15251094599893866154e1, 5.71628192246421288162e1,
    4.40805073893200834700e1, 1.46849561928858024014e1, 2.18663306850790267539e0,
    -1.40256079171354495875e-1, -3.50424626827848203418e-2, -8.57456785154685413611e-4,
)  # fmt: skip
_NDTRI_Q1 = (
    1.0, 1.57799883256466749731e1, 4.53907635128879210584e1,
    4.13172038254672030440e1, 1.50425385692907503408e1, 2.50464946208309415979e0,
    -1.42182922854787788574e-1, -3.80806407691578277194e-2, -9.33259480895457427372e-4,
)  # fmt: skip
_NDTRI_P2 = (
    3.23774891776946035970e0, 6.91522889068984211695e0, 3.93881025292474443415e0,
    1.33303460815807542389e0, 2.01485389549179081538e-1, 1.23716634817820021358e-2,
    3.01581553508235416007e-4, 2.65806974686737550832e-6, 6.23974539184983293730e-9,
)  # fmt: skip
_NDTRI_Q2 = (
    1.0, 6.02427039364742014255e0, 3.67983563856160859403e0,
    1.37702099489081330271e0, 2.16236993594496635890e-1, 1.34204006088543189037e-2,
    3.28014464682127739104e-4, 2.89247864745380683936e-6, 6.79019408009981274425e-9,
)  # fmt: skip


def _horner(coefficients: tuple[float, ...], t: jax.Array) -> jax.Array:
    p = jnp.full_like(t, coefficients[0])
    for c in coefficients[1:]:
        p = jnp.asarray(c, t.dtype) + p * t
    return p


def _body_magnitude(word: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(|Z|, negative, is_tail) of one float32 lane from its word.

    Sign = the top bit; a negative lane reads its 31 magnitude bits complemented (all-one words
    mirror all-zero ones). m = the magnitude bits, U = (2m + 1)·2⁻³² and 1 − U = (2m̄ + 1)·2⁻³²
    (m̄ = 2³¹ − 1 − m), both formed from integers (one float32 rounding each, no cancellation);
    |Z| = √2·erfinv(1 − U) = Φ̄⁻¹(U/2). is_tail: m = 0 (U's cell is (0, 2⁻³¹]).
    """
    negative, flip = _sign_and_flip(word)
    m = (word ^ flip) & jnp.uint32(_LOW31)
    m_bar = (~m) & jnp.uint32(_LOW31)
    scale = jnp.float32(2.0**-32)
    u = ((m << 1) | jnp.uint32(1)).astype(jnp.float32) * scale
    one_minus_u = ((m_bar << 1) | jnp.uint32(1)).astype(jnp.float32) * scale
    w = -jnp.log(u * (1.0 + one_minus_u))
    central = _horner(_ERFINV_CENTRAL, w - 2.5)
    outer = _horner(_ERFINV_OUTER, jnp.sqrt(w) - _ERFINV_OUTER_CENTRE)
    p = jnp.where(w < 5.0, central, outer)
    return p * one_minus_u * jnp.float32(math.sqrt(2.0)), negative, m == 0


def _tail_quantile(p: jax.Array) -> jax.Array:
    """Φ̄⁻¹(p) = −ndtri(p) in float32 for 0 < p ≤ e⁻² (the far-tail branches of Cephes' ndtri)."""
    z = jnp.sqrt(jnp.float32(-2.0) * jnp.log(p))
    rz = jnp.float32(1.0) / z
    near = _horner(_NDTRI_P1, rz) / _horner(_NDTRI_Q1, rz)
    far = _horner(_NDTRI_P2, rz) / _horner(_NDTRI_Q2, rz)
    return (z - jnp.log(z) / z) - jnp.where(z >= jnp.float32(8.0), far, near) / z


def _tail_codes(words: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(first, last) tail lane of every block of ``words``, each coded as 2·lane + negative.

    ``first`` is 2·4096 where a block has no tail lane, ``last`` is −1 where it has fewer than
    two (a block with one tail lane lists it as its first only). A block with ≥ 3 tail lanes
    leaves the middle ones unrefined: that block's lanes are then off the ideal law
    (:func:`normal_overflow_probability`). The sign rides in the code, so no lane word is read
    back. Both ends come from ONE variadic reduction (min, max) over the blocks: XLA:CPU
    compiles it as one small loop, where two ``jnp.min`` / ``jnp.max`` reductions compiled
    into six kernels and cost more compile time than the whole body map (measured).
    """
    size = words.shape[0]
    blocks = -(-size // _BLOCK)
    width = min(size, _BLOCK)  # a draw below one block is not padded to 4096 lanes (below)
    padded = jnp.pad(words, (0, blocks * width - size), constant_values=1)  # 1: a body word
    padded = padded.reshape(blocks, width)
    lane2 = 2 * jnp.arange(width, dtype=jnp.int32)
    code = jnp.where(padded == jnp.uint32(0xFFFFFFFF), lane2 + 1, -1)
    code = jnp.where(padded == jnp.uint32(0), lane2, code)
    none = jnp.int32(2 * _BLOCK)

    def ends(a: tuple[jax.Array, jax.Array], b: tuple[jax.Array, jax.Array]):
        return jnp.minimum(a[0], b[0]), jnp.maximum(a[1], b[1])

    first, last = jax.lax.reduce(
        (jnp.where(code >= 0, code, none), code), (none, jnp.int32(-1)), ends, (1,)
    )
    return first, jnp.where(last == first, -1, last)


def _normal32_of_words(words: jax.Array, fresh: jax.Array) -> jax.Array:
    """N(0, 1) float32 of flat uint32 ``words`` (one per lane) and ``fresh`` (2·blocks words).

    Tail lane j of block b (its first or last) reads fresh word fresh[b] or fresh[blocks + b],
    complemented when the lane is negative, as U = (2f + 1)·2⁻⁶⁴ ∈ [2⁻⁶⁴, 2⁻³¹]; every fresh
    word is read by at most one lane. The tail value is −ndtri(U/2) (accurate where U is tiny).
    """
    size = words.shape[0]
    blocks = fresh.shape[0] // _REFINED_PER_BLOCK
    magnitude, negative, _ = _body_magnitude(words)
    body = _signed(magnitude, negative)
    codes = jnp.concatenate(_tail_codes(words))
    tail_negative = (codes & 1) == 1
    flip = jnp.where(tail_negative, jnp.uint32(0xFFFFFFFF), jnp.uint32(0))
    u = ((fresh ^ flip).astype(jnp.float32) + jnp.float32(0.5)) * jnp.float32(2.0**-63)
    tail = _tail_quantile(u * jnp.float32(0.5))
    start = jnp.tile(jnp.arange(blocks, dtype=jnp.int32) * _BLOCK, _REFINED_PER_BLOCK)
    none = size + jnp.arange(_REFINED_PER_BLOCK * blocks, dtype=jnp.int32)  # out of range
    positions = jnp.where((codes >= 0) & (codes < 2 * _BLOCK), start + (codes >> 1), none)
    return body.at[positions].set(_signed(tail, tail_negative), mode="drop", unique_indices=True)


@functools.partial(jax.jit, static_argnums=1)
def _normal32(key: jax.Array, size: int) -> jax.Array:
    """``size`` i.i.d. N(0, 1) float32 (flat): one word per lane, 2 fresh words per block.

    Jitted so that an eager call runs the same fused program as a jitted caller (op-by-op
    evaluation of the polynomial rounds differently).
    """
    if size == 0:
        return jnp.zeros((0,), jnp.float32)
    return _normal32_of_words(*_normal32_words(key, size))


def _normal32_words(key: jax.Array, size: int) -> tuple[jax.Array, jax.Array]:
    """The random words of a float32 :func:`normal` draw of ``size``: (lane words, fresh).

    ONE ``jax.random.bits`` draw of size + 2·⌈size/4096⌉ words, cut into the lane words and the
    fresh tail words: every word is read by at most one coordinate, and one generator instance
    is compiled (a key split and two draws compiled three; measured).
    """
    fresh = _REFINED_PER_BLOCK * -(-size // _BLOCK)
    bits = jax.random.bits(key, (size + fresh,), jnp.uint32)
    return bits[:size], bits[size:]


def normal(key: jax.Array, shape: tuple[int, ...] = (), dtype: Any = np.float32) -> jax.Array:
    """I.i.d. N(0, 1) of ``shape`` in ``dtype`` (float32 or float64): ±Φ̄⁻¹(U/2).

    float32: one random word per coordinate plus two fresh words per block of 4096 for its tail
    lanes (module docstring, "float32 normal"); float64: two words per coordinate,
    U = (k + ½)·2⁻⁶³. Support (all-zero / all-one words, :func:`gaussian_support_max`):
    |Z| ≤ Φ̄⁻¹(2⁻⁶⁵) = 9.155 in float32 and float64.

    Example:
        >>> import jax
        >>> z = normal(jax.random.key(0), (2, 3))
        >>> z.shape, z.dtype.name
        ((2, 3), 'float32')
    """
    dtype = _check_wide(dtype)
    shape = tuple(shape)
    if dtype == np.float32:
        size = math.prod(shape)
        if size > _MAX_FLOAT32_DRAW:
            raise ValueError(
                f"shape must have at most {_MAX_FLOAT32_DRAW} coordinates per float32 normal "
                f"draw (int32 lane positions); got {shape} ({size}): split the draw"
            )
        return _normal32(key, size).reshape(shape)
    return _sample_words(key, shape, dtype, _normal_of_words)


def _laplace_of_words(hi: jax.Array, lo: jax.Array, dtype: Any) -> jax.Array:
    u, negative = _unit_and_sign_of_words(hi, lo, dtype)
    return _signed(-jnp.log(u), negative)


def laplace(key: jax.Array, shape: tuple[int, ...] = (), dtype: Any = np.float32) -> jax.Array:
    """I.i.d. Laplace(0, 1) of ``shape`` in ``dtype``: ±(−log U); |L| ≤ 64·ln 2 = 44.36."""
    return _sample_words(key, tuple(shape), dtype, _laplace_of_words)


def _exponential_of_words(hi: jax.Array, lo: jax.Array, dtype: Any) -> jax.Array:
    """Exp(1) = −ln U with both tails resolved: U ≤ ½ or U > ½ by the sign bit.

    X = u/2 ∈ (0, ½] (u from :func:`_unit_and_sign`, smallest 2⁻⁶⁵). Top bit 0: U = X,
    E = −log X ∈ [ln 2, 65·ln 2]; top bit 1: U = 1 − X, E = −log1p(−X) ∈ (0, ln 2], so a
    small E keeps its relative accuracy (no 1 − U cancellation). P[E > t] = e^{−t} up to one
    2⁻⁶⁴ cell of X and the float rounding of X (relative 2⁻²³ in float32).
    """
    u, small = _unit_and_sign_of_words(hi, lo, dtype)
    x = u * jnp.asarray(0.5, u.dtype)
    return jnp.where(small, -jnp.log1p(-x), -jnp.log(x))


def _gumbel_of_words(hi: jax.Array, lo: jax.Array, dtype: Any) -> jax.Array:
    return -jnp.log(_exponential_of_words(hi, lo, dtype))


def exponential(key: jax.Array, shape: tuple[int, ...] = (), dtype: Any = np.float32) -> jax.Array:
    """I.i.d. Exp(1) of ``shape`` in ``dtype`` (float32 or float64), from 64 random bits.

    Support (all-zero / all-one words): [2⁻⁶⁵, 65·ln 2] = [2.7e-20, 45.05] in float32 and
    float64 (``jax.random.exponential``: [0, 15.94] in float32, [0, 4.84] in bfloat16, 128
    values). The law is Exp(1) up to one 2⁻⁶⁴ cell of the uniform and the dtype's rounding.
    """
    return _sample_words(key, tuple(shape), dtype, _exponential_of_words)


def gumbel(key: jax.Array, shape: tuple[int, ...] = (), dtype: Any = np.float32) -> jax.Array:
    """I.i.d. standard Gumbel of ``shape`` in ``dtype``: −log E, E from :func:`exponential`.

    Support: [−ln(65·ln 2), 65·ln 2] = [−3.81, 45.05] in float32 and float64
    (``jax.random.gumbel``: [−4.47, 15.94] in float32, [−4.47, 4.84] in bfloat16). Both ends
    matter for the exponential mechanism: a candidate more than T·48.9 below the best is never
    selected (ideal probability < e^{−45}).
    """
    return _sample_words(key, tuple(shape), dtype, _gumbel_of_words)


# --------------------------------------------------------------------- support by extreme bits


@functools.cache
def _constant_bits_impl(word: int) -> Any:
    """A PRNG implementation whose every random word is ``word`` (to feed extreme bits)."""
    from jax.extend.random import define_prng_impl

    def random_bits(key: jax.Array, bit_width: int, shape: tuple[int, ...]) -> jax.Array:
        del key
        dtype = jnp.dtype(f"uint{bit_width}")
        return jnp.full(shape, word & int(np.iinfo(dtype).max), dtype)

    return define_prng_impl(
        key_shape=(1,),
        seed=lambda seed: jnp.zeros((1,), jnp.uint32),
        split=lambda key, shape: jnp.zeros((*shape, 1), jnp.uint32),
        random_bits=random_bits,
        fold_in=lambda key, data: key,
        name=f"constant_bits_{word:#x}",
    )


def constant_bits_key(word: int) -> jax.Array:
    """A key whose generator returns ``word`` for every random word (0 or 0xFFFFFFFF).

    Feeding a sampler all-zero and all-one words exposes the ends of its support exactly,
    which sampling never does (the tail cells have probability ~2⁻⁶⁴).
    """
    return jax.random.key(0, impl=_constant_bits_impl(int(word)))


def _extreme_magnitude(sampler: Any, dtype: Any, words: tuple[int, ...]) -> float:
    """The symmetric reach of ``sampler``: min(largest positive, largest |negative|) output
    over keys whose random words are all equal to one of ``words`` (extreme bit patterns)."""
    values = [
        float(np.asarray(sampler(constant_bits_key(w), (1,), dtype), np.float64)[0]) for w in words
    ]
    positive = max([v for v in values if v > 0], default=0.0)
    negative = max([-v for v in values if v < 0], default=0.0)
    return min(positive, negative)


def gaussian_support_max(dtype: Any = np.float32) -> float:
    """z_max: the largest |Z| :func:`normal` attains on BOTH sides, for noise of ``dtype``.

    Computed by evaluating the transform at the smallest uniform (the all-zero words), with
    either sign bit; ``dtype`` is the leaf's dtype (bfloat16 → float32 noise).
    """
    return _extreme_magnitude(normal, noise_dtype(dtype), (0, 0xFFFFFFFF))


def laplace_support_max(dtype: Any = np.float32) -> float:
    """The largest |L| :func:`laplace` attains on both sides (64·ln 2 up to rounding)."""
    return _extreme_magnitude(laplace, noise_dtype(dtype), (0, 0xFFFFFFFF))


def legacy_gaussian_support_max(dtype: Any = np.float32) -> float:
    """z_max of ``jax.random.normal`` in ``dtype``: its all-zero / all-one bits, symmetric reach.

    float32: min(5.4200, 5.2201) = 5.2201; bfloat16: 2.5156; float16: 3.182.
    """
    return _extreme_magnitude(jax.random.normal, dtype, (0, 0xFFFFFFFF))


def gaussian_tail(z: float) -> float:
    """Φ̄(z) = P[N(0,1) > z] in float64, accurate in the far tail (erfc, not 1 − Φ)."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def _block_overflow_probability(lanes: int = _BLOCK) -> float:
    """P[Binomial(lanes, 2⁻³¹) ≥ 3]: a block of ``lanes`` lanes with an unrefined tail lane.

    Summed term by term from j = 3 up (no 1 − Σ cancellation), each term from the previous by
    the ratio (n − j)/(j + 1)·p/(1 − p) ≤ 2⁻¹⁹: the sum converges after a few terms.
    """
    n, p, j = int(lanes), _TAIL_LANE_PROBABILITY, _REFINED_PER_BLOCK + 1
    if n < j:
        return 0.0
    term = math.comb(n, j) * p**j * math.exp((n - j) * math.log1p(-p))
    total = 0.0
    while term > 0.0 and j <= n:
        total += term
        term *= (n - j) / (j + 1) * p / (1.0 - p)
        j += 1
    return total


def normal_overflow_probability(num_coordinates: int, dtype: Any = np.float32) -> float:
    r"""η: the probability that one :func:`normal` draw of ``num_coordinates`` leaves a tail
    lane unrefined (some block of 4096 lanes has ≥ 3 tail lanes); 0 for float64 noise.

    .. math::  \eta = 1 - (1 - P_{4096})^{\lfloor d/4096 \rfloor}\,(1 - P_{d \bmod 4096}),
       \quad P_n = \Pr[\mathrm{Bin}(n, 2^{-31}) \ge 3]

    P₄₀₉₆ = 1.2·10⁻¹⁸: η = 2.8·10⁻¹⁵ at d = 10⁷; η = 0 for d ≤ 2. Off this event the float32
    draw equals the ideal sampler (every tail lane refined from its own fresh word) lane for
    lane; on it, the middle tail lanes of the block keep the body value Φ̄⁻¹(2⁻³³) = 6.338.

    Args:
        num_coordinates: d ≥ 0, the size of the draw.
        dtype: the leaf dtype the noise is for (bfloat16 / float16 → float32 noise).

    Returns:
        η in [0, 1].
    """
    if np.dtype(noise_dtype(dtype)) != np.dtype(np.float32) or num_coordinates <= 0:
        return 0.0
    full, rest = divmod(int(num_coordinates), _BLOCK)
    log_none = full * math.log1p(-_block_overflow_probability())
    log_none += math.log1p(-_block_overflow_probability(rest))
    return float(-math.expm1(log_none))


# --------------------------------------------------------------------- keys for real releases


def os_key(impl: Any = None) -> jax.Array:
    """A fresh JAX PRNG key whose every bit comes from the operating system's CSPRNG.

    The key data (all of it: two uint32 words for threefry2x32, four for rbg) is read from
    :func:`secrets.token_bytes` (``os.urandom``) and wrapped with
    :func:`jax.random.wrap_key_data`; no integer seed is formed, so nothing is truncated and
    nothing depends on ``jax_enable_x64`` (``jax.random.key(int.from_bytes(os.urandom(8)))``
    raises OverflowError for seeds ≥ 2⁶³, and folds a 64-bit seed into 32 bits without x64).

    JAX's PRNG (threefry) with a fixed integer seed is fine for research, tests and audits:
    runs are reproducible. A release of real data to an untrusted party needs a key nobody can
    guess — this one — and non-porous noise (:func:`dpjax.mechanisms.discrete_laplace`): the
    floating-point samplers leak through their least significant bits (Mironov 2012).

    Args:
        impl: the PRNG implementation (as for :func:`jax.random.key`); ``None``: JAX's default
            (``jax_default_prng_impl``).

    Returns:
        A typed scalar key (``jax.random.key`` style). Keep it secret; never log it.

    Raises:
        ValueError: when called anywhere but at the top level, i.e. while any JAX
            transformation traces the caller: ``jax.jit`` (where the OS bytes are read once, at
            compile time, and baked into the program as a constant, so every call would reuse
            one key, ``jax.ensure_compile_time_eval`` included), ``jax.vmap`` (where the body
            runs once and the one key it draws is broadcast to every row: all rows share one
            noise draw), ``pmap``, ``shard_map``, ``lax.scan``/``cond`` bodies, ``grad`` and
            ``eval_shape``. Call ``os_key()`` outside and pass the key in (one key per row of a
            vmap: ``jax.random.split(dpjax.os_key(), rows)``). A host callback
            (``jax.pure_callback``) runs at the top level and may call it.

    Example:
        >>> import jax
        >>> key = os_key()
        >>> key.shape, jax.random.key_data(key).dtype.name
        ((), 'uint32')
    """
    _refuse_under_transform()
    shape, dtype = _key_data_layout(impl, jax.config.jax_default_prng_impl)
    nbytes = np.dtype(dtype).itemsize * math.prod(shape)
    words = np.frombuffer(secrets.token_bytes(nbytes), dtype=dtype).reshape(shape)
    key = jax.random.wrap_key_data(words, impl=impl)
    if isinstance(key, jax.core.Tracer):  # belt and braces: a trace the check above missed
        _refuse_os_key_here()
    return key


def _at_top_level() -> bool:
    """Whether no JAX transformation is tracing the caller (the current trace is eager).

    ``jax.extend.core.find_top_trace`` returns the current trace: ``EvalTrace`` at the top level
    and in host callbacks; a batching, staging (jit, scan, cond, pmap, eval_shape, also under
    ``ensure_compile_time_eval``, which keeps the jit's trace and only folds constants) or
    differentiation trace otherwise. If that API is missing (a JAX this code was not written
    for), the answer is False: os_key then refuses loudly rather than risk a shared key.
    """
    if find_top_trace is None:
        return False
    return type(find_top_trace(())).__name__ == "EvalTrace"


def _refuse_under_transform() -> None:
    if not _at_top_level():
        _refuse_os_key_here()


def _refuse_os_key_here() -> None:
    raise ValueError(
        "os_key must be called at the top level, outside every JAX transformation (jax.jit, "
        "jax.ensure_compile_time_eval inside jit, jax.vmap, pmap, shard_map, lax.scan/cond "
        "bodies, grad, a jitted training step): under jit it runs once, when the function is "
        "compiled, and its bytes become a constant of the compiled program, so every call would "
        "release the SAME noise; under vmap it runs once and its one key serves every row, so "
        "the rows share one noise draw. Either way differences of releases would be noise-free. "
        "Draw the key outside and pass it in: key = dpjax.os_key(); jitted_release(key, value), "
        "or one key per row: jax.vmap(release)(jax.random.split(dpjax.os_key(), rows), values)"
    )


@functools.lru_cache(maxsize=32)
def _key_data_layout(impl: Any, default_impl: str) -> tuple[tuple[int, ...], Any]:
    """Shape and dtype of one key's data for ``impl`` (``default_impl`` keys the cache)."""
    del default_impl
    data = jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0, impl=impl)))
    return tuple(data.shape), np.dtype(data.dtype)
