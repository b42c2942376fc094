import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.random import core as random_core
from scipy import integrate, stats

from dpjax import _random
from dpjax import mechanisms as M
from dpjax.auditing import exact
from dpjax.mechanisms._nonfinite import sanitise_scores
from tests.helpers import assert_frequencies

# rounding claims of compiled code: run on the users' -O3 code (tests/conftest.py)
pytestmark = pytest.mark.codegen

N = 100_000
SCORES = np.array([15.0, 20.0, 25.0, 18.0, 22.0])


def softmax_reference(scores, temperature):
    z = np.asarray(scores, dtype=np.float64) / temperature
    w = np.exp(z - z.max())
    return w / w.sum()


def rnm_reference(scores, scale):
    """P[argmax_i (u_i + Z_i) = i], Z_i iid Exp(scale), by numerical integration."""
    scores = np.asarray(scores, dtype=np.float64)
    probs = []
    for i, ui in enumerate(scores):
        others = np.delete(scores, i)

        def integrand(x, ui=ui, others=others):
            density = stats.expon.pdf(x - ui, scale=scale)
            return density * np.prod(stats.expon.cdf(x - others, scale=scale))

        probs.append(integrate.quad(integrand, ui, np.inf, limit=200)[0])
    return np.array(probs)


def counts_of(indices, d):
    return np.bincount(np.asarray(indices), minlength=d)


def test_exponential_mechanism_matches_softmax(key):
    eps, sens = 0.8, 2.0
    batch = jnp.broadcast_to(jnp.asarray(SCORES), (N, SCORES.size))
    idx = M.exponential_mechanism(key, batch, sensitivity=sens, epsilon=eps)
    assert idx.shape == (N,)
    t = 2 * sens / eps
    assert_frequencies(
        counts_of(idx, SCORES.size),
        softmax_reference(SCORES, t),
        wrong_probs=[softmax_reference(SCORES, 1.5 * t), softmax_reference(SCORES, t / 1.5)],
    )


def test_election_example_29():
    # 004 Example 29: eps = 1, Delta = 1, scores (15, 20, 25)
    probs = M.exponential_mechanism_probabilities(
        jnp.array([15.0, 20.0, 25.0]), sensitivity=1.0, epsilon=1.0
    )
    denom = math.exp(7.5) + math.exp(10.0) + math.exp(12.5)
    assert float(probs[0]) == pytest.approx(math.exp(7.5) / denom, rel=1e-12)
    assert float(probs[2]) == pytest.approx(math.exp(12.5) / denom, rel=1e-12)


def test_monotonic_halves_temperature():
    assert M.exponential_mechanism_scale(sensitivity=1.0, epsilon=1.0) == 2.0
    assert M.exponential_mechanism_scale(sensitivity=1.0, epsilon=1.0, monotonic=True) == 1.0


def test_report_noisy_max_matches_integrated_probabilities(key):
    eps, sens = 1.0, 1.5
    scores = SCORES / 3.0
    batch = jnp.broadcast_to(jnp.asarray(scores), (N, scores.size))
    idx = M.report_noisy_max(key, batch, sensitivity=sens, epsilon=eps)
    s = M.report_noisy_max_scale(sensitivity=sens, epsilon=eps)
    assert s == pytest.approx(2 * sens / eps)
    ref = rnm_reference(scores, s)
    assert ref.sum() == pytest.approx(1.0, abs=1e-7)
    assert_frequencies(
        counts_of(idx, scores.size),
        ref,
        wrong_probs=[rnm_reference(scores, 1.5 * s), rnm_reference(scores, s / 1.5)],
    )


