"""Sensitivity of matrix-factorization strategies against brute force over patterns."""

from __future__ import annotations

import importlib
import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from dpjax.dp_sgd import matrix_factorization as mf

sensitivity_module = importlib.import_module("dpjax.dp_sgd.matrix_factorization.sensitivity")


def _patterns(n, b, k):
    for size in range(1, k + 1):
        for pattern in itertools.combinations(range(n), size):
            if all(q - p >= b for p, q in itertools.pairwise(pattern)):
                yield pattern


def _brute_force(c, b, k):
    """max over patterns and over signs g_t = ±1 of ‖Σ_t C[:, t] g_t‖ (≤ the sensitivity;
    equal to it when the Gram is non-negative)."""
    best = 0.0
    for pattern in _patterns(c.shape[1], b, k):
        columns = c[:, pattern]
        for signs in itertools.product((1.0, -1.0), repeat=len(pattern) - 1):
            best = max(best, float(np.linalg.norm(columns @ np.array((1.0, *signs)))))
    return best


def _strategies(n):
    rng = np.random.default_rng(7)
    return {
        "sqrt": mf.toeplitz_matrix(mf.sqrt_prefix_sum_coefficients(n)),
        "tree": mf.tree_aggregation(n),
        "banded_sqrt": mf.banded_sqrt_strategy(n, 3),
        "optimised": mf.banded_strategy(n, 3, steps=20),
        "random_nonnegative": np.tril(rng.random((n, n))),
    }


@pytest.mark.parametrize(("n", "b", "k"), [(8, 2, 3), (9, 3, 2), (10, 1, 3), (9, 4, 3)])
def test_sensitivity_equals_brute_force_for_non_negative_gram(n, b, k):
    for name, c in _strategies(n).items():
        assert np.all(c.T @ c >= -1e-15), name
        bounds = mf.sensitivity_bounds(c, min_separation=b, max_participations=k)
        truth = _brute_force(c, b, k)
        assert bounds.exact, name
        assert truth <= bounds.upper <= truth * (1 + 1e-12), name
        assert bounds.lower <= truth * (1 + 1e-12), name


@pytest.mark.parametrize(("n", "b", "k"), [(8, 2, 3), (10, 3, 3)])
def test_relaxation_path_is_an_upper_bound_and_exact_when_it_says_so(n, b, k, monkeypatch):
    monkeypatch.setattr(sensitivity_module, "_ENUMERATION_LIMIT", 0)  # force the relaxation
    for name, c in _strategies(n).items():
        bounds = mf.sensitivity_bounds(c, min_separation=b, max_participations=k)
        truth = _brute_force(c, b, k)
        assert bounds.upper >= truth, name
        assert bounds.lower <= truth * (1 + 1e-12), name
        if bounds.exact:
            assert bounds.upper <= truth * (1 + 1e-9), name
        if name == "tree":  # the relaxation alone is loose here; branch and bound closes it
            assert bounds.exact


def test_branch_and_bound_certifies_the_tree_where_the_relaxation_is_loose():
    c = mf.tree_aggregation(40)
    bounds = mf.sensitivity_bounds(c, min_separation=4, max_participations=6)
    assert bounds.exact and bounds.upper <= bounds.lower * (1 + 1e-12)


def test_opposite_columns_count_fully_not_cancel():
    # Columns e1 and −e1: the signed sum over the pattern is 0, but an example whose two
    # gradients have opposite signs moves the output by 2.
    c = np.array([[1.0, -1.0], [0.0, 0.0]])
    assert mf.sensitivity(c, min_separation=1, max_participations=2) >= 2.0
    assert _brute_force(c, 1, 2) == pytest.approx(2.0)


def test_negative_gram_gives_a_certified_upper_bound():
    rng = np.random.default_rng(3)
    c = np.tril(rng.standard_normal((9, 9)))
    bounds = mf.sensitivity_bounds(c, min_separation=2, max_participations=3)
    assert bounds.upper >= _brute_force(c, 2, 3)
    assert not bounds.exact


def test_single_participation_is_the_largest_column_norm():
    rng = np.random.default_rng(1)
    c = np.tril(rng.standard_normal((12, 12)))
    expected = np.max(np.linalg.norm(c, axis=0))
    assert mf.sensitivity(c) == pytest.approx(expected, rel=1e-14)
    assert mf.sensitivity(c) >= expected
    assert mf.sensitivity(c, min_separation=5) == mf.sensitivity(c)


def test_dp_sgd_sensitivity_counts_the_participations_that_fit():
    assert mf.sensitivity(np.eye(5), min_separation=3, max_participations=10) == pytest.approx(
        math.sqrt(2), rel=1e-14
    )
    assert mf.sensitivity(np.eye(8), min_separation=1, max_participations=3) == pytest.approx(
        math.sqrt(3), rel=1e-14
    )


def test_upper_bound_is_rounded_up_past_the_exact_rational_value():
    c = np.tril(np.full((6, 6), 0.1)) + np.diag(np.full(6, 0.3))
    exact_gram = [
        [sum(Fraction(c[r, i]) * Fraction(c[r, j]) for r in range(6)) for j in range(6)]
        for i in range(6)
    ]
    truth2 = max(sum(exact_gram[i][j] for i in p for j in p) for p in _patterns(6, 2, 3))
    upper = mf.sensitivity(c, min_separation=2, max_participations=3)
    assert Fraction(upper) ** 2 >= truth2


def test_large_toeplitz_sensitivity_is_certified_exact_and_fast():
    n, b, k = 300, 10, 30
    c = mf.toeplitz_matrix(mf.sqrt_prefix_sum_coefficients(n))
    bounds = mf.sensitivity_bounds(c, min_separation=b, max_participations=k)
    cyclic = np.arange(0, n, b)[:k]
    assert bounds.exact
    assert bounds.upper == pytest.approx(math.sqrt(np.sum((c.T @ c)[np.ix_(cyclic, cyclic)])))


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        (dict(strategy=np.ones(3)), "strategy"),
        (dict(strategy=np.array([[1.0, np.inf]])), "strategy"),
        (dict(strategy=np.eye(3), min_separation=0), "min_separation"),
        (dict(strategy=np.eye(3), max_participations=0), "max_participations"),
        (dict(strategy=np.eye(3), max_participations=1.5), "max_participations"),
    ],
)
def test_bad_inputs_raise_value_error_naming_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name} must be"):
        mf.sensitivity(**kwargs)
