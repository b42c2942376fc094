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
from typing import Any, NamedTuple

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
    """``x_row · 2^{e_row}`` as two products by exact powers of two (``e`` int32 (B,)).

    Exact wherever the entry and its result are normal floats. A backend that flushes
    subnormals (XLA:CPU sets FTZ/DAZ) makes a subnormal entry or a subnormal result 0, the
    same flush it applies to that entry in every other product, the clipped sum's included;
    a backend that keeps subnormals rounds a subnormal result once (≤ 2^-149 in float32).
    ``jnp.ldexp`` is neither on XLA:CPU: it returns a subnormal entry unchanged (measured).
    Each factor ``2^{⌊e/2⌋}``, ``2^{e − ⌊e/2⌋}`` is a normal float for |e| ≤ 2·(emax − 1), and
    the intermediate lies between the entry and the result, so it is normal when both are.
    """
    e = e.astype(jnp.int32).reshape(e.shape + (1,) * (x.ndim - 1))
    half = jnp.right_shift(e, 1)  # ⌊e/2⌋
    return x * _pow2(half, x.dtype) * _pow2(e - half, x.dtype)


def _pow2(k: jax.Array, dtype: Any) -> jax.Array:
    """``2^k`` exactly, built from its exponent bits, for k in the normal range (else clamped)."""
    info = jnp.finfo(dtype)
    bits = info.bits
    mant = info.nmant
    bias = int(info.maxexp) - 1
    k = jnp.clip(k, 1 - bias, bias)
    uint = {32: jnp.uint32, 64: jnp.uint64}[bits]
    return jax.lax.bitcast_convert_type((k + bias).astype(uint) << mant, dtype)


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


def automatic_scale(upper: jax.Array, scale: Any, stability: Any, eta: float) -> jax.Array:
    """``R/(U·(1+η) + γ)`` in U's dtype, every rounding upward in the denominator (AUTO-S).

    The denominator D is formed as ``inflate(fl(inflate(U, η) + γ), 0)``: ``inflate(U, η)`` ≥
    U·(1+η), the addition of γ > 0 loses at most u, and the final ``inflate`` (≥ 1 + 2u) wins it
    back, so D ≥ U·(1+η) whatever γ (γ rounded to 0 included). The factor R/D therefore
    satisfies the same inequality as :func:`certified_scale`'s R/max(U·(1+η), R): the product
    of the factor with what U bounds, rounding included, has norm ≤ R (< R: γ > 0). U = inf
    gives 0 (the example is dropped); U·(1+η) overflowing gives 0 as well.
    """
    r = jnp.asarray(scale, upper.dtype)
    g = jnp.asarray(stability, upper.dtype)
    return r / inflate(inflate(upper, eta) + g, 0.0)


def clip_factor(upper: jax.Array, clip: Any, eta: float, gamma: Any = None) -> jax.Array:
    """Flat clipping (``gamma`` None: :func:`certified_scale`), else :func:`automatic_scale`."""
    if gamma is None:
        return certified_scale(upper, clip, eta)
    return automatic_scale(upper, clip, gamma, eta)


def combine_norms(parts_sq_upper: list[jax.Array]) -> jax.Array:
    """Upper bound of √(Σ_l x_l) from per-part upper bounds x_l of squared norms."""
    total = sum(parts_sq_upper[1:], parts_sq_upper[0])
    return sqrt_up(inflate(total, gamma(len(parts_sq_upper), total.dtype)))


def finite_float_dtype(dtype: Any) -> bool:
    """Whether ``dtype`` is a floating dtype (clipping outputs are cast back to it)."""
    return bool(jnp.issubdtype(dtype, np.floating))


# ----------------------------------------------------------------------------- the batch sum
#
# The released sum Σ_i x_i of B per-example contributions (each of ℓ2 norm ≤ C_eff) is formed
# in a CONTROLLED order: a pairwise tree over the batch axis in double-float arithmetic (each
# node a pair (hi, lo) with hi + lo carrying the partial sum to ≈ u²; Knuth's TwoSum), then
# rounded ONCE to the output dtype. Per coordinate j, with A_j = Σ_i |x_ij| (Higham, 2nd ed.,
# §4.3 and §4.4, pairwise and compensated summation; Ogita, Rump, Oishi 2005, "Accurate sum
# and dot product", TwoSum), every node of height h satisfies
#     |lo| ≤ 2u·A_j   and   |hi + lo − exact| ≤ h·δ·A_j,   δ = 7u²,
# so the released value is off by at most (hδ + u_fin(1 + hδ))·A_j, and in ℓ2 (Minkowski)
# by at most that factor times Σ_i ‖x_i‖ ≤ B·C_eff. Clipping at C_eff = C/(1 + 2·rel) then
# keeps |fl(S_D) − fl(S_D′)| ≤ C_eff + err_D + err_D′ ≤ C for add/remove-one neighbours
# (Casacuberta, Shoemate, Vadhan, Wagaman 2022, "Widespread underestimation of sensitivity in
# differentially private libraries", CCS: the fix "bound n, add the rounding to the
# sensitivity").