def test_utility_lemma_tail_and_expectation(key):
    eps, sens, d = 1.0, 1.0, 50
    rng = np.random.default_rng(0)
    scores = rng.uniform(0, 20, size=d)
    t = 1.0
    psi = M.exponential_mechanism_utility_bound(
        sensitivity=sens, epsilon=eps, num_candidates=d, t=t
    )
    assert psi == pytest.approx(2 * sens * (math.log(d) + t) / eps)
    # exact probability of a gap > psi from the (independent) softmax, and empirically
    probs = softmax_reference(scores, 2 * sens / eps)
    bad = scores < scores.max() - psi
    assert probs[bad].sum() <= math.exp(-t)
    idx = np.asarray(
        M.exponential_mechanism(
            key, jnp.broadcast_to(jnp.asarray(scores), (20_000, d)), sensitivity=sens, epsilon=eps
        )
    )
    assert np.mean(bad[idx]) <= math.exp(-t)
    # expectation form: u* - E u(Q) <= 2 Delta ln d / eps, for many random score vectors
    bound = M.exponential_mechanism_expected_gap_bound(
        sensitivity=sens, epsilon=eps, num_candidates=d
    )
    assert bound == pytest.approx(2 * math.log(d))
    for _ in range(200):
        u = rng.uniform(0, rng.uniform(0.1, 40), size=d)
        p = softmax_reference(u, 2 * sens / eps)
        assert u.max() - p @ u <= bound + 1e-12


def test_jit_and_vmap_match_eager(key):
    scores = jnp.asarray(SCORES)
    for fn in (M.exponential_mechanism, M.report_noisy_max):
        eager = fn(key, scores, sensitivity=1.0, epsilon=1.0)
        jitted = jax.jit(lambda k, s, fn=fn: fn(k, s, sensitivity=1.0, epsilon=1.0))(key, scores)
        assert int(eager) == int(jitted)
        keys = jax.random.split(key, 4)
        batched = jax.vmap(lambda k, fn=fn: fn(k, scores, sensitivity=1.0, epsilon=1.0))(keys)
        loop = [int(fn(k, scores, sensitivity=1.0, epsilon=1.0)) for k in keys]
        assert [int(i) for i in batched] == loop


def test_integer_scores_are_accepted(key):
    idx = M.exponential_mechanism(key, jnp.array([0, 1000, 0]), sensitivity=1.0, epsilon=1.0)
    assert int(idx) == 1


@pytest.mark.parametrize(
    "call",
    [
        lambda: M.exponential_mechanism(
            jax.random.key(0), jnp.zeros((0,)), sensitivity=1.0, epsilon=1.0
        ),
        lambda: M.exponential_mechanism(
            jax.random.key(0), jnp.float64(1.0), sensitivity=1.0, epsilon=1.0
        ),
        lambda: M.report_noisy_max(
            jax.random.key(0), jnp.zeros((3, 0)), sensitivity=1.0, epsilon=1.0
        ),
        lambda: M.exponential_mechanism(
            jax.random.key(0), jnp.zeros(3), sensitivity=0.0, epsilon=1.0
        ),
        lambda: M.exponential_mechanism(
            jax.random.key(0), jnp.zeros(3), sensitivity=1.0, epsilon=0.0
        ),
        lambda: M.report_noisy_max(jax.random.key(0), jnp.zeros(3), sensitivity=-1.0, epsilon=1.0),
        lambda: M.exponential_mechanism_utility_bound(
            sensitivity=1.0, epsilon=1.0, num_candidates=0, t=1.0
        ),
        lambda: M.exponential_mechanism_utility_bound(
            sensitivity=1.0, epsilon=1.0, num_candidates=3, t=0.0
        ),
    ],
)
def test_bad_inputs_raise(call):
    with pytest.raises(ValueError, match="must be"):
        call()


