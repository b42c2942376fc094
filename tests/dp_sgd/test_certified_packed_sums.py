"""Issue 24: the speed work on the certified sums keeps their arithmetic exactly.

* :func:`dpjax.dp_sgd._certified.tree_sum` and the ghost T = 1 merges store each double-float
  pair as one complex array (one pass per merge instead of five). Packing is storage only: the
  tree must give, bit for bit, the pairs of a NumPy float32 reference doing the same TwoSum
  operations in the same order (NumPy float32 arithmetic is IEEE round-to-nearest).
* :func:`dpjax.dp_sgd._certified.ldexp_rows` (the accurate ghost branch's exponent scaling)
  claims ``x·2^e``: exact for normal entries with normal results, and at most the backend's
  flush (0) for subnormal ones. ``jnp.ldexp`` returned subnormal entries UNCHANGED on XLA:CPU
  (1e-39 "scaled" by 2^-1 stayed 1e-39; 2^-127 scaled by 2^119 stayed 2^-127): neither exact
  nor the flush the clipped sum applies.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpjax.dp_sgd import _certified, ghost

# rounding claims of compiled code: run on the users' -O3 code (tests/conftest.py)
pytestmark = pytest.mark.codegen

TINY32 = float(np.finfo(np.float32).tiny)


def _np_two_sum(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _np_tree(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The documented order of ``tree_sum``, in NumPy float32."""
    hi, lo = x, None
    while hi.shape[0] > 1:
        n, m = hi.shape[0], hi.shape[0] // 2
        if lo is None:
            top = _np_two_sum(hi[:m], hi[m : 2 * m])
        else:
            s, e = _np_two_sum(hi[:m], hi[m : 2 * m])
            top = _np_two_sum(s, e + (lo[:m] + lo[m : 2 * m]))
        if n % 2:
            last_lo = np.zeros_like(hi[2 * m :]) if lo is None else lo[2 * m :]
            top = (np.concatenate([top[0], hi[2 * m :]]), np.concatenate([top[1], last_lo]))
        hi, lo = top
    return hi[0], (np.zeros_like(hi[0]) if lo is None else lo[0])


def test_packed_tree_sum_is_bitwise_the_double_float_tree():
    r = np.random.default_rng(24)
    with np.errstate(over="ignore", invalid="ignore"):
        for n in (1, 2, 3, 5, 64, 257):
            scale = np.exp(r.uniform(-25, 25, (n, 1)))
            x = (r.standard_normal((n, 33)) * scale).astype(np.float32)
            hi, lo = jax.jit(_certified.tree_sum)(jnp.asarray(x))
            ref_hi, ref_lo = _np_tree(x)
            np.testing.assert_array_equal(np.asarray(hi), ref_hi)
            np.testing.assert_array_equal(np.asarray(lo), ref_lo)


def test_packed_merge_is_bitwise_df_add():
    r = np.random.default_rng(5)
    hi, part = r.standard_normal((2, 64, 9)) * np.exp(r.uniform(-20, 20, (2, 64, 1)))
    hi, part = hi.astype(np.float32), part.astype(np.float32)
    lo = (hi * np.float32(2.0**-30)).astype(np.float32)
    got = jax.jit(lambda h, lo_, p: _certified.df_add_packed(_certified.df_pack(h, lo_), p))(
        jnp.asarray(hi), jnp.asarray(lo), jnp.asarray(part)
    )
    s, e = _np_two_sum(hi, part)
    ref = _np_two_sum(s, e + lo)
    np.testing.assert_array_equal(np.asarray(jnp.real(got)), ref[0])
    np.testing.assert_array_equal(np.asarray(jnp.imag(got)), ref[1])


def test_ghost_dense_sum_within_its_certified_error():
    """The T = 1 grouped sum with packed merges: error ≤ pre_rel + depth·δ per coordinate."""
    r = np.random.default_rng(7)
    b, k, n = 300, 17, 5  # padded to whole groups; 3 scan steps
    a = (r.standard_normal((b, 1, k)) * np.exp(r.uniform(-8, 8, (b, 1, 1)))).astype(np.float32)
    g = (r.standard_normal((b, 1, n)) * np.exp(r.uniform(-8, 8, (b, 1, 1)))).astype(np.float32)
    keep = np.ones(b, bool)
    keep[3] = False
    a[3] = np.nan  # a dropped row must contribute 0, not NaN
    hi, lo = jax.jit(ghost._dense_clipped_sum, static_argnums=3)(
        jnp.asarray(a), jnp.asarray(g), jnp.asarray(keep), True
    )
    a64 = np.where(keep[:, None, None], a, 0.0).astype(np.float64)[:, 0]
    g64 = g.astype(np.float64)[:, 0]
    exact = a64.T @ g64
    mass = np.abs(a64).T @ np.abs(g64)
    rel = ghost._pre_rel([_t1_tap(k, n)], b, jnp.float32) + 64 * 7 * 2.0**-48
    got = np.asarray(hi, np.float64) + np.asarray(lo, np.float64)
    assert np.all(np.abs(got - exact) <= rel * mass * (1 + 1e-6) + 1e-30)


