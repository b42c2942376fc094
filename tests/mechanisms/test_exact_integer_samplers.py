"""The exact integer samplers (issue 26): realised laws, integer arithmetic, x64 off, porosity.

* the pmf of 2.5·10⁵ draws (10⁶ in the slow twins) equals the analysed pmf (Pearson
  chi-square, cells pooled to ≥ 5 expected, level 1e-4) and the same draws REJECT σ (or the
  Laplace scale) off by 5% (at 2.5·10⁵ draws the wrong laws' statistics are still hundreds of
  times the critical value);
* the two pieces of integer arithmetic that could go wrong are checked against Python's exact
  integers: the rejection zone of Bern(a/M) and the split of γ = d²·den/P into ⌊γ⌋ and
  the remainder (float32 estimate + wrapping 32-bit correction);
* with x64 off the samplers give bit-identical output (same key) to x64 on;
* porosity 0: every output of D is possible under D′.
"""

import importlib
import math
import os
import subprocess
import sys
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpjax import mechanisms as M
from dpjax.auditing import exact, porosity
from dpjax.mechanisms import _integer_noise as integer
from dpjax.mechanisms import discrete
from tests.helpers import assert_frequencies

N = 1_000_000  # the slow twins
N_DEFAULT = 250_000
discrete_gaussian = importlib.import_module("dpjax.mechanisms.discrete_gaussian")


def pooled(counts, probs, wrong):
    """Chi-square after pooling cells whose expected count is below 5 (in every law)."""
    counts, probs = np.asarray(counts, np.float64), np.asarray(probs, np.float64)
    n = counts.sum()
    small = probs * n < 5.0
    for w in wrong:
        small |= np.asarray(w) * n < 5.0

    def pool(x):
        x = np.asarray(x, np.float64)
        return np.append(x[~small], x[small].sum())

    assert_frequencies(pool(counts), pool(probs), wrong_probs=[pool(w) for w in wrong])


def dg_cells(sigma, top):
    """The exact law of N_ℤ(0, σ²) on −top … top with the two tails folded onto the ends."""
    law = np.asarray(exact.discrete_gaussian_law(0, sigma=sigma, low=-top, high=top))
    inner = law[1:-1].copy()
    inner[0] += law[0]
    inner[-1] += law[-1]
    return inner


@pytest.mark.parametrize(
    "sigma, n",
    [
        (Fraction(37, 10), N_DEFAULT),
        (1, N_DEFAULT),  # m = 1, the smallest σ
        pytest.param(Fraction(37, 10), N, marks=pytest.mark.slow),
        pytest.param(3, N, marks=pytest.mark.slow),
        pytest.param(40.5, N, marks=pytest.mark.slow),
    ],
)
def test_discrete_gaussian_realised_pmf_and_a_5_percent_wrong_sigma(key, sigma, n):
    # one call, n coordinates: the realised law against the analysed one, and against
    # σ·1.05 and σ·0.95 (which the same draws must reject)
    y = np.asarray(
        jax.jit(
            lambda k: M.discrete_gaussian(k, jnp.zeros(n, jnp.int32), sensitivity=1, sigma=sigma)
        )(key)
    )
    top = int(12 * float(sigma))
    counts = np.bincount(np.clip(y, -top, top) + top, minlength=2 * top + 1)
    law = dg_cells(sigma, top)
    wrong = [dg_cells(float(sigma) * f, top) for f in (1.05, 0.95)]
    pooled(counts, law, wrong)
    assert abs(y.mean()) < 5 * float(sigma) / math.sqrt(n)


def dl_cells(rate, top):
    r = math.exp(-rate)
    k = np.arange(-top, top + 1)
    law = (1 - r) / (1 + r) * r ** np.abs(k).astype(np.float64)
    law[0] += r ** (top + 1) / (1 + r)
    law[-1] += r ** (top + 1) / (1 + r)
    return law


@pytest.mark.parametrize("n", [N_DEFAULT, pytest.param(N, marks=pytest.mark.slow)])
def test_discrete_laplace_realised_pmf_and_a_5_percent_wrong_scale(key, n):
    # g = 1, Δ₁ = 1, one release of n coordinates: Δ_g = n + 1, so ε = 0.3(n + 1) gives the
    # rate a = ⌊0.3·2^30⌋/2^30 on i.i.d. coordinates (T mod S ≠ 0: the quotient/remainder
    # carry of CKS Algorithm 2 is exercised); far from the clamp B = 4096
    eps = 0.3 * (n + 1)
    kw = dict(sensitivity=1.0, epsilon=eps, bound=4096.0, granularity=1.0)
    rate = discrete.discrete_laplace_rate(
        sensitivity=1.0, epsilon=eps, granularity=1.0, num_coordinates=n
    )
    assert abs(float(rate) - 0.3) < 2.0**-29 and (2**30 % (rate * 2**30).numerator) != 0
    a = float(rate)
    y = np.asarray(jax.jit(lambda k: M.discrete_laplace(k, jnp.zeros(n, jnp.float32), **kw))(key))
    k = y.astype(np.int64)
    assert np.all(k == y)
    top = 80
    counts = np.bincount(np.clip(k, -top, top) + top, minlength=2 * top + 1)
    pooled(counts, dl_cells(a, top), [dl_cells(a / 1.05, top), dl_cells(a / 0.95, top)])


