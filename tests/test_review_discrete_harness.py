"""Adversarial review of randomized response and of the exact-profile harness itself.

Randomized response: the law is re-derived from the code path (the library's word → report
map run on the words at every boundary, then counted with integers) and its ε checked with
100-digit decimal arithmetic, independently of ``randomized_response_other_weight``'s own
60-digit computation. The harness (``dpjax.auditing.exact``) is cross-checked against exact
rational arithmetic (``fractions.Fraction``) and probed at zeros, ties and underflow.
"""

import decimal
import importlib
import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpjax.auditing import exact

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


@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_review_randomized_response_law_rederived_from_the_code_path(k):
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
def test_review_out_of_domain_under_jit_is_category_zero_with_the_same_randomness(monkeypatch, k):
    # grey-box check: with the SAME random words, an out-of-domain entry under jit reports
    # exactly what category 0 reports, so its law is a k-RR law and any replace-one pair
    # (in-domain or not) stays within e^ε. Dtypes: float (NaN, ±inf, 2.5, −1, k), int8/int64
    # (−1, k), uint8 (255), bool (k = 2).
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


def test_review_randomized_response_under_vmap_matches_the_batched_call(key):
    # vmap over (key, value) pairs reproduces the per-row call; domain rule applies per row
    vals = jnp.array([0, 4, -3, 2], jnp.int32)
    keys = jax.random.split(key, 4)
    f = lambda k, v: rr.randomized_response(k, v, epsilon=2.0, num_categories=3)  # noqa: E731
    batched = np.asarray(jax.vmap(f)(keys, vals))
    rows = [int(jax.jit(f)(keys[i], vals[i])) for i in range(4)]
    np.testing.assert_array_equal(batched, rows)
    assert set(batched.tolist()) <= {0, 1, 2}


# ---------------------------------------------------------------- the harness


def random_rational_law(rng, n, zeros):
    w = rng.integers(0, 6, n) if zeros else rng.integers(1, 6, n)
    if w.sum() == 0:
        w[0] = 1
    return [Fraction(int(x), int(w.sum())) for x in w]


def test_review_harness_against_exact_rational_arithmetic():
    rng = np.random.default_rng(0)
    checked = 0
    for trial in range(400):
        n = int(rng.integers(1, 7))
        p = random_rational_law(rng, n, zeros=trial % 2 == 0)
        q = random_rational_law(rng, n, zeros=trial % 3 == 0)
        if trial % 5 == 0:
            q = list(p)  # ties: identical laws
        pf, qf = [float(x) for x in p], [float(x) for x in q]
        for base in (1, 2, 3):  # e^ε rational: ε = ln base
            want = sum(max(Fraction(0), a - base * b) for a, b in zip(p, q, strict=True))
            got = exact.hockey_stick_delta(pf, qf, math.log(base))
            assert abs(got - float(want)) <= 1e-12, (p, q, base)
        ratios = [a / b for a, b in zip(p, q, strict=True) if a > 0 and b > 0]
        if any(a > 0 and b == 0 for a, b in zip(p, q, strict=True)):
            assert exact.max_log_ratio(pf, qf) == math.inf
        else:
            assert exact.max_log_ratio(pf, qf) == pytest.approx(math.log(max(ratios)), abs=1e-12)
        assert exact.hockey_stick_delta(pf, qf, math.inf) == pytest.approx(
            float(sum(a for a, b in zip(p, q, strict=True) if b == 0)), abs=1e-15
        )
        checked += 1
    assert checked == 400
    with pytest.raises(ValueError, match="sum to 1"):
        exact.pure_epsilon([0.5, 0.4], [0.5, 0.5])
    with pytest.raises(ValueError, match="non-negative"):
        exact.pure_epsilon([1.5, -0.5], [0.5, 0.5])


def test_review_harness_tiny_but_normal_probabilities():
    # what held: masses down to 1e-300 keep exact ratios and δ
    p, q = [1.0, 1e-300, 0.0], [1.0 - 1e-16, math.e * 1e-300, 0.0]
    assert exact.max_log_ratio(q, p) == pytest.approx(1.0, abs=1e-12)
    assert exact.hockey_stick_delta([1.0 - 1e-300, 1e-300], [1.0, 0.0], 5.0) == 1e-300


