import decimal
import importlib
import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpjax import mechanisms as M
from dpjax.auditing import exact
from tests.helpers import assert_frequencies

N = 100_000


def flip_scaled(p_keep, k, factor):
    """k-RR law (true category first) with the flip mass scaled by ``factor``."""
    flip = (1.0 - p_keep) * factor
    return np.array([1.0 - flip] + [flip / (k - 1)] * (k - 1))


def test_keep_probability_matches_closed_form():
    assert M.randomized_response_keep_probability(epsilon=math.log(3.0)) == pytest.approx(0.75)
    eps, k = 1.3, 5
    ref = math.exp(eps) / (math.exp(eps) + k - 1)
    got = M.randomized_response_keep_probability(epsilon=eps, num_categories=k)
    assert got == pytest.approx(ref, rel=1e-14)
    # large epsilon must not overflow
    assert M.randomized_response_keep_probability(epsilon=800.0) == 1.0


def test_epsilon_inverts_keep_probability_and_coin_is_ln3():
    assert M.randomized_response_epsilon(keep_probability=0.75) == pytest.approx(math.log(3.0))
    assert M.COIN_EPSILON == pytest.approx(math.log(3.0))
    p = M.randomized_response_keep_probability(epsilon=0.7, num_categories=4)
    eps = M.randomized_response_epsilon(keep_probability=p, num_categories=4)
    assert eps == pytest.approx(0.7, rel=1e-12)


