r"""Mironov's floating-point test: which outputs on D are impossible on D′?

For a release M(D) = f(D) + noise computed in floating point, the set of attainable outputs
depends on f(D) (Mironov, *On Significance of the Least Significant Bits for Differential
Privacy*, CCS 2012). An output y attainable under D but not under D′ identifies D with
certainty, so the fraction

.. math::  \mathrm{porosity} = P_{y \sim M(D)}[\,y \notin \mathrm{supp}\,M(D')\,]

is a δ that no amount of noise removes. For JAX's float32 samplers every noise value can be
enumerated: ``jax.random.uniform`` produces the 2^23 values m·2^-23, and ``jax.random.laplace``
maps them through sign(u)·log1p(−|u|). The enumeration replays those float
operations with JAX on the same backend and is checked against real draws (the control).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dpjax import _validate
from dpjax.auditing import exact
from dpjax.mechanisms import discrete

__all__ = [
    "PorosityResult",
    "float32_uniform_values",
    "textbook_noise_float32_values",
    "textbook_laplace_float32_values",
    "impossible_fraction",
    "textbook_porosity",
    "textbook_laplace_porosity",
    "attainable_float64",
    "discrete_laplace_support",
    "discrete_laplace_porosity",
    "discrete_gaussian_porosity",
]


@dataclasses.dataclass(frozen=True)
class PorosityResult:
    """Result of an exact-support test.

    Attributes:
        fraction: P_D[output impossible under D′] (exact, by enumeration).
        outputs: number of distinct noise values (or grid points) enumerated.
        mechanism: what was tested.
    """

    fraction: float
    outputs: int
    mechanism: str


def float32_uniform_values() -> np.ndarray:
    """All 2^23 values of ``jax.random.uniform(key, dtype=float32)``: m·2^-23, m < 2^23."""
    return (np.arange(2**23, dtype=np.float64) * 2.0**-23).astype(np.float32)


_NOISES = ("laplace", "gaussian")


def _noise_from_unit(f: jax.Array, noise: str) -> jax.Array:
    """Replays jax._src.random._laplace / _normal_real on a value f of the uniform [0, 1) grid.

    Both draw u = max(lo, f·(1 − lo) + lo) with lo = −1 + epsneg (the float just above −1);
    Laplace returns sign(u)·log1p(−|u|), the normal √2·erfinv(u).
    """
    dtype = f.dtype
    lo = jnp.asarray(np.nextafter(np.array(-1.0, dtype), np.array(0.0, dtype)), dtype)
    hi = jnp.asarray(1.0, dtype)
    u = jnp.maximum(lo, f * (hi - lo) + lo)
    if noise == "laplace":
        return jnp.sign(u) * jnp.log1p(-jnp.abs(u))
    return jnp.asarray(np.sqrt(2.0), dtype) * jax.scipy.special.erfinv(u)


_noise_from_unit_jit = jax.jit(_noise_from_unit, static_argnums=1)


def textbook_noise_float32_values(noise: str = "laplace") -> np.ndarray:
    """Every value ``jax.random.laplace`` / ``jax.random.normal`` (float32) can return.

    Args:
        noise: ``"laplace"`` or ``"gaussian"``.

    Returns:
        The 2^23 equiprobable noise values (one per uniform mantissa), float32.
    """
    _validate.one_of("noise", noise, _NOISES)
    return np.asarray(_noise_from_unit_jit(jnp.asarray(float32_uniform_values()), noise))


def textbook_laplace_float32_values() -> np.ndarray:
    """Every value ``jax.random.laplace(key, dtype=float32)`` can return (2^23, equiprobable)."""
    return textbook_noise_float32_values("laplace")


def impossible_fraction(outputs_d, support_dprime, weights=None) -> float:
    """Weighted fraction of ``outputs_d`` not in ``support_dprime`` (exact float comparison).

    Args:
        outputs_d: outputs under D (each equiprobable unless ``weights`` is given).
        support_dprime: every output attainable under D′.
        weights: probabilities of ``outputs_d`` (default uniform).
    """
    y = np.asarray(outputs_d).ravel()
    missing = ~np.isin(y, np.asarray(support_dprime).ravel())
    if weights is None:
        return float(np.mean(missing))
    w = np.asarray(weights, dtype=np.float64).ravel()
    return float(np.sum(w[missing]) / np.sum(w))


def textbook_porosity(
    *, f_d: float, f_dprime: float, scale: float, noise: str = "laplace"
) -> PorosityResult:
    """Exact porosity of float32 ``f + scale·noise`` (as dpjax.mechanisms adds it).

    Args:
        f_d: f(D) (rounded to float32).
        f_dprime: f(D′).
        scale: the noise scale (Laplace b = Δ/ε, or Gaussian σ).
        noise: ``"laplace"`` or ``"gaussian"``.

    Returns:
        P_D[y impossible under D′] over all 2^23 equiprobable noise values, with the
        release computed as dpjax does it: ``float32(f) + float32(scale) * z``.
    """
    _validate.positive("scale", scale)
    z = textbook_noise_float32_values(noise)
    b = np.float32(scale)
    y_d = np.float32(f_d) + b * z
    y_dprime = np.float32(f_dprime) + b * z
    return PorosityResult(
        fraction=impossible_fraction(y_d, y_dprime),
        outputs=int(np.unique(y_d).size),
        mechanism=f"textbook {noise} float32 (scale = {scale:g})",
    )


def textbook_laplace_porosity(*, f_d: float, f_dprime: float, scale: float) -> PorosityResult:
    """``textbook_porosity`` for the Laplace mechanism (dpjax.mechanisms.laplace, float32)."""
    return textbook_porosity(f_d=f_d, f_dprime=f_dprime, scale=scale, noise="laplace")


@functools.partial(jax.jit, static_argnums=1)
def _noise_float64(m: jax.Array, noise: str) -> jax.Array:
    one = jnp.asarray(np.array(1.0).view(np.uint64))
    unit = jax.lax.bitcast_convert_type(one | m, jnp.float64) - 1.0
    return _noise_from_unit(unit, noise)


def _release_float64(m: jax.Array, f: float, scale: float, noise: str) -> np.ndarray:
    """f + scale·noise for the uniform mantissa m (uint64 < 2^52), as dpjax computes it eagerly.

    The noise is materialised first, as ``jax.random.*`` does, and the shift and scale are two
    separately rounded IEEE operations (NumPy): fused by XLA, scale·(√2·erfinv(u)) may be
    re-associated and f + scale·z contracted into an FMA, which rounds differently.
    """
    z = np.asarray(_noise_float64(m, noise), dtype=np.float64)
    return np.float64(f) + np.float64(scale) * z


def attainable_float64(outputs, *, f: float, scale: float, noise: str = "laplace") -> np.ndarray:
    """Whether each float64 output equals f + scale·noise(m) for some uniform mantissa m.

    The release is non-increasing in m (u increases with m; both noise maps are monotone), so
    a binary search over the 2^52 mantissas decides attainability exactly, provided the float
    evaluation is monotone too; the control (outputs drawn under f itself are all attainable)
    checks that assumption. Needs x64 (``jax_enable_x64``).

    Args:
        outputs: float64 outputs to test.
        f: the exact answer f(D′) of the hypothesis.
        scale: the noise scale.
        noise: ``"laplace"`` or ``"gaussian"``.

    Returns:
        A boolean array: True where the output is attainable under f.
    """
    _validate.one_of("noise", noise, _NOISES)
    if not jax.config.jax_enable_x64:
        raise ValueError("jax_enable_x64 must be True for the float64 porosity search; got False")
    y = np.asarray(outputs, dtype=np.float64).ravel()
    sign = -1.0 if noise == "laplace" else 1.0  # Laplace decreases in u, the normal increases
    lo = np.zeros(y.shape, np.uint64)
    hi = np.full(y.shape, 2**52 - 1, np.uint64)
    for _ in range(53):  # smallest m with sign·release(m) >= sign·y
        mid = lo + (hi - lo) // np.uint64(2)
        above = sign * _release_float64(jnp.asarray(mid), f, scale, noise) >= sign * y
        hi, lo = np.where(above, mid, hi), np.where(above, lo, mid + np.uint64(1))
    return _release_float64(jnp.asarray(lo), f, scale, noise) == y


def discrete_laplace_support(
    *, f: float, sensitivity: float, epsilon: float, bound: float, granularity: float
) -> np.ndarray:
    """All outputs of ``discrete_laplace(f)`` (float32 values): the points of positive mass.

    The integer noise is sampled exactly (CKS 2020 Algorithm 2 on random words), so its
    realised law is the discrete Laplace law, under which every magnitude has positive
    probability; the support is the set of grid points where the exact law
    (:func:`dpjax.auditing.exact.discrete_laplace_law`, in log space) is > 0 — the whole grid
    gℤ ∩ [−B, B] for every f (tests/mechanisms/test_exact_integer_samplers.py ties the law to the
    code).
    """
    r = discrete.discrete_laplace_ratio(
        sensitivity=sensitivity, epsilon=epsilon, granularity=granularity
    )
    half = math.floor(bound / granularity)
    law = exact.discrete_laplace_law(np.float32(f), ratio=r, bound=bound, granularity=granularity)
    k_y = np.arange(-half, half + 1)[law.log > -np.inf]
    return (k_y.astype(np.float32) * np.float32(granularity)).astype(np.float32)


def discrete_laplace_porosity(
    *,
    f_d: float,
    f_dprime: float,
    sensitivity: float,
    epsilon: float,
    bound: float,
    granularity: float,
) -> PorosityResult:
    """Exact porosity of ``discrete_laplace``: P_D[y ∉ supp M(D′)] (0: the supports agree).

    The probabilities of D's outputs are the exact discrete-Laplace masses (clamped at ±B),
    which are the sampler's realised masses (exact integer sampler).
    """
    kw = dict(sensitivity=sensitivity, epsilon=epsilon, bound=bound, granularity=granularity)
    supp_d = discrete_laplace_support(f=f_d, **kw)
    supp_dprime = discrete_laplace_support(f=f_dprime, **kw)
    r = discrete.discrete_laplace_ratio(
        sensitivity=sensitivity, epsilon=epsilon, granularity=granularity
    )
    law = exact.discrete_laplace_law(np.float32(f_d), ratio=r, bound=bound, granularity=granularity)
    half = math.floor(bound / granularity)
    y_grid = (np.arange(-half, half + 1).astype(np.float32) * np.float32(granularity)).astype(
        np.float32
    )
    attainable = np.isin(y_grid, supp_d)
    fraction = impossible_fraction(y_grid[attainable], supp_dprime, np.asarray(law)[attainable])
    return PorosityResult(
        fraction=fraction,
        outputs=int(supp_d.size),
        mechanism=f"discrete Laplace, exact integer sampler (g = {granularity:g}, B = {bound:g})",
    )


def discrete_gaussian_porosity(*, f_d: int, f_dprime: int, sigma: Any) -> PorosityResult:
    """Exact porosity of ``discrete_gaussian`` on the window f ± (40σ + |f_d − f_dprime|).

    Every integer has positive mass under N_ℤ(f, σ²) for every f (the law is computed in log
    space, so no cell underflows to an impossible one): the result is 0.
    """
    lo = min(f_d, f_dprime) - math.ceil(40 * float(sigma)) - 1
    hi = max(f_d, f_dprime) + math.ceil(40 * float(sigma)) + 1
    law_d = exact.discrete_gaussian_law(f_d, sigma=sigma, low=lo, high=hi)
    law_dprime = exact.discrete_gaussian_law(f_dprime, sigma=sigma, low=lo, high=hi)
    outcomes = np.arange(lo - 1, hi + 2)  # the two end cells are the folded tails
    possible = law_dprime.log > -np.inf
    fraction = float(np.sum(np.asarray(law_d)[~possible]))
    return PorosityResult(
        fraction=fraction,
        outputs=int(np.sum(law_d.log > -np.inf)),
        mechanism=f"discrete Gaussian, exact integer sampler (sigma = {sigma}, "
        f"{outcomes.size} outcomes)",
    )
