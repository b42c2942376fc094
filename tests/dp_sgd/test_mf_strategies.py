"""Matrix-factorization strategies: exact identities, closed forms, optimisation, bad inputs."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from dpjax.dp_sgd import matrix_factorization as mf


def _prefix(n):
    return np.tril(np.ones((n, n)))


def test_sqrt_coefficients_are_central_binomials_over_four_to_the_k():
    c = mf.sqrt_prefix_sum_coefficients(60)
    exact = [Fraction(math.comb(2 * k, k), 4**k) for k in range(60)]
    np.testing.assert_allclose(c, [float(e) for e in exact], rtol=1e-14, atol=0)


def test_sqrt_strategy_squares_to_the_prefix_sum_matrix():
    n = 512
    c = mf.toeplitz_matrix(mf.sqrt_prefix_sum_coefficients(n))
    assert np.max(np.abs(c @ c - _prefix(n))) <= 1e-12


def test_toeplitz_matrix_places_coefficients_on_diagonals_and_bands_the_rest():
    c = mf.toeplitz_matrix([3.0, 2.0, 1.0], 5)
    for t in range(5):
        for s in range(5):
            expected = [3.0, 2.0, 1.0][t - s] if 0 <= t - s < 3 else 0.0
            assert c[t, s] == expected
    np.testing.assert_array_equal(mf.toeplitz_matrix([1.0, 2.0, 3.0], 2), [[1, 0], [2, 1]])


def test_banded_sqrt_is_the_normalised_truncated_root():
    n = 20
    full = mf.banded_sqrt_strategy(n, n)
    c = mf.sqrt_prefix_sum_coefficients(n)
    np.testing.assert_allclose(full * np.linalg.norm(c), mf.toeplitz_matrix(c), rtol=1e-14)
    np.testing.assert_array_equal(mf.banded_sqrt_strategy(n, 1), np.eye(n))
    banded = mf.banded_sqrt_strategy(n, 4)
    assert np.all(np.tril(banded, -4) == 0)
    assert mf.sensitivity(banded) == pytest.approx(1.0, rel=1e-12)


@pytest.mark.parametrize("n", [1, 2, 17, 100])
def test_sqrt_closed_form_errors_match_the_matrix_computation(n):
    closed = mf.sqrt_prefix_sum_errors(n)
    dense = mf.prefix_sum_errors(mf.toeplitz_matrix(mf.sqrt_prefix_sum_coefficients(n)))
    assert closed.rmse == pytest.approx(dense.rmse, rel=1e-10)
    assert closed.max_error == pytest.approx(dense.max_error, rel=1e-10)
    if n >= 2:
        assert closed.max_error <= 1 + (1 + math.log(n - 1)) / math.pi


@pytest.mark.parametrize(("n", "b", "k"), [(10, 1, 1), (12, 3, 4), (9, 4, 2)])
def test_dp_sgd_errors_have_the_closed_form(n, b, k):
    errors = mf.prefix_sum_errors(np.eye(n), min_separation=b, max_participations=k)
    participations = min(k, -(-n // b))
    assert errors.rmse == pytest.approx(math.sqrt(participations * (n + 1) / 2), rel=1e-12)
    assert errors.max_error == pytest.approx(math.sqrt(participations * n), rel=1e-12)


def test_tree_with_honaker_on_two_leaves_has_the_hand_computed_error():
    # T = [[1,0],[0,1],[1,1]]: (TᵀT)⁻¹ = [[2,-1],[-1,2]]/3, both prefix variances 2/3, sens² 2.
    errors = mf.prefix_sum_errors(mf.tree_aggregation(2))
    assert errors.rmse**2 == pytest.approx(4 / 3, rel=1e-12)
    assert errors.max_error**2 == pytest.approx(4 / 3, rel=1e-12)


@pytest.mark.parametrize("n", [13, 16])
def test_tree_square_factor_is_the_least_squares_tree_estimator(n):
    nodes = mf.tree_aggregation_nodes(n)
    assert np.all(np.sum(nodes, axis=0) == nodes[:, 0].sum())  # every leaf in h + 1 nodes
    height = int(nodes[:, 0].sum()) - 1
    honaker = _prefix(n) @ np.linalg.pinv(nodes)  # least squares from all noisy nodes
    variances = np.sum(honaker**2, axis=1)
    c = mf.tree_aggregation(n)
    assert np.allclose(c, np.tril(c))
    errors = mf.prefix_sum_errors(c)
    assert errors.max_error**2 == pytest.approx((height + 1) * variances.max(), rel=1e-9)
    assert errors.rmse**2 == pytest.approx((height + 1) * variances.mean(), rel=1e-9)
    # The plain estimator sums the popcount(t + 1) dyadic nodes of [0, t]: Honaker is no worse.
    plain = np.array([bin(t + 1).count("1") for t in range(n)])
    assert np.all(variances <= plain + 1e-12) and np.any(variances < plain - 0.1)


def test_optimised_banded_beats_banded_sqrt_and_dp_sgd_under_its_pattern():
    n, bands, b, k = 64, 4, 4, 16
    pattern = dict(min_separation=b, max_participations=k)
    optimised = mf.banded_strategy(n, bands, **pattern)
    assert np.all(np.tril(optimised, -bands) == 0) and np.allclose(optimised, np.tril(optimised))
    assert mf.sensitivity(optimised, **pattern) == pytest.approx(1.0, rel=1e-9)
    ours = mf.prefix_sum_errors(optimised, **pattern).rmse
    assert ours <= mf.prefix_sum_errors(mf.banded_sqrt_strategy(n, bands), **pattern).rmse
    assert ours < 0.9 * mf.prefix_sum_errors(np.eye(n), **pattern).rmse


def test_optimised_banded_with_more_bands_than_separation_is_normalised_and_better():
    n, bands, b, k = 32, 8, 4, 8
    pattern = dict(min_separation=b, max_participations=k)
    optimised = mf.banded_strategy(n, bands, steps=30, **pattern)
    assert mf.sensitivity(optimised, **pattern) <= 1.0 + 1e-9
    ours = mf.prefix_sum_errors(optimised, **pattern).rmse
    # Strictly better: a surrogate on the SIGNED Gram lets the columns cancel, ends worse and
    # falls back to the banded root.
    assert ours < 0.99 * mf.prefix_sum_errors(mf.banded_sqrt_strategy(n, bands), **pattern).rmse
    assert ours < mf.prefix_sum_errors(np.eye(n), **pattern).rmse


def test_max_objective_lowers_the_max_error():
    n, bands = 48, 6
    by_max = mf.prefix_sum_errors(mf.banded_strategy(n, bands, objective="max", steps=30))
    by_mean = mf.prefix_sum_errors(mf.banded_strategy(n, bands, steps=30))
    start = mf.prefix_sum_errors(mf.banded_sqrt_strategy(n, bands))
    assert by_max.max_error <= start.max_error
    assert by_max.max_error <= by_mean.max_error * (1 + 1e-6)


def test_blt_matrix_is_the_toeplitz_matrix_of_its_coefficients():
    blt = mf.BLT(buf_decay=np.array([0.5, 0.9]), output_scale=np.array([0.3, -0.1]))
    c = blt.coefficients(7)
    expected = [1.0] + [0.3 * 0.5 ** (t - 1) - 0.1 * 0.9 ** (t - 1) for t in range(1, 7)]
    np.testing.assert_allclose(c, expected, rtol=1e-15, atol=1e-16)
    np.testing.assert_array_equal(blt.matrix(7), mf.toeplitz_matrix(c, 7))


def test_toeplitz_errors_match_the_dense_computation():
    c = mf.blt_strategy(40, 2, steps=20).coefficients(40)
    mean, worst = mf.toeplitz_errors(c)
    b_matrix = _prefix(40) @ np.linalg.inv(mf.toeplitz_matrix(c))
    assert mean == pytest.approx(np.sum(b_matrix**2) / 40, rel=1e-10)
    assert worst == pytest.approx(np.max(np.sum(b_matrix**2, axis=1)), rel=1e-10)


def test_blt_with_two_buffers_is_as_good_as_the_full_square_root():
    n = 128
    blt = mf.blt_strategy(n, 2, steps=50)
    assert np.all((blt.buf_decay > 0) & (blt.buf_decay < 1))
    ours = mf.prefix_sum_errors(blt, n=n).rmse
    assert ours <= 1.01 * mf.sqrt_prefix_sum_errors(n).rmse
    assert ours < 0.5 * mf.prefix_sum_errors(np.eye(n)).rmse


def test_blt_optimised_for_multiple_participations_beats_the_square_root_there():
    pattern = dict(min_separation=8, max_participations=8)
    blt = mf.blt_strategy(64, 2, steps=50, **pattern)
    ours = mf.prefix_sum_errors(blt, n=64, **pattern)
    root = mf.prefix_sum_errors(mf.toeplitz_matrix(mf.sqrt_prefix_sum_coefficients(64)), **pattern)
    assert ours.exact
    assert ours.rmse < 0.9 * root.rmse  # signed-Gram surrogate: 1.3× worse than the root


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: mf.sqrt_prefix_sum_coefficients(0), "n"),
        (lambda: mf.toeplitz_matrix([1.0, np.nan]), "coefficients"),
        (lambda: mf.toeplitz_matrix(np.ones((2, 2))), "coefficients"),
        (lambda: mf.banded_sqrt_strategy(4, 5), "bands"),
        (lambda: mf.banded_strategy(4, 0), "bands"),
        (lambda: mf.banded_strategy(4, 2, objective="median"), "objective"),
        (lambda: mf.banded_strategy(4, 2, max_participations=0), "max_participations"),
        (lambda: mf.tree_aggregation(-1), "n"),
        (lambda: mf.blt_strategy(1, 1), "n"),
        (lambda: mf.blt_strategy(8, 0), "buffers"),
        (lambda: mf.prefix_sum_errors(np.ones((2, 2))), "strategy"),
        (lambda: mf.prefix_sum_errors(np.zeros((2, 2))), "strategy"),
        (lambda: mf.prefix_sum_errors(mf.BLT(np.array([0.5]), np.array([1.0]))), "n"),
        (lambda: mf.BLT(np.array([1.5]), np.array([1.0])).matrix(4), "buf_decay"),
        (lambda: mf.BLT(np.array([0.5]), np.array([1.0, 2.0])).coefficients(4), "output_scale"),
    ],
)
def test_bad_inputs_raise_value_error_naming_the_argument(call, name):
    with pytest.raises(ValueError, match=rf"^{name} must be"):
        call()
