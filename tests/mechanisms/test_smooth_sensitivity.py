import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, stats

from dpjax import mechanisms as M
from tests.helpers import assert_distribution

# rounding claims of compiled code: run on the users' -O3 code (tests/conftest.py)
pytestmark = pytest.mark.codegen

N = 100_000


def smooth_sensitivity_reference(x, upper, beta):
    """Equation (4) of the lecture on smooth sensitivity (median), with plain loops.

    x_(i) = 0 for i <= 0 and Λ for i > n.
    """
    x = np.sort(np.asarray(x, dtype=np.float64))
    n = x.size
    m = (n + 1) // 2

    def order(i):
        return 0.0 if i <= 0 else (upper if i > n else x[i - 1])

    best = 0.0
    for k in range(n + 1):
        width = max(order(m + t) - order(m + t - k - 1) for t in range(k + 2))
        best = max(best, math.exp(-k * beta) * width)
    return best


def brute_force_smooth_sensitivity(n, upper, beta):
    """S*(x) = max_y LS(y) e^{-β d(x, y)} over all data sets in {0..Λ}^n (Definition 14)."""
    grid = np.array(list(itertools.product(range(upper + 1), repeat=n)), dtype=np.float64)
    m = (n + 1) // 2

    def median(d):
        return np.sort(d, axis=1)[:, m - 1]

    med = median(grid)
    local = np.zeros(len(grid))
    for i in range(n):
        for v in range(upper + 1):
            changed = grid.copy()
            changed[:, i] = v
            local = np.maximum(local, np.abs(median(changed) - med))
    distance = (grid[:, None, :] != grid[None, :, :]).sum(-1)
    smooth = np.max(local[None, :] * np.exp(-beta * distance), axis=1)
    return grid, local, smooth


@pytest.mark.parametrize("n", [5, 4])
def test_smooth_sensitivity_matches_brute_force_definition(n):
    upper, beta = 3, 0.4
    grid, local, smooth = brute_force_smooth_sensitivity(n, upper, beta)
    data = jnp.asarray(grid)
    got_smooth = jax.vmap(lambda d: M.smooth_sensitivity_median(d, upper=upper, beta=beta))(data)
    got_local = jax.vmap(lambda d: M.local_sensitivity_median(d, upper=upper))(data)
    np.testing.assert_allclose(np.asarray(got_local), local, atol=1e-12)
    np.testing.assert_allclose(np.asarray(got_smooth), smooth, rtol=1e-12, atol=1e-12)


def test_matches_equation_4_on_random_data():
    rng = np.random.default_rng(1)
    for n, beta in [(25, 0.05), (40, 0.3), (7, 2.0)]:
        x = rng.beta(2, 5, size=n) * 4.0
        got = float(M.smooth_sensitivity_median(jnp.asarray(x), upper=4.0, beta=beta))
        assert got == pytest.approx(smooth_sensitivity_reference(x, 4.0, beta), rel=1e-12)


def test_beta_smooth_upper_bound_on_random_neighbours():
    rng = np.random.default_rng(2)
    beta, upper, trials, n = 0.2, 1.0, 200, 21
    x = rng.uniform(0, upper, size=(trials, n))
    y = x.copy()
    rows = np.arange(trials)
    # replace one record by 0, by Λ, or by a fresh uniform value
    new_value = np.select(
        [rows % 3 == 0, rows % 3 == 1], [0.0, upper], rng.uniform(0, upper, size=trials)
    )
    y[rows, rng.integers(n, size=trials)] = new_value
    smooth = jax.jit(jax.vmap(lambda d: M.smooth_sensitivity_median(d, upper=upper, beta=beta)))
    local = jax.jit(jax.vmap(lambda d: M.local_sensitivity_median(d, upper=upper)))
    sx, sy = np.asarray(smooth(jnp.asarray(x))), np.asarray(smooth(jnp.asarray(y)))
    assert np.all(sx <= math.exp(beta) * sy * (1 + 1e-12))
    assert np.all(sy <= math.exp(beta) * sx * (1 + 1e-12))
    assert np.all(sx >= np.asarray(local(jnp.asarray(x))))