# ------------------------------------------------------------------------------------------------
# ``exponential_mechanism`` / ``report_noisy_max`` as the code runs.
#
# * Support probes: JAX's Gumbel and exponential samplers fed all-zero and all-one random bits
#   (``jax._src.random.core._random_bits`` patched, ``jax.disable_jit``) give their exact range.
# * 16-bit scores (findings SEL-1 / SEL-2, fixed): the review enumerated 16-bit noise (a
#   bfloat16 / float16 uniform takes 2^nmant values: 128 / 1024) through the mechanism and found
#   pure ε = ∞ (RNM, bfloat16, (0, −8.75) / (0, −9.75)) and 2.77 (EM, float16). The selection
#   noise is now drawn from 64 random bits in at least float32 (``dpjax._random.gumbel`` /
#   ``exponential``) and the argmax is taken on the float32 sum; the tests check that with the
#   same key 16-bit scores select exactly what float32 scores select, the selection frequencies
#   on the review's pairs against the ideal laws (binomial tolerance from n), and the samplers'
#   laws (KS, with rejection of a wrong scale) and supports (extreme bits).
# * The non-finite rule: a fixed map that is 1-Lipschitz in ℓ∞ and order-preserving on score
#   vectors with the same non-finite pattern, so Δ and monotonicity carry over.
# ------------------------------------------------------------------------------------------------


def extreme(sampler, dtype, ones):
    """The sampler's value when every random bit is 1 (``ones``) or 0."""
    original = random_core._random_bits

    def fake(key, bit_width, shape):
        dt = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}[bit_width]
        return jnp.full(shape, np.iinfo(dt).max if ones else 0, dt)

    random_core._random_bits = fake
    try:
        with jax.disable_jit():
            return float(sampler(jax.random.key(0), (1,), dtype)[0])
    finally:
        random_core._random_bits = original


def selection_frequencies(name, scores, dtype, n, key, **kw):
    """Frequencies of the selected index over n independent runs (one key each)."""
    batch = jnp.broadcast_to(jnp.asarray(scores, dtype), (n, len(scores)))
    picks = jax.jit(jax.vmap(lambda k, s: getattr(M, name)(k, s, **kw)))(
        jax.random.split(key, n), batch
    )
    return np.bincount(np.asarray(picks), minlength=len(scores)) / n


def same_key_picks(name, scores, dtype, n, key, **kw):
    """The picks for ``scores`` in ``dtype`` and in float32, with the same n keys."""
    keys = jax.random.split(key, n)
    out = []
    for dt in (dtype, jnp.float32):
        batch = jnp.broadcast_to(jnp.asarray(scores, dt), (n, len(scores)))
        run = jax.jit(jax.vmap(lambda k, s: getattr(M, name)(k, s, **kw)))
        out.append(np.asarray(run(keys, batch)))
    return out


def binomial_ok(freq, prob, n, z=5.0):
    """|freq − prob| within z binomial standard deviations (of n draws at prob)."""
    return abs(freq - prob) <= z * math.sqrt(prob * (1.0 - prob) / n)


def pure_eps(p, q):
    if np.any((p > 0) != (q > 0)):
        return math.inf
    seen = p > 0
    return float(np.max(np.abs(np.log(p[seen]) - np.log(q[seen]))))


def delta_at(p, q, eps):
    return max(
        float(np.sum(np.maximum(0.0, p - math.exp(eps) * q))),
        float(np.sum(np.maximum(0.0, q - math.exp(eps) * p))),
    )


# ---------------------------------------------------------------- support probes (held)


def test_noise_ranges_from_extreme_bits():
    # the documented ranges (exponential_mechanism docstring) and the ones it does not give
    """Catches selection noise whose all-zero / all-one bits give an unbounded or wrong range."""
    got = {
        jnp.dtype(dt).name: [
            extreme(s, dt, ones)
            for s in (jax.random.gumbel, jax.random.exponential)
            for ones in (False, True)
        ]
        for dt in (jnp.bfloat16, jnp.float16, jnp.float32, jnp.float64)
    }
    np.testing.assert_allclose(got["float32"], [-4.4698, 15.9424, 0.0, 15.9424], atol=1e-4)
    np.testing.assert_allclose(got["float64"], [-6.5630, 36.0437, 0.0, 36.0437], atol=1e-4)
    np.testing.assert_allclose(got["bfloat16"], [-4.46875, 4.84375, 0.0, 4.84375], atol=1e-6)
    np.testing.assert_allclose(got["float16"], [-2.2715, 6.9297, 0.0, 6.9297], atol=1e-4)


