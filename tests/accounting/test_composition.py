"""Closed-form composition theorems, group privacy, subsampling and the KOV optimal composition.

Expected values are hand-computed from the lectures' formulas (properties of DP, ML under DP,
advances in DP) with the numbers written out, or come from independent references
(dp-accounting's PLD of the canonical (ε, δ) pair; brute-force enumeration).
"""

import itertools
import math

import numpy as np
import pytest
from dp_accounting.pld import common as pld_common
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from dpjax import accounting as acc


def test_basic_and_parallel_composition_example_8_of_004():
    # Lecture on advances in DP, Example 8 (sequential and parallel composition): Q1, Q2 on
    # x1 compose sequentially (ε1 + ε2); Q3 on disjoint x2 in parallel.
    seq = acc.basic_composition([0.3, 0.2])
    assert seq == (pytest.approx(0.5), 0.0)
    assert acc.parallel_composition([seq[0], 0.4]) == (pytest.approx(0.5), 0.0)
    assert acc.parallel_composition([seq[0], 0.9]) == (0.9, 0.0)


def test_basic_composition_sums_deltas():
    eps, dlt = acc.basic_composition([0.1] * 10, [1e-6] * 10)
    assert eps == pytest.approx(1.0)
    assert dlt == pytest.approx(1e-5)


def test_advanced_composition_hand_computed():
    # ε√(2T ln(1/δ')) + Tε(e^ε−1)/(e^ε+1) at ε = 0.1, T = 100, δ' = 1e-5:
    # 0.1·√(200·11.512925) = 4.798526 and 100·0.1·0.0499584 = 0.499584.
    eps, dlt = acc.advanced_composition(epsilon=0.1, delta=1e-7, steps=100, delta_prime=1e-5)
    assert eps == pytest.approx(4.798526 + 0.499584, abs=2e-6)
    assert dlt == pytest.approx(100 * 1e-7 + 1e-5)


def test_advanced_beats_basic_for_small_epsilon_large_T_only():
    # Theory: advanced wins when ε√(2T ln 1/δ') + drift < Tε, i.e. for large T and small ε.
    for eps0, steps in [(0.01, 1000), (0.1, 1000), (0.1, 10_000)]:
        adv, _ = acc.advanced_composition(epsilon=eps0, delta=0.0, steps=steps, delta_prime=1e-6)
        assert adv < eps0 * steps
    # ... and loses for a single step (the √(2 ln 1/δ') factor).
    adv1, _ = acc.advanced_composition(epsilon=0.5, delta=0.0, steps=1, delta_prime=1e-6)
    assert adv1 > 0.5


def test_advanced_composition_heterogeneous_reduces_to_homogeneous():
    homo = acc.advanced_composition(epsilon=0.2, delta=1e-8, steps=50, delta_prime=1e-6)
    het = acc.advanced_composition_heterogeneous([0.2] * 50, [1e-8] * 50, delta_prime=1e-6)
    assert het == pytest.approx(homo, rel=1e-12)
    counted = acc.advanced_composition_heterogeneous([0.2], [1e-8], counts=[50], delta_prime=1e-6)
    assert counted == pytest.approx(homo, rel=1e-12)


def test_corollary_step_epsilon_meets_target():
    # Lecture on properties of DP, per-step corollary of advanced composition:
    # ε ≤ ε'/√(8T ln(1/δ')) suffices for (ε', Tδ + δ') when ε' < 1.
    for target, steps in [(0.5, 100), (0.9, 10_000), (0.1, 10)]:
        step = acc.advanced_composition_step_epsilon(
            target_epsilon=target, steps=steps, delta_prime=1e-5
        )
        assert step == pytest.approx(target / math.sqrt(8 * steps * math.log(1e5)))
        total, _ = acc.advanced_composition(epsilon=step, delta=0.0, steps=steps, delta_prime=1e-5)
        assert total <= target
    with pytest.raises(ValueError, match="target_epsilon"):
        acc.advanced_composition_step_epsilon(target_epsilon=1.5, steps=10, delta_prime=1e-5)