def test_bernoulli_rejection_zone_against_exact_integers():
    # Bern(a/M) keeps w < 2^32 − (2^32 mod M) and answers [w mod M < a]
    for m in (1, 2, 3, 7, 1000, 2**30 + 1, 2**31 - 1, 2**31):
        top = 2**32 - (2**32 % m)
        words = np.unique(
            np.clip(
                np.array([0, 1, m - 1, m, top - 2, top - 1, top, top + 1, 2**32 - 1]), 0, 2**32 - 1
            )
        ).astype(np.uint32)
        for a in sorted({0, 1, m // 2, m}):
            usable, bit = integer._bernoulli(
                jnp.asarray(words), jnp.asarray(a, jnp.uint32), jnp.asarray(m, jnp.uint32)
            )
            w = words.astype(np.int64)
            np.testing.assert_array_equal(np.asarray(usable), w < top, err_msg=str((m, a)))
            np.testing.assert_array_equal(np.asarray(bit), (w % m) < a, err_msg=str((m, a)))


@pytest.mark.parametrize(
    "square", [Fraction(9), Fraction(1369, 100), Fraction(2**28, 3), Fraction(2**28 - 1, 2**28 - 3)]
)
def test_gamma_split_against_exact_integers(square):
    # ⌊d²·den/P⌋ and d²·den mod P, P = 2·num, for d at every place the float estimate could
    # err: small d, random d, and d around the saturation threshold q ≈ 2^20
    proposal, accept = discrete_gaussian._sampler_parameters(square)
    num, den = square.numerator, square.denominator
    p = 2 * num
    d_sat = math.isqrt(2**20 * p // den)
    rng = np.random.default_rng(num % 1000)
    ds = set(range(0, 200)) | set(range(max(0, d_sat - 300), d_sat + 300))
    ds |= set(rng.integers(0, d_sat, 3000).tolist()) | {2**30 - 1, 2**29}
    ds = np.array(sorted(d for d in ds if d + accept.m < 2**30), dtype=np.int64)
    mags = ds + accept.m  # |Y| = m + d
    q, r = integer._split_gamma(jnp.asarray(mags, jnp.uint32), accept, proposal.cap)
    q, r = np.asarray(q).astype(np.int64), np.asarray(r).astype(np.int64)
    for d, qi, ri in zip(ds.tolist(), q.tolist(), r.tolist(), strict=True):
        true_q, true_r = divmod(d * d * den, p)
        if qi == 2**31:  # saturated: only where the true quotient is huge
            assert true_q >= 2**19, (d, true_q)
        else:
            assert (qi, ri) == (true_q, true_r), (d, qi, ri, true_q, true_r)
    assert np.any(q == 2**31) and np.any((q > 2**19) & (q < 2**31))


def test_timing_depends_on_the_key_only(key):
    # the loop's round count and the noise are functions of the key: two different inputs
    # with the same key get identical noise and the same number of rounds
    proposal, accept = discrete_gaussian._sampler_parameters(Fraction(25))
    n1, rounds1 = integer.integer_noise(key, (1000,), proposal, accept)
    n2, rounds2 = integer.integer_noise(key, (1000,), proposal, accept)
    assert int(rounds1) == int(rounds2) and np.array_equal(np.asarray(n1), np.asarray(n2))
    a = M.discrete_gaussian(key, jnp.zeros(1000, jnp.int32), sensitivity=1, sigma=5)
    b = M.discrete_gaussian(key, jnp.full(1000, 7, jnp.int32), sensitivity=1, sigma=5)
    np.testing.assert_array_equal(np.asarray(b) - np.asarray(a), 7)


X64_OFF = r"""
import jax, jax.numpy as jnp, numpy as np
from fractions import Fraction
from dpjax import mechanisms as M
assert not jax.config.read("jax_enable_x64")
key = jax.random.key(7)
g = M.discrete_gaussian(key, jnp.arange(64, dtype=jnp.int32), sensitivity=1, sigma=Fraction(37, 10))
l = M.discrete_laplace(key, jnp.zeros(64, jnp.float32), sensitivity=1.0, epsilon=0.5, bound=64.0,
                       granularity=1.0)
assert g.dtype == jnp.int32 and l.dtype == jnp.float32
print(" ".join(map(str, np.asarray(g).tolist())))
print(" ".join(map(str, np.asarray(l).astype(int).tolist())))
"""


@pytest.mark.slow  # an x64-off subprocess (~10 s)
def test_x64_off_gives_the_same_integers_as_x64_on():
    env = dict(os.environ, JAX_ENABLE_X64="0", JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", X64_OFF], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    g_off, l_off = ([int(v) for v in line.split()] for line in done.stdout.split("\n")[:2])
    key = jax.random.key(7)
    g_on = M.discrete_gaussian(
        key, jnp.arange(64, dtype=jnp.int32), sensitivity=1, sigma=Fraction(37, 10)
    )
    l_on = M.discrete_laplace(
        key, jnp.zeros(64, jnp.float32), sensitivity=1.0, epsilon=0.5, bound=64.0, granularity=1.0
    )
    assert g_off == np.asarray(g_on).tolist()
    assert l_off == np.asarray(l_on).astype(int).tolist()


def test_porosity_is_zero_for_both_integer_mechanisms(key):
    grid = dict(sensitivity=1.0, epsilon=1.0, bound=8.0, granularity=2.0**-6)
    result = porosity.discrete_laplace_porosity(f_d=0.0, f_dprime=1.0, **grid)
    assert result.fraction == 0.0 and result.outputs == 2 * 8 * 64 + 1
    result = porosity.discrete_gaussian_porosity(f_d=0, f_dprime=1, sigma=3)
    assert result.fraction == 0.0 and result.outputs == (122 + 121 + 1) + 2  # + 2 tail cells
    # the textbook float Gaussian at the same σ is porous (control: the test can fail)
    textbook = porosity.textbook_porosity(f_d=0.0, f_dprime=1.0, scale=3.0, noise="gaussian")
    assert textbook.fraction > 0.5
