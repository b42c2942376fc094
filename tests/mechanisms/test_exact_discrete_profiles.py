"""Exact privacy profiles of the discrete mechanisms over adversarial neighbour pairs.

Each mechanism's output law is finite and computable (dpjax.auditing.exact, written from the
documented algorithm); sampling tests tie that law to the code as it runs, and the profile
tests check ε_true ≤ ε_claimed(1 + 1e-9) over extreme, tied, non-finite and out-of-range pairs
(issue 13, findings 2–4).
"""

import importlib
import itertools
import math
import os
import subprocess
import sys
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, stats

from dpjax import mechanisms as M
from dpjax.auditing import exact
from dpjax.mechanisms import discrete
from tests.helpers import assert_frequencies

WORDS = 2**32
# the module (the package attribute of the same name is the function)
rr = importlib.import_module("dpjax.mechanisms.randomized_response")


def pooled(counts, probs, *, wrong=(), min_expected=5.0):
    """Pearson chi-square after pooling the cells with expected count < min_expected."""
    counts = np.asarray(counts, dtype=np.float64).ravel()
    probs = np.asarray(probs, dtype=np.float64).ravel()
    small = probs * counts.sum() < min_expected

    def pool(x):
        x = np.asarray(x, dtype=np.float64).ravel()
        return np.append(x[~small], x[small].sum()) if small.any() else x

    assert_frequencies(pool(counts), pool(probs), wrong_probs=[pool(w) for w in wrong])


# ----------------------------------------------------------------------------- profiles


def test_profile_functions_on_hand_computed_laws():
    p, q = [0.75, 0.25], [0.25, 0.75]
    assert exact.max_log_ratio(p, q) == pytest.approx(math.log(3.0), rel=1e-15)
    assert exact.hockey_stick_delta(p, q, math.log(2.0)) == pytest.approx(0.25, rel=1e-14)
    assert exact.hockey_stick_delta(p, q, math.log(3.0)) == pytest.approx(0.0, abs=1e-16)
    assert exact.delta_at(p, q, 0.0) == pytest.approx(0.5)  # total variation
    # asymmetric pair: directions differ, pure eps is the larger
    a, b = [0.5, 0.5, 0.0], [0.25, 0.25, 0.5]
    assert exact.max_log_ratio(a, b) == pytest.approx(math.log(2.0))
    assert exact.max_log_ratio(b, a) == math.inf
    assert exact.pure_epsilon(a, b) == math.inf
    assert exact.hockey_stick_delta(b, a, math.inf) == pytest.approx(0.5)
    assert exact.delta_at(a, b, math.log(2.0)) == pytest.approx(0.5)
    exact.assert_within_claim(a, b, epsilon=math.log(2.0), delta=0.5)
    with pytest.raises(AssertionError, match="exceeds"):
        exact.assert_within_claim(a, b, epsilon=math.log(2.0), delta=0.49)
    with pytest.raises(AssertionError, match="exceeds"):
        exact.assert_within_claim(p, q, epsilon=math.log(3.0) * (1 - 1e-8))
    assert exact.product_law([0.5, 0.5], [0.25, 0.75]).shape == (2, 2)
    with pytest.raises(ValueError, match="sum to 1"):
        exact.pure_epsilon([0.5, 0.4], [0.5, 0.5])


def test_law_from_cdf_bins_a_continuous_release():
    # Laplace(b = 1) releases of f = 0 and f = 1 (eps = 1): binned profiles are lower bounds
    # that reach the true eps; a half-scale (eps = 2) release is caught.
    edges = np.linspace(-8.0, 9.0, 1701)  # cells >> CDF rounding (see law_from_cdf)
    p = exact.law_from_cdf(stats.laplace(0.0, 1.0).cdf, edges)
    q = exact.law_from_cdf(stats.laplace(1.0, 1.0).cdf, edges)
    assert p.sum() == pytest.approx(1.0, abs=1e-12)
    exact.assert_within_claim(p, q, epsilon=1.0)
    assert exact.pure_epsilon(p, q) > 0.999
    half = exact.law_from_cdf(stats.laplace(1.0, 0.5).cdf, edges)
    with pytest.raises(AssertionError):
        exact.assert_within_claim(
            exact.law_from_cdf(stats.laplace(0.0, 0.5).cdf, edges), half, epsilon=1.0
        )


