"""The Gaussian mechanism: classical (Dwork & Roth 2014; Abadi et al. 2016; Dwork &
Roth 2014) and analytic (Balle & Wang 2018) calibration.

Every calibration here is scale-free: the privacy of N(0, σ²) noise on a statistic of ℓ2
sensitivity Δ depends only on the ratio σ/Δ, so the ratio is found first (in float64 at
Δ = 1) and σ = ratio·Δ is formed last, refusing a sensitivity for which that product is not a
finite, normal float64 (an underflow to 0 or to a subnormal would release almost no noise).
"""

from __future__ import annotations

import math
import sys
from typing import Any

import jax
from scipy import special

from dpjax import _validate
from dpjax._noise import tree_add_noise
from dpjax.mechanisms._nonfinite import zero_nonfinite
from dpjax.mechanisms._scale import GAUSSIAN_SUPPORT, refuse_overflowing_noise
from dpjax.mechanisms._vmap_guard import guarded_release

__all__ = [
    "gaussian",
    "gaussian_sigma",
    "classic_gaussian_sigma",
    "classic_gaussian_ratio",
    "analytic_gaussian_sigma",
    "gaussian_delta",
    "gaussian_epsilon",
]

_CALIBRATIONS = ("analytic", "classic")
_BISECTION_STEPS = 200


def gaussian_delta(*, sigma: float, sensitivity: float, epsilon: float) -> float:
    r"""Exact δ(ε) of the Gaussian mechanism N(0, σ²) with ℓ2 sensitivity Δ (its privacy profile).

    .. math::
        \delta(\varepsilon) = \Phi(\Delta/(2\sigma) - \varepsilon\sigma/\Delta)
          - e^{\varepsilon}\,\Phi(-\Delta/(2\sigma) - \varepsilon\sigma/\Delta)

    Formal guarantees:
        The mechanism is (ε, δ)-DP iff δ ≥ this value, for neighbours at ℓ2 distance at most Δ
        under the caller's relation (Balle & Wang, ICML 2018, Theorem 8). Computed in float64
        with the second term in log space, so it does not overflow at large ε.
    """
    sigma = _validate.positive("sigma", sigma)
    sensitivity = _validate.positive("sensitivity", sensitivity)
    epsilon = _validate.non_negative("epsilon", epsilon)
    a = sensitivity / (2.0 * sigma)
    b = epsilon * sigma / sensitivity
    first = special.ndtr(a - b)
    second = math.exp(epsilon + special.log_ndtr(-a - b))
    return max(float(first - second), 0.0)


