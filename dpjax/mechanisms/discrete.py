r"""A non-porous Laplace mechanism: discrete Laplace noise on a power-of-two grid.

The textbook float Laplace sampler f(D) + b·sign·ln(U) is *porous* (Mironov, CCS 2012): the
set of floats it can output depends on f(D), so an output that is impossible under D′ reveals
D (about 90% of float32 outputs, literature.md §4.3; measured by
:mod:`dpjax.auditing.porosity`). This mechanism outputs only points of the grid gℤ ∩ [−B, B]
(g a power of two, so every grid point is an exact float), and every grid point is reachable
from every input, so the output *support* does not depend on the data:

1. k_f = clamp(round(f(D)/g), −B/g, B/g)  (integer);
2. K ~ discrete Laplace, P[K = k] ∝ r^{|k|}, r = exp(−ε g/Δ_g), Δ_g = g(⌊Δ₁/g⌋ + d) for a
   value with d coordinates;
3. output g · clamp(k_f + K, −B/g, B/g)  (integer arithmetic, then one exact multiplication).

Rounding to the grid can grow the ℓ1 distance by up to g *per coordinate*, hence Δ_g (the
proof is in :func:`grid_sensitivity`). Clamping the input is 1-Lipschitz and clamping the
output is post-processing. Non-finite input: ``ValueError`` when concrete; under ``jit`` NaN →
0 and ±inf → ±B (the clamp), before the rounding, so the output is always on the grid.

The integer noise is drawn from float64 uniforms, so JAX's 64-bit mode is required
(``jax_enable_x64``; float32 uniforms realise ε far above the claim) and rates εg/Δ_g too small
for float64 to resolve are refused (:func:`realised_excess_bound`).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from dpjax import _validate
from dpjax._noise import float_dtype_of
from dpjax._random import noise_dtype
from dpjax.mechanisms._nonfinite import refuse_nonfinite

__all__ = ["discrete_laplace", "grid_sensitivity", "discrete_laplace_ratio"]

_LOG_THRESHOLD = 8.0 * math.log(2.0)  # one refinement level of the exponential sampler
_THRESHOLD = 2.0**-8  # P[U <= 2^-8] = 2^-8 exactly for JAX's uniform grid


def _check_granularity(granularity: float) -> float:
    _validate.positive("granularity", granularity)
    mantissa, _ = math.frexp(float(granularity))
    if mantissa != 0.5:
        _validate.fail("granularity", granularity, "a power of two (2.0**k)")
    return float(granularity)


def grid_sensitivity(sensitivity: float, granularity: float, num_coordinates: int = 1) -> float:
    r"""Δ_g = g(⌊Δ₁/g⌋ + d): the ℓ1 sensitivity of f rounded to the grid gℤ, d coordinates.

    Args:
        sensitivity: ℓ1 sensitivity Δ₁ of f (all coordinates together).
        granularity: g, a power of two.
        num_coordinates: d, the number of coordinates of f (1 for a scalar).

    Returns:
        Δ_g, a multiple of g.

    Formal guarantees:
        Let s_i = f_i(D)/g, t_i = f_i(D′)/g and k_i, k′_i their roundings to ℤ (any
        round-to-nearest, ties included, after the 1-Lipschitz clamp to [−B, B]). Since
        |round(s) − s| ≤ 1/2, |k_i − k′_i| ≤ |s_i − t_i| + 1, so
        ‖k − k′‖₁ ≤ Δ₁/g + d, and as ‖k − k′‖₁ is an integer, ‖k − k′‖₁ ≤ ⌊Δ₁/g⌋ + d = Δ_g/g.
        The bound is attained: g = 1, Δ₁ = 0.4, f(D) = (0.4, 0.4), f(D′) = (0.6, 0.6) round to
        (0, 0) and (1, 1), ‖k − k′‖₁ = 2 = ⌊0.4⌋ + 2. (Rounding a d-vector and charging only
        one extra step, Δ_g = g(⌊Δ₁/g⌋ + 1), was issue 13 finding 4: true ε up to 2× the claim
        there.) To keep the inflation small choose g ≤ Δ₁/d: then Δ_g ≤ 2Δ₁.

    Example:
        >>> grid_sensitivity(0.4, 1.0, num_coordinates=2)
        2.0
    """
    _validate.positive("sensitivity", sensitivity)
    g = _check_granularity(granularity)
    d = _validate.positive_int("num_coordinates", num_coordinates)
    return g * (math.floor(float(sensitivity) / g) + float(d))


def discrete_laplace_ratio(
    *, sensitivity: float, epsilon: float, granularity: float, num_coordinates: int = 1
) -> float:
    """r = exp(−ε g/Δ_g): P[K = k] ∝ r^{|k|} for the integer noise K of each coordinate."""
    _validate.epsilon("epsilon", epsilon)
    delta_g = grid_sensitivity(sensitivity, granularity, num_coordinates)
    return math.exp(-float(epsilon) * float(granularity) / delta_g)


def _exponential(key: jax.Array, shape: tuple[int, ...], levels: int, dtype: Any) -> jax.Array:
    """Exp(1) draws with support up to ≈ levels·8 ln 2, by memorylessness.

    E = J·L + (−ln U_J), J = number of leading uniforms ≤ 2^-8 among U_0..U_{levels−1}
    (L = 8 ln 2): given J, U_J is uniform on (2^-8, 1] (or on (0, 1] at the last level).
    """
    u = 1.0 - jax.random.uniform(key, (levels + 1, *shape), dtype)  # in (0, 1]
    low = (u[:-1] <= _THRESHOLD).astype(jnp.int32)
    j = jnp.sum(jnp.cumprod(low, axis=0), axis=0)
    u_j = jnp.take_along_axis(u, j[None], axis=0)[0]
    return j.astype(dtype) * jnp.asarray(_LOG_THRESHOLD, dtype) - jnp.log(u_j)


def _integer_noise(key, shape, *, r: float, cap: int, levels: int, dtype) -> jax.Array:
    """K with P[K = k] ∝ r^{|k|}, |K| clipped to ``cap`` (int32)."""
    k_zero, k_geo = jax.random.split(key)
    p0 = (1.0 - r) / (1.0 + r)
    u0 = jax.random.uniform(k_zero, shape, dtype)
    a = -math.log(r)
    g = jnp.floor(_exponential(k_geo, shape, levels, dtype) / jnp.asarray(a, dtype))
    magnitude = jnp.minimum(1.0 + g, float(cap)).astype(jnp.int32)
    sign = jnp.where(u0 >= (1.0 + p0) / 2.0, 1, -1).astype(jnp.int32)
    return jnp.where(u0 < p0, jnp.zeros_like(magnitude), sign * magnitude)


def _noise_dtype() -> Any:
    """float64: the noise is always drawn in float64 (x64 is required, :func:`_require_x64`).

    With x64 disabled JAX would give float32 uniforms, whose 2^23 grid realises the geometric
    cells with a relative error ~2^{−15}/a (every float32 uniform enumerated: ε = 1e-4,
    Δ₁ = 0.5, g = 1 realised ε = 0.125; ε = 1, Δ₁ = 1, g = 2⁻¹⁰ realised ε ≥ 1.03), so that
    configuration is refused rather than released.
    """
    return jnp.float64 if jax.config.read("jax_enable_x64") else jnp.float32


def _require_x64() -> None:
    """Refuse to release when JAX's 64-bit mode is off (float32 uniforms break the ε claim)."""
    if not jax.config.read("jax_enable_x64"):
        raise ValueError(
            "jax_enable_x64 must be True for discrete_laplace; got False. With x64 off the "
            "noise would be drawn from float32 uniforms (a 2^-23 grid), whose geometric cells "
            "realise a pure epsilon far above the claim (0.125 at a claimed 1e-4, >= 1.03 at "
            "a claimed 1). Enable it with jax.config.update('jax_enable_x64', True) or the "
            "JAX_ENABLE_X64=1 environment variable."
        )