def test_uniform_threshold_realisation_matches_jax_uniform(key):
    # JAX's float32 uniform takes 2^23 equally likely values j 2^-23: P[U < t] = ceil(t 2^23)/2^23
    u = np.asarray(jax.random.uniform(key, (2_000_000,), jnp.float32))
    assert np.all(u * 2**23 == np.round(u * 2**23))
    t = 0.3
    got = exact.uniform_below_probability(t, np.float32)
    assert got == math.ceil(t * 2**23) / 2**23
    assert abs(np.mean(u < np.float32(t)) - got) < 5 * math.sqrt(got * (1 - got) / u.size)


# ----------------------------------------------------------------------------- randomized response

RR_EPSILONS = [1e-3, 0.1, 1.0, math.log(3.0), 5.0, 15.0, 17.0, 30.0, 800.0]


@pytest.mark.parametrize("k", [2, 3, 5, 7, 256])
def test_randomized_response_exact_epsilon_within_claim_and_tight(k):
    for eps in RR_EPSILONS:
        laws = [exact.randomized_response_law(c, epsilon=eps, num_categories=k) for c in range(k)]
        for i, j in itertools.combinations(range(min(k, 4)), 2):
            exact.assert_within_claim(laws[i], laws[j], epsilon=eps)
            # never infinite (float uniforms gave P[lie] = 0 at eps = 17 in float32)
            assert np.all(laws[i] > 0)
        # tight up to the 32-bit resolution: m < 2^32/(e^eps + k - 1) + 1
        eps_real = exact.pure_epsilon(laws[0], laws[1])
        if eps <= 20.0:
            slack = (math.exp(eps) + k - 1) ** 2 / (WORDS * math.exp(eps))
            assert eps_real >= eps + math.log1p(-slack) - 1e-12, (eps, k, eps_real)
        # the law matches the documented integer rule (computed here independently)
        if eps < 30:
            m_ref = math.ceil(WORDS / (math.exp(eps) + k - 1))
            assert laws[0][1] * WORDS == pytest.approx(m_ref, abs=1.0)


def test_old_float_threshold_scheme_is_flagged_by_the_harness():
    # main compared a float32 uniform with p: the realised law had eps = inf at eps = 17
    # and 15.249 at eps = 15 (issue 13, finding 3); the harness computes exactly that.
    def float32_rr_law(eps, truth):
        p = np.float32(M.randomized_response_keep_probability(epsilon=eps))
        keep = exact.uniform_below_probability(float(p), np.float32)
        law = np.full(2, 1.0 - keep)
        law[truth] = keep
        return law

    assert exact.pure_epsilon(float32_rr_law(17.0, 0), float32_rr_law(17.0, 1)) == math.inf
    eps15 = exact.pure_epsilon(float32_rr_law(15.0, 0), float32_rr_law(15.0, 1))
    assert eps15 == pytest.approx(15.249, abs=1e-3)