def _t1_tap(k: int, n: int):
    from dpjax.dp_sgd._ghost_trace import DenseTap

    return DenseTap(0, 0, 1, (0,), (0,), (0, 1), 1, k, n, (n,), jnp.float32, (k, n))


def _flush_or_exact(got: np.ndarray, x: np.ndarray, e: np.ndarray) -> None:
    want = np.ldexp(x.astype(np.float64), e[:, None])
    normal_in = np.abs(x) >= TINY32
    normal_out = (np.abs(want) >= TINY32) & (np.abs(want) <= np.finfo(np.float32).max)
    exact = normal_in & normal_out
    np.testing.assert_array_equal(got[exact], want[exact].astype(np.float32))
    rest = ~exact & (x != 0) & np.isfinite(want)
    # subnormal entry or result: the exact value (rounded once) or the flush to 0, nothing else
    ok = (got[rest] == 0) | (np.abs(got[rest] - want[rest]) <= 2.0**-149)
    assert ok.all(), (x[rest][~ok], got[rest][~ok], want[rest][~ok])


def test_ldexp_rows_exact_on_normals_and_flushes_subnormals():
    r = np.random.default_rng(11)
    x = (r.standard_normal((64, 40)) * np.exp2(r.integers(-140, 120, (64, 40)))).astype(np.float32)
    x[0, :3] = [1e-39, 2.0**-130, 1.0]  # subnormal entries next to a normal maximum
    x[1, :3] = [2.0**-127, 3 * 2.0**-126, 2.0**-120]  # max near tiny: scaled UP by 2^119
    e = -np.asarray(_certified.scale_exponent(jnp.asarray(x)))
    got = np.asarray(jax.jit(_certified.ldexp_rows)(jnp.asarray(x), jnp.asarray(e)))
    _flush_or_exact(got, x, e)
    # the accurate branch relies on it: every scaled row's maximum is in [1/2, 1)
    top = np.abs(got).max(axis=1)
    assert np.all((top >= 0.5) & (top < 1.0))


def test_ldexp_rows_extreme_exponents():
    x = jnp.asarray(
        [[1.5, -3.0, jnp.inf, 2.0**-100], [2.0**127, 1.0, 0.0, -(2.0**-60)]], jnp.float32
    )
    e = jnp.asarray([200, -252], jnp.int32)
    got = np.asarray(jax.jit(_certified.ldexp_rows)(x, e))
    assert got[0, 0] == np.inf and got[0, 1] == -np.inf and got[0, 2] == np.inf
    assert got[0, 3] == np.float32(2.0**100)
    assert got[1, 0] == np.float32(2.0**-125) and got[1, 2] == 0.0 and got[1, 3] == 0.0
    assert got[1, 1] == 0.0 or abs(got[1, 1]) <= 2.0**-149  # 2^-252: flushed (or rounded)


def test_tree_sum_without_a_complex_type_keeps_two_arrays():
    """float16 has no complex type: the unpacked fallback, same error bound (u = 2^-11)."""
    r = np.random.default_rng(3)
    x = (r.standard_normal((37, 8)) * np.exp(r.uniform(-3, 3, (37, 1)))).astype(np.float16)
    hi, lo = jax.jit(_certified.tree_sum)(jnp.asarray(x))
    assert hi.dtype == jnp.float16 and lo.dtype == jnp.float16
    x64 = x.astype(np.float64)
    got = np.asarray(hi, np.float64) + np.asarray(lo, np.float64)
    u = 2.0**-11
    bound = _certified.tree_depth(37) * 7 * u * u * np.abs(x64).sum(0)
    assert np.all(np.abs(got - x64.sum(0)) <= bound + 2.0**-24)
