r"""Empirical lower bounds on ε from a distinguishing game (host-side NumPy/SciPy).

The game: a mechanism M is run many times on D and on a neighbouring D′ with independent keys;
every run is reduced to one real **score**, with the convention that a *large* score is
evidence for D′. A threshold test "guess D′ iff s ≥ t" has

* false-positive rate  α = P_D[s ≥ t]   (says D′ on a D run),
* false-negative rate  β = P_D′[s < t]  (says D on a D′ run).

An (ε, δ)-DP mechanism forces α + e^ε β ≥ 1 − δ and β + e^ε α ≥ 1 − δ for every test (the
hypothesis-testing view of DP; Kairouz, Oh, Viswanath 2015), hence

.. math::
    \varepsilon \ge \max(\ln[(1-\delta-\beta)/\alpha],\ \ln[(1-\delta-\alpha)/\beta]).

Replacing α, β by Clopper–Pearson upper confidence bounds α⁺, β⁺ turns the estimate into a
lower bound that holds with the stated confidence. Three estimators are provided:

* :func:`direct_epsilon_lower_bound` – no assumption on M (Jagielski, Ullman, Oprea 2020);
* :func:`gdp_epsilon_lower_bound` – a heuristic, conditional on the caller's assumption that M's
  trade-off curve is Gaussian (μ-GDP), as for the Gaussian mechanism, Gaussian
  output/objective perturbation and full-batch DP-GD (Nasr et al., USENIX Security 2023);
  much tighter at small δ when the assumption holds, and not a lower bound when it does not
  (on an exactly 1-DP Laplace mechanism it reports ε ≈ 4.4 at δ = 1e-5), so the caller must
  state the assumption with ``assume_gaussian_tradeoff=True``;
* :func:`one_run_epsilon_lower_bound` – m canaries, one run (Steinke, Nasr, Jagielski 2023).

Threshold choice: the threshold is chosen on the first half of the scores ("selection half")
and the confidence bound is computed on the second half only; choosing t on the same samples
the bound is computed from inflates the bound. Trials are i.i.d., so a
fixed split (first half / second half) is as good as a random one.

All functions are pure functions of their arguments (arrays of scores, counts, parameters).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy import optimize, special, stats

from dpjax import _validate
from dpjax.accounting import fdp as _fdp

__all__ = [
    "EpsilonLowerBound",
    "GAUSSIAN_TRADEOFF_ASSUMPTION",
    "check_gaussian_tradeoff_assumed",
    "clopper_pearson_upper",
    "clopper_pearson_lower",
    "epsilon_from_rates",
    "gdp_mu_from_rates",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_mu_for",
    "direct_epsilon_lower_bound",
    "gdp_epsilon_lower_bound",
    "one_run_p_value",
    "one_run_epsilon_lower_bound",
    "guesses_from_scores",
]

_MAX_THRESHOLDS = 2000
# The threshold is chosen with much stricter bounds (1 − 1e-6) than the final one: it penalises
# the extreme thresholds whose selection-half rates look good by chance (winner's curse); at
# 99.9% the GDP estimator still picked far-tail thresholds in ~1 audit in 20.
_SELECTION_CONFIDENCE = 1.0 - 1e-6

GAUSSIAN_TRADEOFF_ASSUMPTION = (
    "the mechanism's trade-off curve between D and D′ is Gaussian (μ-GDP; Nasr et al., "
    "USENIX Security 2023): a heuristic, not a lower bound on ε, if it is not"
)


@dataclasses.dataclass(frozen=True)
class EpsilonLowerBound:
    """An empirical lower bound on ε and how it was obtained.

    Attributes:
        epsilon: the lower bound ε_LB (≥ 0); the true ε of the mechanism is at least this,
            with probability ``confidence`` over the trials.
        confidence: the confidence level of the bound (e.g. 0.95).
        method: ``"direct"``, ``"gdp"`` or ``"one_run"``.
        delta: the δ at which ε_LB is stated.
        threshold: the score threshold used (None for the one-run bound).
        fpr_upper: α⁺, upper confidence bound on the false-positive rate P_D[s ≥ t].
        fnr_upper: β⁺, upper confidence bound on the false-negative rate P_D′[s < t].
        fpr: observed α on the evaluation half.
        fnr: observed β on the evaluation half.
        mu: μ_LB of the GDP estimator (None for the others).
        n_eval: number of scores per data set the bound was computed from.
        conditional_on: the unverified assumption the bound rests on (None: none, the bound
            holds for every mechanism). Set by the GDP estimator, whose output is a heuristic
            unless M's trade-off curve really is Gaussian.
    """

    epsilon: float
    confidence: float
    method: str
    delta: float
    threshold: float | None = None
    fpr_upper: float | None = None
    fnr_upper: float | None = None
    fpr: float | None = None
    fnr: float | None = None
    mu: float | None = None
    n_eval: int | None = None
    conditional_on: str | None = None

    @property
    def is_heuristic(self) -> bool:
        """True when ε_LB holds only under ``conditional_on`` (an assumption not checked)."""
        return self.conditional_on is not None


def clopper_pearson_upper(k, n, alpha: float):
    """One-sided Clopper–Pearson upper bound p⁺ with P[p ≤ p⁺] ≥ 1 − alpha.

    Args:
        k: number of successes (int or integer array), 0 ≤ k ≤ n.
        n: number of trials (> 0).
        alpha: error probability of the one-sided bound, in (0, 1).

    Returns:
        ``Beta.ppf(1 − alpha; k + 1, n − k)`` (1 where k = n), float or array.

    Example:
        >>> round(float(clopper_pearson_upper(0, 100, 0.05)), 4)  # "rule of three"-like
        0.0295
    """
    alpha = _validate.in_range("alpha", alpha, 0.0, 1.0, low_inclusive=False)
    k = np.asarray(k, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    full = k >= n
    upper = stats.beta.ppf(1.0 - alpha, k + 1.0, np.where(full, 1.0, n - k))
    return np.where(full, 1.0, upper)


def clopper_pearson_lower(k, n, alpha: float):
    """One-sided Clopper–Pearson lower bound p⁻ with P[p ≥ p⁻] ≥ 1 − alpha (0 where k = 0)."""
    alpha = _validate.in_range("alpha", alpha, 0.0, 1.0, low_inclusive=False)
    k = np.asarray(k, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    empty = k <= 0
    lower = stats.beta.ppf(alpha, np.where(empty, 1.0, k), n - k + 1.0)
    return np.where(empty, 0.0, lower)


def epsilon_from_rates(fpr, fnr, delta: float = 0.0):
    r"""ε implied by a test with error rates (α, β): max(ln((1−δ−β)/α), ln((1−δ−α)/β), 0).

    Args:
        fpr: α (array or float), typically an upper confidence bound α⁺.
        fnr: β, typically β⁺.
        delta: the δ of the DP statement being tested, in [0, 1).

    Returns:
        The largest ε for which (ε, δ)-DP would be contradicted by these rates (0 if none).
    """
    delta = _validate.delta("delta", delta)
    a = np.asarray(fpr, dtype=np.float64)
    b = np.asarray(fnr, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        e1 = np.log(np.maximum(1.0 - delta - b, 0.0)) - np.log(a)
        e2 = np.log(np.maximum(1.0 - delta - a, 0.0)) - np.log(b)
    eps = np.fmax(np.fmax(e1, e2), 0.0)
    return np.where(np.isnan(eps), 0.0, eps)


def gdp_mu_from_rates(fpr, fnr):
    r"""μ implied by a test with error rates (α, β) under a Gaussian trade-off curve.

    .. math:: \mu = \Phi^{-1}(1-\alpha) - \Phi^{-1}(\beta)

    (β ≥ Φ(Φ⁻¹(1−α) − μ) for every test against a μ-GDP mechanism; Dong, Roth, Su 2022.)
    Clipped at 0.
    """
    a = np.asarray(fpr, dtype=np.float64)
    b = np.asarray(fnr, dtype=np.float64)
    return np.fmax(special.ndtri(1.0 - a) - special.ndtri(b), 0.0)


def gdp_delta(epsilon: float, mu: float) -> float:
    r"""δ(ε) of μ-GDP (Dong, Roth, Su 2022, Cor. 2.13); positional form of
    :func:`dpjax.accounting.gdp_delta`, its one home."""
    return _fdp.gdp_delta(mu=mu, epsilon=epsilon)


def gdp_epsilon(mu: float, delta: float) -> float:
    """ε(δ) of a μ-GDP mechanism; positional form of :func:`dpjax.accounting.gdp_epsilon`.

    Example:
        >>> round(gdp_epsilon(1.0, 1e-5), 3)
        4.377
    """
    return _fdp.gdp_epsilon(mu=mu, delta=delta)


def gdp_mu_for(epsilon: float, delta: float) -> float:
    """The largest μ whose GDP curve satisfies (ε, δ)-DP (the GDP pass threshold μ_claim).

    A mechanism claiming (ε, δ)-DP with a Gaussian trade-off curve is μ_claim-GDP at most;
    ``μ_LB > μ_claim`` is equivalent to ``gdp_epsilon(μ_LB, δ) > ε``.
    """
    epsilon = _validate.epsilon("epsilon", epsilon)
    delta = _validate.in_range("delta", delta, 0.0, 1.0, low_inclusive=False)
    hi = 1.0
    while gdp_delta(epsilon, hi) < delta:
        hi *= 2.0
    return float(optimize.brentq(lambda m: gdp_delta(epsilon, m) - delta, 1e-12, hi, xtol=1e-13))


def _check_scores(scores_d, scores_dprime) -> tuple[np.ndarray, np.ndarray]:
    s0 = np.asarray(scores_d, dtype=np.float64).ravel()
    s1 = np.asarray(scores_dprime, dtype=np.float64).ravel()
    for name, s in (("scores_d", s0), ("scores_dprime", s1)):
        if s.size < 4:
            _validate.fail(name, f"<{s.size} scores>", "an array of at least 4 scores")
        if np.isnan(s).any():
            _validate.fail(name, "<array with NaN>", "free of NaN")
    return s0, s1


def _split_halves(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    half = s.size // 2
    return s[:half], s[half:]


def _rates_at(thresholds: np.ndarray, s0: np.ndarray, s1: np.ndarray):
    """Counts (k_fp, k_fn) of the tests "D′ iff s ≥ t" for every threshold t."""
    s0_sorted, s1_sorted = np.sort(s0), np.sort(s1)
    k_fp = s0.size - np.searchsorted(s0_sorted, thresholds, side="left")
    k_fn = np.searchsorted(s1_sorted, thresholds, side="left")
    return k_fp, k_fn


def _candidate_thresholds(s0: np.ndarray, s1: np.ndarray) -> np.ndarray:
    pooled = np.unique(np.concatenate([s0, s1]))
    if pooled.size > _MAX_THRESHOLDS:
        qs = np.linspace(0.0, 1.0, _MAX_THRESHOLDS)
        pooled = np.unique(np.quantile(pooled, qs, method="nearest"))
    return pooled


def _upper_rates(k_fp, k_fn, n0: int, n1: int, confidence: float):
    per_side = (1.0 - confidence) / 2.0  # Bonferroni over the two rates
    return clopper_pearson_upper(k_fp, n0, per_side), clopper_pearson_upper(k_fn, n1, per_side)


def _select_and_bound(scores_d, scores_dprime, confidence, objective):
    """Pick t maximising ``objective(α⁺, β⁺)`` on the selection half; bound on the other."""
    confidence = _validate.in_range("confidence", confidence, 0.0, 1.0, low_inclusive=False)
    s0, s1 = _check_scores(scores_d, scores_dprime)
    sel0, ev0 = _split_halves(s0)
    sel1, ev1 = _split_halves(s1)
    thresholds = _candidate_thresholds(sel0, sel1)
    k_fp, k_fn = _rates_at(thresholds, sel0, sel1)
    a_up, b_up = _upper_rates(k_fp, k_fn, sel0.size, sel1.size, _SELECTION_CONFIDENCE)
    t = float(thresholds[int(np.argmax(objective(a_up, b_up)))])
    k_fp, k_fn = _rates_at(np.array([t]), ev0, ev1)
    a_up, b_up = _upper_rates(k_fp, k_fn, ev0.size, ev1.size, confidence)
    rates = dict(
        threshold=t,
        fpr_upper=float(a_up[0]),
        fnr_upper=float(b_up[0]),
        fpr=float(k_fp[0]) / ev0.size,
        fnr=float(k_fn[0]) / ev1.size,
        n_eval=int(min(ev0.size, ev1.size)),
    )
    return rates


def direct_epsilon_lower_bound(
    scores_d, scores_dprime, *, delta: float = 0.0, confidence: float = 0.95
) -> EpsilonLowerBound:
    r"""Assumption-free lower bound on ε from scores of runs on D and D′.

    Args:
        scores_d: scores of independent runs on D (1-D array; large = evidence for D′).
        scores_dprime: scores of independent runs on D′ (independent keys from the D runs).
        delta: the δ of the DP claim being audited, in [0, 1).
        confidence: joint confidence of the bound; each error rate gets a one-sided
            Clopper–Pearson bound at level (1 + confidence)/2.

    Returns:
        An :class:`EpsilonLowerBound` with ε_LB = max(ln((1−δ−β⁺)/α⁺), ln((1−δ−α⁺)/β⁺), 0).

    Formal guarantees:
        If M is (ε, δ)-DP (for the relation D, D′ are neighbours under) and the runs are
        independent, then P[ε_LB > ε] ≤ 1 − confidence: the threshold is a function of the
        selection half only, the two Clopper–Pearson bounds on the evaluation half each fail
        with probability ≤ (1 − confidence)/2, and (ε, δ)-DP implies α + e^ε β ≥ 1 − δ and
        β + e^ε α ≥ 1 − δ (Kairouz, Oh, Viswanath 2015, Thm 2.1; Jagielski, Ullman, Oprea 2020).
        No assumption on the shape of M's output distribution.

    Example:
        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> s0, s1 = rng.laplace(0, 1, 20000), rng.laplace(1, 1, 20000)  # ε = 1 Laplace
        >>> b = direct_epsilon_lower_bound(s0, s1)
        >>> 0.5 < b.epsilon <= 1.0
        True
    """
    delta = _validate.delta("delta", delta)
    confidence = _validate.in_range("confidence", confidence, 0.0, 1.0, low_inclusive=False)
    rates = _select_and_bound(
        scores_d, scores_dprime, confidence, lambda a, b: epsilon_from_rates(a, b, delta)
    )
    eps = float(epsilon_from_rates(rates["fpr_upper"], rates["fnr_upper"], delta))
    return EpsilonLowerBound(
        epsilon=eps, confidence=confidence, method="direct", delta=delta, **rates
    )


def check_gaussian_tradeoff_assumed(assume_gaussian_tradeoff: bool) -> None:
    """Refuse the GDP estimator unless the caller states its assumption (``True``)."""
    if assume_gaussian_tradeoff is not True:
        _validate.fail(
            "assume_gaussian_tradeoff",
            assume_gaussian_tradeoff,
            "True to use the GDP estimator: it assumes "
            + GAUSSIAN_TRADEOFF_ASSUMPTION
            + " (on an exactly 1-DP Laplace mechanism it reports ε ≈ 4.4 at δ = 1e-5). "
            "State the assumption only for Gaussian-shaped mechanisms (Gaussian noise on a "
            "statistic, Gaussian output perturbation, full-batch DP-GD); otherwise use "
            "direct_epsilon_lower_bound",
        )


def gdp_epsilon_lower_bound(
    scores_d,
    scores_dprime,
    *,
    delta: float,
    confidence: float = 0.95,
    assume_gaussian_tradeoff: bool = False,
) -> EpsilonLowerBound:
    r"""Heuristic ε(δ) bound, valid only if M's trade-off curve is Gaussian (Nasr et al. 2023).

    μ_LB = Φ⁻¹(1 − α⁺) − Φ⁻¹(β⁺) at the threshold chosen on the selection half, and
    ε_LB = ``gdp_epsilon(μ_LB, δ)``.

    Args:
        scores_d: scores of runs on D (large = evidence for D′).
        scores_dprime: scores of runs on D′, independent of the D runs.
        delta: δ in (0, 1) at which ε_LB is reported.
        confidence: joint confidence (Clopper–Pearson on both rates, Bonferroni).
        assume_gaussian_tradeoff: must be ``True``: the caller states that M's trade-off
            curve between D and D′ is Gaussian. The default ``False`` raises, because for
            other mechanisms the output is not a lower bound.

    Returns:
        An :class:`EpsilonLowerBound` with ``mu`` = μ_LB, ``epsilon`` = ε of μ_LB-GDP at δ and
        ``conditional_on`` recording the assumption (``is_heuristic`` is True).

    Raises:
        ValueError: ``assume_gaussian_tradeoff`` is not True, or a bad δ, confidence or scores.

    Formal guarantees:
        Assumption: M's trade-off curve between D and D′ is that of μ-GDP for some μ (true
        for the Gaussian mechanism and every post-processing of a Gaussian release of a
        statistic whose shift is the sensitivity, e.g. Gaussian output perturbation and
        full-batch DP-GD with T steps, μ = √T·Δ/σ; Dong, Roth, Su 2022, Thm 2.7 and
        Cor. 3.3). Then μ ≥ μ_LB with probability ≥ confidence, and since ε(δ) of μ-GDP is
        increasing in μ, ε ≥ ε_LB. A μ_claim-GDP claim is refuted when μ_LB > μ_claim
        (``gdp_mu_for``). For mechanisms that are not GDP-shaped (Laplace, subsampled or
        discrete mechanisms) ε_LB is NOT a lower bound: one (α, β) point is extrapolated along
        the wrong curve, e.g. an exactly 1-DP Laplace pair gives μ_LB ≈ 1.03 and ε_LB ≈ 4.4 at
        δ = 1e-5. Use :func:`direct_epsilon_lower_bound` there.

    Example:
        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> s0, s1 = rng.normal(0, 1, 100000), rng.normal(1, 1, 100000)  # 1-GDP
        >>> b = gdp_epsilon_lower_bound(s0, s1, delta=1e-5, assume_gaussian_tradeoff=True)
        >>> 0.9 < b.mu <= 1.0, b.is_heuristic
        (True, True)
    """
    check_gaussian_tradeoff_assumed(assume_gaussian_tradeoff)
    delta = _validate.in_range("delta", delta, 0.0, 1.0, low_inclusive=False)
    confidence = _validate.in_range("confidence", confidence, 0.0, 1.0, low_inclusive=False)
    rates = _select_and_bound(scores_d, scores_dprime, confidence, gdp_mu_from_rates)
    mu = float(gdp_mu_from_rates(rates["fpr_upper"], rates["fnr_upper"]))
    eps = gdp_epsilon(mu, delta)
    return EpsilonLowerBound(
        epsilon=eps,
        confidence=confidence,
        method="gdp",
        delta=delta,
        mu=mu,
        conditional_on=GAUSSIAN_TRADEOFF_ASSUMPTION,
        **rates,
    )


def one_run_p_value(m: int, r: int, v: int, epsilon: float, delta: float = 0.0) -> float:
    r"""P[≥ v correct guesses out of r] under an (ε, δ)-DP null (Steinke, Nasr, Jagielski 2023).

    With m canaries each included independently with probability ½ and r guesses,
    the number of correct guesses W satisfies

    .. math::
        P[W \ge v] \le P[\mathrm{Bin}(r, \tfrac{e^\varepsilon}{1+e^\varepsilon}) \ge v]
          + 2m\delta \max_{i \in [v]} \tfrac{1}{i} P[v > \mathrm{Bin}(r, q) \ge v - i].

    Args:
        m: number of canaries (≥ r).
        r: number of guesses made (abstentions excluded).
        v: number of correct guesses (≤ r).
        epsilon: ε ≥ 0 of the null hypothesis.
        delta: δ of the null hypothesis, in [0, 1].

    Returns:
        The p-value (clipped to 1).

    Formal guarantees:
        Steinke, Nasr, Jagielski, NeurIPS 2023, Theorem 3.1 / Algorithm 2 (their p-value).
    """
    if not 0 <= v <= r <= m:
        _validate.fail("(m, r, v)", (m, r, v), "integers with 0 <= v <= r <= m")
    epsilon = _validate.non_negative("epsilon", epsilon)
    delta = _validate.in_range("delta", delta, 0.0, 1.0, high_inclusive=True)
    q = special.expit(epsilon)
    tail = float(stats.binom.sf(v - 1, r, q))
    if delta == 0.0 or v == 0:
        return min(tail, 1.0)
    pmf = stats.binom.pmf(np.arange(v - 1, -1, -1), r, q)  # P[Bin = v-i], i = 1..v
    worst = float(np.max(np.cumsum(pmf) / np.arange(1, v + 1)))
    return min(tail + 2.0 * m * delta * worst, 1.0)


def guesses_from_scores(scores, *, k_in: int, k_out: int) -> np.ndarray:
    """One-run guesses: IN (+1) for the ``k_in`` highest scores, OUT (−1) for the ``k_out``
    lowest, abstain (0) otherwise. Fix k_in, k_out before looking at the scores.

    Args:
        scores: one score per canary (large = evidence the canary was included).
        k_in: number of IN guesses (≥ 0).
        k_out: number of OUT guesses (≥ 0), with k_in + k_out ≤ number of canaries.

    Returns:
        An int array of guesses in {−1, 0, +1}.
    """
    s = np.asarray(scores, dtype=np.float64).ravel()
    if not (0 <= k_in and 0 <= k_out and k_in + k_out <= s.size):
        _validate.fail("(k_in, k_out)", (k_in, k_out), f"non-negative with sum <= {s.size}")
    order = np.argsort(s, kind="stable")
    guesses = np.zeros(s.size, dtype=np.int64)
    guesses[order[s.size - k_in :]] = 1
    guesses[order[:k_out]] = -1
    return guesses


def one_run_max_epsilon(
    *, m: int, guesses: int, delta: float = 0.0, confidence: float = 0.95
) -> float:
    """The largest ε_LB a one-run audit can ever report: every one of its guesses correct.

    With m canaries, r = ``guesses`` guesses, δ and the confidence fixed, the bound of
    :func:`one_run_epsilon_lower_bound` is increasing in the number of correct guesses, so
    v = r gives its maximum. An audit whose maximum is at or below a claimed ε cannot refute
    that claim, whatever the implementation does (1 000 canaries, 50 + 50 guesses and
    δ = 10⁻⁵ reach at most about 3.47): size m and the guesses from this before the run.

    Args:
        m: number of canaries.
        guesses: r, the total number of IN and OUT guesses (1 ≤ r ≤ m).
        delta: δ of the claim, in [0, 1).
        confidence: confidence of the bound.

    Returns:
        The ε_LB with all r guesses correct.

    Example:
        >>> round(one_run_max_epsilon(m=1000, guesses=100, delta=1e-5), 2)
        3.47
    """
    m = _validate.positive_int("m", m)
    r = _validate.positive_int("guesses", guesses)
    if r > m:
        _validate.fail("guesses", guesses, f"at most m = {m}")
    g = np.ones(r, dtype=np.int64)
    return one_run_epsilon_lower_bound(
        g, np.ones(r, dtype=bool), m=m, delta=delta, confidence=confidence
    ).epsilon


def one_run_epsilon_lower_bound(
    guesses, truths, *, m: int | None = None, delta: float = 0.0, confidence: float = 0.95
) -> EpsilonLowerBound:
    """ε_LB from one run with m canaries (Steinke, Nasr, Jagielski 2023, Algorithm 2).

    Args:
        guesses: array over canaries: +1 (guess IN), −1 (guess OUT) or 0 (abstain).
        truths: array over canaries: True where the canary was included (each included
            independently with probability ½ — the analysis needs this).
        m: number of canaries (defaults to ``len(truths)``).
        delta: δ of the claim, in [0, 1).
        confidence: the bound holds with this probability.

    Returns:
        The largest ε whose p-value for the observed correct guesses is < 1 − confidence.

    Formal guarantees:
        Steinke, Nasr, Jagielski, NeurIPS 2023, Theorem 3.1: valid for any (ε, δ)-DP
        training algorithm under add/remove of canaries, with no group-privacy cost.
    """
    delta = _validate.delta("delta", delta)
    confidence = _validate.in_range("confidence", confidence, 0.0, 1.0, low_inclusive=False)
    g = np.asarray(guesses).ravel()
    t = np.asarray(truths, dtype=bool).ravel()
    if g.shape != t.shape:
        _validate.fail("guesses", g.shape, f"an array of shape {t.shape} like truths")
    m = t.size if m is None else _validate.positive_int("m", m)
    r = int(np.count_nonzero(g))
    v = int(np.count_nonzero((g > 0) & t) + np.count_nonzero((g < 0) & ~t))
    p = 1.0 - confidence

    def rejected(eps: float) -> bool:
        return one_run_p_value(m, r, v, eps, delta) < p

    if r == 0 or not rejected(0.0):
        eps = 0.0
    else:
        lo, hi = 0.0, 1.0
        while rejected(hi) and hi < 1e3:
            lo, hi = hi, 2.0 * hi
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if rejected(mid) else (lo, mid)
        eps = lo
    return EpsilonLowerBound(
        epsilon=float(eps),
        confidence=confidence,
        method="one_run",
        delta=float(delta),
        fpr=None,
        fnr=None,
        n_eval=r,
    )
