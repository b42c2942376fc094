"""Balls-in-bins accounting: the conservative (no amplification) bound against a brute-force
privacy curve of the dominating pair, and the Monte Carlo estimator against brute force and
dp-accounting's Poisson PLD."""

import math

import jax
import numpy as np
import pytest
from scipy import optimize, stats

from dpjax import events as ev
from dpjax.accounting import PrivacyAccountant, monte_carlo_epsilon
from dpjax.accounting.conversion import to_dp_event

_NODES = {1: 2401, 2: 2401, 3: 801}  # outer quadrature nodes per dimension


def _exact_delta(sigma: float, t: int, epsilon: float) -> float:
    """δ(ε) of one balls-in-bins epoch's pair P = (1/t)Σ N(e_s, σ²I), Q = N(0, σ²I), the
    larger of both directions: quadrature over t − 1 coordinates, the last one in closed form
    (lognormal call / put prices). Independent of the code under test."""
    mu, s = -1.0 / (2.0 * sigma**2), 1.0 / sigma  # Y = dN(1,σ²)/dN(0,σ²)(σZ) = e^{μ + sZ}
    z = np.linspace(-11.0, 11.0, _NODES[t])
    w = stats.norm.pdf(z) * (z[1] - z[0])
    grids = np.meshgrid(*([z] * (t - 1)), indexing="ij")
    weight = np.ones_like(grids[0]) if t > 1 else np.ones(())
    partial = np.zeros_like(weight)
    for g in grids:
        partial = partial + np.exp(mu + s * g)
    for axis in range(t - 1):
        shape = [1] * (t - 1)
        shape[axis] = -1
        weight = weight * w.reshape(shape)
    # remove direction: E[(S − e^ε)₊], S = (partial + Y)/t; Y lognormal(μ, s)
    c = t * math.exp(epsilon) - partial  # need Y > c
    with np.errstate(divide="ignore", invalid="ignore"):
        d2 = (mu - np.log(np.where(c > 0, c, 1.0))) / s
        call = np.where(c > 0, stats.norm.cdf(d2 + s) - c * stats.norm.cdf(d2), 1.0 - c)
        remove = float(np.sum(weight * call) / t)
        k = t * math.exp(-epsilon) - partial  # add direction: E[(1 − e^ε S)₊], need Y < k
        d2 = (mu - np.log(np.where(k > 0, k, 1.0))) / s
        put = np.where(k > 0, k * stats.norm.cdf(-d2) - stats.norm.cdf(-d2 - s), 0.0)
        add = float(np.sum(weight * put) * math.exp(epsilon) / t)
    return max(remove, add)


def _exact_epsilon(sigma: float, t: int, delta: float) -> float:
    return optimize.brentq(lambda e: _exact_delta(sigma, t, e) - delta, 0.0, 30.0, xtol=1e-6)


def _gaussian_delta(mu: float, epsilon: float) -> float:
    """Balle & Wang 2018, Theorem 8: δ(ε) of the Gaussian mechanism with Δ/σ = μ."""
    a, b = mu / 2.0, epsilon / mu
    return stats.norm.cdf(a - b) - math.exp(epsilon) * stats.norm.cdf(-a - b)


def test_brute_force_reproduces_the_gaussian_curve_at_one_step():
    # t = 1 is the Gaussian mechanism: validates the quadrature used below.
    for sigma in (0.8, 2.0):
        for eps in (0.3, 1.5):
            assert _exact_delta(sigma, 1, eps) == pytest.approx(_gaussian_delta(1 / sigma, eps))


@pytest.mark.parametrize(("t", "sigma"), [(2, 0.8), (2, 2.0), (3, 0.8)])
def test_conservative_bound_holds_for_the_exact_epoch_curve(t, sigma):
    """ε of the recorded event at δ_exact(ε₀) is ≥ ε₀, for the brute-force privacy curve of
    the epoch; an event that claimed more noise (σ·1.5) fails the same check."""
    too_optimistic = []
    for eps0 in (0.25, 1.0, 2.0):
        d = _exact_delta(sigma, t, eps0)
        if d < 1e-12:
            continue
        event = ev.BallsInBinsGaussianEvent(noise_multiplier=sigma, steps_per_epoch=t, count=t)
        assert PrivacyAccountant([event]).epsilon(d) >= eps0 - 1e-6
        assert d < _gaussian_delta(1 / sigma, eps0)  # the mixture is strictly more private
        wrong = ev.BallsInBinsGaussianEvent(noise_multiplier=1.5 * sigma, steps_per_epoch=t)
        too_optimistic.append(PrivacyAccountant([wrong]).epsilon(d) < eps0)
    assert any(too_optimistic)