@pytest.mark.parametrize("eps, k", [(1.0, 5), (17.0, 2), (0.3, 3), (800.0, 4)])
def test_randomized_response_word_map_realises_the_law(eps, k):
    # The report is a function of one uint32 word; check the map on every word of windows
    # at both ends of the lie region and of the truth region (the law counts these words).
    m = rr.randomized_response_other_weight(epsilon=eps, num_categories=k)
    lie_words = (k - 1) * m
    windows = [
        np.arange(0, min(lie_words, 3 * (k - 1))),
        np.arange(lie_words - (k - 1), lie_words),
        np.arange(lie_words, lie_words + 5),
        np.arange(WORDS - 5, WORDS),
    ]
    truth = 1 % k
    for w in windows:
        words = jnp.asarray(w, jnp.uint32)
        out = np.asarray(
            rr._respond(jnp.full(w.shape, truth, jnp.int32), words, other_weight=m, k=k)
        )
        lies = w < lie_words
        assert np.all(out[~lies] == truth)
        assert np.all(out[lies] != truth) and np.all((0 <= out) & (out < k))
        if lies.sum() and lies.sum() % (k - 1) == 0:
            # a run of k - 1 consecutive lie words hits each other category equally often
            counts = np.bincount(out[lies], minlength=k)
            assert counts[truth] == 0
            assert np.all(np.delete(counts, truth) == lies.sum() // (k - 1))


@pytest.mark.parametrize("eps", [15.0, 17.0, 30.0])
def test_randomized_response_extreme_words_reach_a_lie(monkeypatch, eps):
    # Support probe: the most lie-favouring randomness must produce a lie at every eps.
    truth = jnp.zeros(4, jnp.int32)
    monkeypatch.setattr(rr, "_random_words", lambda key, v: jnp.zeros(jnp.shape(v), jnp.uint32))
    assert np.all(np.asarray(M.randomized_response(jax.random.key(0), truth, epsilon=eps)) == 1)
    monkeypatch.setattr(
        rr, "_random_words", lambda key, v: jnp.full(jnp.shape(v), WORDS - 1, jnp.uint32)
    )
    assert np.all(np.asarray(M.randomized_response(jax.random.key(0), truth, epsilon=eps)) == 0)


@pytest.mark.parametrize(
    "bad", [jnp.array([0, 5]), jnp.array([-1, 0]), jnp.array([0.0, 1.5]), jnp.array([jnp.nan])]
)
def test_randomized_response_refuses_out_of_domain_concrete_input(key, bad):
    with pytest.raises(ValueError, match="value must be integers in"):
        M.randomized_response(key, bad, epsilon=1.0)
    with pytest.raises(ValueError, match="value must be integers in"):
        M.coin_randomized_response(key, bad)


def test_randomized_response_out_of_domain_under_jit_reports_the_public_category(key):
    # Under jit an out-of-range record is randomised as category 0: its reports follow the
    # exact law of category 0 (never the raw value 5), so the pair (5, 1) is within the claim.
    n, eps = 20_000, math.log(3.0)
    values = {"big": jnp.full(n, 5, jnp.int32), "nan": jnp.full(n, jnp.nan), "neg": -jnp.ones(n)}
    run = jax.jit(lambda k, v: M.randomized_response(k, v, epsilon=eps))
    coin = jax.jit(M.coin_randomized_response)
    reports = {}
    for i, (name, v) in enumerate(values.items()):
        for fn_name, fn in (("rr", run), ("coin", coin)):
            out = np.asarray(fn(jax.random.fold_in(key, i), v))
            assert np.all((out == 0) | (out == 1)), (name, fn_name, np.unique(out))
            reports[name, fn_name] = out.astype(np.int64)
    law0 = exact.randomized_response_law(0, epsilon=eps)
    law1 = exact.randomized_response_law(1, epsilon=eps)
    for (_, fn_name), out in reports.items():
        law = law0 if fn_name == "rr" else exact.coin_randomized_response_law(0)
        assert_frequencies(np.bincount(out, minlength=2), law, wrong_probs=[law1])
    exact.assert_within_claim(law0, law1, epsilon=eps)


def test_randomized_response_dtype_domain_is_checked(key):
    with pytest.raises(ValueError, match="value must be integers"):
        M.randomized_response(key, jnp.array([True, False]), epsilon=1.0, num_categories=3)
    with pytest.raises(ValueError, match="value must be an integer dtype"):
        M.randomized_response(key, jnp.zeros(3, jnp.uint8), epsilon=1.0, num_categories=300)
    with pytest.raises(ValueError, match="epsilon must be large enough"):
        M.randomized_response(key, jnp.zeros(3, jnp.int32), epsilon=1e-12, num_categories=3)


# ----------------------------------------------------------------------------- discrete Laplace


def dl_ratio(*, sensitivity, epsilon, granularity, d):
    """The documented calibration r = exp(-eps g / (g (floor(D/g) + d))), computed here."""
    return math.exp(-epsilon / (math.floor(sensitivity / granularity) + d))


def test_discrete_laplace_vector_pair_of_finding_4():
    # g = 1, Delta_1 = 0.4: f(D) = (0.4, 0.4) and f(D') = (0.6, 0.6) round to (0, 0), (1, 1).
    kw = dict(bound=4.0, granularity=1.0)
    x, x2 = [0.4, 0.4], [0.6, 0.6]
    old_r = math.exp(-1.0 / (math.floor(0.4) + 1))  # one extra grid step for the whole vector
    eps_old = exact.pure_epsilon(
        exact.discrete_laplace_law(x, ratio=old_r, **kw),
        exact.discrete_laplace_law(x2, ratio=old_r, **kw),
    )
    assert eps_old == pytest.approx(2.0, rel=1e-12)  # the bug, computed exactly
    r = dl_ratio(sensitivity=0.4, epsilon=1.0, granularity=1.0, d=2)
    assert discrete.discrete_laplace_ratio(
        sensitivity=0.4, epsilon=1.0, granularity=1.0, num_coordinates=2
    ) == pytest.approx(r, rel=1e-15)
    p = exact.discrete_laplace_law(x, ratio=r, **kw)
    q = exact.discrete_laplace_law(x2, ratio=r, **kw)
    exact.assert_within_claim(p, q, epsilon=1.0)
    assert exact.pure_epsilon(p, q) == pytest.approx(1.0, rel=1e-12)  # tight


def test_discrete_laplace_vector_law_matches_sampling(key):
    # The code's joint law on a 2-vector is the exact law with the d = 2 calibration, and is
    # distinguishable from the old d-independent one (which main used).
    n, kw = 40_000, dict(sensitivity=0.4, epsilon=1.0, bound=3.0, granularity=1.0)
    x = jnp.array([0.4, -1.6])
    keys = jax.random.split(key, n)
    y = jax.jit(jax.vmap(lambda k: M.discrete_laplace(k, x, **kw)))(keys)
    k_y = np.asarray(y).astype(np.int64) + 3
    counts = np.bincount(k_y[:, 0] * 7 + k_y[:, 1], minlength=49)
    lkw = dict(bound=3.0, granularity=1.0)
    law = exact.discrete_laplace_law(x, ratio=dl_ratio(**kw_ratio(kw), d=2), **lkw)
    old = exact.discrete_laplace_law(x, ratio=math.exp(-1.0), **lkw)
    pooled(counts, law, wrong=[old])


def kw_ratio(kw):
    return dict(sensitivity=kw["sensitivity"], epsilon=kw["epsilon"], granularity=kw["granularity"])


def _clamped(v, bound):
    v = np.where(np.isnan(v), 0.0, v)
    return np.clip(v, -bound, bound)


# d = 3 (8³ starts × 5 directions × 3 scales: ~10x the pairs of d = 2, no other code path:
# the law is a product over coordinates and d = 2 already splits the ℓ1 budget) is slow
@pytest.mark.parametrize("d", [1, 2, pytest.param(3, marks=pytest.mark.slow)])
@pytest.mark.parametrize("g, sens", [(1.0, 0.4), (1.0, 1.0), (0.5, 1.5), (0.5, 0.25)])
def test_discrete_laplace_adversarial_pairs_within_claim(d, g, sens):
    eps, bound = 1.0, 2.0
    r = dl_ratio(sensitivity=sens, epsilon=eps, granularity=g, d=d)
    eta = 2.0**-20
    # per-coordinate starting points: just below / at / above rounding ties, the clamp,
    # beyond it, and non-finite records (mapped by the documented rule).
    starts = [0.5 * g - eta, 0.5 * g, 1.5 * g, -0.5 * g, bound - eta, bound + 3.0, np.nan, np.inf]
    directions = [np.eye(d)[i] for i in range(d)] + [np.ones(d) / d, -np.ones(d) / d]
    laws = {}

    def law(v):
        key = tuple(np.round(_clamped(np.asarray(v), bound) / g * 2**24))
        if key not in laws:
            laws[key] = exact.discrete_laplace_law(v, ratio=r, bound=bound, granularity=g)
        return laws[key]

    worst = 0.0
    for combo in itertools.product(starts, repeat=d):
        x = np.array(combo, dtype=np.float64)
        for direction in directions:
            for scale in (sens, sens - eta, sens / 2):
                x2 = _clamped(x, bound) + scale * direction  # ‖φ(x) − x2‖₁ ≤ Δ₁
                assert np.abs(_clamped(x, bound) - x2).sum() <= sens * (1 + 1e-12)
                p, q = law(x), law(x2)
                exact.assert_within_claim(p, q, epsilon=eps)
                worst = max(worst, exact.pure_epsilon(p, q))
    assert worst > 0.5 * eps  # the search reached hard pairs


def test_discrete_laplace_high_dimension_grid_sensitivity():
    # g = 2^-10, Delta_1 = 1, d = 1000 (finding 4): each coordinate of a tie-straddling pair
    # moves one grid step. The product law's max log-ratio is the sum of the coordinates'.
    g, sens, d, eps, bound = 2.0**-10, 1.0, 1000, 1.0, 2.0
    assert discrete.grid_sensitivity(sens, g, d) == g * (1024 + 1000)
    eta = 2.0**-12 * g
    x_tie, x2_tie = 0.5 * g - eta, 0.5 * g + eta  # 999 coordinates round 0 -> 1
    x0 = 0.5 * g - eta
    x2_0 = x0 + (sens - (d - 1) * 2 * eta)  # the remaining l1 budget on coordinate 0
    for r, claim_ok in (
        (dl_ratio(sensitivity=sens, epsilon=eps, granularity=g, d=d), True),
        (math.exp(-eps * g / (g * 1025)), False),
    ):
        kw = dict(ratio=r, bound=bound, granularity=g)
        tie = exact.max_log_ratio(
            exact.discrete_laplace_law(x_tie, **kw), exact.discrete_laplace_law(x2_tie, **kw)
        )
        first = exact.max_log_ratio(
            exact.discrete_laplace_law(x0, **kw), exact.discrete_laplace_law(x2_0, **kw)
        )
        eps_true = first + (d - 1) * tie
        if claim_ok:
            assert eps_true <= eps * (1 + 1e-9)
        else:
            assert eps_true == pytest.approx(2023 / 1025, rel=1e-9)  # 1.97x the claim


def test_discrete_laplace_non_finite_rule(key):
    kw = dict(sensitivity=1.0, epsilon=1.0, bound=4.0, granularity=2.0**-4)
    for bad in (jnp.array([jnp.nan, 0.0]), jnp.array([jnp.inf, 0.0]), jnp.float64(-jnp.inf)):
        with pytest.raises(ValueError, match="value must be finite"):
            M.discrete_laplace(key, bad, **kw)
    # under jit, same key: NaN -> 0 and +-inf -> +-B before the rounding
    run = jax.jit(lambda k, v: M.discrete_laplace(k, v, **kw))
    got = run(key, jnp.array([jnp.nan, jnp.inf, -jnp.inf, 1.0]))
    ref = run(key, jnp.array([0.0, 4.0, -4.0, 1.0]))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(ref))
    assert np.all(np.isfinite(np.asarray(got)))