RELATIVE_EXCESS = 1e-3  # the realised ε may exceed the claim by at most this fraction of it


def realised_excess_bound(a: float, cap: int, nmant: int = 52) -> float:
    r"""Upper bound on (realised ε − claimed ε)/claimed ε of the float sampler at rate a.

    Args:
        a: the rate εg/Δ_g = −ln r of the integer noise.
        cap: the largest magnitude |K| the sampler returns (2⌊B/g⌋ + 1).
        nmant: mantissa bits of the noise dtype's uniforms (52 for float64).

    Returns:
        2.01·ρ/a, where ρ bounds the relative error of every realised cell probability
        (``inf`` when ρ > 0.1, where the first-order bound does not apply).

    Formal guarantees:
        The uniforms are U = j·2^{−n} (n = ``nmant``, j uniform on [0, 2^n)), u = 1 − U.
        Level ℓ of :func:`_exponential` is chosen with probability exactly 2^{−8ℓ}(1 − 2^{−8})
        (2^{n−8} of the 2^n values of u are ≤ 2^{−8}; the last level 2^{−8ℓ}) and given ℓ,
        u is uniform on its N_ℓ grid points. The
        cell {G = m} is E ∈ [ma, (m+1)a), E = ℓL − ln u (L = 8 ln 2); its ideal probability
        is e^{−ma}(1 − e^{−a}) (memorylessness). Computed in float, Ê = E ± τ with
        τ ≤ 2^{−n}(3E + 12) (the rounding of ℓL, of ln u (≤ 2 ulp of |ln u| ≤ L), of the
        subtraction and of the division by a; E ≤ cap·a on every cell boundary). Joint
        density of (ℓ, u) is 2^{−8ℓ} per unit of u, i.e. e^{−E} per unit of E, and a grid point
        carries 2^{−8ℓ−n}. A point is miscounted only if E lies within τ of one of the two
        boundaries of cell m: probability ≤ 2·2τ·e^{−ma}(1.01), plus one point per boundary
        and per level piece for the grid, and one per piece end for the alignment of the
        piece {level ℓ} ∩ cell: ≤ 4 points per piece. The pieces lie at levels
        ℓ ≥ ⌊ma/L⌋, so Σ_ℓ 4·2^{−8ℓ−n} ≤ 4·257·2^{−n}e^{−ma}, and relative to the ideal
        e^{−ma}(1 − e^{−a}) the cell is off by ρ_G ≤ 2^{−n}(1077 + 12.2·cap·a)/(1 − e^{−a}).
        The zero and sign draw compare one uniform with p₀ = tanh(a/2) and (1 + p₀)/2:
        relative error ρ₀ ≤ 2^{1−n}/p₀. Every realised probability of K (the clipped cell |K| = cap
        included, as a sum of cells) is within a factor 1 ± ρ, ρ = ρ_G + ρ₀ + ρ_G ρ₀, of
        the ideal one, so the log-ratio of two outputs of one coordinate exceeds the ideal
        one by ≤ ln((1 + ρ)/(1 − ρ)) ≤ 2.01ρ (ρ ≤ 0.1). Coordinates with k_i = k′_i have the
        same law; each other one has ideal ratio ≤ e^{a|k_i − k′_i|} with |k_i − k′_i| ≥ 1,
        so the realised ε ≤ Σ_i (a|k_i − k′_i| + 2.01ρ) ≤ ε(1 + 2.01ρ/a).

    Example:
        >>> realised_excess_bound(1e-2, 17) < RELATIVE_EXCESS < realised_excess_bound(1e-5, 17)
        True
    """
    two_n = 2.0**-nmant
    rho_g = two_n * (1077.0 + 12.2 * cap * a) / -math.expm1(-a)
    rho_0 = 2.0 * two_n / math.tanh(a / 2.0)
    rho = rho_g + rho_0 + rho_g * rho_0
    return 2.01 * rho / a if rho <= 0.1 else math.inf