# H-1 (fixed): laws were float64 probabilities only: the ideal discrete Laplace law (r = e^-1,
# B/g = 744) has cells of mass e^-744 ≈ 1e-323 (subnormal) and 0; pure_epsilon returned inf
# (B/g ≥ 744) or 1.0296 (claim 1); exponential_mechanism_law on (0, −1490) likewise. The law
# builders now return exact.Law, which carries the log-probabilities.
def test_review_harness_profiles_of_ideal_laws_with_long_tails():
    r = math.exp(-1.0)
    for h in (744.0, 800.0):
        p = exact.discrete_laplace_law(0.0, ratio=r, bound=h, granularity=1.0)
        q = exact.discrete_laplace_law(1.0, ratio=r, bound=h, granularity=1.0)
        assert exact.pure_epsilon(p, q) == pytest.approx(1.0, abs=1e-9), h
    kw = dict(sensitivity=1.0, epsilon=1.0)
    p = exact.exponential_mechanism_law([0.0, -1490.0], **kw)
    q = exact.exponential_mechanism_law([0.0, -1491.0], **kw)
    assert exact.pure_epsilon(p, q) <= 1.0 + 1e-9


def test_review_harness_against_dp_accounting_pld():
    # independent implementation: dp_accounting's PLD from the two pmfs (both directions,
    # symmetric=False); its pessimistic / optimistic estimates bracket the exact δ(ε)
    from dp_accounting.pld import privacy_loss_distribution as pld

    def logs(law):
        return {i: math.log(x) for i, x in enumerate(np.ravel(law)) if x > 0}

    r = math.exp(-0.5)
    pairs = [
        (
            exact.discrete_laplace_law([0.3, -0.2], ratio=r, bound=3.0, granularity=1.0),
            exact.discrete_laplace_law([1.6, -0.9], ratio=r, bound=3.0, granularity=1.0),
        ),
        (
            exact.exponential_mechanism_law([0.0, 1.0, 5.0], sensitivity=1.0, epsilon=2.0),
            exact.exponential_mechanism_law([1.0, 0.0, 4.0], sensitivity=1.0, epsilon=2.0),
        ),
        (
            exact.randomized_response_law(0, epsilon=1.5, num_categories=4),
            exact.randomized_response_law(3, epsilon=1.5, num_categories=4),
        ),
        (np.array([0.5, 0.3, 0.2, 0.0]), np.array([0.2, 0.3, 0.4, 0.1])),
    ]
    for p, q in pairs:
        brackets = [
            pld.from_two_probability_mass_functions(
                logs(p),
                logs(q),
                pessimistic_estimate=pe,
                symmetric=False,
                value_discretization_interval=1e-5,
            )
            for pe in (True, False)
        ]
        for eps in (0.0, 0.25, 0.5, 1.0, 2.0):
            mine = exact.delta_at(p, q, eps)
            hi, lo = (b.get_delta_for_epsilon(eps) for b in brackets)
            assert lo - 1e-12 <= mine <= hi + 1e-12, (eps, lo, mine, hi)


def test_harness_log_laws_keep_tails_and_derived_arrays_drop_them():
    # H-1: a Law carries exact log-probabilities through product_law; any array derived from
    # it (a mixture, a slice) is read as plain probabilities, never with stale logs
    r = math.exp(-1.0)
    p = exact.discrete_laplace_law([0.0, 0.0], ratio=r, bound=800.0, granularity=1.0)
    q = exact.discrete_laplace_law([1.0, 0.0], ratio=r, bound=800.0, granularity=1.0)
    assert isinstance(p, exact.Law) and p.log.shape == p.shape == (1601, 1601)
    assert exact.pure_epsilon(p, q) == pytest.approx(1.0, abs=1e-9)
    assert exact.delta_at(p, q, 1.0) <= 1e-15 and exact.delta_at(p, q, 0.5) > 0.1  # rounding
    mixture = 0.5 * p + 0.5 * q
    assert mixture.log is None
    plain = np.asarray(p)
    assert exact.pure_epsilon(plain, np.asarray(q)) == math.inf  # the old false alarm
    assert exact.pure_epsilon(mixture, p) == math.inf  # no logs: read as probabilities
