import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from dpjax import mechanisms as M
from dpjax.mechanisms import gaussian, laplace
from tests.helpers import assert_distribution

N = 200_000


def laplace_cdf(b):
    return lambda x: stats.laplace.cdf(x, scale=b)


def normal_cdf(s):
    return lambda x: stats.norm.cdf(x, scale=s)


def test_laplace_distribution_and_wrong_scale(key):
    b = M.laplace_scale(sensitivity=2.0, epsilon=0.5)
    assert b == 4.0
    y = M.laplace(key, jnp.zeros(N), sensitivity=2.0, epsilon=0.5)
    assert_distribution(y, laplace_cdf(b), wrong_cdfs=[laplace_cdf(1.5 * b), laplace_cdf(b / 1.5)])


def test_gaussian_distribution_and_wrong_scale(key):
    s = M.gaussian_sigma(sensitivity=1.0, epsilon=1.0, delta=1e-5)
    y = M.gaussian(key, jnp.zeros(N), sensitivity=1.0, epsilon=1.0, delta=1e-5)
    assert_distribution(y, normal_cdf(s), wrong_cdfs=[normal_cdf(1.5 * s), normal_cdf(s / 1.5)])


def test_classic_formula_matches_lecture():
    # Lecture on properties of DP, the Gaussian mechanism:
    # sigma = Delta sqrt(2 ln(1.25/delta)) / eps
    s = M.gaussian_sigma(sensitivity=3.0, epsilon=0.5, delta=1e-5, calibration="classic")
    assert s == pytest.approx(3.0 * math.sqrt(2 * math.log(1.25e5)) / 0.5, rel=1e-12)


def test_classic_refuses_large_epsilon_and_names_alternative():
    with pytest.raises(ValueError, match="calibration='analytic'"):
        M.gaussian_sigma(sensitivity=1.0, epsilon=1.0, delta=1e-5, calibration="classic")


@pytest.mark.parametrize(
    "eps, delta",
    [(0.05, 1e-5), (0.5, 1e-6), (1.0, 1e-5), (4.0, 1e-8), (20.0, 1e-5)],
)
def test_analytic_sigma_is_tight(eps, delta):
    s = M.analytic_gaussian_sigma(sensitivity=1.0, epsilon=eps, delta=delta)
    # meets the exact condition (Balle & Wang Thm 8) and is minimal to 1e-9 relative
    assert M.gaussian_delta(sigma=s, sensitivity=1.0, epsilon=eps) <= delta
    assert M.gaussian_delta(sigma=s * (1 - 1e-9), sensitivity=1.0, epsilon=eps) > delta


def test_analytic_gaussian_independent_reference():
    # Independent check of Balle & Wang's privacy profile through the privacy loss random
    # variable: for N(0, s^2) vs N(1, s^2), L ~ N(m, 2m), m = 1/(2 s^2), and
    # delta(eps) = P[L > eps] - e^eps P[L' < -eps] (Balle & Wang 2018, Thm 5).
    s, eps = 2.0, 0.8
    m = 1.0 / (2 * s * s)
    ref = stats.norm.sf(eps, loc=m, scale=math.sqrt(2 * m)) - math.exp(eps) * stats.norm.cdf(
        -eps, loc=m, scale=math.sqrt(2 * m)
    )
    assert M.gaussian_delta(sigma=s, sensitivity=1.0, epsilon=eps) == pytest.approx(ref, rel=1e-10)


def test_analytic_below_classic_in_classic_range():
    for eps in (0.1, 0.5, 0.9):
        a = M.gaussian_sigma(sensitivity=1.0, epsilon=eps, delta=1e-5)
        c = M.gaussian_sigma(sensitivity=1.0, epsilon=eps, delta=1e-5, calibration="classic")
        assert a < c


def test_classic_gaussian_exact_epsilon_matches_literature():
    # literature §3.3: classical sigma at (1, 1e-5) = 4.845 has exact eps 0.751
    assert M.gaussian_epsilon(sigma=4.845, sensitivity=1.0, delta=1e-5) == pytest.approx(
        0.751, abs=1e-3
    )


def test_laplace_utility_functions():
    assert M.laplace_expected_l1_error(k=5, sensitivity=1.0, epsilon=0.5) == 10.0
    assert M.laplace_linf_tail_bound(k=10, sensitivity=1.0, epsilon=1.0, beta=0.1) == pytest.approx(
        math.log(100)
    )


def test_laplace_utility_empirical(key):
    k, eps = 4, 0.7
    y = M.laplace(key, jnp.zeros((20_000, k)), sensitivity=1.0, epsilon=eps)
    l1 = np.abs(np.asarray(y)).sum(axis=1)
    expected = M.laplace_expected_l1_error(k=k, sensitivity=1.0, epsilon=eps)
    assert abs(l1.mean() - expected) < 5 * l1.std() / math.sqrt(l1.size)
    t = M.laplace_linf_tail_bound(k=k, sensitivity=1.0, epsilon=eps, beta=0.05)
    assert (np.abs(np.asarray(y)).max(axis=1) >= t).mean() <= 0.05


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(sensitivity=1.0, epsilon=0.0),
        dict(sensitivity=1.0, epsilon=-1.0),
        dict(sensitivity=0.0, epsilon=1.0),
        dict(sensitivity=-1.0, epsilon=1.0),
    ],
)
def test_laplace_bad_inputs(kwargs, key):
    with pytest.raises(ValueError):
        M.laplace(key, 0.0, **kwargs)


@pytest.mark.parametrize("delta", [0.0, 1.0, -0.1, 1.5])
def test_gaussian_bad_delta(delta, key):
    with pytest.raises(ValueError, match="delta"):
        M.gaussian(key, 0.0, sensitivity=1.0, epsilon=1.0, delta=delta)


