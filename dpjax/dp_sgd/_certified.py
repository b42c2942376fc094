r"""Certified floating-point bounds for per-example clipping (shared by the vmap and ghost paths).

Every clip factor must come from an UPPER bound on the norm of what is actually added to the
sum, rounding included. The tools here bound the error of the reductions the clipping code
performs, for ANY summation order XLA picks (Higham, "Accuracy and Stability of Numerical
Algorithms", 2nd ed., Lemma 3.1 and §3.1: a sum of n terms has relative error at most
γ_n = n·u/(1 − n·u) of the sum of the absolute values; u is the unit roundoff).

Dtype rule: norms, bounds and clip factors are computed in :func:`wide_dtype` (float64 when JAX
runs with x64, else float32), never in the inputs' dtype and never picked by itemsize;
the clipped sums in :func:`sum_dtype` (the widest float among the operands, at least float32).
Integer operands are converted to these float dtypes before any arithmetic.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

HIGHEST = jax.lax.Precision.HIGHEST

# A sum of squares whose γ_d exceeds this (d > 16382 in float32; never in float64) is split in
# two levels (≈√d each) so that γ stays small. One level is much faster on XLA:CPU.
_ONE_LEVEL_GAMMA = 2.0**-10


def wide_dtype() -> Any:
    """float64 when x64 is enabled, else float32: the dtype of norms and clip factors."""
    return jnp.dtype(jnp.float64) if jax.config.jax_enable_x64 else jnp.dtype(jnp.float32)


def sum_dtype(*dtypes: Any) -> Any:
    """The widest floating dtype among ``dtypes``, at least float32 (integers are ignored)."""
    bits = [jnp.finfo(d).bits for d in dtypes if jnp.issubdtype(d, jnp.floating)]
    wide = wide_dtype()
    return wide if max(bits, default=32) > 32 else jnp.dtype(jnp.float32)


def output_dtype(param_dtype: Any) -> Any:
    """dtype of a parameter's clipped sum: the parameter's, widened to at least float32.

    bfloat16/float16 sums are returned in float32: rounding the sum of a data set and of its
    neighbour to 8 or 11 bits separately moves their difference by ≈ 2⁻⁹·‖S‖, far more than the
    clip norm allows. Add the noise first, then cast (post-processing).
    """
    return sum_dtype(param_dtype)


def unit_roundoff(dtype: Any) -> float:
    """u = eps/2 of a floating dtype (round to nearest)."""
    return float(jnp.finfo(dtype).eps) / 2.0


def tiny(dtype: Any) -> float:
    """The smallest normal number: the absolute error of one operation that underflows (FTZ)."""
    return float(jnp.finfo(dtype).tiny)


def gamma(n: int, dtype: Any) -> float:
    """γ_n = n·u/(1 − n·u), rounded up; a ValueError where n·u ≥ 1/2 (no useful bound)."""
    nu = max(int(n), 1) * unit_roundoff(dtype)
    if nu >= 0.5:
        raise ValueError(
            f"reduction length must be < {int(0.5 / unit_roundoff(dtype))} for a certified "
            f"bound in {jnp.dtype(dtype).name}; got {n}"
        )
    return math.nextafter(nu / (1.0 - nu), math.inf) * (1.0 + 1e-12)


def compose(*rels: float) -> float:
    """Relative error of a chain of operations: Π(1 + ρ_i) − 1, rounded up."""
    out = 1.0
    for r in rels:
        out *= 1.0 + r
    return (out - 1.0) * (1.0 + 1e-12) + 1e-300


def inflate(x: jax.Array, rel: float) -> jax.Array:
    """An upper bound of ``x·(1 + rel)`` for ``x ≥ 0`` computed in ``x``'s dtype, rounding included.

    The constant 1 + rel + 4u rounds to at least 1 + rel + 2u, and the product loses at most one
    more u, so the result is ≥ x·(1 + rel) (0 and inf map to themselves).
    """
    c = 1.0 + rel + 4.0 * unit_roundoff(x.dtype)
    return x * jnp.asarray(c, x.dtype)


def sqrt_up(x: jax.Array) -> jax.Array:
    """An upper bound of √x for x ≥ 0 (NaN/inf propagate; negative inputs are clamped to 0)."""
    return inflate(jnp.sqrt(jnp.maximum(x, jnp.zeros((), x.dtype))), 0.0)


def row_sq_norms(x: jax.Array, dtype: Any) -> tuple[jax.Array, jax.Array]:
    """Per-row ``Σ_j x_j²`` of ``x`` (B, ...) in ``dtype``, and a certified upper bound of it.

    One reduction of any order has relative error ≤ γ_{d+2} (the squares and the conversion
    included). Where that exceeds 2⁻¹⁰ (d > 16382 in float32) the rows are reduced in two
    levels (blocks of r ≈ √d, then the m = d/r block sums, an ``optimization_barrier`` between
    them), so the bound is ≈ γ_r + γ_m instead of γ_d (0.04 for d = 6.7·10⁵ in float32). r
    divides d where a divisor near √d exists (no copy); otherwise the rows are zero-padded.

    Returns:
        ``(sq, sq_upper)``, both (B,): the computed value and an upper bound of the exact
        sum of squares of ``x``'s entries (the conversion to ``dtype`` included).
    """
    b = x.shape[0]
    flat = x.reshape(b, -1).astype(dtype)
    d = flat.shape[1]
    if gamma(d + 2, dtype) <= _ONE_LEVEL_GAMMA:
        sq = jnp.sum(jnp.square(flat), axis=1)
        rel = compose(gamma(d + 2, dtype), unit_roundoff(dtype))
    else:
        r = _block_length(d)
        m = -(-d // r)
        if m * r != d:
            flat = jnp.pad(flat, ((0, 0), (0, m * r - d)))
        partial = jnp.sum(jnp.square(flat.reshape(b, m, r)), axis=2)
        # XLA merges consecutive reductions (even a batched dot followed by a sum) into one
        # reduction of any order; the barrier keeps the two levels apart
        (partial,) = jax.lax.optimization_barrier((partial,))
        sq = jnp.sum(partial, axis=1)
        rel = compose(gamma(r + 2, dtype), gamma(m, dtype), unit_roundoff(dtype))
    return sq, sq_upper_from(sq, rel, d)


def _block_length(d: int) -> int:
    """A divisor of d within a factor 8 of √d (the one nearest √d), else ⌈√d⌉ (then padded)."""
    root = math.isqrt(d)
    for delta in range(0, 7 * root // 8 + 1):
        for r in (root - delta, root + 1 + delta):
            if r >= max(root // 8, 2) and d % r == 0:
                return r
    return root + 1


def sq_upper_from(sq: jax.Array, rel: float, n: int) -> jax.Array:
    """Upper bound of a sum of ``n`` squares computed as ``sq`` with relative error ≤ ``rel``.

    The exact sum is ≤ sq/(1 − rel); 4·(n+2)·tiny covers squares and sums that underflow.
    """
    floor = jnp.asarray(4.0 * (n + 2) * tiny(sq.dtype), sq.dtype)
    return inflate(inflate(sq, rel / (1.0 - rel)) + floor, 0.0)


def scale_exponent(x: jax.Array) -> jax.Array:
    """Per-row exponent e with max|x_row| < 2^e (0 for zero or non-finite rows), int32 (B,)."""
    m = jnp.max(jnp.abs(x.reshape(x.shape[0], -1)), axis=1)
    _, e = jnp.frexp(jnp.where(jnp.isfinite(m), m, jnp.zeros((), m.dtype)))
    return e.astype(jnp.int32)


def ldexp_rows(x: jax.Array, e: jax.Array) -> jax.Array:
    """``x_row · 2^{e_row}`` (exact unless it over- or underflows)."""
    e = e.reshape(e.shape + (1,) * (x.ndim - 1))
    return jnp.ldexp(x, e)


def shrink(wide: Any, sum_dtypes: list[Any], out_dtypes: list[Any]) -> float:
    """η of the factor C/(U·(1+η)): covers the rounding of the factor and of its application.

    The factor is C divided by U·(1+η), both rounded in ``wide`` (2u), cast to the sum dtype
    (u), multiplied into the example (u), and the finished sum is cast to the parameter dtype
    (u of the output dtype where it is narrower than the sum dtype).
    """
    u_w = unit_roundoff(wide)
    u_s = max((unit_roundoff(d) for d in sum_dtypes), default=0.0)
    u_o = max(
        (
            unit_roundoff(o)
            for s, o in zip(sum_dtypes, out_dtypes, strict=True)
            if jnp.finfo(o).bits < jnp.finfo(s).bits
        ),
        default=0.0,
    )
    return compose(u_w, u_w, u_w, u_s, u_s, u_s, u_o)


def certified_scale(upper: jax.Array, clip: Any, eta: float) -> jax.Array:
    """``min(1, C/(U·(1+η)))`` in U's dtype: 1 where U·(1+η) ≤ C, 0 where U is inf.

    ``upper`` is an upper bound on the norm of what the factor multiplies; the product of the
    factor with it, rounding included, has norm ≤ C (with ``eta`` from :func:`shrink`).
    """
    c = jnp.asarray(clip, upper.dtype)
    return c / jnp.maximum(inflate(upper, eta), c)


def combine_norms(parts_sq_upper: list[jax.Array]) -> jax.Array:
    """Upper bound of √(Σ_l x_l) from per-part upper bounds x_l of squared norms."""
    total = sum(parts_sq_upper[1:], parts_sq_upper[0])
    return sqrt_up(inflate(total, gamma(len(parts_sq_upper), total.dtype)))


def finite_float_dtype(dtype: Any) -> bool:
    """Whether ``dtype`` is a floating dtype (clipping outputs are cast back to it)."""
    return bool(jnp.issubdtype(dtype, np.floating))
