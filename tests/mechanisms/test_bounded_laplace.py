import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, stats

from dpjax import mechanisms as M
from tests.helpers import assert_distribution

N = 100_000
L, U = 0.0, 10.0


def truncated_laplace_cdf(q, b, lo=L, hi=U):
    def cdf(x):
        f_lo = stats.laplace.cdf(lo, loc=q, scale=b)
        f_hi = stats.laplace.cdf(hi, loc=q, scale=b)
        return np.clip((stats.laplace.cdf(x, loc=q, scale=b) - f_lo) / (f_hi - f_lo), 0, 1)

    return cdf


def normaliser(q, b, lo=L, hi=U):
    """C_q by quadrature (independent of the closed form in the module)."""
    return integrate.quad(
        lambda v: stats.laplace.pdf(v, loc=q, scale=b), lo, hi, points=[q], epsabs=1e-13
    )[0]


def log_density(v, q, b, lo=L, hi=U):
    return stats.laplace.logpdf(v, loc=q, scale=b) - math.log(normaliser(q, b, lo, hi))


@pytest.mark.parametrize("q", [1.0, 9.5, 5.0])
def test_samples_follow_restricted_laplace(key, q):
    b = M.bounded_laplace_scale(sensitivity=1.0, epsilon=0.5, lower=L, upper=U)
    y = M.bounded_laplace(key, jnp.full(N, q), sensitivity=1.0, epsilon=0.5, lower=L, upper=U)
    y = np.asarray(y)
    assert y.min() >= L and y.max() <= U
    assert_distribution(
        y,
        truncated_laplace_cdf(q, b),
        wrong_cdfs=[truncated_laplace_cdf(q, 1.5 * b), truncated_laplace_cdf(q, b / 1.5)],
    )


def test_delta_c_matches_quadrature():
    for b in (0.3, 2.0, 50.0):
        ref = normaliser(L + 1.0, b) / normaliser(L, b)
        got = M.bounded_laplace_delta_c(b=b, sensitivity=1.0, lower=L, upper=U)
        assert got == pytest.approx(ref, rel=1e-9)


@pytest.mark.parametrize("eps, delta, sens", [(1.0, 0.0, 1.0), (0.5, 1e-3, 2.0), (0.1, 0.0, 0.5)])
def test_scale_is_smallest_solution_of_theorem_26(eps, delta, sens):
    b = M.bounded_laplace_scale(sensitivity=sens, epsilon=eps, lower=L, upper=U, delta=delta)

    def condition(b):
        dc = M.bounded_laplace_delta_c(b=b, sensitivity=sens, lower=L, upper=U)
        return b >= sens / (eps - math.log(dc) - math.log(1 - delta))

    assert condition(b)
    assert not condition(b * (1 - 1e-9))
    assert b > sens / (eps - math.log(1 - delta))  # the data-dependent normaliser costs noise


def hockey_stick(q, q2, b, eps):
    """sup_B P_q(B) − e^ε P_q2(B) = ∫ (p_q − e^ε p_q2)_+ on [L, U], by quadrature."""
    cq, cq2 = normaliser(q, b), normaliser(q2, b)

    def integrand(v):
        p = stats.laplace.pdf(v, loc=q, scale=b) / cq
        p2 = stats.laplace.pdf(v, loc=q2, scale=b) / cq2
        return max(p - math.exp(eps) * p2, 0.0)

    return integrate.quad(integrand, L, U, points=[q, q2], limit=200, epsabs=1e-12)[0]


@pytest.mark.parametrize("eps, delta", [(1.0, 0.0), (0.5, 0.05)])
def test_privacy_checked_independently(eps, delta):
    sens = 1.0
    b = M.bounded_laplace_scale(sensitivity=sens, epsilon=eps, lower=L, upper=U, delta=delta)
    worst = 0.0
    for q in np.linspace(L, U - sens, 7):
        for a, c in ((q, q + sens), (q + sens, q)):
            worst = max(worst, hockey_stick(a, c, b, eps))
    assert worst <= delta + 1e-9
    # pure-DP level: the log-density ratio at v = l between q = l and q' = l + Δ
    ratio = log_density(L, L, b) - log_density(L, L + sens, b)
    assert ratio == pytest.approx(
        M.bounded_laplace_epsilon(b=b, sensitivity=sens, lower=L, upper=U), rel=1e-9
    )
    assert ratio <= eps - math.log1p(-delta) + 1e-9


