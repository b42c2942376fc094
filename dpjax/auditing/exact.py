r"""Exact privacy profiles of mechanisms with a finite, computable output law.

Empirical audits (:mod:`dpjax.auditing.estimators`) give lower bounds on ε and cannot see a
δ-level leak. Where the output law of a mechanism can be written down exactly, its privacy can
be *computed* instead: given the law P of M(D) and the law Q of M(D′) over the same finite
outcome set, the mechanism is (ε, δ)-DP on that pair iff the hockey-stick divergence

.. math:: \delta(\varepsilon) = \max\Big(\sum_o \max(0, P_o - e^\varepsilon Q_o),
          \sum_o \max(0, Q_o - e^\varepsilon P_o)\Big)

is at most δ, and purely ε-DP iff :math:`\max_o |\ln(P_o/Q_o)| \le \varepsilon` (with
ln(p/0) = +∞). Running this over adversarial neighbour pairs (extreme, tied, non-finite and
out-of-range records) checks the guarantee itself rather than a noisy estimate of it
("exact privacy profile" test shape of the soundness notes; Mironov 2012 and Casacuberta et
al. 2022 for why the law *as the code realises it* is what must be checked).

Two kinds of functions:

* **profiles** (any finite laws): :func:`max_log_ratio`, :func:`pure_epsilon`,
  :func:`hockey_stick_delta`, :func:`delta_at`, :func:`assert_within_claim`,
  :func:`product_law` (independent coordinates), :func:`law_from_cdf` (binned continuous
  outputs: a lower bound on the profile);
* **laws** of dpjax mechanisms (numpy, float64, written from the documented algorithm, not
  by running the mechanism; tests tie them to the code by sampling and by probing the
  sampler's randomness): :func:`uniform_below_probability`, :func:`randomized_response_law`
  (exactly the realised law: integer threshold), :func:`coin_randomized_response_law`,
  :func:`discrete_laplace_law` (rounding and clamping included),
  :func:`exponential_mechanism_law`, :func:`report_noisy_max_law` (real-arithmetic noise;
  each docstring says where the float sampler departs from it).

Probabilities are float64; a profile computed from them is exact up to float64 rounding
(relative ~1e-15), hence the default tolerance ``rtol = 1e-9`` of :func:`assert_within_claim`.
The law builders return a :class:`Law`, which also carries the log-probabilities, so cells
below e^{−745} (subnormal or 0 as float64) keep their exact ratios: the discrete Laplace law
with a·B/g > 745 and softmax gaps above 745 are profiled without false alarms. Plain arrays
(and arrays derived from a ``Law``) are read as probabilities.

Example:
    Binary randomized response keeps the truth w.p. 3/4: its pure ε is ln 3, and at ε = ln 2
    it needs δ = 3/4 − 2·1/4 = 1/4.

    >>> import math
    >>> P, Q = [0.75, 0.25], [0.25, 0.75]       # laws of the report for truth 0 and truth 1
    >>> round(pure_epsilon(P, Q), 12) == round(math.log(3.0), 12)
    True
    >>> round(delta_at(P, Q, math.log(2.0)), 12)
    0.25
    >>> assert_within_claim(P, Q, epsilon=math.log(3.0))
    >>> max_log_ratio([0.5, 0.5], [1.0, 0.0])     # an outcome impossible under D′
    inf
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = [
    "max_log_ratio",
    "pure_epsilon",
    "hockey_stick_delta",
    "delta_at",
    "assert_within_claim",
    "product_law",
    "law_from_cdf",
    "Law",
    "uniform_below_probability",
    "randomized_response_law",
    "coin_randomized_response_law",
    "discrete_laplace_law",
    "discrete_gaussian_law",
    "exponential_mechanism_law",
    "report_noisy_max_law",
]


# ----------------------------------------------------------------------------- profiles


class Law(np.ndarray):
    """Float64 probabilities that also carry their exact log-probabilities (``.log``).

    A long-tailed law (discrete Laplace with a·B/g > 745, an exponential mechanism with a
    score gap above 745 temperatures) has cells below the smallest float64 (e^{−745}): as
    probabilities they are subnormal (few significant bits) or 0, and a profile computed from
    them reports ε = ∞ or a wrong ε (a false alarm). The law builders of this module return a
    ``Law``; the profile functions use ``.log`` where both laws carry one. Any array derived
    from a ``Law`` (a slice, a sum, a mixture) drops ``.log`` and is read as plain
    probabilities.
    """

    log: np.ndarray | None

    @classmethod
    def from_log(cls, log_probabilities: Any) -> Law:
        """The law with the given log-probabilities (−inf for an impossible outcome)."""
        logp = np.asarray(log_probabilities, dtype=np.float64)
        out = np.exp(logp).view(cls)
        out.log = logp
        return out

    def __array_finalize__(self, obj: Any) -> None:
        self.log = None


def _log_of(law: Any) -> np.ndarray:
    """The log-probabilities of ``law``, exact if it is a :class:`Law` with ``.log``."""
    logp = getattr(law, "log", None)
    if isinstance(law, Law) and logp is not None and logp.shape == law.shape:
        return logp.ravel()
    with np.errstate(divide="ignore"):
        return np.log(np.asarray(law, dtype=np.float64).ravel())


def _laws(p: Any, q: Any) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(p, dtype=np.float64).ravel()
    q = np.asarray(q, dtype=np.float64).ravel()
    if p.shape != q.shape or p.size == 0:
        raise ValueError(f"p and q must be laws on the same outcomes; got sizes {p.size}, {q.size}")
    for name, law in (("p", p), ("q", q)):
        if not (np.all(np.isfinite(law)) and np.all(law >= 0.0)):
            raise ValueError(f"{name} must be finite and non-negative; got {law!r}")
        if abs(law.sum() - 1.0) > 1e-9:
            raise ValueError(f"{name} must sum to 1 (within 1e-9); got sum {law.sum()!r}")
    return p, q


def max_log_ratio(p: Any, q: Any) -> float:
    """max over outcomes o with P_o > 0 of ln(P_o/Q_o): the pure ε of the direction D → D′.

    Args:
        p: law of M(D), probabilities over a finite outcome set (any shape, flattened).
        q: law of M(D′) over the same outcomes, in the same order.

    Returns:
        The largest log-ratio; ``inf`` if some outcome has P_o > 0 = Q_o.
    """
    _laws(p, q)
    logp, logq = _log_of(p), _log_of(q)
    seen = logp > -np.inf
    if np.any(logq[seen] == -np.inf):
        return math.inf
    return float(np.max(logp[seen] - logq[seen]))


def pure_epsilon(p: Any, q: Any) -> float:
    """The smallest ε for which the pair (P, Q) is ε-indistinguishable in both directions."""
    return max(max_log_ratio(p, q), max_log_ratio(q, p))


def hockey_stick_delta(p: Any, q: Any, epsilon: float) -> float:
    """δ(ε) of the direction D → D′: Σ_o max(0, P_o − e^ε Q_o) (sup over events of P − e^ε Q)."""
    p, q = _laws(p, q)
    if not epsilon >= 0.0:
        raise ValueError(f"epsilon must be in [0, inf]; got {epsilon!r}")
    logp, logq = _log_of(p), _log_of(q)
    if math.isinf(epsilon):
        return float(np.sum(p[logq == -np.inf]))
    # P − e^ε Q = P(1 − e^{ε + ln Q − ln P}) where it is positive, in log space (no overflow
    # of e^ε Q, and no false difference where both underflow).
    seen = logp > -np.inf
    with np.errstate(over="ignore"):
        gap = -np.expm1(np.minimum(logq[seen] + epsilon - logp[seen], 745.0))
    return float(np.sum(p[seen] * np.maximum(0.0, gap)))


def delta_at(p: Any, q: Any, epsilon: float) -> float:
    """δ(ε) of the pair in both directions: the smallest δ for which it is (ε, δ)-DP."""
    return max(hockey_stick_delta(p, q, epsilon), hockey_stick_delta(q, p, epsilon))


def assert_within_claim(
    p: Any, q: Any, *, epsilon: float, delta: float = 0.0, rtol: float = 1e-9
) -> None:
    """Raise ``AssertionError`` unless the pair (P, Q) satisfies the claimed (ε, δ).

    For δ = 0 the check is ε_true = :func:`pure_epsilon` ≤ ε(1 + rtol); for δ > 0 it is
    :func:`delta_at` (ε(1 + rtol)) ≤ δ. ``rtol`` absorbs float64 rounding of the laws only;
    it is far below any real violation (the rounding bug this catches was a factor 2).

    Args:
        p: law of M(D).
        q: law of M(D′), same outcomes.
        epsilon: the claimed ε ≥ 0.
        delta: the claimed δ ∈ [0, 1).
        rtol: relative slack on ε.
    """
    if delta == 0.0:
        eps_true = pure_epsilon(p, q)
        assert eps_true <= epsilon * (1.0 + rtol), (
            f"pure epsilon {eps_true!r} exceeds the claimed {epsilon!r}"
        )
        return
    d = delta_at(p, q, epsilon * (1.0 + rtol))
    assert d <= delta, f"delta({epsilon!r}) = {d!r} exceeds the claimed {delta!r}"


def product_law(*laws: Any) -> np.ndarray:
    """Joint law of independent coordinates: the outer product, shape (n₁, n₂, …)."""
    out = np.zeros((), dtype=np.float64)
    for law in laws:
        logp = getattr(law, "log", None)
        if not (isinstance(law, Law) and logp is not None and logp.shape == law.shape):
            with np.errstate(divide="ignore"):
                logp = np.log(np.asarray(law, dtype=np.float64))
        out = np.add.outer(out, logp)
    return Law.from_log(out)


def law_from_cdf(cdf: Any, edges: Any) -> np.ndarray:
    """Masses of the cells (−∞, e₀], (e₀, e₁], …, (e_{n−1}, ∞) under a CDF.

    For a mechanism with a continuous output (a 1-D Laplace/Gaussian release, bounded
    Laplace), the profile of the binned laws is a *lower* bound on the true profile (binning
    is post-processing), exact in the limit of fine bins and exact outright when the output
    only takes values inside the cells' boundaries. Use it to catch violations, and a density
    computation to prove their absence. The masses are differences of CDF values, each with
    absolute error ~1e-16: keep every cell's mass well above that (ratios of tiny tail cells
    are rounding noise).

    Args:
        cdf: vectorised CDF of the output, x ↦ P[M ≤ x].
        edges: increasing cell boundaries (1-D).

    Returns:
        Array of len(edges) + 1 masses summing to 1.

    Example:
        >>> law_from_cdf(lambda x: np.clip(x, 0.0, 1.0), [0.25, 0.5]).tolist()  # uniform
        [0.25, 0.25, 0.5]
    """
    edges = np.asarray(edges, dtype=np.float64)
    inner = np.diff(np.asarray(cdf(edges), dtype=np.float64))
    c = np.asarray(cdf(edges[[0, -1]]), dtype=np.float64)
    return np.concatenate([[c[0]], np.maximum(inner, 0.0), [1.0 - c[1]]])


# ----------------------------------------------------------------------------- laws


def uniform_below_probability(threshold: float, dtype: Any) -> float:
    """P[U < t] for ``jax.random.uniform(key, (), dtype)``, exactly.

    JAX's uniform takes the values j·2^-m, j = 0 … 2^m − 1 (m = mantissa bits: 23 for
    float32, 52 for float64) with equal probability, so a comparison ``u < t`` with a float
    probability t realises ⌈t·2^m⌉/2^m, not t (soundness notes, "randomness plumbing").

    Example:
        >>> import numpy as np
        >>> uniform_below_probability(1.0 - 3e-8, np.float32)  # rounds to "always"
        1.0
    """
    m = int(np.finfo(np.dtype(dtype)).nmant)
    grid = 2.0**m
    return min(1.0, max(0.0, math.ceil(float(threshold) * grid) / grid))


def randomized_response_law(
    true_category: int, *, epsilon: float, num_categories: int = 2
) -> np.ndarray:
    """Law of one report of :func:`dpjax.mechanisms.randomized_response` as realised.

    The mechanism draws one uniform 32-bit word w and lies iff w < (k − 1)·m, reporting
    truth + 1 + (w mod (k − 1)) (mod k); m is
    :func:`dpjax.mechanisms.randomized_response.randomized_response_other_weight`. So each
    other category has probability exactly m/2^32 and the truth (2^32 − (k − 1)m)/2^32.

    Args:
        true_category: the respondent's category in {0, …, k − 1}.
        epsilon: the ε passed to the mechanism.
        num_categories: k.

    Returns:
        Array of shape (k,): P[report = j].
    """
    from dpjax.mechanisms.randomized_response import (
        RANDOM_WORDS,
        randomized_response_other_weight,
    )

    k = int(num_categories)
    m = randomized_response_other_weight(epsilon=epsilon, num_categories=k)
    law = np.full(k, m / RANDOM_WORDS, dtype=np.float64)
    law[int(true_category)] = (RANDOM_WORDS - (k - 1) * m) / RANDOM_WORDS
    return law


def coin_randomized_response_law(truth: int) -> np.ndarray:
    """Law of one report of the coin protocol: truth w.p. 1/2 + 1/4 (two fair random bits)."""
    law = np.full(2, 0.25)
    law[int(truth)] = 0.75
    return law


def discrete_laplace_law(
    value: Any, *, ratio: float, bound: float, granularity: float
) -> np.ndarray:
    """Joint law of :func:`dpjax.mechanisms.discrete_laplace` on a small vector (exact).

    Follows the documented algorithm: NaN → 0; k_f = clamp(round_half_even(x/g), −h, h)
    with h = ⌊B/g⌋; k_y = clamp(k_f + K, −h, h) with K i.i.d. discrete Laplace,
    P[K = k] = (1 − r)/(1 + r)·r^{|k|}; the tails P[K ≥ n] = r^n/(1 + r) fold onto ±h.
    The mechanism draws K with the exact integer sampler of CKS 2020 (Algorithm 2), so with
    r = e^{−a}, a the rational rate of ``discrete_laplace_rate``, this is its realised law.

    Args:
        value: f(D), a scalar or a small 1-D vector (d coordinates; the law has (2h + 1)^d
            entries).
        ratio: r, the noise ratio the mechanism uses (``discrete_laplace_ratio``).
        bound: B.
        granularity: g (a power of two).

    Returns:
        Array of shape (2h + 1,)*d: the probability of each output grid point
        (coordinate i on axis i, grid −h … h).
    """
    x = np.atleast_1d(np.asarray(value, dtype=np.float64))
    g = float(granularity)
    h = math.floor(float(bound) / g)
    r = float(ratio)
    grid = np.arange(-h, h + 1)
    log_r = math.log(r)
    log_cell = math.log1p(-r) - math.log1p(r)  # ln((1 − r)/(1 + r))
    laws = []
    for xi in x:
        xi = 0.0 if math.isnan(xi) else xi
        k_f = int(np.clip(np.round(xi / g), -h, h))  # numpy rounds half to even, like JAX
        logp = log_cell + np.abs(grid - k_f).astype(np.float64) * log_r
        logp[0] = np.logaddexp(logp[0], (k_f + h + 1) * log_r - math.log1p(r))
        logp[-1] = np.logaddexp(logp[-1], (h - k_f + 1) * log_r - math.log1p(r))
        laws.append(Law.from_log(logp))
    return product_law(*laws)


def discrete_gaussian_law(value: int, *, sigma: Any, low: int, high: int) -> Law:
    """Law of ``value`` + N_ℤ(0, σ²) on {< low} ∪ {low, …, high} ∪ {> high} (exact, log space).

    P[Y = y] = e^{−y²/(2σ²)}/Z with Z summed over |y| ≤ 40σ + 1 (the rest is < e^{−800}
    relative); the first and last cells hold the two tails (summed to 40σ beyond the window).
    :func:`dpjax.mechanisms.discrete_gaussian` samples this law exactly (CKS 2020 Algorithm 3)
    up to its saturation event (< 2^{−700 000} in total variation).

    Args:
        value: the integer f(D).
        sigma: σ > 0 (a float, int or ``fractions.Fraction``).
        low: the first integer outcome of the window.
        high: the last one.

    Returns:
        A :class:`Law` of size high − low + 3.
    """
    s2 = float(sigma) ** 2
    span = math.ceil(40.0 * math.sqrt(s2)) + 1
    z = np.arange(-span, span + 1, dtype=np.float64)
    log_z = float(np.logaddexp.reduce(-(z * z) / (2.0 * s2)))
    y = np.arange(low, high + 1, dtype=np.float64) - float(value)
    inside = -(y * y) / (2.0 * s2) - log_z
    below = np.arange(low - 1 - span, low, dtype=np.float64) - float(value)
    above = np.arange(high + 1, high + 2 + span, dtype=np.float64) - float(value)
    tails = [float(np.logaddexp.reduce(-(t * t) / (2.0 * s2))) - log_z for t in (below, above)]
    return Law.from_log(np.concatenate([[tails[0]], inside, [tails[1]]]))


def _sanitised_scores(scores: Any) -> np.ndarray:
    """The documented non-finite rule for scores: NaN → lowest finite, ±inf → clipped."""
    u = np.asarray(scores, dtype=np.float64).ravel()
    finite = np.isfinite(u)
    if not np.any(finite):
        return np.zeros_like(u)
    low, high = u[finite].min(), u[finite].max()
    return np.where(np.isnan(u), low, np.clip(u, low, high))


def exponential_mechanism_law(
    scores: Any, *, sensitivity: float, epsilon: float, monotonic: bool = False
) -> np.ndarray:
    """softmax(ε ũ/(2Δ)) (Δ/ε if monotonic), ũ the scores after the non-finite rule.

    This is the law of :func:`dpjax.mechanisms.exponential_mechanism` in exact arithmetic
    (Gumbel-max identity), as a :class:`Law` (log-softmax, exact far tails). The float
    Gumbel noise (:func:`dpjax._random.gumbel`, range [−3.81, 45.05]) has a bounded range, so
    the realised law differs from it for candidates whose probability is below ~e^-48.
    """
    factor = 1.0 if monotonic else 2.0
    z = _sanitised_scores(scores) * float(epsilon) / (factor * float(sensitivity))
    z = z - z.max()
    return Law.from_log(z - np.log(np.sum(np.exp(z))))  # log-softmax: exact far tails


def report_noisy_max_law(scores: Any, *, sensitivity: float, epsilon: float) -> np.ndarray:
    r"""Law of :func:`dpjax.mechanisms.report_noisy_max` (exponential noise of scale s = 2Δ/ε).

    Report-noisy-max with exponential noise is the permute-and-flip mechanism (Ding, Kifer,
    Wang et al. 2021; McKenna & Sheldon 2020) — *not* the exponential mechanism. Substituting
    t = e^{−(x − u*)/s} in P[argmax = i] = ∫ f(x − u_i) Π_{j≠i} F(x − u_j) dx gives

    .. math:: P[i] = p_i \int_0^1 \prod_{j \ne i} (1 - p_j t)\,dt,
        \qquad p_j = e^{(u_j - u^*)/s},

    a polynomial of degree d − 1 in t, integrated exactly by Gauss–Legendre quadrature with
    ⌊d/2⌋ + 2 nodes (positive integrand, no cancellation). As for the exponential mechanism,
    float exponential noise (:func:`dpjax._random.exponential`, range [2.7e-20, 45.05]) has a
    bounded range, so the realised law drops candidates whose ideal probability is below
    ~e^-45. Returned as plain float64 probabilities (no log-probabilities).
    """
    u = _sanitised_scores(scores)
    s = 2.0 * float(sensitivity) / float(epsilon)
    p = np.exp((u - u.max()) / s)
    nodes, weights = np.polynomial.legendre.leggauss(u.size // 2 + 2)
    t = 0.5 * (nodes + 1.0)  # nodes on [0, 1]
    factors = 1.0 - np.outer(p, t)  # (d, nodes)
    law = np.empty(u.size)
    for i in range(u.size):
        law[i] = p[i] * 0.5 * np.sum(weights * np.prod(np.delete(factors, i, axis=0), axis=0))
    return law
