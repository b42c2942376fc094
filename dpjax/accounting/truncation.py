r"""The δ floor that a sampler's bounded support puts under DP-SGD.

A floating-point Gaussian sampler has a largest output z_max (in units of σ). Where the output
law on D has mass that the law on D′ has not, the privacy loss is infinite, so no (ε, δ)
statement with δ below that mass can hold, whatever ε.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpjax import _random, _validate

__all__ = ["noise_truncation_delta"]

_SAMPLERS = ("dpjax", "legacy")
_TOP_ATOM = 2.0**-64  # mass of the top value of dpjax._random.normal on one coordinate


def noise_truncation_delta(
    *,
    noise_multiplier: float,
    sampling_rate: float,
    steps: int,
    num_coordinates: int,
    dtype: Any = np.float32,
    sampler: str = "dpjax",
) -> float:
    r"""δ floor of T Poisson-sampled Gaussian releases from a sampler truncated at ±z_max.

    .. math::  \delta_{\text{floor}} = 1 - (1 - q\,p - \eta)^T, \quad
       p = \max\big(\bar\Phi(z_{\max} - 1/\sigma),\ 1 - (1 - a)^d\big)

    Args:
        noise_multiplier: σ > 0 (noise std in units of the ℓ2 sensitivity C).
        sampling_rate: Poisson rate q ∈ (0, 1].
        steps: T ≥ 1 releases.
        num_coordinates: d, the number of noised coordinates (parameters) per release.
        dtype: the dtype of the update the noise is added to (bfloat16 / float16 / float32 /
            float64): it selects the sampler's support.
        sampler: ``"dpjax"`` (:mod:`dpjax._random`: z_max = 9.155 in float32 and float64 —
            the noise is drawn in at least float32) or ``"legacy"`` (``jax.random.normal`` in
            ``dtype``: z_max = 5.2201 in float32, 3.182 in float16, 2.516 in bfloat16).

    Returns:
        The floor (a float in [0, 1]): no accountant's δ below it is achievable.

    Raises:
        ValueError: σ ≤ 0 or not finite, q outside (0, 1], steps < 1, unknown sampler.

    Formal guarantees:
        Add/remove-one, clipped sum of ℓ2 sensitivity C, noise σC·Z with Z on [−z_max, z_max]
        per coordinate (z_max measured by feeding the sampler all-zero / all-one random words).
        Take the differing example's clipped gradient g = C·e₁ (allowed: ‖g‖₂ = C). With the
        example, one release is the mixture (1 − q)·P₀ + q·P_g; the set
        A = {y : y₁ > s₁ + σC·z_max} has P₀(A) = 0 and P_g(A) = P[Z > z_max − 1/σ], so the
        neighbour without the example gives A probability 0 while the one with it gives
        q·P[Z > z_max − 1/σ] (the other direction uses g = −C·e₁ and the negative tail). T
        releases with independent noise (adaptive composition) hit such a set at least once
        with probability 1 − (1 − q·p)^T, an event of probability 0 under the neighbour, so
        δ(ε) ≥ that for every ε (the δ of hypothesis testing: Kairouz, Oh, Viswanath 2015,
        "The composition theorem for differential privacy", the privacy region). p is taken
        as Φ̄(z_max − 1/σ), the tail of the exact normal, which the sampler reproduces up to
        one 2⁻⁶³ cell (2⁻²³ for legacy). Second witness (dpjax sampler): its top value is an
        ATOM of mass a = 2⁻⁶⁴ on every coordinate (the one word pair with U = 2⁻⁶⁴ takes the
        whole ideal tail cell). Spread the gradient, g = (C/√d)·(1, …, 1): every coordinate can
        land at s_i + g_i + σC·z_max, which the neighbour never produces, so one release has an
        infinite-loss event of probability ≥ q·(1 − (1 − a)^d); p is the larger of the two.
        It is a floor only (a lower bound on the δ any accountant can claim, not an upper
        bound on the sampler's extra δ): the float outputs are also porous (Mironov 2012),
        which this number does not cover. Third term (dpjax sampler, float32 noise): η =
        :func:`dpjax._random.normal_overflow_probability` (d), the probability that a draw
        leaves a tail lane unrefined (a block of 4096 coordinates with ≥ 3 of its 2⁻³¹-rare
        tail lanes). Off that event the draw equals the fully refined sampler coordinate for
        coordinate (a coupling), so η bounds, per release and whatever the data, the mass on
        which the sampler departs from the law analysed here; it is added to the per-release
        term (an upper-bound term inside the floor: the published number errs upwards).

    Example:
        >>> floor = noise_truncation_delta(noise_multiplier=1.1, sampling_rate=0.0051,
        ...                                steps=10_000, num_coordinates=1, sampler="legacy")
        >>> f"{floor:.2g}"  # jax.random.normal float32: z_max = 5.2201
        '0.00041'
        >>> noise_truncation_delta(
        ...     noise_multiplier=0.5, sampling_rate=1.0, steps=1, num_coordinates=10**6
        ... ) < 1e-12
        True
    """
    _validate.positive("noise_multiplier", noise_multiplier)
    _validate.in_range(
        "sampling_rate", sampling_rate, 0.0, 1.0, low_inclusive=False, high_inclusive=True
    )
    steps = _validate.positive_int("steps", steps)
    _validate.one_of("sampler", sampler, _SAMPLERS)
    if sampler == "dpjax":
        z_max = _random.gaussian_support_max(dtype)
    else:
        z_max = _random.legacy_gaussian_support_max(dtype)
    d = _validate.positive_int("num_coordinates", num_coordinates)
    tail = _random.gaussian_tail(z_max - 1.0 / noise_multiplier)
    atom = _TOP_ATOM if sampler == "dpjax" else 0.0  # legacy: the tail witness only
    overflow = _random.normal_overflow_probability(d, dtype) if sampler == "dpjax" else 0.0
    per_step = sampling_rate * max(tail, float(-np.expm1(d * np.log1p(-atom)))) + overflow
    per_step = min(per_step, 1.0)
    return float(-np.expm1(steps * np.log1p(-per_step)))