# ----------------------------------------------------------------------------- selection


def test_report_noisy_max_law_matches_numerical_integration():
    for scores, sens, eps in (([0.0, 1.0, 2.5, 2.4], 1.0, 1.0), ([5.0, 5.0, 3.0], 0.5, 0.3)):
        s = 2 * sens / eps
        law = exact.report_noisy_max_law(scores, sensitivity=sens, epsilon=eps)
        for i, ui in enumerate(scores):
            others = np.delete(np.asarray(scores), i)
            ref = integrate.quad(
                lambda x, ui=ui, others=others: (
                    stats.expon.pdf(x - ui, scale=s) * np.prod(stats.expon.cdf(x - others, scale=s))
                ),
                ui,
                np.inf,
                limit=200,
                epsabs=1e-13,
                epsrel=1e-12,
            )[0]
            assert law[i] == pytest.approx(ref, rel=1e-8)
        assert law.sum() == pytest.approx(1.0, abs=1e-12)
        em = exact.exponential_mechanism_law(scores, sensitivity=sens, epsilon=eps)
        assert not np.allclose(law, em, rtol=1e-3)  # RNM is permute-and-flip, not softmax


NONFINITE_SCORES = np.array([0.0, np.nan, 3.0, -np.inf, np.inf, 1.0])


