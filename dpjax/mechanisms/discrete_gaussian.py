r"""The discrete Gaussian mechanism (Canonne, Kamath, Steinke 2020), sampled exactly.

f(D) + Y for an integer-valued f, Y ~ N_ℤ(0, σ²) i.i.d. per coordinate:
P[Y = y] = e^{−y²/(2σ²)} / Σ_{z∈ℤ} e^{−z²/(2σ²)}. The noise is integer, so the release is an
integer (no porosity, no rounding), and it is drawn with the exact sampler of CKS20
(Algorithm 3 on Algorithms 1–2) using unsigned 32-bit integer arithmetic on random words
(:mod:`dpjax.mechanisms._integer_noise`), with JAX's 64-bit mode on or off.

σ must be given so that σ² is a fraction num/den with num, den ≤ 2^28 and σ ≥ 1: an int, a
``fractions.Fraction`` (``Fraction(37, 10)``) or a float whose exact binary value squares to such
a fraction (3.75 does; 3.7 = 4166174849427251/2^50 does not and is refused, naming the fix).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from scipy import special

from dpjax import _validate
from dpjax.mechanisms._integer_noise import (
    GAUSSIAN_TAIL_LOG2_BOUND,
    GaussianAcceptance,
    LaplaceProposal,
    integer_noise,
)
from dpjax.mechanisms._vmap_guard import guarded_release

__all__ = [
    "discrete_gaussian",
    "discrete_gaussian_rho",
    "discrete_gaussian_delta",
    "discrete_gaussian_epsilon",
    "discrete_gaussian_pmf",
    "sigma_squared_fraction",
    "VALUE_LIMIT",
    "GAUSSIAN_TAIL_LOG2_BOUND",
]

#: |f(D)| is clamped to this (refused when concrete), so f(D) + Y fits int32 (|Y| < 2^30).
VALUE_LIMIT = 2**30
_NOISE_CAP = 2**30 - 1
_MAX_TERMS = 2**28  # bound on σ²'s numerator and denominator
_BISECTION_STEPS = 200
_TINY = float(np.finfo(np.float64).tiny)  # δ below it is reported as it (an upper bound)
_LOG_TINY = math.log(_TINY)


def sigma_squared_fraction(sigma: Any) -> Fraction:
    """σ² as an exact fraction num/den, checked: σ ≥ 1, num ≤ 2^28, den ≤ 2^28.

    Args:
        sigma: an int, a float (its exact binary value) or a ``fractions.Fraction``.

    Returns:
        σ² in lowest terms.

    Raises:
        ValueError: σ not a finite real ≥ 1, or σ² whose numerator or denominator exceeds 2^28
            (the sampler's 32-bit integer arithmetic).

    Example:
        >>> sigma_squared_fraction(Fraction(37, 10))
        Fraction(1369, 100)
    """
    if isinstance(sigma, Fraction):
        exact = sigma
    else:
        real = _validate.real("sigma", sigma, "a finite real number ≥ 1")
        if not math.isfinite(real):
            _validate.fail("sigma", sigma, "a finite real number ≥ 1")
        exact = Fraction(real)
    if not exact >= 1 or isinstance(sigma, bool):
        _validate.fail("sigma", sigma, "a finite real number ≥ 1 (the exact sampler's range)")
    square = exact * exact
    if square.numerator > _MAX_TERMS or square.denominator > _MAX_TERMS:
        _validate.fail(
            "sigma",
            sigma,
            "a number whose square is a fraction num/den with num, den ≤ 2**28 (the exact "
            f"sampler's 32-bit arithmetic); this sigma is exactly {exact} as a binary float. "
            "Pass an int, a dyadic float such as 3.75, or fractions.Fraction(37, 10)",
        )
    return square


def _sampler_parameters(square: Fraction) -> tuple[LaplaceProposal, GaussianAcceptance]:
    """Proposal DLap of scale t = σ²/m (m = round(σ) ≥ 1) and CKS Algorithm 3's acceptance."""
    num, den = square.numerator, square.denominator
    m = max(1, math.isqrt(4 * num // den) + 1 >> 1)  # ≈ round(σ)
    proposal = LaplaceProposal(t=num, s=den * m, cap=_NOISE_CAP)
    return proposal, GaussianAcceptance(m=m, den=den, p=2 * num)


def _check_sensitivity(sensitivity: Any) -> int:
    return _validate.positive_int("sensitivity", sensitivity)


def _integer_values(value: Any) -> jax.Array:
    """The integer query values as int32, clamped to ±VALUE_LIMIT (refused when concrete)."""
    dtype = jnp.result_type(value)
    if not jnp.issubdtype(dtype, jnp.integer) or dtype == jnp.bool_:
        _validate.fail(
            "value",
            f"an array of dtype {jnp.dtype(dtype).name}",
            "an integer array (the discrete Gaussian releases integer queries; round and cast "
            "an integer-valued float with jnp.round(x).astype(jnp.int32))",
        )
    if _validate.is_concrete(value):
        values = np.asarray(value).astype(np.int64)
        if values.size and np.max(np.abs(values)) > VALUE_LIMIT:
            _validate.fail(
                "value", "an array with entries beyond ±2**30", "integers in [-2**30, 2**30]"
            )
    x = jnp.asarray(value)
    if jnp.iinfo(dtype).bits > 32 or (jnp.iinfo(dtype).bits == 32 and dtype == jnp.uint32):
        x = jnp.clip(x, -VALUE_LIMIT if jnp.iinfo(dtype).min < 0 else 0, VALUE_LIMIT)
    x = x.astype(jnp.int32)
    return jnp.clip(x, -VALUE_LIMIT, VALUE_LIMIT)


@guarded_release("value")
def discrete_gaussian(key: jax.Array, value: Any, *, sensitivity: int, sigma: Any) -> jax.Array:
    r"""Release f(D) + N_ℤ(0, σ²) noise on every coordinate, sampled exactly (int32 output).

    Args:
        key: a JAX PRNG key, used once.
        value: f(D), an integer array (any integer dtype; |entries| ≤ 2^30: ``ValueError``
            when concrete, clamped to ±2^30 under ``jit``, a 1-Lipschitz map).
        sensitivity: Δ, a positive integer with ‖f(D) − f(D′)‖₂ ≤ Δ for neighbours under the
            caller's relation (add/remove-one for counts: Δ = 1 for a histogram; replace-one:
            ‖·‖₂ = √2, so pass Δ = 2, or account ρ with Δ² = 2 yourself). Passing the ℓ1
            sensitivity is valid (‖·‖₂ ≤ ‖·‖₁).
        sigma: σ ≥ 1 with σ² = num/den, num, den ≤ 2^28 (int, dyadic float or ``Fraction``;
            see :func:`sigma_squared_fraction`).

    Returns:
        An int32 array of ``value``'s shape.

    Raises:
        ValueError: non-integer values or sensitivity, σ < 1 or σ² not representable.

    Formal guarantees:
        ρ-zCDP with ρ = Δ²/(2σ²) under the relation for which Δ holds (Canonne, Kamath,
        Steinke 2020, Theorem 14 for one coordinate, and its multivariate form for
        independent coordinates: the Rényi divergence of order α between N_ℤ(0,σ²) and its
        shift by an integer vector μ is at most α‖μ‖₂²/(2σ²)); for one coordinate the exact
        (ε, δ) curve is CKS Theorem 7 (:func:`discrete_gaussian_delta`). As the code runs:
        the noise is drawn by CKS Algorithm 3 with integer arithmetic on random words, so its
        law is N_ℤ(0, σ²) except on the saturation event of the sampler (a proposal needing
        ≥ 2^19 consecutive Bern(e^{-1}) successes), whose total-variation effect is below
        2^{GAUSSIAN_TAIL_LOG2_BOUND} ≈ 2^{-756 000}: a δ far below any float64 and below any
        δ a release states (δ-approximate ρ-zCDP with that δ). The output is integer, so
        there is no porosity: every integer is reachable from every input. Timing (CKS §5):
        the sampler's loop runs a number of rounds that depends only on the random words,
        never on f(D); it reveals the number of rejected proposals, independent of the data.
        Not guarded: ``jax.pmap`` / ``shard_map`` with ONE key replicated to every device
        gives every device's rows the same noise draw; pass one key per device (e.g.
        ``jax.random.fold_in(key, jax.lax.axis_index(name))``) and account for every device.
        Under ``jax.vmap``: each row of a vmap that batches ``key`` with distinct keys is its own
        release with this guarantee (account for every row); a vmap of ``value`` with one key for
        all rows raises ``ValueError``, and repeated keys in the batch raise eagerly and void the
        release under ``jit`` (the int32 minimum): rows that share a key share one noise draw and
        would release their differences noise-free.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> y = discrete_gaussian(jax.random.key(0), jnp.array([10, 20]), sensitivity=1, sigma=3)
        >>> y.dtype == jnp.int32 and y.shape == (2,)
        True
    """
    _check_sensitivity(sensitivity)
    proposal, accept = _sampler_parameters(sigma_squared_fraction(sigma))
    x = _integer_values(value)
    noise, _ = integer_noise(key, x.shape, proposal, accept)
    return x + noise


def discrete_gaussian_rho(*, sensitivity: float, sigma: Any) -> float:
    r"""ρ = Δ²/(2σ²): the zCDP of the discrete Gaussian mechanism (CKS20 Theorem 14).

    Args:
        sensitivity: Δ ≥ ‖f(D) − f(D′)‖₂ > 0 (any real: √2 for replace-one histograms).
        sigma: σ > 0.

    Returns:
        ρ.

    Formal guarantees:
        Canonne, Kamath, Steinke 2020, Theorem 14: for integer shifts μ with ‖μ‖₂ ≤ Δ,
        D_α(N_ℤ(0,σ²) ‖ N_ℤ(μ,σ²)) ≤ αΔ²/(2σ²) for every α > 1 (equality when (α − 1)μ is
        integer); the same ρ as the continuous Gaussian.

    Example:
        >>> discrete_gaussian_rho(sensitivity=1, sigma=2)
        0.125
    """
    delta = _validate.positive("sensitivity", sensitivity)
    s = _validate.positive("sigma", float(sigma) if isinstance(sigma, Fraction) else sigma)
    return delta * delta / (2.0 * s * s)


def discrete_gaussian_pmf(values: Any, *, sigma: Any) -> np.ndarray:
    """P[Y = y] of N_ℤ(0, σ²) at integer ``values`` (float64; the normaliser summed to ±40σ).

    Example:
        >>> round(float(discrete_gaussian_pmf([0], sigma=1)[0]), 8)  # 1/θ₃(e^{-1/2})
        0.39894228
    """
    square = Fraction(sigma) ** 2 if isinstance(sigma, Fraction) else None
    s2 = float(square) if square is not None else _validate.positive("sigma", sigma) ** 2
    y = np.asarray(values, dtype=np.float64)
    return np.exp(-(y * y) / (2.0 * s2) - _log_normaliser(s2))


def _log_normaliser(s2: float) -> float:
    """log Σ_{|z| ≤ 40σ+1} e^{−z²/(2σ²)} (the rest is below e^{−800} relative)."""
    top = math.ceil(40.0 * math.sqrt(s2)) + 1
    z = np.arange(-top, top + 1, dtype=np.float64)
    return float(special.logsumexp(-(z * z) / (2.0 * s2)))


def _exact_s2(sigma: Any) -> Fraction:
    exact = sigma if isinstance(sigma, Fraction) else Fraction(_validate.positive("sigma", sigma))
    if not exact > 0:
        _validate.fail("sigma", sigma, "in (0, inf)")
    return exact * exact


def discrete_gaussian_delta(*, sensitivity: int, sigma: Any, epsilon: float) -> float:
    r"""Exact δ(ε) of one coordinate of the discrete Gaussian mechanism (CKS20 Theorem 7).

    .. math::
        \delta(\varepsilon) = P[Y > \varepsilon\sigma^2/\Delta - \Delta/2]
            - e^{\varepsilon} P[Y > \varepsilon\sigma^2/\Delta + \Delta/2],
        \quad Y \sim N_{\mathbb{Z}}(0, \sigma^2)

    Args:
        sensitivity: Δ, a positive integer (|f(D) − f(D′)| ≤ Δ, one integer coordinate).
        sigma: σ > 0.
        epsilon: ε ≥ 0.

    Returns:
        δ(ε), the smallest δ for which the release is (ε, δ)-DP.

    Formal guarantees:
        Canonne, Kamath, Steinke 2020, Theorem 7 (tight: the mechanism is (ε, δ)-DP iff δ is at
        least this). Computed as Σ_{y > εσ²/Δ − Δ/2} p(y)(1 − e^{ε − (2yΔ + Δ²)/(2σ²)}) in log
        space (every term ≥ 0; the threshold is found with exact rational arithmetic), the
        sums truncated at 40σ beyond their start (remainder < e^{−800} relative), and rounded
        up by a relative 1e-12 for the float64 summation (a δ below 2.2e-308 is reported as
        2.2e-308, an upper bound). For vectors use ρ
        (:func:`discrete_gaussian_rho`): Theorem 7 is the one-dimensional curve.

    Example:
        >>> round(discrete_gaussian_delta(sensitivity=1, sigma=5, epsilon=0.5), 6)
        0.000498
    """
    delta_int = _check_sensitivity(sensitivity)
    eps = _validate.non_negative("epsilon", epsilon)
    square = _exact_s2(sigma)
    s2 = float(square)
    threshold = Fraction(eps) * square / delta_int - Fraction(delta_int, 2)
    first = math.floor(threshold) + 1
    span = math.ceil(40.0 * math.sqrt(s2)) + delta_int + 2
    low = max(first, -span)
    y = np.arange(low, max(first, 0) + span + 1, dtype=np.float64)
    loss = (2.0 * y * delta_int + delta_int * delta_int) / (2.0 * s2)  # ln p(y)/p(y + Δ)
    keep = -np.expm1(np.minimum(eps - loss, 0.0))
    with np.errstate(divide="ignore"):
        log_terms = -(y * y) / (2.0 * s2) + np.log(keep)
    log_delta = special.logsumexp(log_terms) - _log_normaliser(s2)
    if log_delta < _LOG_TINY:  # below the normal float64 range: report the smallest normal
        return 0.0 if log_delta == -math.inf else _TINY
    return min(1.0, math.exp(log_delta) * (1.0 + 1e-12))


def discrete_gaussian_epsilon(*, sensitivity: int, sigma: Any, delta: float) -> float:
    """Smallest ε with :func:`discrete_gaussian_delta` ≤ δ (bisection; the exact ε, rounded up).

    Args:
        sensitivity: Δ, a positive integer (one integer coordinate).
        sigma: σ > 0.
        delta: δ in (0, 1).

    Returns:
        ε ≥ 0 such that one release is (ε, δ)-DP (CKS20 Theorem 7), within 1e-12 relative of
        the smallest such ε.

    Example:
        >>> eps = discrete_gaussian_epsilon(sensitivity=1, sigma=5, delta=1e-5)
        >>> discrete_gaussian_delta(sensitivity=1, sigma=5, epsilon=eps) <= 1e-5
        True
    """
    _check_sensitivity(sensitivity)
    target = _validate.in_range("delta", delta, 0.0, 1.0, low_inclusive=False)

    def dlt(e: float) -> float:
        return discrete_gaussian_delta(sensitivity=sensitivity, sigma=sigma, epsilon=e)

    if dlt(0.0) <= target:
        return 0.0
    s = math.sqrt(float(_exact_s2(sigma)))
    rho = float(sensitivity) ** 2 / (2.0 * s * s)
    hi = 1.01 * (rho + 2.0 * math.sqrt(rho * math.log(1.0 / target))) + 1e-9  # zCDP bound
    while dlt(hi) > target:
        hi *= 2.0
    lo = 0.0
    for _ in range(_BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        if dlt(mid) <= target:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-12 * hi:
            break
    return hi