def test_group_privacy_hand_computed():
    # (kε, δ(e^{kε}−1)/(e^ε−1)): k = 2, ε = 1 → δ(e + 1) = 3.718282e-6 for δ = 1e-6.
    eps, dlt = acc.group_privacy(epsilon=1.0, delta=1e-6, group_size=2)
    assert eps == 2.0
    assert dlt == pytest.approx(3.718282e-6, rel=1e-6)
    # k = 3, ε = ln 2: δ(8 − 1)/(2 − 1) = 7δ.
    eps3, dlt3 = acc.group_privacy(epsilon=math.log(2.0), delta=1e-6, group_size=3)
    assert eps3 == pytest.approx(3 * math.log(2.0))
    assert dlt3 == pytest.approx(7e-6)
    assert acc.group_privacy(epsilon=0.3, delta=1e-5, group_size=1) == (0.3, pytest.approx(1e-5))


def test_amplification_by_subsampling_hand_computed_and_relations():
    # ln(1 + p(e^ε − 1)) at ε = 1, p = 0.01: ln(1.0171828) = 0.0170369.
    eps, dlt = acc.amplification_by_subsampling(epsilon=1.0, delta=1e-5, sampling_rate=0.01)
    assert eps == pytest.approx(0.0170369, abs=1e-7)
    assert dlt == pytest.approx(1e-7)
    same = acc.amplification_by_subsampling(
        epsilon=1.0, delta=1e-5, sampling_rate=0.01, sampling="without_replacement"
    )
    assert same == (pytest.approx(eps), pytest.approx(dlt))
    assert acc.SAMPLING_RELATIONS == {
        "poisson": acc.SAMPLING_RELATIONS["poisson"],
        "without_replacement": acc.SAMPLING_RELATIONS["without_replacement"],
    }
    with pytest.raises(ValueError, match="relation"):
        acc.amplification_by_subsampling(
            epsilon=1.0, delta=0.0, sampling_rate=0.1, relation="replace_one"
        )
    with pytest.raises(ValueError, match="relation"):
        acc.amplification_by_subsampling(
            epsilon=1.0,
            delta=0.0,
            sampling_rate=0.1,
            sampling="without_replacement",
            relation="add_or_remove_one",
        )
    # p = 1: nothing changes.
    assert acc.amplification_by_subsampling(epsilon=0.7, delta=1e-6, sampling_rate=1.0) == (
        pytest.approx(0.7),
        pytest.approx(1e-6),
    )


def test_optimal_composition_two_steps_hand_computed():
    # T = 2, (1, 0): δ(ε') = (e² − e^{ε'})/(1 + e)² for 0 ≤ ε' < 2, so at δ = 0.01
    # ε' = ln(e² − 0.01(1 + e)²) = ln(7.389056 − 0.138249) = 1.981112.
    eps = acc.optimal_composition_epsilon(epsilon=1.0, delta=0.0, steps=2, delta_total=0.01)
    assert eps == pytest.approx(1.981112, abs=1e-6)


def _brute_force_delta(epsilon, delta, steps, epsilon_total):
    # Enumerate the canonical KOV pair: outcomes {A, B, flip0, flip1} with probabilities
    # P = (δ, 0, (1−δ)e^ε/(1+e^ε), (1−δ)/(1+e^ε)), Q = (0, δ, (1−δ)/(1+e^ε), (1−δ)e^ε/(1+e^ε)).
    e = math.exp(epsilon)
    p = [delta, 0.0, (1 - delta) * e / (1 + e), (1 - delta) / (1 + e)]
    q = [0.0, delta, (1 - delta) / (1 + e), (1 - delta) * e / (1 + e)]
    total = 0.0
    for outcome in itertools.product(range(4), repeat=steps):
        pp = math.prod(p[i] for i in outcome)
        qq = math.prod(q[i] for i in outcome)
        total += max(0.0, pp - math.exp(epsilon_total) * qq)
    return total


@pytest.mark.parametrize("steps", [1, 3, 5])
def test_optimal_composition_delta_matches_brute_force(steps):
    for eps_total in [0.0, 0.4, 1.1, 2.0]:
        got = acc.optimal_composition_delta(
            epsilon=0.5, delta=1e-3, steps=steps, epsilon_total=eps_total
        )
        assert got == pytest.approx(_brute_force_delta(0.5, 1e-3, steps, eps_total), abs=1e-12)