def example_12_datasets(n=11, upper=1.0):
    m = (n + 1) // 2
    d1 = np.r_[np.zeros(m), np.full(n - m, upper)]
    d2 = np.r_[np.zeros(m + 1), np.full(n - m - 1, upper)]
    return jnp.asarray(d1), jnp.asarray(d2)


def test_example_12_local_sensitivity_is_not_private(key):
    d1, d2 = example_12_datasets()
    assert int(jnp.sum(d1 != d2)) == 1  # neighbours under replace-one
    ls1 = float(M.local_sensitivity_median(d1, upper=1.0))
    ls2 = float(M.local_sensitivity_median(d2, upper=1.0))
    assert (ls1, ls2) == (1.0, 0.0)
    # "Laplace with the local sensitivity": median + (LS/ε)·Lap(1). On d2 the output is exactly
    # the median every time; on d1 never: P[out = 0] is 1 vs 0, so no (ε, δ < 1) holds.
    z = jax.random.laplace(key, (10_000,))
    out1 = np.asarray(jnp.median(d1) + ls1 * z)
    out2 = np.asarray(jnp.median(d2) + ls2 * z)
    assert np.mean(out2 == 0.0) == 1.0 and np.mean(out1 == 0.0) == 0.0
    # Smooth sensitivity repairs it: Λ and Λe^{-β}, within the factor e^β of each other.
    beta = 0.1
    s1 = float(M.smooth_sensitivity_median(d1, upper=1.0, beta=beta))
    s2 = float(M.smooth_sensitivity_median(d2, upper=1.0, beta=beta))
    assert s1 == pytest.approx(1.0) and s2 == pytest.approx(math.exp(-beta))
    out = M.smooth_median(key, d2, upper=1.0, epsilon=1.0, delta=1e-6, noise="laplace")
    assert float(out) != 0.0


def numerical_heavy_tailed_cdf(gamma):
    """CDF of density ∝ 1/(1+|z|^γ), integrated numerically (not via the Beta identity)."""
    total = integrate.quad(lambda z: 1.0 / (1.0 + z**gamma), 0, np.inf)[0]
    grid = np.r_[0.0, np.logspace(-6, 7, 200_001)]
    cumulative = integrate.cumulative_trapezoid(1.0 / (1.0 + grid**gamma), grid, initial=0.0)

    def cdf(x):
        x = np.asarray(x, dtype=np.float64)
        half = np.interp(np.abs(x), grid, cumulative, right=total) / total
        return 0.5 + 0.5 * np.sign(x) * half

    return cdf


@pytest.mark.parametrize("gamma", [2.0, 4.0])
def test_heavy_tailed_sampler_matches_numerical_cdf(key, gamma):
    z = M.heavy_tailed_noise(key, (N,), jnp.float64, gamma=gamma)
    cdf = numerical_heavy_tailed_cdf(gamma)
    if gamma == 2.0:  # Cauchy: an exact closed form for the integrated CDF too
        grid = np.linspace(-50, 50, 11)
        np.testing.assert_allclose(cdf(grid), stats.cauchy.cdf(grid), atol=1e-7)
    assert_distribution(
        z, cdf, wrong_cdfs=[lambda x: cdf(np.asarray(x) / 1.5), lambda x: cdf(np.asarray(x) * 1.5)]
    )