@pytest.mark.parametrize("name", ["exponential_mechanism", "report_noisy_max"])
def test_selection_refuses_concrete_non_finite_scores(key, name):
    fn = getattr(M, name)
    for bad in ([0.0, np.nan, 100.0], [0.0, np.inf], [-np.inf, 1.0]):
        with pytest.raises(ValueError, match="scores must be finite"):
            fn(key, jnp.asarray(bad), sensitivity=1.0, epsilon=1.0)


@pytest.mark.parametrize(
    "name, law_fn",
    [
        ("exponential_mechanism", exact.exponential_mechanism_law),
        ("report_noisy_max", exact.report_noisy_max_law),
    ],
)
def test_selection_law_under_jit_with_non_finite_scores(key, name, law_fn):
    # finding 2: main picked the NaN / +inf candidate every time. Now the row is mapped to
    # (0, 0, 3, 0, 3, 1) and the sampled law is the exact law of the mapped scores.
    n, kw = 40_000, dict(sensitivity=1.0, epsilon=2.0)
    fn = getattr(M, name)
    batch = jnp.broadcast_to(jnp.asarray(NONFINITE_SCORES), (n, NONFINITE_SCORES.size))
    idx = np.asarray(jax.jit(lambda k, s: fn(k, s, **kw))(key, batch))
    law = law_fn(NONFINITE_SCORES, **kw)
    np.testing.assert_allclose(
        law, law_fn([0.0, 0.0, 3.0, 0.0, 3.0, 1.0], **kw), rtol=1e-15, atol=0
    )
    wrong = law_fn([0.0, 3.0, 3.0, 0.0, 3.0, 1.0], **kw)  # NaN treated as a top score
    assert_frequencies(np.bincount(idx, minlength=NONFINITE_SCORES.size), law, wrong_probs=[wrong])
    all_bad = jnp.asarray([[np.nan, np.inf, -np.inf]] * 3000)
    picks = np.asarray(jax.jit(lambda k, s: fn(k, s, **kw))(key, all_bad))
    assert np.all(np.bincount(picks, minlength=3) > 800)  # uniform over the three


