r"""A keyed digest of the data's row order, kept in the SECRET state of a banded-MF run.

With ``make_private(noise=BandMF(bands=b))`` step t samples part t mod b, and the part of a
record is its ROW INDEX mod b (:class:`~dpjax.dp_sgd.matrix_factorization.config.
CyclicPoissonSampler`): the order of the rows is part of the plan. A run resumed on the same
records in another order lets a record take part in steps less than b apart, which breaks the
b-min-separation that the ⌈T/b⌉-round accounting needs (Choquette-Choo et al. 2023,
"(Amplified) banded matrix factorization", Theorem 4). So the state records a digest of the
rows, in order, from its first step on, and ``step``/``fit`` refuse other data.

The digest is KEYED by the run (its key is derived from ``make_private``'s key and lives in
the state): an unkeyed digest of private data would be a fingerprint of the data set, and the
public ledger must stay a function of public constants. It sits in the correlated-noise state,
which :func:`dpjax.dp_sgd.public_opt_state` reduces to its count, so it is never published.

Construction (one pass over the data, jit-able, 2 × 32 bits): every leaf is read as its
exact bits (``uint32`` words per row; narrower dtypes widened exactly), each word is xored
with a keyed per-column salt and scrambled by a bijective multiply–xorshift, each row is
reduced to two keyed linear combinations r_i (mod 2³²), and the digest is
Σ_i mix(r_i ⊕ mix(i + s)) per lane: a function of every row's bits AND its index. It is a
check against a wrong row order or other data (a reorder collides with probability about
2⁻⁶⁴ over the key), not a cryptographic MAC against an adversary who can read the state.
"""

from __future__ import annotations

import weakref
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from dpjax import _validate

__all__ = ["RowOrder", "init_row_order", "row_order_digest"]

#: Lanes of the digest (uint32 each).
LANES = 2
#: ``fold_in`` tag that derives the digest key from the run's key ("rows").
ROW_ORDER_TAG = 0x726F7773
#: ``fold_in`` tag of the position salt ("pos"; leaves use their index 0, 1, …).
_POSITION_TAG = 0x706F73
_M1 = np.uint32(0x7FEB352D)
_M2 = np.uint32(0x846CA68B)


class RowOrder(NamedTuple):
    """The secret record of a banded-MF run's data order.

    Attributes:
        key: uint32 raw key data of the digest (fixed for the run; SECRET).
        digest: uint32[2], :func:`row_order_digest` of the data of the run's first step
            (zeros before it; SECRET).
    """

    key: jax.Array
    digest: jax.Array


def init_row_order(run_key: jax.Array) -> RowOrder:
    """The row-order record of a new run: a key derived from ``run_key``, no digest yet."""
    key = jax.random.fold_in(run_key, ROW_ORDER_TAG)
    return RowOrder(jax.random.key_data(key), jnp.zeros((LANES,), jnp.uint32))


def _mix(x: jax.Array) -> jax.Array:
    """A bijective scramble of uint32 words (the 'lowbias32' multiply–xorshift)."""
    x = x ^ (x >> 16)
    x = x * _M1
    x = x ^ (x >> 15)
    x = x * _M2
    return x ^ (x >> 16)


def _row_words(leaf: Any) -> jax.Array:
    """The exact bits of each row of ``leaf`` as ``uint32[n, m]`` (m ≥ 1)."""
    x = jnp.asarray(leaf)
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    n = x.shape[0]
    x = jnp.reshape(x, (n, -1))
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        x = jnp.concatenate([jnp.real(x), jnp.imag(x)], axis=1)
    size = jnp.dtype(x.dtype).itemsize
    if x.dtype == jnp.bool_ or (jnp.issubdtype(x.dtype, jnp.integer) and size < 4):
        # exact: every value of these dtypes fits in int32
        words = jax.lax.bitcast_convert_type(x.astype(jnp.int32), jnp.uint32)
    elif size == 2:
        words = jax.lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.uint32)
    elif size == 1:
        words = jax.lax.bitcast_convert_type(x, jnp.uint8).astype(jnp.uint32)
    else:
        words = jax.lax.bitcast_convert_type(x, jnp.uint32)  # 64-bit: (n, m, 2)
    words = jnp.reshape(words, (n, -1))
    if words.shape[1] == 0:  # an empty row still has an index
        words = jnp.zeros((n, 1), jnp.uint32)
    return words


