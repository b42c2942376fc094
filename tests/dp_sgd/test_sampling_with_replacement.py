"""Sampling with replacement: the one-step profile against a brute-force mixture, the lecture's
amplification lemma at b = 1, the relation, and the sampler's wiring."""

import itertools
import math

import jax
import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from scipy import optimize, special, stats

from dpjax import events as ev
from dpjax.accounting import PrivacyAccountant, amplification_by_subsampling
from dpjax.accounting.tight import _gaussian_delta_upper
from dpjax.accounting.with_replacement import with_replacement_delta, with_replacement_epsilon
from dpjax.dp_sgd import WithReplacementSampler


def _means(values: np.ndarray, b: int) -> np.ndarray:
    """Clipped sum (each draw on its own, C = 1) of every one of the n^b equally likely batches."""
    n = values.size
    return np.array([values[list(idx)].sum() for idx in itertools.product(range(n), repeat=b)])


def _hockey_stick(means_p: np.ndarray, means_q: np.ndarray, sigma: float, eps: float) -> float:
    """H_{e^ε}(P || Q) = ∫ (p − e^ε q)_+ for equal-weight Gaussian mixtures: the set where the
    integrand is positive is found on a grid and its end points refined by root finding, then
    each interval is integrated exactly with normal CDFs."""

    def g(y):
        y = np.atleast_1d(y)[:, None]
        p = np.exp(-0.5 * ((y - means_p) / sigma) ** 2).mean(1)
        q = np.exp(-0.5 * ((y - means_q) / sigma) ** 2).mean(1)
        return (p - math.exp(eps) * q) / (sigma * math.sqrt(2 * math.pi))

    lo = min(means_p.min(), means_q.min()) - 15 * sigma
    hi = max(means_p.max(), means_q.max()) + 15 * sigma
    grid = np.linspace(lo, hi, 20001)
    vals = g(grid)
    pos = vals > 0
    edges = [lo] if pos[0] else []
    for k in np.nonzero(pos[1:] != pos[:-1])[0]:
        a, b = grid[k], grid[k + 1]
        if vals[k] * vals[k + 1] < 0:
            edges.append(optimize.brentq(lambda y: g(y)[0], a, b, xtol=1e-13))
        else:  # g is exactly 0 at one end
            edges.append(a if vals[k] == 0 else b)
    if pos[-1]:
        edges.append(hi)

    def mass(means, a, b):
        return (special.ndtr((b - means) / sigma) - special.ndtr((a - means) / sigma)).mean()

    total = 0.0
    for a, b in zip(edges[::2], edges[1::2], strict=True):
        total += mass(means_p, a, b) - math.exp(eps) * mass(means_q, a, b)
    return max(total, 0.0)


OTHERS = {
    "all_minus": lambda n: -np.ones(n - 1),  # the realisable worst case: P = Σ π_k N(2k), Q fixed
    "all_plus": lambda n: np.ones(n - 1),
    "zeros": lambda n: np.zeros(n - 1),
    "mixed": lambda n: np.linspace(-1.0, 1.0, n - 1),
}


@pytest.mark.parametrize("others", sorted(OTHERS))
@pytest.mark.parametrize("n,b", [(3, 2), (4, 3)])
def test_profile_bounds_brute_force_mixture(others, n, b):
    sigma = 1.0
    rest = OTHERS[others](n)
    x = np.concatenate([[1.0], rest])  # record 0 is the one replaced: +C → −C
    x_prime = np.concatenate([[-1.0], rest])
    mp, mq = _means(x, b), _means(x_prime, b)
    for eps in (0.0, 0.5, 1.0, 2.0):
        bound = with_replacement_delta(eps, noise_multiplier=sigma, batch_size=b, dataset_size=n)
        for a, c in ((mp, mq), (mq, mp)):
            assert _hockey_stick(a, c, sigma, eps) <= bound * (1 + 1e-6) + 1e-12


