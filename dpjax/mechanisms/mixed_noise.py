"""The mixed-noise mechanism (Gaussian noise for small Δ, Laplace noise otherwise).

The mechanism adds Gaussian noise when the sensitivity Δ is at most a threshold t₀ and Laplace
noise Lap(Δ/ε) otherwise; its usual statement takes t₀ = √π δε/2 and σ²_MNM = 2(Δ/ε)².

**That statement is not correct, and dpjax does not use its σ.** (ε, δ)-DP of additive
noise is scale invariant: N(0, σ²) with σ = √2Δ/ε has the exact privacy profile
δ*(ε) = Φ(ε/(2√2) − √2) − e^ε Φ(−ε/(2√2) − √2) (Balle & Wang 2018, Thm 8) whatever Δ is, so a
threshold on Δ cannot make it (ε, δ)-DP for δ < δ*(ε) (δ*(1) ≈ 0.040; see
``mixed_noise_lecture_delta``). Because Δ is public, choosing the branch from Δ costs no
privacy; dpjax keeps Definition 9's branch rule and threshold and calibrates the Gaussian
branch exactly (analytic Gaussian, the smallest σ that is (ε, δ)-DP). When δ ≥ δ*(ε) that σ is
at most the stated √2Δ/ε.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax

from dpjax import _validate
from dpjax._noise import tree_add_noise
from dpjax.mechanisms._vmap_guard import guarded_release
from dpjax.mechanisms.gaussian import analytic_gaussian_sigma, gaussian_delta
from dpjax.mechanisms.laplace import laplace_scale

__all__ = [
    "MixedNoiseScale",
    "mixed_noise",
    "mixed_noise_scale",
    "mixed_noise_threshold",
    "mixed_noise_lecture_delta",
]


class MixedNoiseScale(NamedTuple):
    """Which noise the mixed-noise mechanism adds, and its scale (σ or b)."""

    distribution: str  # "gaussian" (scale = σ) or "laplace" (scale = b)
    scale: float


def mixed_noise_threshold(*, epsilon: float, delta: float) -> float:
    """The threshold t₀ = √π δε/2 of the usual statement (Gaussian branch when Δ ≤ t₀).

    Example:
        >>> round(mixed_noise_threshold(epsilon=1.0, delta=0.1), 6)
        0.088623
    """
    _validate.epsilon("epsilon", epsilon)
    _validate.in_range("delta", delta, 0.0, 1.0, low_inclusive=False)
    return math.sqrt(math.pi) * float(delta) * float(epsilon) / 2.0


def mixed_noise_lecture_delta(*, epsilon: float) -> float:
    """Exact δ at ε of the Gaussian branch with the usual statement's σ = √2Δ/ε (independent of Δ).

    The mechanism as usually stated claims (ε, δ)-DP for
    every δ once Δ ≤ √π δε/2; this exact profile shows the branch is (ε, δ)-DP only for
    δ ≥ this value (e.g. ≈ 0.0396 at ε = 1).

    Formal guarantees:
        Balle & Wang 2018, Theorem 8, through ``gaussian_delta`` (σ/Δ = √2/ε).
    """
    _validate.epsilon("epsilon", epsilon)
    return gaussian_delta(sigma=math.sqrt(2.0) / float(epsilon), sensitivity=1.0, epsilon=epsilon)


def mixed_noise_scale(
    *, sensitivity: float, epsilon: float, delta: float, threshold: float | None = None
) -> MixedNoiseScale:
    """Calibration of the mixed-noise mechanism: which noise, and its scale.

    Args:
        sensitivity: Δ > 0 of the query (ℓ2 for the Gaussian branch, ℓ1 for the Laplace branch;
            they coincide for a scalar query) under the caller's neighbouring relation.
        epsilon: ε > 0.
        delta: δ in (0, 1).
        threshold: t₀; default ``mixed_noise_threshold(epsilon, delta)`` (the stated Theorem
            10). Must not depend on the data (it is compared with the public Δ).

    Returns:
        ``MixedNoiseScale("gaussian", σ)`` with σ = ``analytic_gaussian_sigma(Δ, ε, δ)`` if
        Δ ≤ t₀, else ``MixedNoiseScale("laplace", Δ/ε)``.

    Formal guarantees:
        Each branch is (ε, δ)-DP on its own (Laplace: ε-DP, Dwork & Roth 2014;
        Gaussian: Balle & Wang 2018, Thm 8) and the branch is a function of public Δ only, so
        the mechanism is (ε, δ)-DP. This deviates from the usual statement's σ², which is
        not DP (module docstring).
    """
    _validate.positive("sensitivity", sensitivity)
    t0 = mixed_noise_threshold(epsilon=epsilon, delta=delta)
    if threshold is not None:
        t0 = float(_validate.positive("threshold", threshold))
    if float(sensitivity) <= t0:
        sigma = analytic_gaussian_sigma(sensitivity=sensitivity, epsilon=epsilon, delta=delta)
        return MixedNoiseScale("gaussian", sigma)
    return MixedNoiseScale("laplace", laplace_scale(sensitivity=sensitivity, epsilon=epsilon))


@guarded_release("value")
def mixed_noise(
    key: jax.Array,
    value: Any,
    *,
    sensitivity: float,
    epsilon: float,
    delta: float,
    threshold: float | None = None,
) -> Any:
    """Mixed-noise mechanism: Gaussian noise if Δ ≤ t₀, else Laplace noise .

    Args:
        key: a JAX PRNG key, used once.
        value: f(D): a scalar, an array or a pytree of arrays.
        sensitivity: Δ of f under the caller's neighbouring relation (ℓ1 for the Laplace
            branch, ℓ2 for the Gaussian branch; pass the larger if they differ).
        epsilon: ε > 0.
        delta: δ in (0, 1).
        threshold: t₀ (default √π δε/2, the usual statement's).

    Returns:
        The noisy answer, with the structure of ``value``.

    Formal guarantees:
        (ε, δ)-DP under the relation Δ holds for; see ``mixed_noise_scale`` and the module
        docstring for why the Gaussian branch uses the analytic σ instead of the usual statement's.
        Under ``jax.vmap``: each row of a vmap that batches ``key`` with distinct keys is its own
        release with this guarantee (account for every row); a vmap of ``value`` with one key for
        all rows raises ``ValueError``, and repeated keys in the batch raise eagerly and void the
        release under ``jit`` (NaN): rows that share a key share one noise draw and would release
        their differences noise-free.

    Example:
        >>> import jax
        >>> y = mixed_noise(jax.random.key(0), 1.0, sensitivity=1.0, epsilon=1.0, delta=1e-5)
        >>> y.shape
        ()
    """
    choice = mixed_noise_scale(
        sensitivity=sensitivity, epsilon=epsilon, delta=delta, threshold=threshold
    )
    sampler = jax.random.normal if choice.distribution == "gaussian" else jax.random.laplace
    return tree_add_noise(key, value, sampler, choice.scale)