def test_poisson_at_rate_one_over_t_understates_the_epoch():
    """The shortcut 'account balls-in-bins as Poisson sampling at q = 1/t' is not an upper
    bound: at t = 2, σ = 0.8 the exact epoch curve has ε₀ = 0.25 at δ ≈ 0.30, Poisson claims
    less."""
    d = _exact_delta(0.8, 2, 0.25)
    poisson = ev.PoissonSampledGaussianEvent(noise_multiplier=0.8, sampling_rate=0.5, count=2)
    assert PrivacyAccountant([poisson]).epsilon(d) < 0.2
    event = ev.BallsInBinsGaussianEvent(noise_multiplier=0.8, steps_per_epoch=2, count=2)
    assert PrivacyAccountant([event]).epsilon(d) >= 0.25


def test_epochs_compose_as_gaussian_releases():
    e = ev.BallsInBinsGaussianEvent(noise_multiplier=2.0, steps_per_epoch=10, count=25)
    assert e.epochs == 3 and not ev.count_is_additive(e)
    g = ev.GaussianEvent(noise_multiplier=2.0, count=3, relation="add_or_remove_one")
    assert PrivacyAccountant([e]).epsilon(1e-5) == pytest.approx(
        PrivacyAccountant([g]).epsilon(1e-5)
    )
    r = ev.BallsInBinsGaussianEvent(2.0, 10, count=25, relation="replace_one")
    g2 = ev.GaussianEvent(noise_multiplier=1.0, count=3)  # sensitivity 2C under replace-one
    assert PrivacyAccountant([r]).epsilon(1e-5) == pytest.approx(
        PrivacyAccountant([g2]).epsilon(1e-5)
    )


def test_padded_event_pays_the_truncation_slack():
    plain = ev.BallsInBinsGaussianEvent(noise_multiplier=2.0, steps_per_epoch=10, count=25)
    padded = ev.BallsInBinsGaussianEvent(2.0, 10, count=25, dataset_size=1000, max_batch_size=170)
    assert ev.event_from_dict(ev.event_to_dict(padded)) == padded
    assert PrivacyAccountant([padded]).epsilon(1e-5) > PrivacyAccountant([plain]).epsilon(1e-5)
    small = ev.BallsInBinsGaussianEvent(2.0, 10, count=25, dataset_size=1000, max_batch_size=110)
    with pytest.raises(ValueError, match="delta"):  # T·p̄ = 6e-4 cannot fit in δ = 1e-5
        PrivacyAccountant([small]).epsilon(1e-5)
    with pytest.raises(ValueError, match="slack_paid_separately"):
        padded.untruncated()
    with pytest.raises(ValueError, match="untruncated"):  # no DpEvent holds the cap's slack
        to_dp_event(padded, method="rdp")
    assert "rdp" in PrivacyAccountant([padded]).applicable_methods()


def test_history_of_a_padded_run_counts_started_epochs_and_pays_the_slack():
    padded = ev.BallsInBinsGaussianEvent(2.0, 10, count=25, dataset_size=1000, max_batch_size=170)
    acc = PrivacyAccountant([padded])
    for method in ("pld", "rdp"):
        history = dict(acc.epsilon_history(1e-5, every=5, accounting=method))
        assert history[5] == history[10] < history[15] == history[20] < history[25]
        assert history[25] == acc.epsilon(1e-5, method)
        one_epoch = ev.BallsInBinsGaussianEvent(2.0, 10, count=5)  # uncapped: no slack
        assert history[5] > PrivacyAccountant([one_epoch]).epsilon(1e-5, method)


def test_private_selection_over_padded_runs_pays_the_slack():
    from dpjax.accounting.selection import repeat_and_select_rdp

    padded = ev.BallsInBinsGaussianEvent(2.0, 10, count=25, dataset_size=1000, max_batch_size=170)
    plain = padded.untruncated(slack_paid_separately=True)
    with_cap = PrivacyAccountant([ev.RepeatAndSelectEvent(padded, mean=3.0, shape=1.0)])
    without = PrivacyAccountant([ev.RepeatAndSelectEvent(plain, mean=3.0, shape=1.0)])
    assert with_cap.epsilon(1e-5) > without.epsilon(1e-5)
    with pytest.raises(ValueError, match="padded sampler"):  # no RDP curve holds the slack
        repeat_and_select_rdp(ev.RepeatAndSelectEvent(padded, mean=3.0, shape=1.0))


def test_monte_carlo_interval_covers_the_exact_balls_in_bins_epsilon():
    r = monte_carlo_epsilon(
        noise_multiplier=1.0, steps=2, steps_per_epoch=2, delta=1e-2,
        key=jax.random.key(0), num_samples=20_000,
    )  # fmt: skip
    exact = _exact_epsilon(1.0, 2, 1e-2)
    assert r.epsilon_low <= exact <= r.epsilon_high
    assert r.epsilon_high - r.epsilon_low < 0.3
    assert not r.epsilon_low <= _exact_epsilon(1.3, 2, 1e-2) <= r.epsilon_high  # wrong σ