def test_profile_is_nearly_tight_on_the_worst_case_and_multiplicity_matters():
    n, b, sigma = 4, 3, 1.0
    rest = -np.ones(n - 1)
    mp = _means(np.concatenate([[1.0], rest]), b)
    mq = _means(np.concatenate([[-1.0], rest]), b)
    eta = 1 - (1 - 1 / n) ** b
    for eps in (0.5, 1.0, 2.0):
        exact = _hockey_stick(mp, mq, sigma, eps)
        bound = with_replacement_delta(eps, noise_multiplier=sigma, batch_size=b, dataset_size=n)
        assert bound <= 1.5 * exact  # not vacuous
        # Wrong relation/constant: charging one appearance (shift 2C once, amplified by η), as if
        # the lemma held for with-replacement batches of b > 1, is violated by the mixture.
        base = math.log1p(math.expm1(eps) / eta)
        once = eta * _gaussian_delta_upper(2.0 / sigma, base)
        assert exact > 1.05 * once


@pytest.mark.parametrize("eps_base", [0.5, 1.0, 3.0])
def test_b_equal_one_is_the_lecture_amplification_lemma(eps_base):
    n, sigma = 50, 1.3
    delta_base = _gaussian_delta_upper(2.0 / sigma, eps_base)  # replace-one sensitivity 2C
    eps_amp, delta_amp = amplification_by_subsampling(
        epsilon=eps_base, delta=delta_base, sampling_rate=1.0 / n, sampling="without_replacement"
    )
    got = with_replacement_delta(eps_amp, noise_multiplier=sigma, batch_size=1, dataset_size=n)
    assert got == pytest.approx(delta_amp, rel=1e-9)


def test_negative_epsilon_by_duality_and_monotone():
    eps = np.linspace(-3.0, 3.0, 61)
    d = with_replacement_delta(eps, noise_multiplier=1.0, batch_size=5, dataset_size=20)
    assert np.all(np.diff(d) <= 1e-15)
    neg = eps < 0
    dual = -np.expm1(eps[neg]) + np.exp(eps[neg]) * d[::-1][neg]
    np.testing.assert_allclose(d[neg], dual, rtol=1e-12)


def test_pld_of_one_step_inverts_the_profile():
    kw = dict(noise_multiplier=1.0, batch_size=4, dataset_size=100)
    eps = with_replacement_epsilon(**kw, steps=1, delta=1e-5, value_discretization_interval=1e-3)
    assert with_replacement_delta(eps, **kw) <= 1e-5 * (1 + 1e-9)
    assert with_replacement_delta(eps - 0.01, **kw) > 1e-5  # within the grid of the inverse


def test_composition_lies_above_the_realisable_mixture_lower_bound():
    """The worst-case data set realises P = Σ_k π_k N(2kC), Q = N(0) at every step; its
    T-fold PLD is a lower bound on the true ε, which the accountant must not undercut."""
    n, b, sigma, steps = 100, 2, 1.0, 10
    ks = np.arange(0, b + 1)
    lower = pld_lib.from_mixture_gaussian_mechanism(
        sigma,
        list(2.0 * ks),
        list(stats.binom.pmf(ks, b, 1 / n)),
        value_discretization_interval=1e-2,
    ).self_compose(steps)
    eps_lower = lower.get_epsilon_for_delta(1e-5)
    acc = PrivacyAccountant(
        [ev.WithReplacementGaussianEvent(sigma, b, n, count=steps)],
        value_discretization_interval=1e-2,
    )
    assert acc.applicable_methods() == ("pld",)
    assert acc.epsilon(1e-5) >= eps_lower * (1 - 1e-2)


def test_sampler_draws_with_replacement_and_builds_its_event():
    s = WithReplacementSampler(dataset_size=5, batch_size=200)
    idx = np.asarray(s.sample(jax.random.key(3)))
    assert idx.shape == (200,) and idx.dtype == np.int32 and idx.min() >= 0 and idx.max() < 5
    counts = np.bincount(idx, minlength=5)
    assert counts.min() > 0 and len(set(idx.tolist())) == 5  # repeats happen
    e = s.event(noise_multiplier=1.5, steps=7)
    assert e == ev.WithReplacementGaussianEvent(1.5, 200, 5, count=7)
    assert s.expected_batch_size == 200.0
    with pytest.raises(ValueError, match="relation"):
        s.event(noise_multiplier=1.0, steps=1, relation="add_or_remove_one")
    with pytest.raises(ValueError, match="dataset_size"):
        WithReplacementSampler(dataset_size=1, batch_size=1)
    with pytest.raises(ValueError, match="accounting='rdp' does not apply"):
        PrivacyAccountant([e]).epsilon(1e-5, accounting="rdp")
    assert ev.event_from_dict(ev.event_to_dict(e)) == e