def _sanitised(u):
    u = np.asarray(u, dtype=np.float64)
    fin = np.isfinite(u)
    if not fin.any():
        return np.zeros_like(u)
    return np.where(np.isnan(u), u[fin].min(), np.clip(u, u[fin].min(), u[fin].max()))


def selection_pairs(rng, d, sens):
    """Neighbouring score vectors: every ±Δ vertex, ties, huge scores and non-finite records."""
    bases = [
        np.zeros(d),
        np.arange(d, dtype=np.float64) * sens,
        rng.uniform(-5, 5, d),
        np.full(d, 1e6) + np.arange(d),
    ]
    for base in bases:
        for signs in itertools.product((-1.0, 0.0, 1.0), repeat=d):
            yield base, base + sens * np.asarray(signs)
    # non-finite records whose mapped scores are within Δ of the neighbour's
    u2 = np.array([0.0, 0.5, 3.0, 2.0][:d])
    for q in range(d):
        for bad in (np.nan, np.inf, -np.inf):
            u = u2.copy()
            u[q] = bad
            if np.max(np.abs(_sanitised(u) - u2)) <= sens:
                yield u, u2


@pytest.mark.parametrize("d", [2, 3, 4])
def test_selection_exact_profile_over_adversarial_pairs(d):
    rng = np.random.default_rng(d)
    sens = 1.0
    for eps in (0.1, 1.0, 4.0):
        worst_em = worst_rnm = 0.0
        for u, u2 in selection_pairs(rng, d, sens):
            kw = dict(sensitivity=sens, epsilon=eps)
            p, q = (
                exact.exponential_mechanism_law(u, **kw),
                exact.exponential_mechanism_law(u2, **kw),
            )
            exact.assert_within_claim(p, q, epsilon=eps)
            worst_em = max(worst_em, exact.pure_epsilon(p, q))
            p, q = exact.report_noisy_max_law(u, **kw), exact.report_noisy_max_law(u2, **kw)
            exact.assert_within_claim(p, q, epsilon=eps)
            worst_rnm = max(worst_rnm, exact.pure_epsilon(p, q))
            diff = u2 - _sanitised(u)
            if np.all(diff >= 0) or np.all(diff <= 0):  # monotone pair: Δ/ε temperature
                p = exact.exponential_mechanism_law(u, monotonic=True, **kw)
                q = exact.exponential_mechanism_law(u2, monotonic=True, **kw)
                exact.assert_within_claim(p, q, epsilon=eps)
        assert worst_em > 0.5 * eps and worst_rnm > 0.5 * eps  # the pairs are hard ones