def test_noise_parameters_follow_the_notes():
    eps, delta, gamma = 0.8, 1e-6, 3.0
    heavy = M.smooth_noise_parameters(
        epsilon=eps, noise="heavy_tailed", gamma=gamma, recipe="lecture"
    )
    assert heavy.beta == pytest.approx(eps / (2 * (gamma + 1)))
    assert heavy.multiplier == pytest.approx(2 * (gamma + 1) / eps)
    lap = M.smooth_noise_parameters(epsilon=eps, delta=delta, noise="laplace")
    delta_prime = 2 * delta / (math.exp(eps / 2) + 1)
    assert lap.beta == pytest.approx(eps / (2 * math.log(2 / delta_prime)))
    assert lap.multiplier == pytest.approx(2 / eps)
    # Corollary 17: (δ'/2)(e^{ε/2} + 1) recovers δ
    assert M.smooth_laplace_delta(epsilon=eps, delta_prime=delta_prime) == pytest.approx(delta)
    gauss = M.smooth_noise_parameters(epsilon=eps, delta=delta, noise="gaussian")
    assert gauss.beta == pytest.approx(eps / (2 * math.log(2 / delta)))
    assert gauss.multiplier == pytest.approx(5 * math.sqrt(2 * math.log(2 / delta)) / eps)


@pytest.mark.parametrize(
    "noise, cdf",
    [
        ("laplace", lambda x, s: stats.laplace.cdf(x, scale=s)),
        ("gaussian", lambda x, s: stats.norm.cdf(x, scale=s)),
    ],
)
def test_smooth_median_noise_scale(key, noise, cdf):
    rng = np.random.default_rng(3)
    data = rng.beta(2, 2, size=31)
    eps, delta = 1.0, 1e-4
    params = M.smooth_noise_parameters(epsilon=eps, delta=delta, noise=noise)
    s = params.multiplier * smooth_sensitivity_reference(data, 1.0, params.beta)
    keys = jax.random.split(key, 50_000)
    release = jax.jit(
        jax.vmap(
            lambda k: M.smooth_median(
                k, jnp.asarray(data), upper=1.0, epsilon=eps, delta=delta, noise=noise
            )
        )
    )(keys)
    noise_draws = np.asarray(release) - np.sort(data)[15]
    assert_distribution(
        noise_draws,
        lambda x: cdf(x, s),
        wrong_cdfs=[lambda x: cdf(x, 1.5 * s), lambda x: cdf(x, s / 1.5)],
    )


@pytest.mark.slow  # default-run budget; CI runs it in make test-slow
def test_jit_and_vmap_match_eager(key):
    data = jnp.linspace(0.0, 2.0, 15)

    def heavy(k, d):
        return M.smooth_median(k, d, upper=2.0, epsilon=1.0, gamma=3.0)

    def gauss(k, d):
        return M.smooth_median(k, d, upper=2.0, epsilon=1.0, delta=1e-6, noise="gaussian")

    assert float(heavy(key, data)) == pytest.approx(float(jax.jit(heavy)(key, data)), rel=1e-12)
    keys = jax.random.split(key, 3)
    batched = jax.vmap(gauss, in_axes=(0, None))(keys, data)
    for i in range(3):
        assert float(batched[i]) == pytest.approx(float(gauss(keys[i], data)), rel=1e-12)


@pytest.mark.parametrize(
    "call",
    [
        lambda: M.smooth_sensitivity_median(jnp.array([0.5, 1.5]), upper=1.0, beta=0.1),
        lambda: M.smooth_sensitivity_median(jnp.array([-0.1, 0.5]), upper=1.0, beta=0.1),
        lambda: M.smooth_sensitivity_median(jnp.zeros((0,)), upper=1.0, beta=0.1),
        lambda: M.smooth_sensitivity_median(jnp.zeros((2, 2)), upper=1.0, beta=0.1),
        lambda: M.smooth_sensitivity_median(jnp.zeros(3), upper=0.0, beta=0.1),
        lambda: M.smooth_sensitivity_median(jnp.zeros(3), upper=1.0, beta=0.0),
        lambda: M.smooth_noise_parameters(epsilon=0.0),
        lambda: M.smooth_noise_parameters(epsilon=1.0, gamma=1.0),
        lambda: M.smooth_noise_parameters(epsilon=1.0, noise="laplace"),
        lambda: M.smooth_noise_parameters(epsilon=1.0, delta=1.0, noise="gaussian"),
        lambda: M.smooth_noise_parameters(epsilon=1.0, noise="cauchy"),
        lambda: M.smooth_median(jax.random.key(0), jnp.array([2.0]), upper=1.0, epsilon=1.0),
    ],
)
def test_bad_inputs_raise(call):
    with pytest.raises(ValueError, match="must be"):
        call()


