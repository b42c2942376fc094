r"""A non-porous Laplace mechanism: exact discrete Laplace noise on a power-of-two grid.

The textbook float Laplace sampler f(D) + b·sign·ln(U) is *porous* (Mironov, CCS 2012): the
set of floats it can output depends on f(D), so an output that is impossible under D′ reveals
D (about 90% of float32 outputs; measured by
:mod:`dpjax.auditing.porosity`). This mechanism outputs only points of the grid gℤ ∩ [−B, B]
(g a power of two, so every grid point is an exact float), and every grid point is reachable
from every input, so the output *support* does not depend on the data:

1. k_f = clamp(round(f(D)/g), −B/g, B/g)  (integer);
2. K ~ discrete Laplace, P[K = k] ∝ exp(−a|k|), a = S/T ≤ ε g/Δ_g the rational rate of
   :func:`discrete_laplace_rate` (Δ_g = g(⌊Δ₁/g⌋ + d) for a value with d coordinates);
3. output g · clamp(k_f + K, −B/g, B/g)  (integer arithmetic, then one exact multiplication).

Rounding to the grid can grow the ℓ1 distance by up to g *per coordinate*, hence Δ_g (the
proof is in :func:`grid_sensitivity`). Clamping the input is 1-Lipschitz and clamping the
output is post-processing. Non-finite input: ``ValueError`` when concrete; under ``jit`` NaN →
0 and ±inf → ±B (the clamp), before the rounding, so the output is always on the grid.

The integer noise K is sampled EXACTLY from random 32-bit words with unsigned integer
arithmetic (Canonne, Kamath, Steinke 2020, Algorithms 1–2; :mod:`dpjax.mechanisms._integer_noise`):
no float decides any outcome, so the realised law is the analysed law and JAX's 64-bit mode is
not needed. (Formerly the noise came from float64 uniforms and logarithms, whose
realised ε exceeded the claim; it required x64 and refused rates the floats could not resolve.)
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dpjax import _validate
from dpjax._noise import float_dtype_of
from dpjax._random import noise_dtype
from dpjax.mechanisms._integer_noise import LaplaceProposal, integer_noise
from dpjax.mechanisms._nonfinite import refuse_nonfinite
from dpjax.mechanisms._vmap_guard import guarded_release

__all__ = [
    "discrete_laplace",
    "grid_sensitivity",
    "discrete_laplace_rate",
    "discrete_laplace_ratio",
]

_RATE_DENOMINATOR = 2**30  # T of the rational rate S/T (halved for rates ≥ 1)
_MAX_RATE = 2**20  # εg/Δ_g above this: the noise is 0 with probability 1 − 2e^{−2^20}


def _check_granularity(granularity: float) -> float:
    _validate.positive("granularity", granularity)
    mantissa, _ = math.frexp(float(granularity))
    if mantissa != 0.5:
        _validate.fail("granularity", granularity, "a power of two (2.0**k)")
    return float(granularity)


def grid_sensitivity(
    sensitivity: float, granularity: float, num_coordinates: int = 1, *, on_grid: bool = False
) -> float:
    r"""Δ_g = g(⌊Δ₁/g⌋ + d): the ℓ1 sensitivity of f rounded to the grid gℤ, d coordinates.

    Args:
        sensitivity: ℓ1 sensitivity Δ₁ of f (all coordinates together).
        granularity: g, a power of two.
        num_coordinates: d, the number of coordinates of f (1 for a scalar).
        on_grid: f takes values on gℤ by its dtype (an integer query with g ≤ 1), so rounding
            moves nothing: Δ_g = g·max(1, ⌊Δ₁/g⌋), without the d extra steps.

    Returns:
        Δ_g, a multiple of g.

    Formal guarantees:
        Let s_i = f_i(D)/g, t_i = f_i(D′)/g and k_i, k′_i their roundings to ℤ (any
        round-to-nearest, ties included, after the 1-Lipschitz clamp to [−B, B]). Since
        |round(s) − s| ≤ 1/2, |k_i − k′_i| ≤ |s_i − t_i| + 1, so
        ‖k − k′‖₁ ≤ Δ₁/g + d, and as ‖k − k′‖₁ is an integer, ‖k − k′‖₁ ≤ ⌊Δ₁/g⌋ + d = Δ_g/g.
        The bound is attained: g = 1, Δ₁ = 0.4, f(D) = (0.4, 0.4), f(D′) = (0.6, 0.6) round to
        (0, 0) and (1, 1), ‖k − k′‖₁ = 2 = ⌊0.4⌋ + 2. (Rounding a d-vector and charging only
        one extra step, Δ_g = g(⌊Δ₁/g⌋ + 1), was a real bug: true ε up to 2× the claim
        there.) To keep the inflation small choose g ≤ Δ₁/d: then Δ_g ≤ 2Δ₁.

    Example:
        >>> grid_sensitivity(0.4, 1.0, num_coordinates=2)
        2.0
    """
    _validate.positive("sensitivity", sensitivity)
    g = _check_granularity(granularity)
    d = _validate.positive_int("num_coordinates", num_coordinates)
    if on_grid:
        if g > 1.0:
            _validate.fail("granularity", granularity, "at most 1 for a query on the grid")
        # integer k, k′ with ‖k − k′‖₁ ≤ Δ₁/g: at most ⌊Δ₁/g⌋ (and one step at least).
        return g * max(1.0, float(math.floor(float(sensitivity) / g)))
    return g * (math.floor(float(sensitivity) / g) + float(d))


def discrete_laplace_rate(
    *,
    sensitivity: float,
    epsilon: float,
    granularity: float,
    num_coordinates: int = 1,
    on_grid: bool = False,
) -> Fraction:
    r"""The rate a = S/T of the integer noise, P[K = k] ∝ e^{−a|k|}: ε g/Δ_g rounded DOWN.

    Args:
        sensitivity: ℓ1 sensitivity Δ₁ of f (all coordinates together).
        epsilon: ε > 0.
        granularity: g, a power of two.
        num_coordinates: d, the number of coordinates of f.
        on_grid: f is integer-valued by its dtype and g ≤ 1 (see :func:`grid_sensitivity`).

    Returns:
        a = ⌊(εg/Δ_g)·T⌋/T as a ``Fraction`` with T = 2^30 (T halved until S < 2^30 for
        rates ≥ 1), so S, T fit the sampler's 32-bit words; ε and g are taken as the exact
        binary fractions they are.

    Raises:
        ValueError: a rate below 2^{-30} (ε too small for the grid: coarsen g) or above 2^20.

    Formal guarantees:
        a ≤ εg/Δ_g and εg/Δ_g − a < 2^{−30}, so the mechanism's pure ε is a·Δ_g/g ≤ ε (the
        noise is a hair wider than the ideal one, never narrower); the realised law IS the
        discrete Laplace law with rate a (exact sampler), which the exact harness checks.

    Example:
        >>> discrete_laplace_rate(sensitivity=1.0, epsilon=1.0, granularity=1.0)
        Fraction(1, 2)
    """
    _validate.epsilon("epsilon", epsilon)
    delta_g = grid_sensitivity(sensitivity, granularity, num_coordinates, on_grid=on_grid)
    ideal = Fraction(float(epsilon)) * Fraction(float(granularity)) / Fraction(delta_g)
    if ideal > _MAX_RATE:
        _validate.fail(
            "epsilon", epsilon, f"at most 2**20·Δ_g/g = {_MAX_RATE * delta_g / granularity:g}"
        )
    t = _RATE_DENOMINATOR
    while ideal * t >= 2**30:
        t //= 2
    s = math.floor(ideal * t)
    if s < 1:
        _validate.fail(
            "epsilon",
            epsilon,
            f"at least 2**-30·Δ_g/g = {delta_g / granularity * 2.0**-30:.3g} for this grid (the "
            "integer sampler's rate resolution; use a coarser granularity)",
        )
    return Fraction(s, t)


def discrete_laplace_ratio(
    *,
    sensitivity: float,
    epsilon: float,
    granularity: float,
    num_coordinates: int = 1,
    on_grid: bool = False,
) -> float:
    """r = e^{−a} (a of :func:`discrete_laplace_rate`): P[K = k] ∝ r^{|k|} for each coordinate."""
    rate = discrete_laplace_rate(
        sensitivity=sensitivity,
        epsilon=epsilon,
        granularity=granularity,
        num_coordinates=num_coordinates,
        on_grid=on_grid,
    )
    return math.exp(-float(rate))


def exact_dtype_limit(dtype: Any) -> int:
    """The largest B/g for which every grid point k·g, |k| ≤ B/g, is exact in ``dtype``."""
    return 2 ** (int(jnp.finfo(dtype).nmant) + 1)


def _check_output_dtype(dtype: Any, half: int, g: float) -> None:
    """Refuse a grid that the output dtype cannot hold exactly (float16 / bfloat16 papercut)."""
    info = jnp.finfo(dtype)
    name = jnp.dtype(dtype).name
    limit = exact_dtype_limit(dtype)
    if half > limit:
        _validate.fail(
            "bound",
            f"{half}·granularity",
            f"at most {limit}·granularity for {name} values (every grid point k·g, |k| ≤ B/g, "
            f"must be exact in {name}); cast the value to float32 or coarsen the grid",
        )
    if half * g > float(info.max) or g < float(info.tiny):
        _validate.fail(
            "bound",
            half * g,
            f"within {name}'s normal range [{float(info.tiny):g}, {float(info.max):g}]",
        )


@guarded_release("value")
def discrete_laplace(
    key: jax.Array,
    value: Any,
    *,
    sensitivity: float,
    epsilon: float,
    bound: float,
    granularity: float = 2.0**-10,
) -> Any:
    r"""Release f(D) + discrete Laplace noise on the grid gℤ ∩ [−B, B] (non-porous, exact).

    Args:
        key: a JAX PRNG key, used once.
        value: f(D): a scalar or array with d entries (clamped to [−B, B] and rounded to the
            grid). Non-finite entries: ``ValueError`` when concrete; under ``jit`` NaN → 0 and
            ±inf → ±B.
        sensitivity: ℓ1 sensitivity Δ₁ of f (all d entries together) under the caller's
            neighbouring relation (replace-one or add/remove-one: the guarantee holds for the
            relation under which Δ₁ was computed).
        epsilon: ε > 0.
        bound: B > 0, the public range of f (outputs lie in [−B, B]); B/g ≤ 2^22, and every
            grid point must be exact in the value's dtype (B/g ≤ 2048 for float16, 256 for
            bfloat16: ``ValueError`` otherwise).
        granularity: g, a power of two (default 2^-10).

    Returns:
        An array of ``value``'s float dtype whose entries are multiples of g in [−B, B].

    Formal guarantees:
        (ε, 0)-DP under the relation for which Δ₁ holds, for every input, as the code runs:
        rounding the d entries to gℤ gives integer ℓ1 sensitivity Δ_g/g = ⌊Δ₁/g⌋ + d
        (``grid_sensitivity``), and i.i.d. discrete Laplace noise with rate
        a ≤ εg/Δ_g (``discrete_laplace_rate``) on every entry has likelihood ratio
        ≤ e^{a‖k − k′‖₁} ≤ e^ε (geometric mechanism, Ghosh, Roughgarden, Sundararajan 2009;
        the discrete Laplace of Canonne, Kamath, Steinke 2020, §2). The noise is sampled
        exactly (CKS 2020, Algorithms 1–2, integer arithmetic on random words, no floats, any
        x64 setting), so the realised law is the analysed one; clamping the noise magnitude to
        2B/g + 1 inside the sampler and the output to [−B, B] is post-processing. The
        non-finite rule maps every input into [−B, B] before the rounding. The output support
        gℤ ∩ [−B, B] is the same for every input (every point is reachable), so the
        floating-point attack of Mironov (CCS 2012) does not apply; the grid index is computed
        in at least float32 after clamping to ±B, and every grid point is exact in the output
        dtype (checked). Timing: the sampler's loop runs a number of rounds that depends only
        on the random words (CKS §5), not on f(D).
        Not guarded: ``jax.pmap`` / ``shard_map`` with ONE key replicated to every device
        gives every device's rows the same noise draw; pass one key per device (e.g.
        ``jax.random.fold_in(key, jax.lax.axis_index(name))``) and account for every device.
        Under ``jax.vmap``: each row of a vmap that batches ``key`` with distinct keys is its own
        release with this guarantee (account for every row); a vmap of ``value`` with one key for
        all rows raises ``ValueError``, and repeated keys in the batch raise eagerly and void the
        release under ``jit`` (NaN): rows that share a key share one noise draw and would release
        their differences noise-free.

    Example:
        >>> import jax, jax.numpy as jnp
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
    dtype = float_dtype_of(value)
    _check_output_dtype(dtype, half, g)
    refuse_nonfinite("value", value)
    on_grid = _is_integer_query(value) and g <= 1.0
    if _validate.is_concrete(value) and all(map(_validate.is_concrete, jax.tree.leaves(value))):
        k_f = _host_grid_index(value, g=g, half=half)  # exact: float64 on the host, no cast
    else:
        k_f = _grid_index(_exact_traced(jnp.asarray(value), dtype, g=g, half=half), g=g, half=half)
    rate = discrete_laplace_rate(
        sensitivity=sensitivity,
        epsilon=epsilon,
        granularity=g,
        num_coordinates=max(int(k_f.size), 1),
        on_grid=on_grid,
    )
    proposal = LaplaceProposal(t=rate.denominator, s=rate.numerator, cap=2 * half + 1)
    noise, _ = integer_noise(key, jnp.shape(k_f), proposal)
    k_y = jnp.clip(k_f + noise, -half, half)
    return k_y.astype(dtype) * jnp.asarray(g, dtype)