def test_coin_protocol_reports_truth_with_probability_three_quarters(key):
    truth = jnp.concatenate([jnp.ones(N // 2, bool), jnp.zeros(N // 2, bool)])
    reports = M.coin_randomized_response(key, truth)
    assert reports.dtype == truth.dtype
    agree = int(jnp.sum(reports == truth))
    counts = [agree, N - agree]
    assert_frequencies(
        counts, [0.75, 0.25], wrong_probs=[flip_scaled(0.75, 2, 1.5), flip_scaled(0.75, 2, 1 / 1.5)]
    )
    # Same law as binary RR at eps = ln 3: answers are independent of the truth given agreement.
    yes_given_yes = float(jnp.mean(reports[: N // 2]))
    yes_given_no = float(jnp.mean(reports[N // 2 :]))
    tol = 5 * math.sqrt(0.75 * 0.25 / (N // 2))
    assert yes_given_yes == pytest.approx(0.75, abs=tol)
    assert yes_given_no == pytest.approx(0.25, abs=tol)
    # Local DP ratio = 3 = e^{ln 3}, within sampling error.
    assert yes_given_yes / yes_given_no == pytest.approx(3.0, rel=0.05)


@pytest.mark.parametrize("eps, k", [(1.0, 5), (0.3, 2), (2.5, 3)])
def test_k_ary_distribution(key, eps, k):
    true_category = 1 % k
    truth = jnp.full((N,), true_category, dtype=jnp.int32)
    reports = M.randomized_response(key, truth, epsilon=eps, num_categories=k)
    assert reports.dtype == jnp.int32
    counts = np.bincount(np.asarray(reports), minlength=k)
    assert counts.size == k
    # reorder: true category first
    order = [true_category] + [c for c in range(k) if c != true_category]
    p = math.exp(eps) / (math.exp(eps) + k - 1)
    probs = np.array([p] + [(1 - p) / (k - 1)] * (k - 1))
    assert_frequencies(
        counts[order], probs, wrong_probs=[flip_scaled(p, k, 1.5), flip_scaled(p, k, 1 / 1.5)]
    )


def test_frequency_estimator_is_unbiased(key):
    k, eps = 4, 1.0
    pi = np.array([0.1, 0.2, 0.3, 0.4])
    truth = jnp.asarray(np.repeat(np.arange(k), (pi * N).astype(int)), dtype=jnp.int32)
    reports = M.randomized_response(key, truth, epsilon=eps, num_categories=k)
    est = np.asarray(M.randomized_response_frequencies(reports, epsilon=eps, num_categories=k))
    # independent estimator: (lambda - q) / (p - q), p = e^eps/(e^eps+k-1), q = 1/(e^eps+k-1)
    p = math.exp(eps) / (math.exp(eps) + k - 1)
    q = 1.0 / (math.exp(eps) + k - 1)
    lam = np.bincount(np.asarray(reports), minlength=k) / N
    np.testing.assert_allclose(est, (lam - q) / (p - q), rtol=1e-10)
    assert est.sum() == pytest.approx(1.0, abs=1e-9)
    expected_lam = p * pi + q * (1 - pi)
    sd = np.sqrt(expected_lam * (1 - expected_lam) / N) / (p - q)
    assert np.all(np.abs(est - pi) <= 5 * sd)


def test_binary_estimator_fraction_of_yes(key):
    eps = 0.5
    truth = jnp.asarray(np.r_[np.ones(30_000), np.zeros(70_000)], dtype=jnp.int32)
    reports = M.randomized_response(key, truth, epsilon=eps)
    est = M.randomized_response_frequencies(reports, epsilon=eps)
    p = math.exp(eps) / (1 + math.exp(eps))
    lam = 0.3 * p + 0.7 * (1 - p)
    sd = math.sqrt(lam * (1 - lam) / truth.size) / (2 * p - 1)
    assert float(est[1]) == pytest.approx(0.3, abs=5 * sd)


def test_jit_and_vmap_match_eager(key):
    truth = jnp.arange(12, dtype=jnp.int32) % 3
    eager = M.randomized_response(key, truth, epsilon=1.0, num_categories=3)
    jitted = jax.jit(lambda k, v: M.randomized_response(k, v, epsilon=1.0, num_categories=3))
    np.testing.assert_array_equal(eager, jitted(key, truth))
    keys = jax.random.split(key, 3)
    batched = jax.vmap(lambda k: M.randomized_response(k, truth, epsilon=1.0, num_categories=3))(
        keys
    )
    for i in range(3):
        one = M.randomized_response(keys[i], truth, epsilon=1.0, num_categories=3)
        np.testing.assert_array_equal(batched[i], one)
    coin = jax.jit(M.coin_randomized_response)(key, truth > 0)
    np.testing.assert_array_equal(coin, M.coin_randomized_response(key, truth > 0))


def test_pytree_values(key):
    tree = {"a": jnp.zeros(5, jnp.int32), "b": jnp.ones((2, 2), bool)}
    out = M.randomized_response(key, tree, epsilon=1.0)
    assert out["a"].shape == (5,) and out["b"].dtype == jnp.bool_


@pytest.mark.parametrize(
    "call",
    [
        lambda: M.randomized_response_keep_probability(epsilon=0.0),
        lambda: M.randomized_response_keep_probability(epsilon=1.0, num_categories=1),
        lambda: M.randomized_response_epsilon(keep_probability=0.5),
        lambda: M.randomized_response_epsilon(keep_probability=1.0),
        lambda: M.randomized_response(jax.random.key(0), jnp.zeros(3), epsilon=-1.0),
        lambda: M.randomized_response_frequencies(jnp.zeros((0,), jnp.int32), epsilon=1.0),
        lambda: M.randomized_response_frequencies(jnp.zeros((2, 2), jnp.int32), epsilon=1.0),
    ],
)
def test_bad_inputs_raise(call):
    with pytest.raises(ValueError, match="must be"):
        call()


# ------------------------------------------------------------------------------------------------
# randomized response and of the exact-profile harness itself.
#
# Randomized response: the law is re-derived from the code path (the library's word → report
# map run on the words at every boundary, then counted with integers) and its ε checked with
# 100-digit decimal arithmetic, independently of ``randomized_response_other_weight``'s own
# 60-digit computation. The harness (``dpjax.auditing.exact``) is cross-checked against exact
# rational arithmetic (``fractions.Fraction``) and probed at zeros, ties and underflow.
# ------------------------------------------------------------------------------------------------

rr = importlib.import_module("dpjax.mechanisms.randomized_response")
WORDS = 2**32
EPSILONS = sorted(
    {float(e) for e in np.geomspace(0.01, 40.0, 41)} | {math.log(3.0), 22.18, 22.2, 39.9, 40.0}
)


def exp_decimal(eps):
    with decimal.localcontext() as ctx:
        ctx.prec = 100
        return decimal.Decimal(eps).exp()


def independent_other_weight(eps, k):
    """m = ⌈2^32/(e^ε + k − 1)⌉ at 100 digits (1 where that is below 1)."""
    with decimal.localcontext() as ctx:
        ctx.prec = 100
        exact_m = decimal.Decimal(WORDS) / (exp_decimal(eps) + (k - 1))
        return max(1, int(exact_m.to_integral_value(rounding=decimal.ROUND_CEILING)))


def boundary_words(threshold, k):
    """Words at every place the map w → report can change, plus 4096 random ones."""
    span = 3 * (k - 1)
    ws = set(range(0, span)) | set(range(max(0, threshold - span), threshold + span))
    ws |= set(range(WORDS - span, WORDS))
    ws |= set(np.random.default_rng(k).integers(0, WORDS, 4096, dtype=np.uint64).tolist())
    return np.array(sorted(w for w in ws if 0 <= w < WORDS), dtype=np.uint32)


# the smallest and the largest k by default; k = 3, 4 (the same code path) in the slow run.
@pytest.mark.parametrize("k", [2, 5] + [pytest.param(k, marks=pytest.mark.slow) for k in (3, 4)])
def test_randomized_response_law_rederived_from_the_code_path(k):
    """Catches randomized response's realised law drifting from independently derived weights."""
    for eps in EPSILONS:
        m = rr.randomized_response_other_weight(epsilon=eps, num_categories=k)
        assert m == independent_other_weight(eps, k), (eps, k)
        threshold = (k - 1) * m
        words = boundary_words(threshold, k)
        for c in range(k):
            got = np.asarray(rr._respond(jnp.int32(c), jnp.asarray(words), other_weight=m, k=k))
            w = words.astype(np.int64)
            expected = np.where(w < threshold, (c + 1 + w % (k - 1)) % k, c)
            np.testing.assert_array_equal(got, expected)
        # counting the preimages of that map: every other category has exactly m words
        # (the words below (k − 1)m, split evenly by w mod (k − 1)), the truth the rest
        law = [Fraction(m, WORDS)] * k
        law[0] = Fraction(WORDS - threshold, WORDS)
        np.testing.assert_array_equal(
            exact.randomized_response_law(0, epsilon=eps, num_categories=k),
            np.array([float(x) for x in law]),
        )
        ratio = law[0] / law[1]  # the realised e^{ε_real}
        assert ratio >= 1
        assert decimal.Decimal(ratio.numerator) <= exp_decimal(eps) * ratio.denominator


def with_words(monkeypatch, words):
    monkeypatch.setattr(rr, "_random_words", lambda key, value: jnp.asarray(words, jnp.uint32))


@pytest.mark.parametrize("k", [2, 3, 5])
def test_out_of_domain_under_jit_is_category_zero_with_the_same_randomness(monkeypatch, k):
    # grey-box check: with the SAME random words, an out-of-domain entry under jit reports
    # exactly what category 0 reports, so its law is a k-RR law and any replace-one pair
    # (in-domain or not) stays within e^ε. Dtypes: float (NaN, ±inf, 2.5, −1, k), int8/int64
    # (−1, k), uint8 (255), bool (k = 2).
    """Catches an out-of-domain value under jit changing the randomness used (not category 0)."""
    eps = 1.0
    m = rr.randomized_response_other_weight(epsilon=eps, num_categories=k)
    words = boundary_words((k - 1) * m, k)[:64]
    with_words(monkeypatch, words)
    run = jax.jit(
        lambda v: rr.randomized_response(jax.random.key(0), v, epsilon=eps, num_categories=k)
    )
    zero = np.asarray(run(jnp.zeros(words.size, jnp.int32)))
    cases = [
        (jnp.float32, [np.nan, np.inf, -np.inf, 2.5, -1.0, float(k)]),
        (jnp.float64, [np.nan, 1e300]),
        (jnp.int8, [-1, k]),
        (jnp.int64, [-(2**40), 2**40]),
        (jnp.uint8, [255]),
    ]
    for dtype, bad in cases:
        for b in bad:
            got = np.asarray(run(jnp.full(words.size, b, dtype)))
            np.testing.assert_array_equal(got.astype(np.int64), zero, err_msg=f"{dtype} {b}")
    if k == 2:  # bool: True is category 1, reports as the int path does
        one = np.asarray(run(jnp.ones(words.size, jnp.int32)))
        got = np.asarray(run(jnp.ones(words.size, bool)))
        np.testing.assert_array_equal(got.astype(np.int64), one)


def test_randomized_response_under_vmap_matches_the_batched_call(key):
    # vmap over (key, value) pairs reproduces the per-row call; domain rule applies per row
    """Catches randomized response under vmap differing from the per-row jitted calls."""
    vals = jnp.array([0, 4, -3, 2], jnp.int32)
    keys = jax.random.split(key, 4)
    f = lambda k, v: rr.randomized_response(k, v, epsilon=2.0, num_categories=3)  # noqa: E731
    batched = np.asarray(jax.vmap(f)(keys, vals))
    rows = [int(jax.jit(f)(keys[i], vals[i])) for i in range(4)]
    np.testing.assert_array_equal(batched, rows)
    assert set(batched.tolist()) <= {0, 1, 2}