def test_plain_laplace_scale_is_not_private_when_bounded():
    # b = Δ/ε, the unbounded calibration, violates ε-DP once the density is restricted.
    eps, sens = 1.0, 1.0
    ratio = log_density(L, L, sens / eps) - log_density(L, L + sens, sens / eps)
    assert ratio > eps + 0.1
    assert hockey_stick(L, L + sens, sens / eps, eps) > 0.01


def test_out_of_domain_values_are_clipped(key):
    y = M.bounded_laplace(
        key, jnp.array([-5.0, 15.0]), sensitivity=1.0, epsilon=1.0, lower=L, upper=U
    )
    assert bool(jnp.all((y >= L) & (y <= U)))


def test_jit_and_vmap_match_eager(key):
    def f(k, v):
        return M.bounded_laplace(k, v, sensitivity=1.0, epsilon=1.0, lower=L, upper=U)

    v = jnp.array([0.0, 2.5, 10.0])
    np.testing.assert_allclose(f(key, v), jax.jit(f)(key, v), rtol=1e-12)
    keys = jax.random.split(key, 3)
    batched = jax.vmap(f, in_axes=(0, None))(keys, v)
    for i in range(3):
        np.testing.assert_allclose(batched[i], f(keys[i], v), rtol=1e-12)
    tree = {"a": jnp.ones(2), "b": jnp.float32(3.0)}
    out = f(key, tree)
    assert out["b"].dtype == jnp.float32


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(sensitivity=1.0, epsilon=1.0, lower=1.0, upper=1.0),
        dict(sensitivity=1.0, epsilon=1.0, lower=2.0, upper=1.0),
        dict(sensitivity=11.0, epsilon=1.0, lower=L, upper=U),
        dict(sensitivity=0.0, epsilon=1.0, lower=L, upper=U),
        dict(sensitivity=1.0, epsilon=0.0, lower=L, upper=U),
        dict(sensitivity=1.0, epsilon=1.0, lower=L, upper=U, delta=1.0),
        dict(sensitivity=1.0, epsilon=1.0, lower=L, upper=U, delta=-0.1),
        dict(sensitivity=1.0, epsilon=1.0, lower=-math.inf, upper=U),
    ],
)
def test_bad_inputs_raise(kwargs):
    with pytest.raises(ValueError, match="must be"):
        M.bounded_laplace_scale(**kwargs)


def test_support_ends_of_neighbours_agree_without_x64():
    # x64 off: the quantile is evaluated in float32 at a 64-bit CDF position. The ends of the
    # support (all-zero / all-one random words) of q = 0 and q′ = 0.1 (Δ = 0.1, ε = 1 on
    # [0, 10]) must leave at most e^ε·2⁻⁶⁵ real mass of q′ above q's top. Fails on the old
    # code: q's top was 2.5709 (float32 uniform 1 − 2⁻²³), leaving mass ≈ 1.5e-7.
    import os
    import subprocess
    import sys

    code = """
import jax, jax.numpy as jnp
from dpjax import mechanisms as M
from dpjax._random import constant_bits_key
assert not jax.config.jax_enable_x64
kw = dict(sensitivity=0.1, epsilon=1.0, lower=0.0, upper=10.0)
print(M.bounded_laplace_scale(**kw),
      float(M.bounded_laplace(constant_bits_key(0xFFFFFFFF), jnp.float32(0.0), **kw)))
"""
    env = dict(os.environ, JAX_ENABLE_X64="0", PYTHONPATH=os.getcwd())
    run = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    b, top = map(float, run.stdout.split())
    q2 = 0.1
    c = 1.0 - 0.5 * (math.exp(-q2 / b) + math.exp(-(10.0 - q2) / b))
    above = 0.5 * (math.exp(-(top - q2) / b) - math.exp(-(10.0 - q2) / b)) / c
    assert above <= math.exp(1.0) * 2.0**-65 * (1 + 1e-4), (top, above)
