r"""Accounting of DP-SGD on batches drawn uniformly WITH replacement (b draws from n).

The mechanism (:class:`dpjax.dp_sgd.WithReplacementSampler`): each step draws b indices
independently and uniformly from the n records; every draw is clipped to C on its own and the
clipped sum gets N(0, (σC)²) once. A record drawn k times contributes up to k·C: the
multiplicity k ~ Binomial(b, 1/n) is *charged*, not clipped away.

Relation: replace-one (n and b are public; neighbouring data sets differ in one record's value).

One step's privacy profile (both directions, ε' ≥ 0):

.. math::

    δ'(ε') = \sum_{k=1}^{b} \binom{b}{k} n^{-k} (1 - 1/n)^{b-k}\,
             δ_{\mathcal N}\big(ε;\ μ_k = 2k/σ\big),
    \qquad ε = \ln\big(1 + (e^{ε'} - 1)/η\big),\quad η = 1 - (1 - 1/n)^b,

with δ_N(ε; μ) the Gaussian profile Φ(μ/2 − ε/μ) − e^ε Φ(−μ/2 − ε/μ). For ε' < 0 the
profile follows by duality, δ(ε') = 1 − e^{ε'} + e^{ε'} δ(−ε'). The T-step guarantee composes a
pessimistic ("connect the dots") PLD built from this profile.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from scipy import special, stats

from dpjax import _validate
from dpjax import events as ev

__all__ = [
    "with_replacement_delta",
    "with_replacement_pld",
    "with_replacement_epsilon",
]

_TAIL = 1e-14  # binomial tail mass P[K > k_max], lumped into δ (each δ_N ≤ 1)
_HALF_POINTS = 10_000  # connect-the-dots points per side of 0
_TOP_DELTA = 1e-12  # profile value where the grid stops (the rest is mass at +inf)


def _check(noise_multiplier: float, batch_size: int, dataset_size: int):
    sigma = _validate.positive("noise_multiplier", noise_multiplier)
    b = _validate.positive_int("batch_size", batch_size)
    n = _validate.positive_int("dataset_size", dataset_size)
    if n < 2:
        _validate.fail("dataset_size", n, "at least 2 (replace-one needs two records)")
    return sigma, b, n


def _multiplicities(b: int, n: int) -> tuple[np.ndarray, np.ndarray, float, float]:
    """(k = 1..k_max, P[K = k], tail P[K > k_max], η = P[K ≥ 1]) for K ~ Binomial(b, 1/n)."""
    dist = stats.binom(b, 1.0 / n)
    k_max = int(min(b, max(1, dist.isf(_TAIL)) + 1))
    ks = np.arange(1, k_max + 1)
    eta = -math.expm1(b * math.log1p(-1.0 / n))
    return ks, dist.pmf(ks), float(dist.sf(k_max)), eta


def _gaussian_delta(eps: np.ndarray, mu: np.ndarray) -> np.ndarray:
    """δ_N(ε; μ) (broadcast), rounded up by a relative 1e-12 to stay an upper bound."""
    a, c = mu / 2.0, eps / mu
    first = special.ndtr(a - c)
    second = np.exp(np.minimum(eps + special.log_ndtr(-a - c), 0.0))
    return np.clip(first * (1.0 + 1e-12) - second * (1.0 - 1e-12), 0.0, 1.0)


def _delta_nonneg(eps_prime: np.ndarray, sigma: float, b: int, n: int) -> np.ndarray:
    ks, pmf, tail, eta = _multiplicities(b, n)
    eps = np.log1p(np.expm1(eps_prime) / eta)
    mus = 2.0 * ks / sigma
    terms = _gaussian_delta(eps[:, None], mus[None, :]) * pmf[None, :]
    return np.minimum(terms.sum(axis=1) + tail, 1.0)


def with_replacement_delta(
    epsilon, *, noise_multiplier: float, batch_size: int, dataset_size: int
) -> np.ndarray | float:
    r"""δ(ε) of ONE with-replacement DP-SGD step (replace-one, either direction).

    Formal guarantees:
        Balle, Barthe, Gaboardi 2018 ("Privacy amplification by subsampling: tight analyses
        via couplings and divergences"), sampling with replacement under substitution: advanced
        joint convexity (their Theorem 2) with η = P[record drawn] = 1 − (1 − 1/n)^b, and the
        coupling that keeps every draw but the k draws of the differing record bounds both
        divergences by the k-fold group profile. Per-draw clipping makes that profile exactly a
        Gaussian with sensitivity 2kC (k replaced draws, each moving the sum by ≤ 2C), so
        δ'(ε') = Σ_k P[K = k] δ_N(ln(1 + (e^{ε'} − 1)/η); 2k/σ), K ~ Binomial(b, 1/n).
        For b = 1 this is the textbook amplification lemma (ln(1 + (e^ε − 1)p), pδ) with
        p = 1/n. Negative ε by the duality δ(ε) = 1 − e^ε + e^ε δ(−ε) (the bound holds in
        both directions).

    Args:
        epsilon: ε (scalar or array, any real).
        noise_multiplier: σ/C > 0 (noise std over the per-draw clip norm).
        batch_size: b ≥ 1 draws per step.
        dataset_size: n ≥ 2.

    Returns:
        δ(ε), same shape as ``epsilon``.

    Example:
        >>> d = with_replacement_delta(1.0, noise_multiplier=1.0, batch_size=1, dataset_size=100)
        >>> bool(0.0 < d < 0.01)
        True
    """
    sigma, b, n = _check(noise_multiplier, batch_size, dataset_size)
    eps = np.atleast_1d(np.asarray(epsilon, dtype=np.float64))
    out = np.empty_like(eps)
    pos = eps >= 0.0
    out[pos] = _delta_nonneg(eps[pos], sigma, b, n)
    neg = ~pos
    if neg.any():
        e = eps[neg]
        out[neg] = np.clip(-np.expm1(e) + np.exp(e) * _delta_nonneg(-e, sigma, b, n), 0.0, 1.0)
    return float(out[0]) if np.ndim(epsilon) == 0 else out


def _pmf_delta(pmf, eps: np.ndarray) -> np.ndarray:
    """δ(ε) of a dense PLD pmf at sorted ``eps`` by suffix sums (O(grid + len(eps)))."""
    dense = pmf.to_dense_pmf()
    probs = dense._probs  # noqa: SLF001 (no public accessor)
    losses = (dense._lower_loss + np.arange(probs.size)) * dense._discretization  # noqa: SLF001
    tail_p = np.concatenate([np.cumsum(probs[::-1])[::-1], [0.0]])
    tail_q = np.concatenate([np.cumsum((probs * np.exp(-losses))[::-1])[::-1], [0.0]])
    first = np.searchsorted(losses, eps, side="right")  # losses strictly above ε
    body = tail_p[first] - np.exp(eps) * tail_q[first]
    return np.maximum(body, 0.0) + dense._infinity_mass  # noqa: SLF001


@functools.lru_cache(maxsize=16)
def _step_pld(sigma: float, b: int, n: int, vdi: float) -> pld_lib.PrivacyLossDistribution:
    top = 1.0
    while with_replacement_delta(top, noise_multiplier=sigma, batch_size=b, dataset_size=n) > (
        _TOP_DELTA
    ):
        top *= 1.25
        if top > 1e3:
            break
    m = int(math.ceil(top / vdi))
    # Connect the dots holds for any increasing support: a stride > 1 (at most ~2·10⁴ points)
    # only adds pessimism (linear interpolation in e^ε of a convex profile lies above it).
    stride = max(1, m // _HALF_POINTS)
    rounded = np.unique(np.concatenate([np.arange(-m, m + 1, stride), [m]]))
    deltas = with_replacement_delta(
        rounded * vdi, noise_multiplier=sigma, batch_size=b, dataset_size=n
    )
    deltas = np.minimum.accumulate(deltas)  # monotone already; guards last-ulp noise
    pmf = pld_pmf.create_pmf_pessimistic_connect_dots(vdi, rounded, deltas)
    if np.any(_pmf_delta(pmf, rounded * vdi) < deltas - 1e-12):  # must dominate the profile
        raise ArithmeticError("with-replacement PLD does not dominate its privacy profile")
    return pld_lib.PrivacyLossDistribution(pmf, pmf)


def with_replacement_pld(
    event: ev.WithReplacementGaussianEvent, *, value_discretization_interval: float = 1e-4
) -> pld_lib.PrivacyLossDistribution:
    """The (pessimistic) PLD of ``event.count`` steps; see :func:`with_replacement_delta`.

    Formal guarantees:
        The one-step PLD is the pessimistic connect-the-dots discretisation (Doroshenko,
        Ghazi, Kamath, Kumar, Manurangsi 2022) of the profile of
        :func:`with_replacement_delta`; its δ(ε) is checked to dominate that profile at every
        grid point, and PLD composition of dominating pairs dominates the composition.
    """
    if not isinstance(event, ev.WithReplacementGaussianEvent):
        _validate.fail("event", event, "a WithReplacementGaussianEvent")
    step = _step_pld(
        event.noise_multiplier,
        event.batch_size,
        event.dataset_size,
        _validate.positive("value_discretization_interval", value_discretization_interval),
    )
    if event.count == 1:
        return step
    return step.self_compose(event.count, tail_mass_truncation=1e-15)


def with_replacement_epsilon(
    *,
    noise_multiplier: float,
    batch_size: int,
    dataset_size: int,
    steps: int,
    delta: float,
    value_discretization_interval: float = 1e-4,
) -> float:
    """ε(δ) of ``steps`` with-replacement DP-SGD steps (replace-one), by PLD.

    Example:
        >>> e = with_replacement_epsilon(noise_multiplier=2.0, batch_size=10, dataset_size=1000,
        ...                              steps=10, delta=1e-5, value_discretization_interval=1e-3)
        >>> round(e, 2)  # Poisson sampling at q = 0.01 (replace-one) gives 0.10
        1.14
    """
    event = ev.WithReplacementGaussianEvent(
        noise_multiplier=noise_multiplier,
        batch_size=batch_size,
        dataset_size=dataset_size,
        count=steps,
    )
    delta = _validate.delta("delta", delta)
    pld = with_replacement_pld(event, value_discretization_interval=value_discretization_interval)
    return float(pld.get_epsilon_for_delta(delta))