_SIZE_BOUND = 2.0**40  # public upper bound on the number of coordinates of a released sum


def two_sum(a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Knuth's TwoSum: ``(s, e)`` with ``s = fl(a + b)`` and ``s + e = a + b`` exactly."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def df_add(x: tuple[jax.Array, jax.Array], y: tuple[jax.Array, jax.Array]):
    """Double-float sum of ``(hi, lo)`` pairs, renormalised (``|lo| ≤ u·|hi|``)."""
    s, e = two_sum(x[0], y[0])
    return two_sum(s, e + (x[1] + y[1]))


def df_pack(hi: jax.Array, lo: jax.Array) -> jax.Array:
    """A double-float pair stored as ONE complex array (``hi`` real part, ``lo`` imaginary).

    Speed only, no arithmetic: the pair's parts are read back unchanged by :func:`df_unpack`
    (a complex number is two floats side by side). A merge ``df_add`` whose result is packed
    compiles to one elementwise pass that writes one array; with two float outputs XLA:CPU
    splits it into about five passes, each of which re-reads its operands (measured: the
    T = 1 ghost sums' merges cost more than their matrix products). float32 parts give
    complex64, float64 parts complex128.
    """
    return jax.lax.complex(hi, lo)


def df_unpack(z: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The ``(hi, lo)`` parts of a :func:`df_pack` ed pair (exact)."""
    return jnp.real(z), jnp.imag(z)


def df_add_packed(z: jax.Array, hi: jax.Array, lo: jax.Array | None = None) -> jax.Array:
    """:func:`df_add` of a packed pair ``z`` and ``(hi, lo)`` (``lo`` None: 0), packed.

    The same operations as ``df_add(df_unpack(z), (hi, lo))``; with ``lo`` None the zero low
    part is not added (x + 0 = x exactly, so the result is the same).
    """
    zh, zl = df_unpack(z)
    s, e = two_sum(zh, hi)
    return df_pack(*two_sum(s, e + (zl if lo is None else zl + lo)))


def tree_sum_packed(x: jax.Array) -> jax.Array:
    """:func:`tree_sum` as one packed (complex) array of shape ``x.shape[1:]``."""
    n = x.shape[0]
    if n == 0:
        z = jnp.zeros(x.shape[1:], x.dtype)
        return df_pack(z, z)
    if n == 1:
        return df_pack(x[0], jnp.zeros_like(x[0]))
    packed = None
    while n > 1:
        m = n // 2
        if packed is None:
            top = df_pack(*two_sum(x[:m], x[m : 2 * m]))
            last = df_pack(x[2 * m :], jnp.zeros_like(x[2 * m :]))
        else:
            top = df_pack(*df_add(df_unpack(packed[:m]), df_unpack(packed[m : 2 * m])))
            last = packed[2 * m :]
        packed = jnp.concatenate([top, last]) if n % 2 else top
        # one stored array per level: fused levels would re-evaluate every node once per
        # use of its parts (measured: 50 ms instead of 1 for B = 1024 rows of 1034 entries)
        (packed,) = jax.lax.optimization_barrier((packed,))
        n = packed.shape[0]
    return packed[0]


def tree_sum(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Pairwise double-float sum over axis 0 in a fixed order: ``(hi, lo)`` of shape x.shape[1:].

    Level by level the first half of the rows is added to the second half (an odd last row
    is carried up unchanged), ⌈log2 B⌉ levels; every level is elementwise, so XLA cannot
    reorder it. The error is bounded by :func:`batch_sum_error`. Each level's pairs are
    packed (:func:`df_pack`): one pass per level.
    """
    if jnp.dtype(x.dtype) not in _PACKABLE:  # no complex type of that width: two arrays
        return _tree_sum_pairs(x)
    return df_unpack(tree_sum_packed(x))


_PACKABLE = (jnp.dtype(jnp.float32), jnp.dtype(jnp.float64))


def _tree_sum_pairs(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """:func:`tree_sum` with the pairs kept as two arrays (dtypes without a complex type)."""
    n = x.shape[0]
    if n == 0:
        z = jnp.zeros(x.shape[1:], x.dtype)
        return z, z
    hi, lo = x, jnp.zeros_like(x)
    first = True
    while n > 1:
        m = n // 2
        if first:
            top = two_sum(hi[:m], hi[m : 2 * m])
        else:
            top = df_add((hi[:m], lo[:m]), (hi[m : 2 * m], lo[m : 2 * m]))
        if n % 2:
            top = (
                jnp.concatenate([top[0], hi[2 * m :]]),
                jnp.concatenate([top[1], lo[2 * m :]]),
            )
        hi, lo = top
        first = False
        n = hi.shape[0]
    return hi[0], lo[0]


def pairwise_sum(x: jax.Array) -> jax.Array:
    """Plain pairwise sum over axis 0 in the fixed order of :func:`tree_sum` (one float each).

    Error ≤ γ_{⌈log2 n⌉}·Σ_i |x_i| per coordinate (Higham, 2nd ed., §4.2); for a few partial
    sums that already carry a larger error (ghost's grouped products) this is as good as the
    double-float tree at a third of the memory traffic.
    """
    n = x.shape[0]
    if n == 0:
        return jnp.zeros(x.shape[1:], x.dtype)
    while n > 1:
        m = n // 2
        top = x[:m] + x[m : 2 * m]
        x = jnp.concatenate([top, x[2 * m :]]) if n % 2 else top
        n = x.shape[0]
    return x[0]


def df_round(x: tuple[jax.Array, jax.Array], dtype: Any) -> jax.Array:
    """``hi + lo`` rounded once to ``dtype`` (the single final rounding of a released sum).

    A scalar ``lo`` under a non-scalar ``hi`` is the exact zero low part of a plain sum
    (the ghost embedding table): ``hi`` is only cast (no second table in memory).
    """
    if jnp.ndim(x[1]) == 0 and jnp.ndim(x[0]) > 0:
        return x[0].astype(dtype)
    return (x[0] + x[1]).astype(dtype)


def tree_depth(n: int) -> int:
    """Levels of :func:`tree_sum` over n rows: ⌈log2 n⌉."""
    return max(int(n) - 1, 0).bit_length()


def df_zeros(shape: tuple[int, ...], dtype: Any) -> tuple[jax.Array, jax.Array]:
    z = jnp.zeros(shape, dtype)
    return z, z


def batch_sum_error(
    rows: int,
    sum_dtype: Any,
    out_dtype: Any,
    *,
    stages: int = 1,
    depth: int | None = None,
    pre_rel: float = 0.0,
    clip: float = 1.0,
) -> float:
    """rel with ‖released − Σ_i x_i‖₂ ≤ rel·C_eff for ``rows`` contributions ‖x_i‖ ≤ C_eff.

    The released sum is formed by ``stages`` double-float summations in sequence (trees or
    sequential accumulations, each of depth ≤ ``depth``; default ⌈log2 rows⌉ + 2, one tree),
    each ended by
    ONE rounding to
    ``out_dtype`` (stage 2: e.g. micro-batch sums or per-device sums added up); ``pre_rel``
    is a relative error, per coordinate against Σ_i |x_ij|, made before the first stage
    (a contraction over a few examples inside a matrix product). Subnormals flushed to zero
    (FTZ/DAZ) add ≤ (B + 32·merges)·tiny per coordinate, counted with C_eff ≥ ``clip``/4.

    Raises:
        ValueError: the bound is useless (depth·δ > 0.9, or C_eff would fall below C/4).
    """
    u = unit_roundoff(sum_dtype)
    u_out = unit_roundoff(out_dtype)
    fin = u + (u_out * (1.0 + u) if u_out > u else 0.0)
    delta = u * u * (2.0 + (1.0 + u) * (1.9 + 2.0 * u) + 2.0 * (1.0 + u))
    depth = tree_depth(rows) + 2 if depth is None else depth
    b = depth * delta
    if b > 0.9:
        raise ValueError(f"no certified batch sum for {rows} rows in {jnp.dtype(sum_dtype).name}")
    err, grow = pre_rel, 1.0 + pre_rel
    for _ in range(stages):
        err += (b + fin * (1.0 + b)) * grow
        grow *= (1.0 + b) * (1.0 + fin)
    per_coord_abs = 33.0 * (rows + 64) * tiny(sum_dtype) * stages * 2.0
    abs_rel = math.sqrt(_SIZE_BOUND) * per_coord_abs / (clip / 4.0)
    rel = (rows * err + abs_rel) * (1.0 + 1e-9)
    return math.nextafter(rel, math.inf)


def summation_shrink(
    rows: int,
    sum_dtype: Any = jnp.float32,
    out_dtype: Any = jnp.float32,
    *,
    stages: int = 1,
    depth: int | None = None,
    pre_rel: float = 0.0,
    clip: float = 1.0,
) -> float:
    """The factor f = 1/(1 + 2·rel) (rounded down) by which the clip norm is multiplied.

    With every contribution clipped to C_eff = f·C, adding or removing one of ``rows`` rows
    moves the released sum by ≤ C_eff·(1 + 2·rel) ≤ C (see :func:`batch_sum_error`).

    Raises:
        ValueError: where f < 1/4 (the rounding bound eats most of C: use smaller batches,
            micro-batches, or float64 sums).
    """
    rel = batch_sum_error(
        rows, sum_dtype, out_dtype, stages=stages, depth=depth, pre_rel=pre_rel, clip=clip
    )
    # 8u below: C·f rounded to the wide dtype stays ≤ the real C/(1 + 2·rel)
    f = math.nextafter(1.0 / (1.0 + 2.0 * rel), 0.0) * (1.0 - 8.0 * unit_roundoff(wide_dtype()))
    if f < 0.25:
        raise ValueError(
            f"batch of {rows} rows: the certified rounding bound of its sum in "
            f"{jnp.dtype(sum_dtype).name} would shrink the clip norm by {f:.3g} (< 1/4); "
            "use fewer rows per released sum, micro-batches or float64"
        )
    return f


class Release(NamedTuple):
    """How the sums of one clipped-gradient call end up in a released sum (all public).

    Attributes:
        rows: rows (padding included) whose contributions enter one released sum (≥ the
            call's rows).
        stages: roundings to the output dtype on the way: 1 when the call's result is the
            released sum, 2 when the call's rounded sums are added up once more (micro-batch
            accumulation, devices) with a double-float sum.
        depth: a bound on the depth of every double-float summation on the way.
        clip: C, the bound the release is certified against.
    """

    rows: int
    stages: int
    depth: int
    clip: float


def release_shrink(
    release: Release, sum_dtypes: list[Any], out_dtypes: list[Any], pre_rel: float = 0.0
) -> tuple[float, float]:
    """``(f, rel)`` of :func:`summation_shrink` for the least precise of the given dtypes."""
    sd = max(sum_dtypes, key=unit_roundoff, default=jnp.dtype(jnp.float32))
    od = max(out_dtypes, key=unit_roundoff, default=jnp.dtype(jnp.float32))
    kwargs = dict(stages=release.stages, depth=release.depth, pre_rel=pre_rel, clip=release.clip)
    rel = batch_sum_error(release.rows, sd, od, **kwargs)
    return summation_shrink(release.rows, sd, od, **kwargs), rel


def accumulation_scale(call_shrink: float, call_rows: int, calls: int, dtype: Any, clip: float):
    """ρ ≤ 1 such that ρ·(double-float sum of ``calls`` rounded call sums) has sensitivity ≤ C.

    Each call's sum of ``call_rows`` contributions (norm ≤ C_m = f·C, f = ``call_shrink``) is
    within r_m·C_m of exact, r_m = (1/f − 1)/2 (:func:`summation_shrink` certified the call
    alone). Adding the k sums sequentially in double-float and rounding once errs by
    ≤ s·Σ‖Ŝ_m‖, s = b + u(1 + b), b = (k + 2)·7u², with Σ‖Ŝ_m‖ ≤ (k·m + k·r_m)·C_m; the final
    product by ρ by ≤ u·ρ‖T̂‖. So adding or removing one example moves ρ·T̂ by
    ≤ ρ·C_m·(1 + 2k·r_m + 2(s + u(1 + s))(k·m + k·r_m)) + abs, and ρ is the reciprocal of
    that factor (rounded down); 1 where the calls already cover it.

    Returns:
        ρ as a Python float (1.0: no scaling needed).
    """
    if int(calls) == 1:
        return 1.0  # 0 + Ŝ is exact: the call's own certificate is the release's
    u = unit_roundoff(dtype)
    r_m = (1.0 / call_shrink - 1.0) / 2.0
    k, rows = int(calls), int(calls) * int(call_rows)
    delta = u * u * (2.0 + (1.0 + u) * (1.9 + 2.0 * u) + 2.0 * (1.0 + u))
    b = (k + 2) * delta
    s = b + u * (1.0 + b)
    mass = rows + k * r_m
    abs_rel = math.sqrt(_SIZE_BOUND) * 66.0 * (rows + 64) * tiny(dtype) / (clip / 4.0)
    factor = 1.0 + 2.0 * k * r_m + 2.0 * (s + u * (1.0 + s)) * mass + abs_rel
    rho = 1.0 / (call_shrink * factor * (1.0 + 1e-14))  # covers this float64 arithmetic
    if rho >= 1.0:
        return 1.0
    return math.nextafter(rho, 0.0) * (1.0 - 8.0 * u)