def neighbour_pairs():
    """Example 12's pair and random replace-one neighbours (n = 11, Λ = 1)."""
    d1, d2 = example_12_datasets()
    pairs = [(np.asarray(d1), np.asarray(d2))]
    rng = np.random.default_rng(4)
    for i in range(6):
        x = rng.uniform(0, 1, size=11)
        y = x.copy()
        y[rng.integers(11)] = [0.0, 1.0, rng.uniform()][i % 3]
        pairs.append((x, y))
    return pairs + [(y, x) for x, y in pairs]


def release_law(data, params):
    """(centre, scale) of the release: median + multiplier · S_β · Z."""
    s = smooth_sensitivity_reference(data, 1.0, params.beta)
    return np.sort(data)[(len(data) + 1) // 2 - 1], params.multiplier * s


def test_heavy_tailed_recipe_is_pure_dp_on_neighbours():
    # sup_v |log p_x(v) − log p_y(v)| ≤ ε, checked on a wide grid (independent of the theory)
    eps, gamma = 1.0, 3.0
    params = M.smooth_noise_parameters(epsilon=eps, noise="heavy_tailed", gamma=gamma)
    v = np.r_[-np.logspace(6, -6, 2000), 0.0, np.logspace(-6, 6, 2000)]
    v = np.unique(np.r_[v, np.linspace(-3, 3, 20_001)])

    def log_density(mu, c):
        return -np.log1p(np.abs((v - mu) / c) ** gamma) - np.log(c)

    worst = 0.0
    for x, y in neighbour_pairs():
        (mx, cx), (my, cy) = release_law(x, params), release_law(y, params)
        worst = max(worst, np.max(np.abs(log_density(mx, cx) - log_density(my, cy))))
    assert worst <= eps


@pytest.mark.parametrize("noise, law", [("laplace", stats.laplace), ("gaussian", stats.norm)])
def test_approximate_recipes_meet_delta_on_neighbours(noise, law):
    # hockey-stick divergence ∫ (p_x − e^ε p_y)_+ by quadrature, for every neighbour pair
    eps, delta = 1.0, 1e-3
    params = M.smooth_noise_parameters(epsilon=eps, delta=delta, noise=noise)
    worst = 0.0
    for x, y in neighbour_pairs():
        (mx, cx), (my, cy) = release_law(x, params), release_law(y, params)

        def integrand(v, mx=mx, cx=cx, my=my, cy=cy):
            return max(law.pdf(v, mx, cx) - math.exp(eps) * law.pdf(v, my, cy), 0.0)

        span = 60 * max(cx, cy)
        div = integrate.quad(integrand, mx - span, mx + span, points=[mx, my], limit=400)[0]
        worst = max(worst, div)
    assert worst <= delta


def test_default_cauchy_release_has_the_tight_scale(key):
    # γ = 2: ε(α, β) = √(α² + β²), so the tight recipe is α = β = ε/√2: noise (√2/ε)·S_{ε/√2}·Z.
    rng = np.random.default_rng(9)
    data = rng.beta(2, 2, size=31)
    eps = 1.0
    beta = eps / math.sqrt(2.0)
    scale = math.sqrt(2.0) / eps * smooth_sensitivity_reference(data, 1.0, beta)
    keys = jax.random.split(key, 50_000)
    release = jax.jit(
        jax.vmap(lambda k: M.smooth_median(k, jnp.asarray(data), upper=1.0, epsilon=eps, gamma=2.0))
    )(keys)
    noise_draws = np.asarray(release) - np.sort(data)[15]

    def cdf(s):
        return lambda x: stats.cauchy.cdf(x, scale=s)

    assert_distribution(noise_draws, cdf(scale), wrong_cdfs=[cdf(1.5 * scale), cdf(scale / 1.5)])


def test_float32_collapse_case_keeps_noise_without_x64():
    # x64 off (S_β computed in float32): 1001 records, 910 zeros, rest Λ = 1, default recipe.
    # Fails on the old code: S_β underflowed to 0 and every release was exactly the median.
    import os
    import subprocess
    import sys

    code = """
import jax, jax.numpy as jnp, numpy as np
from dpjax import mechanisms as M
assert not jax.config.jax_enable_x64
x = jnp.asarray(np.r_[np.zeros(910), np.ones(91)], jnp.float32)
p = M.smooth_noise_parameters(epsilon=1.0)
s = float(M.smooth_sensitivity_median(x, upper=1.0, beta=p.beta))
f = jax.jit(jax.vmap(lambda k: M.smooth_median(k, x, upper=1.0, epsilon=1.0)))
out = np.asarray(f(jax.random.split(jax.random.key(0), 2000)))
print(s, float(np.mean(out != 0.0)))
"""
    env = dict(os.environ, JAX_ENABLE_X64="0", PYTHONPATH=os.getcwd())
    run = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    s, noisy = map(float, run.stdout.split())
    assert s > 0.0
    assert noisy >= 0.99  # in real numbers P[output ≠ median] = 1


def test_non_finite_refusal_message_is_data_free(key):
    # Fails on the old code: "an array with 2 non-finite entries (e.g. nan)" counted the
    # private records. The message names the argument and the valid range only.
    data = jnp.asarray([0.1, jnp.nan, jnp.inf, 0.3, 0.5])
    with pytest.raises(ValueError, match="data must be finite") as info:
        M.smooth_median(key, data, upper=1.0, epsilon=1.0)
    message = str(info.value)
    assert "2 non-finite" not in message and "e.g." not in message, message
    assert not any(ch.isdigit() for ch in message), message


def test_smooth_sensitivity_floor_keeps_it_smooth():
    # max(S, c) for S from the library on neighbouring 0/1 data sets around the underflow
    # point: LS ≤ S and S(x) ≤ e^β S(y) in both directions (float64, β = 2: S reaches e^-700).
    beta = 2.0
    values = []
    for zeros in range(849, 860):
        x = jnp.asarray(np.r_[np.zeros(zeros), np.ones(1001 - zeros)])
        values.append(float(M.smooth_sensitivity_median(x, upper=1.0, beta=beta)))
    for a, b in zip(values, values[1:], strict=False):
        assert 0.0 < a and 0.0 < b
        assert a <= math.exp(beta) * b * (1 + 1e-12) and b <= math.exp(beta) * a * (1 + 1e-12)


@pytest.mark.parametrize("noise", ["gaussian", "heavy_tailed"])
def test_float32_release_scale_is_never_below_multiplier_times_s(monkeypatch, noise):
    """x64 off: the scale handed to the noise is ≥ multiplier·S_β in exact rationals. The
    float32 product fl(fl(m)·S) was below m·S for about half of these data sets."""
    from fractions import Fraction

    import dpjax.mechanisms.smooth_sensitivity as ss

    scales = []
    real = ss.tree_add_noise
    monkeypatch.setattr(
        ss, "tree_add_noise", lambda k, v, smp, s: scales.append(s) or real(k, v, smp, s)
    )
    delta = 0.0 if noise == "heavy_tailed" else 1e-6
    p = M.smooth_noise_parameters(epsilon=1.0, delta=delta, noise=noise)
    below = 0
    with jax.enable_x64(False):
        for seed in range(2):
            x = jnp.asarray(np.random.default_rng(seed).uniform(size=51), jnp.float32)
            s = M.smooth_sensitivity_median(x, upper=1.0, beta=p.beta)
            M.smooth_median(jax.random.key(0), x, upper=1.0, epsilon=1.0, delta=delta, noise=noise)
            drawn = Fraction(float(np.asarray(scales[-1])))
            below += drawn < Fraction(p.multiplier) * Fraction(float(s))
    assert below == 0