def test_float32_delta_floor_of_the_bounded_noise():
    # a candidate more than T·(max − min) below the best is never selected: the pair
    # (0, −gap) / (0, −gap − Δ) straddling that gap has pure ε = ∞ and δ = the ideal
    # probability at the gap. Two candidates, float32: EM 1.4e-9, RNM 5.9e-8 (60× the EM
    # floor; it grows linearly with the number of such candidates).
    """Catches the float32 selection noise's delta floor drifting from its stated value."""
    g_lo, g_hi = (extreme(jax.random.gumbel, jnp.float32, b) for b in (False, True))
    e_hi = extreme(jax.random.exponential, jnp.float32, True)
    em_floor = 1.0 / (1.0 + math.exp(g_hi - g_lo))  # softmax at gap T·W
    rnm_floor = 0.5 * math.exp(-e_hi)  # P[Z_1 − Z_0 > gap/s] at gap/s = max Z
    assert 1.3e-9 < em_floor < 1.5e-9 and 5.8e-8 < rnm_floor < 6.0e-8


# ---------------------------------------------------------------- 16-bit scores


@pytest.mark.slow  # 2 × 2^21 selections plus 3 same-key batches (~12 s)
def test_report_noisy_max_bfloat16_realised_law_within_claim(key):
    # SEL-1 (fixed): bfloat16 scores got bfloat16 noise (review's enumeration: 128 values in
    # [0, 4.84]; (0, −8.75) selected 1 w.p. 2.9e-3, (0, −9.75) never: ε = ∞). Now the
    # noise is the float32 64-bit sampler and the argmax is taken in float32: with the same
    # key bfloat16 scores select exactly what float32 scores select...
    """Catches report_noisy_max on bfloat16 scores realising a law beyond its epsilon."""
    kw = dict(sensitivity=1.0, epsilon=1.0)
    for scores in ([0.0, -8.75], [1000.0, 1000.0], [0.0, -0.5, 0.5]):
        low, wide = same_key_picks("report_noisy_max", scores, jnp.bfloat16, 20_000, key, **kw)
        np.testing.assert_array_equal(low, wide, err_msg=str(scores))
    # ...and the frequencies on the review's pair match the ideal law, which is within claim
    n = 2**21
    p = selection_frequencies("report_noisy_max", [0.0, -8.75], jnp.bfloat16, n, key, **kw)
    q = selection_frequencies("report_noisy_max", [0.0, -9.75], jnp.bfloat16, n, key, **kw)
    p_ideal = exact.report_noisy_max_law([0.0, -8.75], **kw)
    q_ideal = exact.report_noisy_max_law([0.0, -9.75], **kw)
    assert binomial_ok(p[1], p_ideal[1], n) and binomial_ok(q[1], q_ideal[1], n), (p, q)
    assert not binomial_ok(p[1], 2.9e-3, n) and q[1] > 0  # the 16-bit law is rejected
    assert pure_eps(p_ideal, q_ideal) <= 1.0 * (1 + 1e-9)
    assert pure_eps(p, q) <= 1.0 * (1 + 1e-9), (p, q, delta_at(p, q, 1.0))