def _check_resolution(a: float, dtype: Any, cap: int = 1) -> None:
    """Refuse a rate a = εg/Δ_g whose realised ε could exceed the claim by > RELATIVE_EXCESS."""
    nmant = int(jnp.finfo(dtype).nmant)
    excess = realised_excess_bound(a, cap, nmant)
    if not excess <= RELATIVE_EXCESS:
        _validate.fail(
            "granularity",
            "ε·g/Δ_g = " + repr(a),
            f"large enough that the {jnp.dtype(dtype).name} sampler's realised ε is within "
            f"{RELATIVE_EXCESS:g} (relative) of the claim (bound {excess:.3g} here; "
            "realised_excess_bound): use a coarser granularity or a larger epsilon",
        )


def _levels_for(cap: int, r: float) -> int:
    return max(1, math.ceil(cap * -math.log(r) / _LOG_THRESHOLD) + 1)


def discrete_laplace(
    key: jax.Array,
    value: Any,
    *,
    sensitivity: float,
    epsilon: float,
    bound: float,
    granularity: float = 2.0**-10,
) -> Any:
    r"""Release f(D) + discrete Laplace noise on the grid gℤ ∩ [−B, B] (non-porous).

    Args:
        key: a JAX PRNG key, used once.
        value: f(D): a scalar or array with d entries (clamped to [−B, B] and rounded to the
            grid). Non-finite entries: ``ValueError`` when concrete; under ``jit`` NaN → 0 and
            ±inf → ±B.
        sensitivity: ℓ1 sensitivity Δ₁ of f (all d entries together) under the caller's
            neighbouring relation.
        epsilon: ε > 0.
        bound: B > 0, the public range of f (outputs lie in [−B, B]); B/g ≤ 2^22.
            Requires ``jax_enable_x64`` (``ValueError`` otherwise).
        granularity: g, a power of two (default 2^-10).

    Returns:
        An array of ``value``'s float dtype whose entries are multiples of g in [−B, B].

    Formal guarantees:
        (ε, 0)-DP under the relation for which Δ₁ holds, in exact arithmetic, for every input:
        rounding the d entries to gℤ gives integer ℓ1 sensitivity Δ_g/g = ⌊Δ₁/g⌋ + d
        (``grid_sensitivity``), and i.i.d. discrete Laplace noise with r = e^{−εg/Δ_g} on
        every entry has likelihood ratio ≤ r^{−‖k − k′‖₁} ≤ e^ε (geometric mechanism, Ghosh,
        Roughgarden, Sundararajan 2009; discrete Laplace of Canonne, Kamath, Steinke 2020
        §2). The non-finite rule maps every input into [−B, B] before the rounding. The output
        support gℤ ∩ [−B, B] is the same for every input (every point is reachable), so the
        floating-point attack of Mironov (CCS 2012) does not apply. As the code runs: the
        geometric draw uses float64 uniforms and logarithms (not the exact CKS20 sampler), so
        the realised probabilities carry a relative error; the realised pure ε is at most
        ε(1 + RELATIVE_EXCESS) = 1.001ε, proven in :func:`realised_excess_bound`, and rates
        εg/Δ_g for which that bound fails (about a < 2.2e-5 at B/g ≤ 2^13) raise
        ``ValueError`` (granularity). With x64 disabled the uniforms would be float32 (ε = 1e-4
        realised 0.125, ε = 1 realised ≥ 1.03, exact enumeration), so the mechanism raises
        ``ValueError`` naming ``jax_enable_x64``. The grid index is computed in at least
        float32 after clamping to ±B (a float16 x/g would overflow to inf).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> jax.config.update("jax_enable_x64", True)  # required: float64 uniforms
        >>> y = discrete_laplace(jax.random.key(0), jnp.zeros(3, jnp.float32), sensitivity=1.0,
        ...                      epsilon=1.0, bound=8.0, granularity=2.0**-6)
        >>> bool(jnp.all(y * 64 == jnp.round(y * 64)))
        True
    """
    g = _check_granularity(granularity)
    _validate.positive("sensitivity", sensitivity)
    _validate.epsilon("epsilon", epsilon)
    _validate.positive("bound", bound)
    half = math.floor(float(bound) / g)
    if not 1 <= half <= 2**22:
        _validate.fail(
            "bound", bound, f"in [granularity, 2**22 * granularity] = [{g}, {g * 2**22}]"
        )
    cap = 2 * half + 1
    dtype = float_dtype_of(value)
    refuse_nonfinite("value", value)
    _require_x64()
    x = jnp.asarray(value, dtype)
    r = discrete_laplace_ratio(
        sensitivity=sensitivity, epsilon=epsilon, granularity=g, num_coordinates=max(x.size, 1)
    )
    noise_dtype = _noise_dtype()
    _check_resolution(-math.log(r), noise_dtype, cap)
    k_f = _grid_index(x, g=g, half=half)
    levels = _levels_for(cap, r)
    noise = _integer_noise(key, jnp.shape(x), r=r, cap=cap, levels=levels, dtype=noise_dtype)
    k_y = jnp.clip(k_f + noise, -half, half)
    return k_y.astype(dtype) * jnp.asarray(g, dtype)


def _grid_index(x: jax.Array, *, g: float, half: int) -> jax.Array:
    """k_f = clamp(round(x/g), −half, half) as int32, computed in at least float32.

    NaN → 0; x is clamped to ±half·g BEFORE the division, in a dtype where half·g (≤ 2^22 g)
    and x/g are finite: a float16 x/g overflows to inf for |x| > 65504 g, and inf → int32
    saturates (then k_f + K wraps around).
    """
    wide = noise_dtype(x.dtype)  # float32 / float64 stay, 16-bit floats → float32
    limit = jnp.asarray(half * g, wide)  # exact: a power of two times an integer ≤ 2^22
    xw = jnp.where(jnp.isnan(x), jnp.zeros((), x.dtype), x).astype(wide)
    xw = jnp.clip(xw, -limit, limit)
    return jnp.clip(jnp.round(xw / jnp.asarray(g, wide)), -half, half).astype(jnp.int32)
