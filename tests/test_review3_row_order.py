"""Review 3 (adversarial): row swaps that keep BandMF's keyed row-order digest.

A swap of two rows that differ in ONE bit of ONE leaf must change the digest, whatever the
leaf's dtype (narrow dtypes are widened; a bit lost there would let the swap pass), and
whichever leaf holds the difference (leaves are salted by their index).
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from dpjax.dp_sgd.matrix_factorization.row_order import init_row_order, row_order_digest

N = 8
KEY = init_row_order(jax.random.key(11)).key
_digest = jax.jit(row_order_digest)


def _swap01(x):
    x = np.array(x)
    x[[0, 1]] = x[[1, 0]]
    return x


def _rows_differing_in_one_bit(dtype, bit):
    """(N, 3) rows of ``dtype``, equal except that row 1 has ``bit`` flipped in column 2."""
    dtype = np.dtype(dtype)
    raw = np.zeros((N, 3 * dtype.itemsize), np.uint8)
    raw[:, 0] = 3  # some common content
    raw = raw.view(dtype).copy()
    flipped = raw[1:2].view(np.uint8).copy()
    flipped[0, 2 * dtype.itemsize + bit // 8] ^= np.uint8(1 << (bit % 8))
    raw[1:2] = flipped.view(dtype)
    return raw


DTYPES = [
    np.int8, np.uint8, np.int16, np.uint16, np.float16, ml_dtypes.bfloat16, np.int32,
    np.uint32, np.float32, np.complex64, ml_dtypes.float8_e4m3fn,
]  # fmt: skip


def _leaves(changed=None, bit=0):
    """One leaf per dtype (rows all equal), except ``changed`` whose row 1 differs in ``bit``."""
    out = {}
    for dtype in DTYPES:
        name = np.dtype(dtype).name
        rows = _rows_differing_in_one_bit(dtype, bit) if name == changed else None
        out[name] = rows if rows is not None else _rows_differing_in_one_bit(dtype, 0)[[0] * N]
    return out


@pytest.mark.slow
def test_a_swap_of_rows_differing_in_the_top_or_bottom_bit_of_any_dtype_changes_the_digest():
    """One compiled digest for all: every dtype is a leaf of one tree (same shapes each time)."""
    for dtype in DTYPES:
        name, bits = np.dtype(dtype).name, 8 * np.dtype(dtype).itemsize
        for bit in (0, bits - 1):
            leaves = _leaves(name, bit)
            assert not np.array_equal(
                leaves[name][0].view(np.uint8), leaves[name][1].view(np.uint8)
            )
            swapped = dict(leaves, **{name: _swap01(leaves[name])})
            as_jax = lambda tree: jax.tree.map(jnp.asarray, tree)  # noqa: E731
            same = np.array_equal(_digest(KEY, as_jax(leaves)), _digest(KEY, as_jax(swapped)))
            assert not same, (name, bit)


@pytest.mark.slow
def test_a_swap_of_bool_rows_and_of_key_rows_changes_the_digest():
    flags = np.zeros((N, 1), bool)
    flags[1] = True
    keys = jax.random.split(jax.random.key(0), N)
    order = jnp.array([1, 0, *range(2, N)])
    data = [jnp.asarray(flags), keys]
    for swapped in ([jnp.asarray(flags)[order], keys], [jnp.asarray(flags), keys[order]]):
        assert not np.array_equal(_digest(KEY, data), _digest(KEY, swapped))


def test_moving_a_column_to_another_leaf_changes_the_digest():
    """Leaves are salted by index: (x, y) and (y, x) are other data, not the same rows."""
    x = jnp.arange(N, dtype=jnp.float32)[:, None]
    y = jnp.zeros((N, 1), jnp.float32)
    assert not np.array_equal(_digest(KEY, [x, y]), _digest(KEY, [y, x]))
