r"""Monte Carlo ESTIMATES of ε(δ) for DP-SGD samplers, with a confidence interval.

The estimate is never a guarantee: report it next to a proven bound (the accountants of
:mod:`dpjax.accounting`), never alone. Its confidence interval holds with the stated
probability over the Monte Carlo draws, for the dominating pair named below.

Method (the Monte Carlo accountants of Wang, Mahloujifar, Wu, Jia, Mittal 2023, "A randomized
approach to tight privacy accounting", https://arxiv.org/abs/2304.07927, and Chua et al. 2024,
"Balls-and-bins sampling for DP-SGD", https://arxiv.org/abs/2412.16802): for a pair (P, Q)
with privacy loss L = ln(dP/dQ), δ(ε) = E_{X∼P}[(1 − e^{ε − L(X)})₊] (hockey-stick
divergence), a mean of variables in [0, 1]; both directions (P‖Q and Q‖P) are estimated
and the larger is used.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import numpy as np
from scipy import special

from dpjax import _validate

__all__ = ["MonteCarloEpsilon", "monte_carlo_epsilon"]

SAMPLINGS = ("balls_in_bins", "poisson")
_CHUNK_VALUES = 2**21  # normal draws per chunk (memory: ~100 MB of float64 temporaries)
_GRID_STEP = 2e-3  # resolution of the ε grid on which the interval is read
_MAX_GRID_POINTS = 50_000  # a coarser grid (top loss / 5e4) beyond losses of 100
_MAX_SAMPLES = 10**8  # two float64 arrays of this length: 1.6 GB
_MAX_DRAWS = 10**10  # normal draws per direction (minutes of CPU)


class MonteCarloEpsilon(NamedTuple):
    """A Monte Carlo ESTIMATE of ε(δ) (not a guarantee).

    Attributes:
        epsilon: the point estimate ε̂ (where the sample mean of δ(ε) crosses ``delta``).
        epsilon_low: lower end of the confidence interval.
        epsilon_high: upper end (``inf`` if the samples cannot certify ``delta``: use more).
        delta: the δ.
        confidence: the interval's confidence level 1 − α.
        num_samples: privacy-loss samples per direction.
        sampling: ``"balls_in_bins"`` or ``"poisson"``.
    """

    epsilon: float
    epsilon_low: float
    epsilon_high: float
    delta: float
    confidence: float
    num_samples: int
    sampling: str


def _kl(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """kl(p‖q) of Bernoulli laws, elementwise (0·ln 0 = 0)."""
    p = np.clip(p, 0.0, 1.0)
    q = np.clip(q, 1e-300, 1.0 - 1e-16)
    return special.xlogy(p, p / q) + special.xlogy(1.0 - p, (1.0 - p) / (1.0 - q))


def _kl_bound(mean: np.ndarray, n: int, log_inv_alpha: float, upper: bool) -> np.ndarray:
    """The Chernoff–Hoeffding confidence bound: the μ beyond ``mean`` with n·kl(mean‖μ) =
    ln(1/α) (bisection, 60 halvings). For i.i.d. variables in [0, 1] with mean μ,
    P[mean̂ ≤ μ − s] ≤ e^{−n·kl(μ − s‖μ)} and likewise above (Hoeffding 1963, Theorem 1), so
    the upper (lower) bound is ≥ μ (≤ μ) with probability ≥ 1 − α."""
    lo = mean.copy() if upper else np.zeros_like(mean)
    hi = np.ones_like(mean) if upper else mean.copy()
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        inside = n * _kl(mean, mid) <= log_inv_alpha
        if upper:
            lo, hi = np.where(inside, mid, lo), np.where(inside, hi, mid)
        else:
            lo, hi = np.where(inside, lo, mid), np.where(inside, mid, hi)
    return hi if upper else lo


def _hockey_stick_means(losses: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """mean over samples of (1 − e^{ε − L})₊ at every ε of ``grid`` (sorted losses, suffix
    log-sum-exps of −L; exact up to rounding). Σ_{L > ε} e^{ε − L} is formed as
    e^{ε + ln Σ e^{−L}} (exponent ≤ ln(count)): e^ε alone overflows beyond ε ≈ 709."""
    order = np.sort(losses)
    log_tail = np.concatenate([np.logaddexp.accumulate(-order[::-1])[::-1], [-np.inf]])
    first = np.searchsorted(order, grid, side="right")  # losses > ε start here
    above = order.size - first
    return np.maximum(above - np.exp(grid + log_tail[first]), 0.0) / order.size


def _generator(key: jax.Array) -> np.random.Generator:
    """A NumPy generator seeded by the bits of ``key`` (float64 draws without a JAX compile
    per shape); the same key gives the same stream."""
    if not jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.wrap_key_data(key)
    return np.random.default_rng(np.asarray(jax.random.key_data(key), np.uint32).ravel().tolist())


def _balls_in_bins_losses(rng, sigma, t, epochs, n, present):
    """n samples of Σ over epochs of ln((1/t)Σ_s e^{(2x_s − 1)/2σ²}), x ∼ N(e₀·present, σ²)."""
    out = np.zeros(n)
    per = max(1, _CHUNK_VALUES // (t * epochs))
    for start in range(0, n, per):
        size = min(per, n - start)
        x = sigma * rng.standard_normal((size, epochs, t))
        if present:  # by symmetry the record's bin can be taken to be the first
            x[:, :, 0] += 1.0
        loss = special.logsumexp((2.0 * x - 1.0) / (2.0 * sigma**2), axis=2) - math.log(t)
        out[start : start + size] = loss.sum(axis=1)
    return out


def _poisson_losses(rng, sigma, q, steps, n, present):
    """n samples of Σ_steps ln(1 − q + q e^{(2x − 1)/2σ²}), x ∼ N(b, σ²), b ∼ Bernoulli(q)
    if ``present`` else b = 0."""
    out = np.zeros(n)
    per = max(1, _CHUNK_VALUES // steps)
    for start in range(0, n, per):
        size = min(per, n - start)
        x = sigma * rng.standard_normal((size, steps))
        if present:
            x += rng.random((size, steps)) < q
        z = (2.0 * x - 1.0) / (2.0 * sigma**2)
        loss = np.logaddexp(math.log1p(-q), math.log(q) + z) if q < 1.0 else z
        out[start : start + size] = loss.sum(axis=1)
    return out


def monte_carlo_epsilon(
    *,
    noise_multiplier: float,
    steps: int,
    delta: float,
    key: jax.Array,
    sampling: str = "balls_in_bins",
    steps_per_epoch: int | None = None,
    sampling_rate: float | None = None,
    num_samples: int = 100_000,
    confidence: float = 0.95,
) -> MonteCarloEpsilon:
    r"""ESTIMATE ε(δ) of DP-SGD by Monte Carlo, with a confidence interval (not a guarantee).

    The estimate and its interval are about the dominating pair of the sampler under
    add/remove-one, sensitivity C = 1, noise σ = ``noise_multiplier``:

    * ``"balls_in_bins"`` (t = ``steps_per_epoch``, E = ⌈steps/t⌉ epochs, a partial epoch
      counted whole): per epoch P = (1/t)Σ_s N(e_s, σ²I_t), Q = N(0, σ²I_t) (Chua et al.
      2024, https://arxiv.org/abs/2412.16802, the pair of their balls-and-bins analysis),
      composed over E epochs;
    * ``"poisson"`` (q = ``sampling_rate``): per step P = (1 − q)N(0, σ²) + qN(1, σ²),
      Q = N(0, σ²) (the tight pair of the Poisson subsampled Gaussian), composed ``steps``
      times — there to check the estimator against dp-accounting's PLD.

    Formal guarantees:
        Not a privacy guarantee: the interval is a statement about the Monte Carlo draws. For
        each direction and each ε, the mean of the n samples of (1 − e^{ε − L})₊ ∈ [0, 1] is
        bounded above and below by the Chernoff–Hoeffding (KL) bound at level α/4 (two sides,
        two directions): P[mean̂ ≥ μ + s] ≤ e^{−n·kl(μ + s‖μ)} and likewise below (Hoeffding
        1963, "Probability inequalities for sums of bounded random variables", Theorem 1,
        https://doi.org/10.1080/01621459.1963.10500830). The interval of ε is read on a grid
        of step 2·10⁻³ (or L_max/5·10⁴ if the sampled losses exceed 100) from monotone
        envelopes of these bounds, rounded outwards; at one
        deterministic grid point next to the true ε(δ) the envelope's failure implies a bound's
        failure, so [``epsilon_low``, ``epsilon_high``] covers the pair's true ε(δ) with
        probability ≥ 1 − α over the draws. A fixed ``key`` gives the same answer every time.

    Args:
        noise_multiplier: σ > 0.
        steps: T ≥ 1, the number of DP-SGD steps.
        delta: δ in (0, 1).
        key: a JAX PRNG key (split in two, one per direction; each seeds a NumPy generator).
        sampling: ``"balls_in_bins"`` or ``"poisson"``.
        steps_per_epoch: t ≥ 1 for ``"balls_in_bins"`` (else None).
        sampling_rate: q in (0, 1] for ``"poisson"`` (else None).
        num_samples: privacy-loss samples per direction, in [100, 10⁸] (certifying δ needs
            ≳ 4/δ; about 10/δ for an interval of useful width).
        confidence: 1 − α in (0, 1).

    Returns:
        :class:`MonteCarloEpsilon`: the estimate, its interval, and the sample size.

    Raises:
        ValueError: an argument out of range (named), the parameter of the other sampling,
            a noise_multiplier so small that the privacy losses overflow float64, more than
            2²¹ normal draws per sample (steps_per_epoch × epochs, or steps) or more than 10¹⁰
            per direction (num_samples × those).

    Example:
        >>> import jax
        >>> r = monte_carlo_epsilon(noise_multiplier=1.0, steps=4, delta=1e-2, steps_per_epoch=4,
        ...                         key=jax.random.key(0), num_samples=2000)
        >>> r.epsilon_low <= r.epsilon <= r.epsilon_high, r.num_samples
        (True, 2000)
    """
    sigma = _validate.positive(
        "noise_multiplier", _validate.real("noise_multiplier", noise_multiplier)
    )
    steps = _validate.positive_int("steps", steps)
    delta = _validate.in_range("delta", delta, 0.0, 1.0, low_inclusive=False, high_inclusive=False)
    _validate.one_of("sampling", sampling, SAMPLINGS)
    n = _validate.positive_int("num_samples", num_samples)
    if not 100 <= n <= _MAX_SAMPLES:
        _validate.fail("num_samples", num_samples, f"an integer in [100, {_MAX_SAMPLES:.0e}]")
    level = _validate.in_range(
        "confidence", confidence, 0.0, 1.0, low_inclusive=False, high_inclusive=False
    )
    if sampling == "balls_in_bins":
        if sampling_rate is not None:
            _validate.fail("sampling_rate", sampling_rate, "None for sampling='balls_in_bins'")
        t = _validate.positive_int("steps_per_epoch", steps_per_epoch)
        epochs = -(-steps // t)

        def draw(k, present):
            return _balls_in_bins_losses(k, sigma, t, epochs, n, present)

    else:
        if steps_per_epoch is not None:
            _validate.fail("steps_per_epoch", steps_per_epoch, "None for sampling='poisson'")
        q = _validate.probability("sampling_rate", sampling_rate)

        def draw(k, present):
            return _poisson_losses(k, sigma, q, steps, n, present)

    _check_draws(n, t * epochs if sampling == "balls_in_bins" else steps, sampling)
    key_p, key_q = jax.random.split(key)
    remove = draw(_generator(key_p), True)  # L under P: the P‖Q direction
    add = -draw(_generator(key_q), False)  # ln(dQ/dP) under Q: the Q‖P direction
    top = max(float(remove.max()), float(add.max()), 0.0)
    if not math.isfinite(top):  # (2x − 1)/2σ² overflowed float64
        _validate.fail("noise_multiplier", sigma, "large enough for finite privacy losses")
    step = max(_GRID_STEP, top / _MAX_GRID_POINTS)  # coarser only for losses above 100
    grid = np.arange(0.0, top + 2 * step, step)
    log_inv = math.log(4.0 / (1.0 - level))
    means = [_hockey_stick_means(s, grid) for s in (remove, add)]
    estimate = np.maximum(*means)
    upper = np.maximum(*(_kl_bound(m, n, log_inv, upper=True) for m in means))
    lower = np.maximum(*(_kl_bound(m, n, log_inv, upper=False) for m in means))
    upper = np.maximum.accumulate(upper[::-1])[::-1]  # nonincreasing envelope from above
    lower = np.minimum.accumulate(lower)  # nonincreasing envelope from below
    return MonteCarloEpsilon(
        epsilon=_first_at_most(grid, estimate, delta),
        epsilon_low=max(0.0, _first_at_most(grid, lower, delta) - step),
        epsilon_high=_first_at_most(grid, upper, delta),
        delta=delta,
        confidence=level,
        num_samples=n,
        sampling=sampling,
    )


def _check_draws(num_samples: int, per_sample: int, sampling: str) -> None:
    """Refuse a run whose normal draws would not fit memory or reasonable time (it hung)."""
    name = "steps_per_epoch" if sampling == "balls_in_bins" else "steps"
    what = "steps_per_epoch × epochs" if sampling == "balls_in_bins" else "steps"
    if per_sample > _CHUNK_VALUES:
        _validate.fail(name, f"{what} = {per_sample}", f"at most {_CHUNK_VALUES} draws per sample")
    if num_samples * per_sample > _MAX_DRAWS:
        _validate.fail(
            "num_samples",
            f"{num_samples} × {per_sample} draws ({what})",
            f"at most {_MAX_DRAWS:.0e} normal draws per direction",
        )


def _first_at_most(grid: np.ndarray, curve: np.ndarray, delta: float) -> float:
    """The smallest ε of ``grid`` with curve(ε) ≤ δ (``inf`` if none)."""
    hits = np.nonzero(curve <= delta)[0]
    return float(grid[hits[0]]) if hits.size else math.inf