def gaussian_epsilon(*, sigma: float, sensitivity: float, delta: float) -> float:
    """Smallest ε with gaussian_delta(ε) ≤ δ, by bisection (the exact ε of one release).

    Formal guarantees:
        The returned ε is the upper end of the final bisection bracket, so the mechanism is
        (ε, δ)-DP at it (Balle & Wang, ICML 2018, Theorem 8).
    """
    sigma = _validate.positive("sigma", sigma)
    sensitivity = _validate.positive("sensitivity", sensitivity)
    delta = _validate.in_range("delta", delta, 0.0, 1.0, low_inclusive=False)

    def excess(eps: float) -> float:
        return gaussian_delta(sigma=sigma, sensitivity=sensitivity, epsilon=eps) - delta

    if excess(0.0) <= 0:
        return 0.0
    lo, hi = 0.0, 1.0
    while excess(hi) > 0:
        lo, hi = hi, 2.0 * hi
    for _ in range(_BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if excess(mid) <= 0 else (mid, hi)
    return hi


def _sigma_for_ratio(ratio: float, sensitivity: float, epsilon: float, delta: float) -> float:
    """σ = ratio·Δ, refusing a sensitivity for which σ is not a finite, normal float64."""
    sigma = ratio * sensitivity
    if not sys.float_info.min <= sigma < math.inf:
        low, high = sys.float_info.min / ratio, sys.float_info.max / ratio
        _validate.fail(
            "sensitivity",
            sensitivity,
            f"in [{low:.3g}, {high:.3g}] for epsilon={epsilon!r}, delta={delta!r} "
            f"(sigma = {ratio:.6g} * sensitivity must be a finite, normal float64)",
        )
    return sigma


def classic_gaussian_ratio(*, epsilon: float, delta: float) -> float:
    r"""The classical formula :math:`\sigma/\Delta_2 = \sqrt{2\ln(1.25/\delta)}/\varepsilon`, as
    a formula: the one home of it, without the theorem's range check.

    For excess-risk bounds and recipes that quote the formula; to calibrate noise use
    :func:`classic_gaussian_sigma` (which refuses ε ≥ 1, where the theorem does not hold) or
    :func:`analytic_gaussian_sigma`.

    Args:
        epsilon: ε in (0, inf).
        delta: δ in (0, 1).

    Returns:
        σ/Δ₂ (``inf`` if it overflows).

    Example:
        >>> round(classic_gaussian_ratio(epsilon=0.5, delta=1e-5), 4)
        9.6896
    """
    epsilon = _validate.epsilon("epsilon", epsilon)
    delta = _validate.in_range("delta", delta, 0.0, 1.0, low_inclusive=False)
    return math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


def classic_gaussian_sigma(*, sensitivity: float, epsilon: float, delta: float) -> float:
    r"""The classical calibration :math:`\sigma = \Delta_2\sqrt{2\ln(1.25/\delta)}/\varepsilon`.

    Formal guarantees:
        (ε, δ)-DP for ε ∈ (0, 1), for ℓ2 sensitivity Δ₂ under the caller's neighbouring
        relation (Dwork & Roth 2014, Theorem A.1; Dwork & Roth 2014, the Gaussian
        mechanism). The theorem does not cover ε ≥ 1 and the formula really fails beyond
        ε ≈ 8.4 at δ = 1e-5 , so ε ≥ 1 is refused: use
        ``analytic_gaussian_sigma``.

    Raises:
        ValueError: ε outside (0, 1), δ outside (0, 1), a non-positive sensitivity, or one so
            small or large that σ is not a finite, normal float64.
    """
    sensitivity = _validate.positive("sensitivity", sensitivity)
    epsilon = _validate.epsilon("epsilon", epsilon)
    delta = _validate.in_range("delta", delta, 0.0, 1.0, low_inclusive=False)
    if not epsilon < 1.0:
        raise ValueError(
            "epsilon must be in (0, 1) for calibration='classic' (Dwork & Roth 2014, Thm A.1); "
            f"got {epsilon!r}. Use calibration='analytic' (Balle & Wang 2018), which is exact "
            "for every epsilon."
        )
    ratio = classic_gaussian_ratio(epsilon=epsilon, delta=delta)
    if math.isinf(ratio):
        _validate.fail("epsilon", epsilon, "large enough that sigma/sensitivity is finite")
    return _sigma_for_ratio(ratio, sensitivity, epsilon, delta)


def _analytic_ratio(epsilon: float, delta: float) -> float:
    """Smallest σ/Δ (to 1e-13 relative) with ``gaussian_delta(σ/Δ, 1, ε) ≤ δ``, by bisection."""

    def ok(ratio: float) -> bool:
        return gaussian_delta(sigma=ratio, sensitivity=1.0, epsilon=epsilon) <= delta

    lo = hi = 1.0
    while not ok(hi):
        if hi > sys.float_info.max / 4.0:
            _validate.fail(
                "epsilon",
                epsilon,
                f"large enough that sigma/sensitivity is a finite float64 at delta={delta!r}",
            )
        hi *= 2.0
    while ok(lo) and lo > 1e-300:
        lo *= 0.5
    for _ in range(_BISECTION_STEPS):
        mid = math.exp(0.5 * (math.log(lo) + math.log(hi)))  # geometric mean, no underflow
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
        if hi / lo - 1.0 < 1e-13:
            break
    return hi


def analytic_gaussian_sigma(*, sensitivity: float, epsilon: float, delta: float) -> float:
    """Smallest σ for which N(0, σ²) noise is (ε, δ)-DP, for every ε > 0 (Balle & Wang 2018).

    Solves ``gaussian_delta(sigma/sensitivity) = delta`` by bisection on log(σ/Δ) at Δ = 1 (the
    profile depends on σ/Δ only), scales by Δ and rounds σ up until the exact condition holds
    at the given Δ, so the returned σ always satisfies it.

    Formal guarantees:
        (ε, δ)-DP for ℓ2 sensitivity Δ under the caller's neighbouring relation, exactly when
        ``gaussian_delta(sigma=σ, ...) ≤ δ`` (Balle & Wang, ICML 2018, Theorem 8 /
        Algorithm 1 "analytic Gaussian mechanism").

    Raises:
        ValueError: ε ≤ 0, δ outside (0, 1), a non-positive sensitivity, or one so small or
            large that σ is not a finite, normal float64 (the message gives the valid range).

    Example:
        >>> round(analytic_gaussian_sigma(sensitivity=1.0, epsilon=1.0, delta=1e-5), 2)
        3.73
    """
    sensitivity = _validate.positive("sensitivity", sensitivity)
    epsilon = _validate.epsilon("epsilon", epsilon)
    delta = _validate.in_range("delta", delta, 0.0, 1.0, low_inclusive=False)
    sigma = _sigma_for_ratio(_analytic_ratio(epsilon, delta), sensitivity, epsilon, delta)
    while gaussian_delta(sigma=sigma, sensitivity=sensitivity, epsilon=epsilon) > delta:
        sigma = math.nextafter(sigma, math.inf)  # the product ratio·Δ rounded down
    return sigma


def gaussian_sigma(
    *, sensitivity: float, epsilon: float, delta: float, calibration: str = "analytic"
) -> float:
    """Noise standard deviation σ of the Gaussian mechanism.

    Args:
        sensitivity: ℓ2 sensitivity Δ₂ under the caller's neighbouring relation.
        epsilon: ε > 0 (``calibration="classic"`` requires ε < 1).
        delta: δ in (0, 1).
        calibration: ``"analytic"`` (default; Balle & Wang 2018, exact for all ε) or
            ``"classic"`` (σ = Δ√(2 ln(1.25/δ))/ε of Dwork & Roth 2014, Thm A.1; ε < 1 only).

    Returns:
        σ (a Python float) such that adding N(0, σ²) to every coordinate is (ε, δ)-DP.

    Formal guarantees:
        See ``analytic_gaussian_sigma`` and ``classic_gaussian_sigma``.
    """
    calibration = _validate.one_of("calibration", calibration, _CALIBRATIONS)
    if calibration == "classic":
        return classic_gaussian_sigma(sensitivity=sensitivity, epsilon=epsilon, delta=delta)
    return analytic_gaussian_sigma(sensitivity=sensitivity, epsilon=epsilon, delta=delta)


@guarded_release("value")
def gaussian(
    key: jax.Array,
    value: Any,
    *,
    sensitivity: float,
    epsilon: float,
    delta: float,
    calibration: str = "analytic",
) -> Any:
    r"""Release ``value + N(0, σ²)`` on every coordinate, σ from ``gaussian_sigma``.

    Args:
        key: a JAX PRNG key, used once.
        value: f(D): a scalar, an array or a pytree of arrays. Non-finite entries (unbounded
            sensitivity) raise ``ValueError`` when concrete and are replaced by 0 before the
            noise under ``jit``/``vmap``.
        sensitivity: ℓ2 sensitivity Δ₂ of f (over the whole pytree) under the caller's
            neighbouring relation.
        epsilon: ε > 0.
        delta: δ in (0, 1).
        calibration: ``"analytic"`` (default) or ``"classic"`` (ε < 1 only).

    Returns:
        The noisy answer, with the structure of ``value``.

    Raises:
        ValueError: invalid ε, δ or sensitivity; a concrete non-finite ``value``; a
            sensitivity so large that value + noise (up to 9.2σ) overflows the value's float
            dtype to ±inf (the message gives the largest admissible sensitivity).

    Formal guarantees:
        (ε, δ)-DP under the relation Δ₂ holds for (Dwork & Roth 2014, the Gaussian
        mechanism; Balle & Wang 2018, Theorem 8 for the analytic calibration). The non-finite
        rule makes every released coordinate finite-plus-noise: never inf/NaN without noise.
        Input dtype: ``value`` is never rounded before the noise. A concrete value that the
        noise dtype cannot hold exactly (float64 or a wide integer while JAX computes in
        float32) is added to the noise in float64 on the host and rounded once after;
        traced wide integers are clamped (1-Lipschitz) into float32's exact range; an inexact
        float64 constant closed over inside ``jit`` raises ``ValueError``
        (:func:`dpjax._noise.exact_sum_with_noise`).
        Not guarded: ``jax.pmap`` / ``shard_map`` with ONE key replicated to every device
        gives every device's rows the same noise draw; pass one key per device (e.g.
        ``jax.random.fold_in(key, jax.lax.axis_index(name))``) and account for every device.
        Under ``jax.vmap``: each row of a vmap that batches ``key`` with distinct keys is its own
        release with this guarantee (account for every row); a vmap of ``value`` with one key for
        all rows raises ``ValueError``, and repeated keys in the batch raise eagerly and void the
        release under ``jit`` (NaN): rows that share a key share one noise draw and would release
        their differences noise-free.

    Security:
        JAX's threefry PRNG and float noise are fine for research and audits; releases of real
        data need OS-seeded keys and non-porous noise .

    Example:
        >>> import jax, jax.numpy as jnp
        >>> y = gaussian(jax.random.key(0), jnp.zeros(3), sensitivity=1.0, epsilon=1.0, delta=1e-5)
        >>> y.shape
        (3,)
    """
    value = zero_nonfinite("value", value)
    sigma = gaussian_sigma(
        sensitivity=sensitivity, epsilon=epsilon, delta=delta, calibration=calibration
    )
    refuse_overflowing_noise(
        value,
        sigma,
        support=GAUSSIAN_SUPPORT,
        sensitivity=sensitivity,
        context=f"epsilon={epsilon!r}, delta={delta!r}",
    )
    return tree_add_noise(key, value, jax.random.normal, sigma)
