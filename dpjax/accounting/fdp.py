r"""f-DP: Gaussian differential privacy and trade-off curves (Dong, Roth, Su 2019/2022).

A mechanism is f-DP if every test of "D" against "D'" at type-I error α has type-II error at
least f(α); μ-GDP means f = G_μ, G_μ(α) = Φ(Φ⁻¹(1 − α) − μ).

* :func:`gdp_delta` / :func:`gdp_epsilon` — exact (ε, δ) conversions of μ-GDP (Cor. 2.13).
* :func:`gdp_mu_clt_approximation` (alias :func:`gdp_mu`) — the central-limit μ of DP-SGD
  (Bu, Dong, Long, Su 2020). An APPROXIMATION, not a guarantee: it can be optimistic at few
  steps or large sampling rates. Never report it as ε without saying so.
* :func:`tradeoff_curve` — a valid lower bound on the trade-off function of a composition,
  from its privacy loss distribution (dp-accounting PLD).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import optimize, special

from dpjax import _validate
from dpjax import events as ev
from dpjax.accounting.with_replacement import _pmf_delta
from dpjax.relation import ADD_OR_REMOVE_ONE

__all__ = [
    "gdp_delta",
    "gdp_epsilon",
    "gdp_mu",
    "gdp_mu_clt_approximation",
    "gdp_tradeoff",
    "tradeoff_curve",
]


_MAX_GDP_MU = 1e150  # ε(δ) ≈ μ²/2 + μΦ⁻¹(1 − δ): finite in float64 up to μ ≈ 1.8e154
_MAX_EXP_ARGUMENT = math.log(np.finfo(np.float64).max)  # e^x overflows beyond (≈ 709.78)
_MIN_CLT_SIGMA = 1.0 / math.sqrt(_MAX_EXP_ARGUMENT)  # ≈ 0.03754


def _alphas(alphas) -> np.ndarray:
    """``alphas`` as a float64 array, every entry in [0, 1] (NaN refused)."""
    try:
        a = np.asarray(alphas, dtype=np.float64)
    except (TypeError, ValueError):
        _validate.fail("alphas", alphas, "type-I errors in [0, 1] (numbers)")
    if not np.all((a >= 0.0) & (a <= 1.0)):  # NaN fails both comparisons
        _validate.fail("alphas", alphas, "type-I errors in [0, 1] in every entry")
    return a


def gdp_delta(*, mu: float, epsilon: float) -> float:
    r"""δ(ε) of a μ-GDP mechanism: Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2).

    Formal guarantees:
        Dong, Roth, Su 2022 ("Gaussian differential privacy", JRSS-B), Corollary 2.13: a
        mechanism is μ-GDP iff it is (ε, δ(ε))-DP for all ε ≥ 0 with this δ(ε). The second term
        is evaluated in log space (no overflow at large ε). Exact up to floating point.

    Args:
        mu: μ ≥ 0.
        epsilon: ε ≥ 0.

    Returns:
        δ in [0, 1).

    Example:
        >>> round(gdp_delta(mu=1.0, epsilon=1.0), 6)
        0.126937
    """
    epsilon = _validate.non_negative("epsilon", epsilon)
    mu = _validate.non_negative("mu", mu)
    if mu == 0.0:
        return 0.0
    first = special.ndtr(-epsilon / mu + mu / 2.0)
    second = math.exp(epsilon + special.log_ndtr(-epsilon / mu - mu / 2.0))
    return max(float(first - second), 0.0)


def gdp_epsilon(*, mu: float, delta: float) -> float:
    """The smallest ε with ``gdp_delta(mu=μ, epsilon=ε) ≤ δ``: ε(δ) of a μ-GDP mechanism.

    Formal guarantees:
        Inverts Dong, Roth, Su 2022, Corollary 2.13 (δ(ε) is decreasing in ε) by root finding
        to 1e-12 absolute.

    Args:
        mu: μ in [0, 1e150] (beyond, ε(δ) ≈ μ²/2 overflows a float: ``ValueError``).
        delta: δ in (0, 1).

    Returns:
        ε ≥ 0 (0 when μ-GDP already gives δ at ε = 0).

    Example:
        >>> round(gdp_epsilon(mu=1.0, delta=1e-5), 3)
        4.377
    """
    mu = _validate.in_range("mu", mu, 0.0, _MAX_GDP_MU, high_inclusive=True)
    delta = _validate.in_range("delta", delta, 0.0, 1.0, low_inclusive=False)
    if gdp_delta(mu=mu, epsilon=0.0) <= delta:
        return 0.0
    hi = 1.0
    while gdp_delta(mu=mu, epsilon=hi) > delta:
        hi *= 2.0
    return float(
        optimize.brentq(lambda e: gdp_delta(mu=mu, epsilon=e) - delta, 0.0, hi, xtol=1e-12)
    )


def gdp_mu_clt_approximation(*, noise_multiplier: float, sampling_rate: float, steps: int) -> float:
    r"""μ of DP-SGD by the central limit theorem — an APPROXIMATION, not a guarantee.

    .. math:: μ ≈ q\sqrt{T\,(e^{1/σ^2} - 1)}

    Formal guarantees:
        None. Bu, Dong, Long, Su 2020 ("Deep learning with Gaussian differential privacy",
        HDSR), Theorem 5 / Corollary: the T-fold composition of the Poisson-subsampled
        Gaussian converges to μ-GDP as T → ∞ with q√T fixed. At finite T it can be optimistic
        (ε below the true one), most at few steps and large q; compare
        :func:`tradeoff_curve` or the PLD accountant before quoting it.

    Args:
        noise_multiplier: σ ≥ 0.0375 (noise std over the clip norm, add/remove-one; below,
            e^(1/σ²) overflows: ``ValueError``).
        sampling_rate: q in (0, 1].
        steps: T ≥ 1.

    Returns:
        The approximate μ.

    Example:
        >>> round(gdp_mu_clt_approximation(noise_multiplier=1.0, sampling_rate=0.01, steps=1000), 4)
        0.4145
    """
    sigma = _validate.positive("noise_multiplier", noise_multiplier)
    q = _validate.probability("sampling_rate", sampling_rate)
    steps = _validate.positive_int("steps", steps)
    if 1.0 / sigma**2 > _MAX_EXP_ARGUMENT:
        _validate.fail(
            "noise_multiplier",
            noise_multiplier,
            f"at least {_MIN_CLT_SIGMA:.6g} (below it e^(1/σ²) overflows a float: the CLT μ is "
            "infinite, no privacy)",
        )
    mu = q * math.sqrt(steps * math.expm1(1.0 / sigma**2))
    if not math.isfinite(mu):
        _validate.fail("steps", steps, "small enough that q·sqrt(T·(e^(1/σ²) − 1)) is finite")
    return mu


#: Short name of :func:`gdp_mu_clt_approximation` (still an approximation).
gdp_mu = gdp_mu_clt_approximation


def gdp_tradeoff(mu: float, alphas) -> np.ndarray:
    """G_μ(α) = Φ(Φ⁻¹(1 − α) − μ), the trade-off function of μ-GDP (Dong, Roth, Su 2022, Def. 2.5).

    Example:
        >>> [round(float(b), 4) for b in gdp_tradeoff(1.0, [0.05, 0.5])]
        [0.7405, 0.1587]

    Args:
        mu: μ ≥ 0.
        alphas: type-I errors α in [0, 1] (a number or an array; ``ValueError`` otherwise).

    Returns:
        β = G_μ(α) for every α, as a float64 array of the shape of ``alphas``.
    """
    mu = _validate.non_negative("mu", mu)
    a = _alphas(alphas)
    return special.ndtr(special.ndtri(1.0 - a) - mu)


def _events_and_vdi(events_or_accountant) -> tuple[list[ev.PrivacyEvent], float]:
    from dpjax.accounting.accountant import PrivacyAccountant  # noqa: PLC0415 (cycle)

    if isinstance(events_or_accountant, PrivacyAccountant):
        return list(events_or_accountant.events), events_or_accountant._vdi  # noqa: SLF001
    if isinstance(events_or_accountant, ev.PrivacyEvent):
        return [events_or_accountant], 1e-4
    events = list(events_or_accountant)
    if not events or not all(isinstance(e, ev.PrivacyEvent) for e in events):
        _validate.fail("events", events_or_accountant, "privacy events or a PrivacyAccountant")
    return events, 1e-4


def _has_truncated_analysis(event: ev.PrivacyEvent) -> bool:
    """A padded-sampler event that dp-accounting analyses exactly (add/remove-one, PLD)."""
    return (
        isinstance(event, ev.PoissonSampledGaussianEvent)
        and event.truncated
        and event.relation is ADD_OR_REMOVE_ONE
    )


def _truncated_poisson_pld(event: ev.PoissonSampledGaussianEvent, vdi: float):
    """The PLD of a padded Poisson sampler's ``count`` steps, by dp-accounting's analysis."""
    import dp_accounting  # noqa: PLC0415 (heavy; only here)

    from dpjax.accounting.tight import to_dp_event  # noqa: PLC0415

    dp_event, relation = to_dp_event(event, method="pld")
    accountant = dp_accounting.pld.PLDAccountant(relation, value_discretization_interval=vdi)
    accountant.compose(dp_event)
    return accountant._pld  # noqa: SLF001 (no public accessor)


def tradeoff_curve(
    events: Sequence[ev.PrivacyEvent] | ev.PrivacyEvent | object,
    alphas,
    *,
    epsilons: Sequence[float] | None = None,
) -> np.ndarray:
    r"""A lower bound β(α) on the trade-off function of the composition of ``events``.

    .. math:: β(α) = \sup_{ε} \max\{0,\ 1 - δ(ε) - e^{ε}α,\ e^{-ε}(1 - δ(ε) - α)\}

    Formal guarantees:
        Dong, Roth, Su 2022, Proposition 2.12: a mechanism that is (ε, δ(ε))-DP for every ε is
        f-DP with f = sup_ε f_{ε, δ(ε)}, f_{ε,δ}(α) = max{0, 1 − δ − e^ε α, e^{−ε}(1 − δ − α)}.
        δ(ε) is the PLD's (pessimistic: an upper bound on the true profile, both directions)
        of the composition, as :class:`dpjax.accounting.PrivacyAccountant` computes it; the
        supremum over a finite grid of ε only lowers β. So every test of the composition at
        type-I error α has type-II error ≥ the returned β(α). A padded sampler's events
        (``max_batch_size``) under add/remove-one are analysed as truncated Poisson sampling by
        dp-accounting's ``TruncatedSubsampledGaussianDpEvent`` (its PLD; the same truncation
        rule as :class:`dpjax.dp_sgd.PoissonSampler`); under replace-one they are evaluated
        untruncated and pay the truncation slack δ(ε) + (1 + e^ε)·Σ count·p̄ at every ε, as
        the accountant does (:func:`dpjax.accounting.truncation_slack`). The events pass the
        accountant's checks: one neighbouring relation and one privacy unit (example or
        user), else ``ValueError``.

    Args:
        events: events (or one event) under one relation, or a ``PrivacyAccountant``.
        alphas: type-I errors in [0, 1].
        epsilons: the ε grid of the supremum (default: 4000 points on [0, ε(1e-12)]).

    Returns:
        β, same shape as ``alphas``.

    Raises:
        ValueError: events that PLD cannot account (e.g. private selection), events of
            different relations (replace-one with add/remove-one) or privacy units.

    Example:
        >>> beta = tradeoff_curve(ev.GaussianEvent(noise_multiplier=1.0), [0.05, 0.5])
        >>> [round(float(b), 3) for b in beta]  # 1-GDP: G_1(α) = [0.7405, 0.1587]
        [0.74, 0.159]
    """
    from dpjax.accounting.accountant import PrivacyAccountant, composed_pld  # noqa: PLC0415
    from dpjax.accounting.padded_slack import _overflow_mass, _untruncated  # noqa: PLC0415

    event_list, vdi = _events_and_vdi(events)
    PrivacyAccountant(event_list)  # the accountant's checks: one relation, one privacy unit
    alpha = np.asarray(alphas, dtype=np.float64)
    if alpha.size and (np.any(~np.isfinite(alpha)) or alpha.min() < 0.0 or alpha.max() > 1.0):
        _validate.fail("alphas", alphas, "values in [0, 1]")
    exact = [e for e in event_list if _has_truncated_analysis(e)]
    rest = [e for e in event_list if not _has_truncated_analysis(e)]
    overflow_mass = _overflow_mass(rest)  # padded samplers without dp-accounting's analysis
    plds = [composed_pld(_untruncated(rest), vdi)] if rest else []
    plds += [_truncated_poisson_pld(e, vdi) for e in exact]
    pld = plds[0]
    for other in plds[1:]:
        pld = pld.compose(other)
    if epsilons is None:
        top = max(float(pld.get_epsilon_for_delta(1e-12)), 1e-3)
        grid = np.linspace(0.0, top, 4000)
    else:
        grid = np.asarray(epsilons, dtype=np.float64)
        grid = np.sort(grid)
    deltas = np.maximum(
        _pmf_delta(pld._pmf_remove, grid),  # noqa: SLF001 (no public accessor)
        _pmf_delta(pld._pmf_add, grid),  # noqa: SLF001
    )
    if overflow_mass > 0.0:  # a padded sampler's truncation slack, as the accountant pays it
        with np.errstate(over="ignore"):
            deltas = deltas + (1.0 + np.exp(grid)) * overflow_mass
    a = alpha.reshape(-1, 1)
    e, d = grid.reshape(1, -1), deltas.reshape(1, -1)
    first = 1.0 - d - np.exp(e) * a
    second = np.exp(-e) * (1.0 - d - a)
    beta = np.max(np.maximum(np.maximum(first, second), 0.0), axis=1)
    return beta.reshape(alpha.shape)