def test_monte_carlo_interval_covers_dp_accounting_poisson_pld():
    r = monte_carlo_epsilon(
        noise_multiplier=1.0, steps=10, sampling="poisson", sampling_rate=0.2, delta=1e-2,
        key=jax.random.key(1), num_samples=20_000,
    )  # fmt: skip
    pld = PrivacyAccountant([ev.PoissonSampledGaussianEvent(1.0, 0.2, count=10)]).epsilon(1e-2)
    assert r.epsilon_low <= pld <= r.epsilon_high
    wrong = PrivacyAccountant([ev.PoissonSampledGaussianEvent(1.3, 0.2, count=10)]).epsilon(1e-2)
    assert not r.epsilon_low <= wrong <= r.epsilon_high


def _gaussian_epsilon(mu: float, delta: float) -> float:
    """ε(δ) of the Gaussian mechanism with Δ/σ = μ (Balle & Wang 2018, Theorem 8), its e^ε
    term in log space so that ε beyond 709 is reachable."""
    from scipy import special

    def gap(e):
        return special.ndtr(mu / 2 - e / mu) - math.exp(e + special.log_ndtr(-mu / 2 - e / mu))

    return optimize.brentq(lambda e: gap(e) - delta, 0.0, 10.0 * mu * mu)


def test_monte_carlo_interval_covers_an_epsilon_beyond_the_float64_exp_range():
    """σ = 0.02, t = 1 (one Gaussian release, μ = 50): ε(0.01) ≈ 1365 > 709, where e^ε
    overflows. The interval must still cover the closed form (it read [inf, inf]) and reject
    the ε of a wrong scale (σ = 0.025: ε ≈ 893)."""
    r = monte_carlo_epsilon(
        noise_multiplier=0.02, steps=1, steps_per_epoch=1, delta=1e-2,
        key=jax.random.key(0), num_samples=2000,
    )  # fmt: skip
    assert r.epsilon_low <= _gaussian_epsilon(50.0, 1e-2) <= r.epsilon_high < math.inf
    assert not r.epsilon_low <= _gaussian_epsilon(40.0, 1e-2) <= r.epsilon_high


def test_monte_carlo_is_reproducible_and_reports_its_sample_size():
    kw = dict(noise_multiplier=1.0, steps=3, steps_per_epoch=3, delta=0.05, num_samples=500)
    a = monte_carlo_epsilon(key=jax.random.key(3), **kw)
    assert a == monte_carlo_epsilon(key=jax.random.key(3), **kw)
    assert a.num_samples == 500 and a.confidence == 0.95 and a.sampling == "balls_in_bins"


@pytest.mark.parametrize(
    ("bad", "name"),
    [
        (dict(noise_multiplier=0.0), "noise_multiplier"),
        (dict(noise_multiplier=1e-200), "noise_multiplier"),  # infinite privacy losses
        (dict(steps=2**22, steps_per_epoch=2**22), "steps_per_epoch"),  # 32 MB per sample: hung
        (dict(steps=10**6, steps_per_epoch=10**6, num_samples=10**5), "num_samples"),
        (dict(delta=1.0), "delta"),
        (dict(num_samples=10), "num_samples"),
        (dict(confidence=1.0), "confidence"),
        (dict(steps_per_epoch=None), "steps_per_epoch"),
        (dict(sampling="shuffle"), "sampling"),
        (dict(sampling_rate=0.1), "sampling_rate"),
    ],
)
def test_monte_carlo_rejects_bad_input_by_name(bad, name):
    kw = dict(noise_multiplier=1.0, steps=2, steps_per_epoch=2, delta=0.01, num_samples=200)
    kw.update(bad)
    with pytest.raises(ValueError, match=name):
        monte_carlo_epsilon(key=jax.random.key(0), **kw)


@pytest.mark.slow
def test_monte_carlo_at_small_delta_against_poisson_pld_and_exact_epoch():
    r = monte_carlo_epsilon(
        noise_multiplier=2.0, steps=100, sampling="poisson", sampling_rate=0.05, delta=1e-5,
        key=jax.random.key(4), num_samples=1_000_000,
    )  # fmt: skip
    pld = PrivacyAccountant([ev.PoissonSampledGaussianEvent(2.0, 0.05, count=100)]).epsilon(1e-5)
    assert r.epsilon_low <= pld <= r.epsilon_high
    b = monte_carlo_epsilon(
        noise_multiplier=0.8, steps=3, steps_per_epoch=3, delta=1e-4,
        key=jax.random.key(5), num_samples=1_000_000,
    )  # fmt: skip
    assert b.epsilon_low <= _exact_epsilon(0.8, 3, 1e-4) <= b.epsilon_high
