"""Accounting of the matrix-factorization mechanisms: against dp-accounting and brute force."""

from __future__ import annotations

import itertools
import math

import dp_accounting
import numpy as np
import pytest
from scipy import integrate, optimize, stats

from dpjax.accounting import PrivacyAccountant
from dpjax.accounting.tight import tight_epsilon
from dpjax.dp_sgd.matrix_factorization.accounting import (
    banded_amplified_event,
    banded_rounds,
    matrix_mechanism_event,
    max_column_norm,
    tree_aggregation_event,
    tree_depth,
)
from dpjax.events import GaussianEvent, PoissonSampledGaussianEvent

DELTA = 1e-5


def _sqrt_toeplitz(n: int, bands: int | None = None) -> np.ndarray:
    """The Toeplitz square root of the prefix-sum matrix (c_k = binom(2k, k)/4^k), banded."""
    k = np.arange(n)
    coeffs = np.array([math.comb(2 * i, i) / 4.0**i for i in k])
    if bands is not None:
        coeffs[bands:] = 0.0
    return np.array([[coeffs[i - j] if i >= j else 0.0 for j in range(n)] for i in range(n)])


def _brute_sensitivity(c: np.ndarray, min_separation: int, max_participations: int) -> float:
    """max over participation sets π (≥ b apart, ≤ k of them) of ‖C·1_π‖ — exact for a C with
    a non-negative column Gram (all gradients equal is then the worst case)."""
    n = c.shape[0]
    best = 0.0
    for size in range(1, max_participations + 1):
        for pi in itertools.combinations(range(n), size):
            if all(b - a >= min_separation for a, b in itertools.pairwise(pi)):
                best = max(best, float(np.linalg.norm(c[:, list(pi)].sum(axis=1))))
    return best


def _gaussian_epsilon(mu: float, delta: float) -> float:
    """Exact ε(δ) of the Gaussian mechanism with Δ/σ = μ (Balle & Wang 2018, Theorem 8)."""

    def gap(eps: float) -> float:
        return (
            stats.norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * stats.norm.cdf(-mu / 2 - eps / mu)
        ) - delta

    return optimize.brentq(gap, 0.0, 100.0, xtol=1e-12)


@pytest.mark.parametrize("separation, participations", [(1, 1), (3, 2), (2, 3)])
def test_multi_epoch_event_is_the_exact_gaussian_of_brute_force_sensitivity(
    separation, participations
):
    c = _sqrt_toeplitz(7)
    assert np.all(c.T @ c >= 0)  # Gram non-negative: brute force over 0/1 patterns is exact
    sens = _brute_sensitivity(c, separation, participations)
    sigma = 3.0
    event = matrix_mechanism_event(sigma, sensitivity=sens)
    acc = PrivacyAccountant()
    acc.record(event)
    got = acc.epsilon(DELTA)
    exact = _gaussian_epsilon(sens / sigma, DELTA)
    assert exact * 0.999 <= got <= exact * 1.01  # PLD is an upper bound, tight to the grid
    # a wrong sensitivity (single participation for a multi-participation run) under-reports
    if participations > 1:
        single = matrix_mechanism_event(sigma, sensitivity=max_column_norm(c))
        assert tight_epsilon([single], DELTA) < exact * 0.95


def test_strategy_event_uses_mf_sensitivity_when_available():
    sens_mod = pytest.importorskip("dpjax.dp_sgd.matrix_factorization.sensitivity")
    from dpjax.dp_sgd.matrix_factorization.accounting import strategy_event

    c = _sqrt_toeplitz(6)
    brute = _brute_sensitivity(c, 2, 3)
    assert sens_mod.sensitivity(c, min_separation=2, max_participations=3) == pytest.approx(
        brute, rel=1e-9
    )
    event = strategy_event(c, noise_multiplier=2.0, min_separation=2, max_participations=3)
    assert event.noise_multiplier == pytest.approx(2.0 / brute, rel=1e-9)


