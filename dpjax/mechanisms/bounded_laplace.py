"""The bounded Laplace mechanism on [l, u] (lecture on advances in DP, Definition 24, Theorem 26).

The output has density ∝ exp(−|v − q|/b) on [l, u], q = f(D) ∈ [l, u]: the Laplace density
*restricted* to the domain (not clamped), with the data-dependent normaliser

    C_q = 1 − ½(exp(−(q − l)/b) + exp(−(u − q)/b)).

Because C_q depends on the data, b = Δ/ε is not enough; the lecture's Theorem 26 (Holohan,
Antonatos, Braghin & Mac Aonghusa 2018, "The Bounded Laplace Mechanism in Differential
Privacy", Journal of Privacy and Confidentiality; the ΔC condition) gives the condition solved
here on the host.

Non-finite values follow the rule of ``dpjax.mechanisms.sensitivity.clip_into_range``: under
``jit`` a NaN coordinate of f(D) is released as if it were (l + u)/2 and ±inf as u / l; an eager
call with a concrete non-finite value raises ``ValueError``.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from dpjax import _validate
from dpjax._noise import tree_noise_like
from dpjax.mechanisms._nonfinite import refuse_nonfinite
from dpjax.mechanisms.sensitivity import clip_into_range

__all__ = [
    "bounded_laplace",
    "bounded_laplace_scale",
    "bounded_laplace_delta_c",
    "bounded_laplace_epsilon",
]


def _domain(lower: float, upper: float) -> tuple[float, float]:
    for name, v in (("lower", lower), ("upper", upper)):
        _validate.in_range(name, v, float("-inf"), float("inf"), low_inclusive=False)
    if not float(lower) < float(upper):
        _validate.fail("upper", upper, f"greater than lower={lower!r} (need l < u)")
    return float(lower), float(upper)


def _check_sensitivity(sensitivity: float, width: float) -> float:
    _validate.in_range(
        "sensitivity", sensitivity, 0.0, width, low_inclusive=False, high_inclusive=True
    )
    return float(sensitivity)


def bounded_laplace_delta_c(*, b: float, sensitivity: float, lower: float, upper: float) -> float:
    r"""ΔC = C_{l+Δ}/C_l of Theorem 26: the largest ratio of normalisers of neighbours.

    .. math:: \Delta C(b) = \frac{2 - e^{-\Delta/b} - e^{-(u-l-\Delta)/b}}{1 - e^{-(u-l)/b}}

    (C_q is concave in q and symmetric about the midpoint, so max_{|q−q'|≤Δ} C_{q'}/C_q is
    attained at q = l, q' = l + Δ.) Computed with ``expm1`` so it is accurate for b ≫ u − l.
    """
    _validate.positive("b", b)
    lo, hi = _domain(lower, upper)
    width = hi - lo
    delta_q = _check_sensitivity(sensitivity, width)
    b = float(b)
    numerator = -math.expm1(-delta_q / b) - math.expm1(-(width - delta_q) / b)
    return numerator / -math.expm1(-width / b)


def bounded_laplace_epsilon(*, b: float, sensitivity: float, lower: float, upper: float) -> float:
    """Pure-DP level of the bounded Laplace mechanism: Δ/b + ln ΔC(b).

    The density ratio of neighbours is at most e^{Δ/b}·C_{q'}/C_q ≤ e^{Δ/b}ΔC, and this is
    attained (q = l, q' = l + Δ, v = l), so this is the exact ε of the (ε, 0) guarantee.
    """
    delta_c = bounded_laplace_delta_c(b=b, sensitivity=sensitivity, lower=lower, upper=upper)
    return float(sensitivity) / float(b) + math.log(delta_c)


def bounded_laplace_scale(
    *,
    sensitivity: float,
    epsilon: float,
    lower: float,
    upper: float,
    delta: float = 0.0,
) -> float:
    r"""Smallest b with :math:`b \ge \Delta/(\varepsilon - \ln\Delta C(b) - \ln(1-\delta))`.

    Solved by bisection on the host (ΔC depends on b); the returned b is the upper end of the
    final bracket, so it always satisfies the condition.

    Args:
        sensitivity: Δ of f under the caller's neighbouring relation, in (0, u − l].
        epsilon: ε > 0.
        lower: l, the lower end of the output domain.
        upper: u > l.
        delta: δ in [0, 1); δ = 0 gives pure ε-DP.

    Returns:
        The scale b.

    Formal guarantees:
        With this b the mechanism is ε'-DP for ε' = Δ/b + ln ΔC(b) ≤ ε − ln(1 − δ), hence
        (ε, 1 − e^{ε−ε'}) ⊆ (ε, δ)-DP (lecture on advances in DP, Theorem 26 (bounded Laplace);
        Holohan et al. 2018, the ΔC condition). b ≥ Δ/(ε − ln(1 − δ)) always, since ΔC ≥ 1.

    Example:
        >>> b = bounded_laplace_scale(sensitivity=1.0, epsilon=1.0, lower=0.0, upper=10.0)
        >>> b > 1.0
        True
    """
    _validate.epsilon(epsilon)
    _validate.delta(delta)
    lo, hi = _domain(lower, upper)
    delta_q = _check_sensitivity(sensitivity, hi - lo)
    budget = float(epsilon) - math.log1p(-float(delta))

    def ok(b: float) -> bool:
        return bounded_laplace_epsilon(b=b, sensitivity=delta_q, lower=lo, upper=hi) <= budget

    b_lo = delta_q / budget  # necessary: ΔC ≥ 1
    b_hi = 2.0 * b_lo
    while not ok(b_hi):
        b_lo, b_hi = b_hi, 2.0 * b_hi
    for _ in range(200):
        mid = math.sqrt(b_lo * b_hi)
        b_lo, b_hi = (b_lo, mid) if ok(mid) else (mid, b_hi)
        if b_hi / b_lo - 1.0 < 1e-13:
            break
    return b_hi


def _truncated_laplace(q: jax.Array, u01: jax.Array, b: float, lo: float, hi: float) -> jax.Array:
    """Inverse CDF of Lap(q, b) restricted to [lo, hi], driven by a uniform u01 ∈ [0, 1).

    q is first mapped into [lo, hi] by the non-finite rule (NaN ↦ midpoint, clip).
    """
    q = clip_into_range(q, lower=lo, upper=hi).astype(u01.dtype)
    # Mass of the restricted density left and right of q (unnormalised, total C_q).
    mass_left = -0.5 * jnp.expm1(-(q - lo) / b)
    mass_right = -0.5 * jnp.expm1(-(hi - q) / b)
    target = u01 * (mass_left + mass_right)
    go_left = target < mass_left
    # Within one side, P[distance ≤ t] (unnormalised) = ½(1 − e^{−t/b}) → t = −b log1p(−2m).
    m = jnp.where(go_left, mass_left - target, target - mass_left)
    distance = -b * jnp.log1p(-2.0 * m)
    v = jnp.where(go_left, q - distance, q + distance)
    return jnp.clip(v, lo, hi)


def bounded_laplace(
    key: jax.Array,
    value: Any,
    *,
    sensitivity: float,
    epsilon: float,
    lower: float,
    upper: float,
    delta: float = 0.0,
) -> Any:
    """Release f(D) with bounded Laplace noise: a sample of Lap(f(D), b) restricted to [l, u].

    Sampling is exact and loop-free (inverse CDF of the restricted density), so it runs
    under ``jit`` and ``vmap``.

    Args:
        key: a JAX PRNG key, used once.
        value: f(D), scalar/array/pytree. Finite values outside [lower, upper] are clipped
            into it (a fixed 1-Lipschitz map, so the sensitivity stays ≤ Δ). Non-finite values:
            an eager call with a concrete NaN or ±inf raises ``ValueError``; under ``jit`` a
            NaN coordinate is replaced by (lower + upper)/2 and ±inf by upper / lower (see
            ``dpjax.mechanisms.sensitivity.clip_into_range``).
        sensitivity: Δ of each coordinate under the caller's neighbouring relation, in
            (0, u − l]. For k coordinates released together, compose (k releases).
        epsilon: ε > 0 (per coordinate).
        lower: l.
        upper: u > l.
        delta: δ in [0, 1) (per coordinate).

    Returns:
        Noisy values in [lower, upper], with the structure of ``value``.

    Formal guarantees:
        Each coordinate is (ε, δ)-DP under the relation Δ holds for, with b from
        ``bounded_laplace_scale`` (lecture on advances in DP, Definition 24 and Theorem 26
        (bounded Laplace); Holohan et al. 2018). Unlike the Laplace mechanism, the guarantee is
        per coordinate: a vector release composes over its coordinates. Δ is a bound on
        |g(D) − g(D′)| for the mapped statistic g = clip_into_range ∘ f; for a finite f this is
        implied by f's sensitivity. If f itself can be NaN on D and finite on a neighbour D′,
        the released law on D is that of q = (l + u)/2, so Δ must cover |(l + u)/2 − f(D′)|
        (at most (u − l)/2); the release is never NaN.

    Example:
        >>> import jax
        >>> y = bounded_laplace(jax.random.key(0), 0.5, sensitivity=1.0, epsilon=1.0,
        ...                     lower=0.0, upper=10.0)
        >>> bool(0.0 <= y <= 10.0)
        True
    """
    b = bounded_laplace_scale(
        sensitivity=sensitivity, epsilon=epsilon, lower=lower, upper=upper, delta=delta
    )
    lo, hi = float(lower), float(upper)
    refuse_nonfinite("value", value)
    uniforms = tree_noise_like(key, value, jax.random.uniform)

    def release(q: Any, u01: jax.Array) -> jax.Array:
        return _truncated_laplace(jnp.asarray(q), u01, b, lo, hi)

    return jax.tree.map(release, value, uniforms)