@pytest.mark.slow  # 4 × 2^22 selections plus 3 same-key batches (~19 s)
def test_exponential_mechanism_float16_realised_law_within_claim(key):
    # SEL-2 (fixed): float16 scores got float16 Gumbel noise (1024 values in [−2.27, 6.93]):
    # (0, −16.75) / (0, −17.75) realised ε = 2.77, (0, −17.5) / (0, −18.5) ε = ∞
    """Catches the exponential mechanism on float16 scores realising a law beyond its epsilon."""
    kw = dict(sensitivity=1.0, epsilon=1.0)
    for scores in ([0.0, -16.75], [1000.0, 1000.0], [0.0, -0.5, 0.5]):
        low, wide = same_key_picks("exponential_mechanism", scores, jnp.float16, 20_000, key, **kw)
        np.testing.assert_array_equal(low, wide, err_msg=str(scores))
    n = 2**22
    for gap in (16.75, 17.5):
        laws = []
        for g in (gap, gap + 1.0):
            f = selection_frequencies("exponential_mechanism", [0.0, -g], jnp.float16, n, key, **kw)
            ideal = exact.exponential_mechanism_law([0.0, -g], **kw)
            assert binomial_ok(f[1], ideal[1], n) and f[1] > 0, (g, f, ideal)
            laws.append((f, ideal))
        (p, p_ideal), (q, q_ideal) = laws
        assert pure_eps(p_ideal, q_ideal) <= 1.0 * (1 + 1e-9)
        # ln(p/q) ideal 0.5: the sampled ratio is within its binomial error of it
        assert pure_eps(p, q) <= 1.0 * (1 + 1e-9), (gap, p, q, delta_at(p, q, 1.0))


def test_16bit_realised_law_is_close_to_ideal_in_the_bulk(key):
    # away from the tails: EM on (0, −1), ε = 1: ideal P[1] = 1/(1 + e^{1/2}) = 0.3775
    """Catches 16-bit scores distorting the exponential mechanism's law in the bulk."""
    n = 2**16
    p = selection_frequencies(
        "exponential_mechanism", [0.0, -1.0], jnp.float16, n, key, sensitivity=1.0, epsilon=1.0
    )
    assert abs(p[1] - 1.0 / (1.0 + math.exp(0.5))) < 0.01
    assert binomial_ok(p[1], 1.0 / (1.0 + math.exp(0.5)), n)


# ---------------------------------------------------------------- the 64-bit selection samplers


def test_selection_samplers_support_from_extreme_bits():
    # all-zero / all-one words: the ends of the supports (documented in dpjax._random)
    """Catches the 64-bit exponential / Gumbel samplers' support ends moving."""
    for dt in (np.float32, np.float64):
        ends = [
            float(np.asarray(s(_random.constant_bits_key(w), (1,), dt), np.float64)[0])
            for s in (_random.exponential, _random.gumbel)
            for w in (0, 0xFFFFFFFF)
        ]
        np.testing.assert_allclose(ends, [45.0546, 2.7105e-20, -3.8079, 45.0546], rtol=1e-4)
        assert 64 * math.log(2.0) < ends[0]  # reaches beyond −ln 2^-64


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_selection_samplers_law_ks_and_wrong_scale(key, dtype):
    """Catches the 64-bit exponential / Gumbel samplers drawing a wrong law or scale (KS)."""
    n = 2**18
    crit = stats.kstwo.isf(1e-6, n)  # ≈ 1.95/√n
    e = np.asarray(_random.exponential(key, (n,), dtype), np.float64)
    g = np.asarray(_random.gumbel(jax.random.fold_in(key, 1), (n,), dtype), np.float64)
    assert e.dtype == np.float64 and np.all(np.isfinite(e)) and np.all(np.isfinite(g))
    assert stats.kstest(e, stats.expon.cdf).statistic < crit
    assert stats.kstest(g, stats.gumbel_r.cdf).statistic < crit
    assert stats.kstest(e, stats.expon(scale=1.05).cdf).statistic > crit  # wrong scale
    assert stats.kstest(g, stats.gumbel_r(scale=1.05).cdf).statistic > crit
    assert stats.kstest(g, stats.gumbel_r(loc=0.03).cdf).statistic > crit  # wrong location