def test_banded_amplified_event_matches_dp_accounting_dp_sgd():
    n, bands, q, sigma = 64, 4, 0.1, 1.2
    c = _sqrt_toeplitz(n, bands)
    event = banded_amplified_event(c, noise_multiplier=sigma, sampling_rate=q, bands=bands)
    col = max_column_norm(c)
    assert event.count == banded_rounds(n, bands) == 16
    assert event.noise_multiplier == pytest.approx(sigma / col, rel=1e-12)
    acc = PrivacyAccountant()
    acc.record(event)
    got = acc.epsilon(DELTA)
    pld = dp_accounting.pld.PLDAccountant()
    gauss = dp_accounting.GaussianDpEvent(sigma / col)
    pld.compose(dp_accounting.PoissonSampledDpEvent(q, gauss), 16)
    assert got == pytest.approx(pld.get_epsilon(DELTA), rel=0.01)


def test_banded_amplified_one_round_matches_brute_force_mixture():
    """n = b: one Poisson round. The output along C·e_j (all other directions are pure noise)
    is N(0, σ²) vs (1 − q)N(0, σ²) + qN(‖Ce_j‖, σ²): its hockey-stick divergence at ε, by
    quadrature, must be ≤ δ at the event's ε and > δ a little below it."""
    bands, q, sigma = 5, 0.2, 0.9
    c = _sqrt_toeplitz(bands)
    event = banded_amplified_event(c, noise_multiplier=sigma, sampling_rate=q)
    assert event.count == 1
    eps = tight_epsilon([event], DELTA)
    mu = max_column_norm(c)

    def hockey(e: float) -> float:
        def p(x):  # remove: D has the record (mixture), D' not; and the reverse direction
            return (1 - q) * stats.norm.pdf(x, 0, sigma) + q * stats.norm.pdf(x, mu, sigma)

        def gap(f, g):
            return integrate.quad(
                lambda x: max(f(x) - math.exp(e) * g(x), 0.0), -30, 30, limit=400, points=[0.0, mu]
            )[0]

        def base(x):
            return stats.norm.pdf(x, 0, sigma)

        return max(gap(p, base), gap(base, p))

    assert hockey(eps) <= DELTA * 1.001
    assert hockey(eps * 0.97) > DELTA


def test_banded_event_refuses_a_wider_strategy():
    c = _sqrt_toeplitz(8, 4)
    with pytest.raises(ValueError, match="bands"):
        banded_amplified_event(c, noise_multiplier=1.0, sampling_rate=0.1, bands=3)


def test_tree_aggregation_event_matches_dp_accounting_rdp():
    for n, sigma in [(1, 2.0), (100, 3.0), (1023, 5.0), (1024, 5.0)]:
        event = tree_aggregation_event(sigma, steps=n)
        assert event.noise_multiplier == pytest.approx(sigma / math.sqrt(tree_depth(n)))
        # dp-accounting states it for zero-out ("replace with a special record") neighbours,
        # which is how dpjax models add/remove-one with a public n (see make_private)
        special = dp_accounting.NeighboringRelation.REPLACE_SPECIAL
        rdp = dp_accounting.rdp.RdpAccountant(neighboring_relation=special)
        rdp.compose(dp_accounting.SingleEpochTreeAggregationDpEvent(sigma, n))
        ours = tight_epsilon([event], DELTA, method="rdp")
        assert ours == pytest.approx(rdp.get_epsilon(DELTA), rel=0.01)
        assert tight_epsilon([event], DELTA) <= ours  # PLD is tighter than RDP


def test_events_compose_in_the_accountant_with_dp_sgd():
    acc = PrivacyAccountant()
    acc.record(tree_aggregation_event(4.0, steps=50))
    acc.record(PoissonSampledGaussianEvent(noise_multiplier=1.0, sampling_rate=0.01, count=100))
    alone = PrivacyAccountant()
    alone.record(PoissonSampledGaussianEvent(noise_multiplier=1.0, sampling_rate=0.01, count=100))
    assert acc.epsilon(DELTA) > alone.epsilon(DELTA)
    assert isinstance(tree_aggregation_event(4.0, steps=50), GaussianEvent)


@pytest.mark.parametrize("kwargs", [{"noise_multiplier": 0.0}, {"sensitivity": -1.0}])
def test_bad_arguments_are_refused(kwargs):
    args = {"noise_multiplier": 1.0, "sensitivity": 1.0} | kwargs
    with pytest.raises(ValueError):
        matrix_mechanism_event(args.pop("noise_multiplier"), **args)
