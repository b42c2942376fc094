import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, stats

from dpjax import mechanisms as M
from tests.helpers import assert_frequencies

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