@pytest.mark.parametrize(("eps0", "delta0", "steps"), [(0.1, 0.0, 100), (0.5, 1e-7, 20)])
def test_optimal_composition_matches_dp_accounting_pld(eps0, delta0, steps):
    # dp-accounting's PLD of the tight (ε, δ) pair, self-composed: an independent oracle
    # (pessimistic, so slightly above the exact KOV value).
    pld = pld_lib.from_privacy_parameters(
        pld_common.DifferentialPrivacyParameters(eps0, delta0),
        value_discretization_interval=1e-4,
    ).self_compose(steps)
    target = 1e-5 + steps * delta0
    ours = acc.optimal_composition_epsilon(
        epsilon=eps0, delta=delta0, steps=steps, delta_total=target
    )
    theirs = pld.get_epsilon_for_delta(target)
    assert ours <= theirs + 1e-9
    assert ours == pytest.approx(theirs, rel=5e-3)


def test_optimal_below_advanced_below_basic_and_stable_at_large_T():
    delta_total = 1e-5
    prev = 0.0
    for steps in [1, 10, 100, 1000, 10_000]:
        opt = acc.optimal_composition_epsilon(
            epsilon=0.1, delta=0.0, steps=steps, delta_total=delta_total
        )
        adv, _ = acc.advanced_composition(
            epsilon=0.1, delta=0.0, steps=steps, delta_prime=delta_total
        )
        assert math.isfinite(opt)
        assert opt <= adv
        assert opt <= 0.1 * steps
        assert opt > prev
        prev = opt
    # √T regime at large T: ε'(10⁴)/ε'(10³) is close to √10, far below the linear 10.
    e3 = acc.optimal_composition_epsilon(epsilon=0.01, delta=0.0, steps=1000, delta_total=1e-5)
    e4 = acc.optimal_composition_epsilon(epsilon=0.01, delta=0.0, steps=10_000, delta_total=1e-5)
    assert 2.5 < e4 / e3 < 4.0


def test_optimal_composition_infinite_when_delta_budget_exhausted():
    assert (
        acc.optimal_composition_epsilon(epsilon=0.1, delta=1e-4, steps=100, delta_total=1e-3)
        == math.inf
    )


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: acc.basic_composition([-1.0]), "epsilons"),
        (lambda: acc.basic_composition([1.0], [1.0]), "deltas"),
        (lambda: acc.basic_composition([]), "epsilons"),
        (lambda: acc.parallel_composition([1.0, 2.0], [0.1]), "deltas"),
        (lambda: acc.advanced_composition(epsilon=0, delta=0, steps=1, delta_prime=0.1), "epsilon"),
        (lambda: acc.advanced_composition(epsilon=1, delta=1.0, steps=1, delta_prime=0.1), "delta"),
        (lambda: acc.advanced_composition(epsilon=1, delta=0, steps=0, delta_prime=0.1), "steps"),
        (lambda: acc.advanced_composition(epsilon=1, delta=0, steps=2.5, delta_prime=0.1), "steps"),
        (lambda: acc.advanced_composition(epsilon=1, delta=0, steps=2, delta_prime=0.0), "delta_"),
        (lambda: acc.group_privacy(epsilon=1, delta=0, group_size=0), "group_size"),
        (
            lambda: acc.amplification_by_subsampling(epsilon=1, delta=0, sampling_rate=0.0),
            "sampling_rate",
        ),
        (
            lambda: acc.amplification_by_subsampling(epsilon=1, delta=0, sampling_rate=1.5),
            "sampling_rate",
        ),
        (
            lambda: acc.amplification_by_subsampling(
                epsilon=1, delta=0, sampling_rate=0.5, sampling="with_replacement"
            ),
            "sampling",
        ),
        (
            lambda: acc.optimal_composition_epsilon(epsilon=1, delta=0, steps=3, delta_total=0.0),
            "delta_total",
        ),
        (
            lambda: acc.optimal_composition_delta(epsilon=1, delta=0, steps=3, epsilon_total=-1.0),
            "epsilon_total",
        ),
    ],
)
def test_validation_names_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_optimal_composition_large_T_runs_in_log_space():
    # 10⁵ steps: the binomial terms overflow in linear space; log space stays finite.
    eps = acc.optimal_composition_epsilon(epsilon=0.01, delta=0.0, steps=100_000, delta_total=1e-6)
    adv, _ = acc.advanced_composition(epsilon=0.01, delta=0.0, steps=100_000, delta_prime=1e-6)
    assert np.isfinite(eps) and eps < adv