def _is_integer_query(value: Any) -> bool:
    """Whether f's dtype makes it integer-valued (bool, Python/numpy/JAX integers)."""
    if isinstance(value, bool | int | np.integer | np.bool_):
        return True
    dtype = getattr(value, "dtype", None)
    return dtype is not None and (
        np.issubdtype(np.dtype(dtype), np.integer) or np.dtype(dtype) == np.bool_
    )


def _host_grid_index(value: Any, *, g: float, half: int) -> jax.Array:
    """k_f for a concrete value, in float64 on the host: clamp to ±half·g, then round.

    The value is never rounded to a narrower float first: float64 2 097 153.4 and
    2 097 152.6 (0.8 apart) round to float32 2 097 153.5 and 2 097 152.5, whose grid indices
    at g = 1 are 2 apart instead of at most 1. (NaN cannot occur: concrete non-finite input was
    refused.) Integers are exact in float64 up to 2^53; beyond that the clamp to ±half·g
    (≤ 2^22·g) is applied to a monotone rounding, which gives the same index.
    """
    x = np.asarray(value).astype(np.float64)
    limit = half * g
    k = np.clip(np.round(np.clip(x, -limit, limit) / g), -half, half)
    return jnp.asarray(k.astype(np.int32))


def _exact_traced(x: jax.Array, dtype: Any, *, g: float, half: int) -> jax.Array:
    """A traced value cast to ``dtype`` with no rounding that matters for the grid index.

    Integers are clamped to ±⌈half·g⌉ in integer arithmetic BEFORE the cast, so every value
    that reaches the float dtype is exact in it (refused when ⌈half·g⌉ itself is not: a
    rounding to a float and then to the grid could cost one more grid step than Δ_g pays).
    :func:`_grid_index` then clamps to ±half·g, as the host path does: ⌊half·g⌋ would index
    3 as 4 instead of 5 at bound 2.5, granularity 1/2.
    """
    if not jnp.issubdtype(x.dtype, jnp.integer):
        return x.astype(dtype)
    limit = math.ceil(half * g)
    if limit > exact_dtype_limit(noise_dtype(dtype)):
        _validate.fail(
            "bound",
            f"{half}·granularity for a traced integer value",
            f"at most {exact_dtype_limit(noise_dtype(dtype))} (integers above it are rounded "
            "when cast to a float before the grid index): lower the bound, or call the "
            "mechanism eagerly (concrete values are indexed exactly in float64)",
        )
    x = x.astype(jnp.int32) if jnp.iinfo(x.dtype).bits < 32 else x
    lower = max(int(jnp.iinfo(x.dtype).min), -limit)  # uint32: −limit would wrap to 2^32 − limit
    return jnp.clip(x, lower, limit).astype(dtype)


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