@pytest.mark.slow  # a fresh interpreter compiling six mechanisms: ~10 s on 2 shared cores
def test_non_finite_rules_hold_with_x64_off():
    # float32 defaults (x64 off): every mechanism maps non-finite / out-of-range input under
    # jit and never releases it (discrete_laplace runs with x64 off since issue 26).
    code = """
import jax, jax.numpy as jnp, numpy as np
from dpjax import mechanisms as M
key = jax.random.key(0)
v = jnp.array([5, -1, 1, 0], jnp.int32)
rr = jax.jit(lambda k, v: M.randomized_response(k, v, epsilon=17.0, num_categories=2))(key, v)
assert rr.dtype == jnp.int32 and set(np.asarray(rr).tolist()) <= {0, 1}, rr
x = jnp.array([jnp.nan, jnp.inf, -jnp.inf, 0.3])
# issue 26: the exact integer sampler runs with x64 off; NaN -> 0, +-inf -> +-B (same key)
dl = jax.jit(lambda k, v: M.discrete_laplace(k, v, sensitivity=1.0, epsilon=1.0, bound=4.0,
                                             granularity=2.0**-4))
y, ref = dl(key, x), dl(key, jnp.array([0.0, 4.0, -4.0, 0.3]))
assert y.dtype == jnp.float32 and np.array_equal(np.asarray(y), np.asarray(ref)), (y, ref)
assert np.all(np.asarray(y) * 16 == np.round(np.asarray(y) * 16)) and np.all(np.abs(y) <= 4)
s = jnp.array([0.0, jnp.nan, 100.0])
for fn in (M.exponential_mechanism, M.report_noisy_max):
    many = jax.vmap(lambda k, s: fn(k, s, sensitivity=1.0, epsilon=1.0), in_axes=(0, None))
    picks = jax.jit(many)(jax.random.split(key, 200), s)
    assert np.all(np.asarray(picks) == 2), picks
for y in (jax.jit(lambda k, v: M.laplace(k, v, sensitivity=1.0, epsilon=1.0))(key, x),
          jax.jit(lambda k, v: M.gaussian(k, v, sensitivity=1.0, epsilon=1.0, delta=1e-5))(key, x)):
    assert y.dtype == jnp.float32 and np.all(np.isfinite(np.asarray(y))), y
print("ok")
"""
    env = dict(os.environ, JAX_ENABLE_X64="0", JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_discrete_laplace_small_rates_are_accepted_and_exact(key):
    # issue 26: the float64 sampler refused a = 0.1/4097 (float32 could not resolve it) and
    # rates below ~2e-5; the integer sampler takes any rate ≥ 2^-30, rounded DOWN to S/2^30
    kw = dict(sensitivity=1.0, epsilon=0.1, bound=1.0, granularity=2.0**-12)
    y = M.discrete_laplace(key, jnp.zeros(1, jnp.float32), **kw)
    assert y.dtype == jnp.float32 and float(y[0] * 2**12) == round(float(y[0] * 2**12))
    rate = discrete.discrete_laplace_rate(sensitivity=1.0, epsilon=0.1, granularity=2.0**-12)
    ideal = Fraction(0.1) / 4097
    assert rate <= ideal and ideal - rate < Fraction(1, 2**30) and (rate * 2**30).denominator == 1
    tiny = dict(sensitivity=1.0, epsilon=1.2e-13, granularity=2.0, bound=2000.0)  # a < 2^-30
    with pytest.raises(ValueError, match="epsilon must be at least"):
        M.discrete_laplace(key, jnp.zeros(1), **tiny)


# ------------------------------------------------------------------------------------------------
# randomized response and of the exact-profile harness itself.
#
# Randomized response: the law is re-derived from the code path (the library's word → report
# map run on the words at every boundary, then counted with integers) and its ε checked with
# 100-digit decimal arithmetic, independently of ``randomized_response_other_weight``'s own
# 60-digit computation. The harness (``dpjax.auditing.exact``) is cross-checked against exact
# rational arithmetic (``fractions.Fraction``) and probed at zeros, ties and underflow.
# ------------------------------------------------------------------------------------------------

# ---------------------------------------------------------------- the harness


def random_rational_law(rng, n, zeros):
    w = rng.integers(0, 6, n) if zeros else rng.integers(1, 6, n)
    if w.sum() == 0:
        w[0] = 1
    return [Fraction(int(x), int(w.sum())) for x in w]


def test_harness_against_exact_rational_arithmetic():
    """Catches the exact-profile harness disagreeing with exact rational arithmetic."""
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


def test_harness_tiny_but_normal_probabilities():
    # what held: masses down to 1e-300 keep exact ratios and δ
    """Catches the harness losing tiny (1e-300) probabilities in ratios and deltas."""
    p, q = [1.0, 1e-300, 0.0], [1.0 - 1e-16, math.e * 1e-300, 0.0]
    assert exact.max_log_ratio(q, p) == pytest.approx(1.0, abs=1e-12)
    assert exact.hockey_stick_delta([1.0 - 1e-300, 1e-300], [1.0, 0.0], 5.0) == 1e-300


# H-1 (fixed): laws were float64 probabilities only: the ideal discrete Laplace law (r = e^-1,
# B/g = 744) has cells of mass e^-744 ≈ 1e-323 (subnormal) and 0; pure_epsilon returned inf
# (B/g ≥ 744) or 1.0296 (claim 1); exponential_mechanism_law on (0, −1490) likewise. The law
# builders now return exact.Law, which carries the log-probabilities.
def test_harness_profiles_of_ideal_laws_with_long_tails():
    """Catches the harness returning inf or a wrong epsilon on laws with subnormal tails."""
    r = math.exp(-1.0)
    for h in (744.0, 800.0):
        p = exact.discrete_laplace_law(0.0, ratio=r, bound=h, granularity=1.0)
        q = exact.discrete_laplace_law(1.0, ratio=r, bound=h, granularity=1.0)
        assert exact.pure_epsilon(p, q) == pytest.approx(1.0, abs=1e-9), h
    kw = dict(sensitivity=1.0, epsilon=1.0)
    p = exact.exponential_mechanism_law([0.0, -1490.0], **kw)
    q = exact.exponential_mechanism_law([0.0, -1491.0], **kw)
    assert exact.pure_epsilon(p, q) <= 1.0 + 1e-9


def test_harness_against_dp_accounting_pld():
    # independent implementation: dp_accounting's PLD from the two pmfs (both directions,
    # symmetric=False); its pessimistic / optimistic estimates bracket the exact δ(ε)
    """Catches the harness disagreeing with dp-accounting's PLD on the same laws."""
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
    """Catches log-probability tails lost when laws are combined or sliced."""
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