def row_order_digest(key_data: jax.Array, data: Any) -> jax.Array:
    r"""The keyed digest (uint32[2]) of ``data``'s rows in order (one pass, jit-able).

    .. math::  D_\ell = \sum_i \mathrm{mix}\big(r_{i\ell} \oplus \mathrm{mix}(i + s_\ell)\big),
       \quad r_{i\ell} = \sum_j a_{j\ell}\,\mathrm{mix}(w_{ij} \oplus t_j) \pmod{2^{32}}

    over the uint32 words w_ij of row i (all leaves), with keyed salts t, s and coefficients a.

    Args:
        key_data: the digest key (:attr:`RowOrder.key`).
        data: a pytree of arrays with a common leading axis n (the rows).

    Returns:
        ``uint32[2]``: equal for the same rows in the same order (bit for bit); another order
        or other rows give another digest except with probability about 2⁻⁶⁴ over the key.
    """
    key = jax.random.wrap_key_data(jnp.asarray(key_data, jnp.uint32))
    leaves = jax.tree.leaves(data)
    rows = jnp.zeros((jnp.shape(leaves[0])[0], LANES), jnp.uint32)
    for i, leaf in enumerate(leaves):
        words = _row_words(leaf)
        salt_key, coef_key = jax.random.split(jax.random.fold_in(key, i))
        salt = jax.random.bits(salt_key, (words.shape[1],), jnp.uint32)
        coef = jax.random.bits(coef_key, (LANES, words.shape[1]), jnp.uint32) | np.uint32(1)
        mixed = _mix(words ^ salt)
        rows = rows + jnp.stack([jnp.sum(mixed * c, axis=1, dtype=jnp.uint32) for c in coef], 1)
    position_salt = jax.random.bits(jax.random.fold_in(key, _POSITION_TAG), (LANES,), jnp.uint32)
    index = jnp.arange(rows.shape[0], dtype=jnp.uint32)[:, None]
    return jnp.sum(_mix(rows ^ _mix(index + position_salt)), axis=0, dtype=jnp.uint32)


# ----------------------------------------------------------------------------- in make_private

_REFUSED = (
    "the rows of this run in the order of its first step (BandMF's parts are row indices mod "
    "bands: a record moved to another row can be sampled in steps less than bands apart, and "
    "the ⌈T/b⌉-round accounting no longer holds); pass the same data in the same order, or "
    "start a new run (make_private with a new key) on the new data"
)


def attach(opt_state: tuple, record: RowOrder) -> tuple:
    """``make_private``'s optimizer state (noise state first) with ``record`` in its noise
    state."""
    return (opt_state[0]._replace(row_order=record),) + tuple(opt_state[1:])


def record_of(opt_state: Any) -> RowOrder:
    """The :class:`RowOrder` of a banded-MF state (``ValueError`` naming ``state`` if none)."""
    record = getattr(opt_state[0], "row_order", None) if isinstance(opt_state, tuple) else None
    if not isinstance(record, RowOrder):
        _validate.fail(
            "state",
            "a BandMF state without the record of its data's row order",
            "a PrivateState of make_private(noise=BandMF(...)) from init / step / fit (a "
            "state without the record cannot show that its steps saw one row order)",
        )
    return record


def checked_in_graph(count: jax.Array, opt_state: tuple, record: RowOrder, digest: jax.Array):
    """``(opt_state with the digest recorded, ok)``: ok iff the state's first step
    (``count == 0``) or the recorded digest equals ``digest`` (jit-able)."""
    ok = (count == 0) | jnp.all(record.digest == digest)
    recorded = RowOrder(record.key, jnp.where(ok, digest, record.digest))
    return attach(opt_state, recorded), ok


def _is_concrete(x: Any) -> bool:
    return not isinstance(x, jax.core.Tracer)


class HostCheck:
    """The host-side check of ``step``/``fit``: digest once per data object, refuse a change.

    The digest of a data set of ``jax.Array`` leaves (immutable) is cached by the identity of
    the leaves and of the record's key (weak references: the cache keeps no data alive), and
    ``step`` puts that very digest object back into the state it returns: a loop over the
    same data (``fit`` puts it on the device once) computes one digest and syncs once. Other
    data, a NumPy array (mutable: digested at every call) or a restored state is compared on
    the host. Under your own ``jax.jit`` the check is in the step's program
    (:func:`checked_in_graph`; NaN parameters on a mismatch).
    """

    def __init__(self) -> None:
        self._digest = jax.jit(row_order_digest)
        self._cache: tuple | None = None

    def digest(self, record: RowOrder, data: Any, steps_done: Any) -> jax.Array:
        """The digest of ``data`` under ``record``'s key, after refusing data whose digest
        differs from the recorded one (``steps_done()`` > 0: the record is set).

        Raises:
            ValueError: (naming ``data``) rows other than those of the run's first step, or
                the same rows in another order.
        """
        leaves = jax.tree.leaves(data)
        if not all(_is_concrete(x) for x in [*leaves, record.key, record.digest]):
            return row_order_digest(record.key, data)
        immutable = all(isinstance(x, jax.Array) for x in leaves)
        cache = self._cache
        if (
            immutable
            and cache is not None
            and cache[0]() is record.key
            and len(cache[1]) == len(leaves)
            and all(ref() is leaf for ref, leaf in zip(cache[1], leaves, strict=True))
        ):
            digest = cache[2]
        else:
            digest = self._digest(record.key, data)
            refs = (weakref.ref(record.key), tuple(weakref.ref(x) for x in leaves))
            self._cache = (*refs, digest) if immutable else None
        if record.digest is not digest and steps_done() > 0:
            if not np.array_equal(np.asarray(record.digest), np.asarray(digest)):
                _validate.fail("data", "rows whose digest differs from the run's", _REFUSED)
        return digest