def test_pytree_noise_independent_per_leaf(key):
    tree = {"a": jnp.zeros(1000), "b": jnp.zeros(1000)}
    y = M.gaussian(key, tree, sensitivity=1.0, epsilon=1.0, delta=1e-5)
    assert not np.allclose(np.asarray(y["a"]), np.asarray(y["b"]))
    r = np.corrcoef(np.asarray(y["a"]), np.asarray(y["b"]))[0, 1]
    assert abs(r) < 5 / math.sqrt(1000)


def test_jit_and_vmap_match_eager(key):
    x = jnp.arange(3.0)
    f = lambda k, v: M.laplace(k, v, sensitivity=1.0, epsilon=1.0)  # noqa: E731
    eager = f(key, x)
    np.testing.assert_allclose(jax.jit(f)(key, x), eager, rtol=1e-12)
    keys = jax.random.split(key, 5)
    batched = jax.vmap(f, in_axes=(0, None))(keys, x)
    np.testing.assert_allclose(batched[2], f(keys[2], x), rtol=1e-12)
    g = lambda k, v: M.gaussian(k, v, sensitivity=1.0, epsilon=1.0, delta=1e-5)  # noqa: E731
    np.testing.assert_allclose(jax.jit(g)(key, x), g(key, x), rtol=1e-12)


def test_float32_input_keeps_dtype(key):
    y = M.laplace(key, jnp.zeros(3, dtype=jnp.float32), sensitivity=1.0, epsilon=1.0)
    assert y.dtype == jnp.float32


def _additive(name):
    if name == "laplace":
        return lambda k, v: M.laplace(k, v, sensitivity=1.0, epsilon=1.0)
    return lambda k, v: M.gaussian(k, v, sensitivity=1.0, epsilon=1.0, delta=1e-5)


@pytest.mark.parametrize("name", ["laplace", "gaussian"])
def test_concrete_non_finite_value_is_refused(key, name):
    # issue 13 finding 2: laplace(value=inf) released inf with no noise at all
    f = _additive(name)
    for bad in (
        jnp.inf,
        jnp.array([0.0, jnp.nan]),
        {"a": jnp.zeros(2), "b": jnp.array([-jnp.inf], jnp.float32)},
    ):
        with pytest.raises(ValueError, match="value must be finite"):
            f(key, bad)
    assert f(key, jnp.arange(3)).shape == (3,)  # integer input: nothing to check


@pytest.mark.parametrize("name", ["laplace", "gaussian"])
def test_traced_non_finite_value_is_zeroed_before_the_noise(key, name):
    # Same key (grey-box): the release on (inf, nan, -inf, 2) is the release on (0, 0, 0, 2),
    # so every coordinate is finite and carries its noise.
    f = jax.jit(_additive(name))
    got = np.asarray(f(key, jnp.array([jnp.inf, jnp.nan, -jnp.inf, 2.0])))
    ref = np.asarray(f(key, jnp.array([0.0, 0.0, 0.0, 2.0])))
    np.testing.assert_array_equal(got, ref)
    assert np.all(np.isfinite(got))
    batched = jax.jit(jax.vmap(_additive(name), in_axes=(0, None)))(
        jax.random.split(key, 3), jnp.array([jnp.nan, 1.0], jnp.float32)
    )
    assert batched.dtype == jnp.float32 and np.all(np.isfinite(np.asarray(batched)))


# ------------------------------------------------------------------------------------------------
# Issue 25's papercuts: each test attacks one fix and fails on the code before it.
# ------------------------------------------------------------------------------------------------

# ----------------------------------------------------------------------------- huge sensitivity


@pytest.mark.parametrize(
    "mechanism, kwargs",
    [(gaussian, dict(delta=1e-5)), (laplace, {})],
)
@pytest.mark.parametrize("dtype, sensitivity", [(jnp.float32, 1e300), (jnp.float16, 1e4)])
def test_noise_that_overflows_the_value_dtype_is_refused(mechanism, kwargs, dtype, sensitivity):
    """Catches a sensitivity whose noise overflows the value dtype (inf release) being accepted."""
    value = jnp.zeros(3, dtype)
    with pytest.raises(ValueError, match=r"sensitivity must be at most .* value \+ noise overflow"):
        mechanism(jax.random.key(0), value, sensitivity=sensitivity, epsilon=1.0, **kwargs)


@pytest.mark.parametrize("mechanism, kwargs", [(gaussian, dict(delta=1e-5)), (laplace, {})])
def test_largest_admissible_sensitivity_releases_finite_noise(mechanism, kwargs):
    """Catches the sensitivity limit being too loose: just below it the release must be finite."""
    value = jnp.zeros(1000, jnp.float32)
    with pytest.raises(ValueError) as info:
        mechanism(jax.random.key(1), value, sensitivity=1e300, epsilon=1.0, **kwargs)
    limit = float(str(info.value).split("at most ")[1].split(" ")[0])
    out = mechanism(jax.random.key(1), value, sensitivity=0.99 * limit, epsilon=1.0, **kwargs)
    assert np.all(np.isfinite(np.asarray(out)))
    assert float(jnp.max(jnp.abs(out))) > 1e-3 * float(jnp.finfo(jnp.float32).max)


def test_value_near_dtype_max_counts_in_the_limit():
    """Catches the overflow limit ignoring the value's own magnitude near the dtype's max."""
    big = jnp.full(2, 3e38, jnp.float32)
    with pytest.raises(ValueError, match="sensitivity must be at most"):
        gaussian(jax.random.key(2), big, sensitivity=1e37, epsilon=1.0, delta=1e-5)