def test_selection_noise_is_wide_for_16bit_scores(monkeypatch, key):
    # grey-box: the mechanisms draw from the 64-bit samplers in float32 for 16-bit scores
    """Catches 16-bit scores drawing their selection noise in 16 bits."""
    seen = []
    for name, attr in (("exponential_mechanism", "gumbel"), ("report_noisy_max", "exponential")):
        real = getattr(_random, attr)

        def spy(k, shape, dtype, real=real):
            seen.append(np.dtype(dtype))
            return real(k, shape, dtype)

        monkeypatch.setattr(_random, attr, spy)
        for dt in (jnp.bfloat16, jnp.float16):
            getattr(M, name)(key, jnp.zeros(3, dt), sensitivity=1.0, epsilon=1.0)
    assert seen == [np.dtype(np.float32)] * 4


# ---------------------------------------------------------------- the non-finite rule (held)


def test_non_finite_rule_is_lipschitz_and_monotone_per_pattern():
    # the mapped value of a non-finite score depends on the row's other scores, but through
    # min / max / clip, which are 1-Lipschitz in ℓ∞ and order-preserving: for neighbours with
    # the same non-finite pattern, ‖ũ − ũ′‖∞ ≤ max over finite q of |u_q − u′_q| and
    # u ≤ u′ ⇒ ũ ≤ ũ′. Random search over 20 000 pairs per d = 2 … 6 (rows of one batch).
    """Catches the non-finite score rule breaking 1-Lipschitz or monotone behaviour."""
    rng = np.random.default_rng(2)
    n = 20_000
    for d in range(2, 7):
        u = rng.choice([-1e6, -3.0, 0.0, 0.5, 2.0, 1e6], (n, d)) + rng.normal(size=(n, d))
        step = rng.uniform(-1.0, 1.0, (n, d)) * rng.choice([0.0, 1.0], (n, d), p=[0.3, 0.7])
        monotone = rng.random(n) < 0.3
        step[monotone] = np.abs(step[monotone])
        pattern = rng.choice([0.0, np.nan, np.inf, -np.inf], (n, d), p=[0.55, 0.15, 0.15, 0.15])
        fin = pattern == 0
        uu, vv = np.where(fin, u, pattern), np.where(fin, u + step, pattern)
        su = np.asarray(sanitise_scores(jnp.asarray(uu)))
        sv = np.asarray(sanitise_scores(jnp.asarray(vv)))
        bound = np.max(np.where(fin, np.abs(step), 0.0), axis=1)
        gap = np.max(np.abs(su - sv), axis=1)
        assert np.all(gap <= bound + 1e-8)  # u + step rounds at |u| ~ 1e6
        assert np.all(sv[monotone] >= su[monotone])
        tight = bound > 0
        assert np.max(gap[tight] / bound[tight]) > 0.99  # the search reached the bound


def test_float64_host_scores_get_noise_at_the_temperature_rounded_up(monkeypatch, key):
    """x64 off, float64 numpy scores (summed with the noise on the host): the noise is T'·Z
    with T' the smallest float32 ≥ T = 2Δ/ε; the nearest float32 of T = 20/3 is below it."""
    import importlib
    from fractions import Fraction

    ex = importlib.import_module("dpjax.mechanisms.exponential")
    temperature = M.exponential_mechanism_scale(sensitivity=1.0, epsilon=0.3)
    nearest = np.float32(temperature)
    assert Fraction(float(nearest)) < Fraction(temperature)
    up = np.nextafter(nearest, np.float32(np.inf))
    seen = {}
    real_noise, real_argmax = ex.tree_noise_like, ex._argmax
    monkeypatch.setattr(ex, "tree_noise_like", lambda *a: seen.setdefault("z", real_noise(*a)))
    monkeypatch.setattr(
        ex, "_argmax", lambda v: seen.setdefault("noisy", v) is v and real_argmax(v)
    )
    with jax.enable_x64(False):
        M.exponential_mechanism(key, np.zeros(64), sensitivity=1.0, epsilon=0.3)
    z = np.asarray(seen["z"])
    assert z.dtype == np.float32
    np.testing.assert_array_equal(seen["noisy"], (up * z).astype(np.float64))
