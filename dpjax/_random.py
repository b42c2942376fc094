r"""Gaussian and Laplace samplers with a far-reaching tail, built from 64 random bits.

``jax.random.normal`` maps a uniform on a 2⁻²³ grid through √2·erfinv: in float32 its support
is [−5.42, +5.22] (bfloat16: [−2.89, +2.52], 128 values). Under DP-SGD the missing tail is a δ
floor (:func:`dpjax.accounting.noise_truncation_delta`) that exceeds the usual δ = 1e-5 at common
settings. The samplers here draw TWO 32-bit words per coordinate:

* one bit is the sign (the top bit; a negative coordinate reads the other bits complemented,
  so all-zero words give the largest positive and all-one words the largest negative value),
  the other 63 bits give a uniform U on the midpoint grid
  {(k + ½)·2⁻⁶³ : 0 ≤ k < 2⁶³} ⊂ (0, 1], so P[U ≤ u] = u up to one cell (2⁻⁶³);
* Gaussian: |Z| = −ndtri(U/2) (Φ̄⁻¹ evaluated where it is accurate: in the tail, not through
  erfinv(1 − tiny)); Laplace: |L| = −log U.

Support (measured by feeding all-zero / all-one words, U = 2⁻⁶⁴; :func:`gaussian_support_max`):
|Z| ≤ Φ̄⁻¹(2⁻⁶⁵) = 9.155 (float32 and float64), |L| ≤ 64·ln 2 = 44.36. δ floor
(:func:`dpjax.accounting.noise_truncation_delta`): per release at least
q·max(Φ̄(9.155 − 1/σ), 1 − (1 − 2⁻⁶⁴)^d) for d coordinates — the top value is an atom of mass
2⁻⁶⁴ on every coordinate — which is below 1e-12 at σ ≥ 0.5 for d ≤ 1.8·10⁷. Cost: twice
the random bits of ``jax.random.normal``. Noise is drawn in at least float32 (bfloat16,
float16 and integer leaves get float32 noise, :func:`noise_dtype`); the callers add it in that
dtype and cast the sum to the leaf's dtype afterwards (post-processing).

Porosity: these are still FLOATING-POINT samplers. Their outputs lie on an irregular grid, so
``x + Z`` on D takes values that ``x' + Z`` on D′ cannot (Mironov 2012, "On significance of the
least significant bits for differential privacy", CCS): an attacker who sees the exact float can
tell D from D′ with a probability no noise scale removes. DP-SGD's guarantee is stated for the
model trained with the real-number mechanism; releases of real data to untrusted parties need
OS-seeded keys and non-porous noise (:func:`dpjax.mechanisms.discrete_laplace`).
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

__all__ = [
    "noise_dtype",
    "normal",
    "laplace",
    "exponential",
    "gumbel",
    "legacy_gaussian_support_max",
    "gaussian_tail",
    "gaussian_support_max",
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


def _sign_and_flip(word: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Sign = the top bit of ``word``; flip = all-ones where negative, so that a negative
    coordinate reads its magnitude bits complemented: all-one words give −(largest magnitude),
    mirroring all-zero words → +(largest magnitude). The law is unchanged (~ is a bijection)."""
    negative = (word >> jnp.uint32(31)) == jnp.uint32(1)
    flip = jnp.where(negative, jnp.uint32(0xFFFFFFFF), jnp.uint32(0))
    return negative, flip


def _unit_and_sign(key: jax.Array, shape: tuple[int, ...], dtype: Any):
    """Two words per coordinate: the sign bit and U = (k + ½)·2⁻⁶³ ∈ (0, 1] from the 63-bit k.

    U is rounded to ``dtype`` (float32 keeps 24 significant bits — exact near 0, where the tail
    lives); its smallest value is 2⁻⁶⁴, so P[U ≤ u] = u up to one 2⁻⁶³ cell.
    """
    dtype = _check_wide(dtype)
    hi, lo = jax.random.bits(key, (2, *shape), jnp.uint32)
    return _unit_and_sign_of_words(hi, lo, dtype)


def _unit_and_sign_of_words(hi: jax.Array, lo: jax.Array, dtype: Any):
    """:func:`_unit_and_sign` of given words: ``hi`` gives the sign and the top 31 bits of k,
    ``lo`` its low 32 bits (elementwise)."""
    negative, flip = _sign_and_flip(hi)
    u = (
        ((hi ^ flip) & jnp.uint32(_LOW31)).astype(dtype) * jnp.asarray(2.0**-31, dtype)
        + (lo ^ flip).astype(dtype) * jnp.asarray(2.0**-63, dtype)
        + jnp.asarray(2.0**-64, dtype)
    )
    return jnp.minimum(u, jnp.asarray(1.0, dtype)), negative


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
    (issue 15).
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


def normal(key: jax.Array, shape: tuple[int, ...] = (), dtype: Any = np.float32) -> jax.Array:
    """I.i.d. N(0, 1) of ``shape`` in ``dtype`` (float32 or float64): ±Φ̄⁻¹(U/2).

    Support (all-zero / all-one words, :func:`gaussian_support_max`): |Z| ≤ Φ̄⁻¹(2⁻⁶⁵) = 9.155
    in float32 and float64. See the module docstring for the construction.
    """
    return _sample_words(key, tuple(shape), dtype, _normal_of_words)


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

    Example:
        >>> import jax
        >>> key = os_key()
        >>> key.shape, jax.random.key_data(key).dtype.name
        ((), 'uint32')
    """
    shape, dtype = _key_data_layout(impl, jax.config.jax_default_prng_impl)
    nbytes = np.dtype(dtype).itemsize * math.prod(shape)
    words = np.frombuffer(secrets.token_bytes(nbytes), dtype=dtype).reshape(shape)
    return jax.random.wrap_key_data(words, impl=impl)


@functools.lru_cache(maxsize=32)
def _key_data_layout(impl: Any, default_impl: str) -> tuple[tuple[int, ...], Any]:
    """Shape and dtype of one key's data for ``impl`` (``default_impl`` keys the cache)."""
    del default_impl
    data = jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0, impl=impl)))
    return tuple(data.shape), np.dtype(data.dtype)
