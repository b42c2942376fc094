"""Audit F: floating-point porosity (Mironov 2012) of textbook Laplace vs the discrete option.

The enumeration of JAX's float32 noise values is checked against real draws (the control):
every sampled noise value is in the enumerated set, and the sampled fraction of D′ outputs
that are possible under D agrees with the exact count.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from dpjax import mechanisms
from dpjax.auditing import porosity

# rounding claims of compiled code: run on the users' -O3 code (tests/conftest.py)
pytestmark = pytest.mark.codegen

N = 100_000
GRID = dict(sensitivity=1.0, epsilon=1.0, bound=8.0, granularity=2.0**-6)


@pytest.fixture(scope="module")
def laplace_values():
    return porosity.textbook_laplace_float32_values()


def textbook_release(key, f, n, scale, noise, dtype):
    """f + scale·Z with the TEXTBOOK jax.random sampler (what porosity.py enumerates).

    The library's mechanisms draw from dpjax._random since issue 12 (a different, wider
    sampler), so the controls of the textbook enumeration sample jax.random directly.
    """
    sampler = jax.random.laplace if noise == "laplace" else jax.random.normal
    return jnp.full((n,), f, dtype) + jnp.asarray(scale, dtype) * sampler(key, (n,), dtype)


def test_enumeration_contains_every_sampled_laplace_value(laplace_values, key):
    assert laplace_values.size == 2**23
    z = jax.random.laplace(key, (N,), jnp.float32)
    assert np.isin(np.asarray(z), laplace_values).all()


def test_textbook_laplace_is_porous_and_the_exact_count_matches_sampling(laplace_values, key):
    # exact: fraction of float32 outputs on D = {0} impossible on D' = {1} at eps = 1
    result = porosity.textbook_laplace_porosity(f_d=0.0, f_dprime=1.0, scale=1.0)
    assert 0.85 < result.fraction < 0.95  # literature §4.3 measured 0.894
    # control by sampling the public mechanism on D: the same fraction is impossible on D'
    y_d = textbook_release(key, 0.0, N, 1.0, "laplace", jnp.float32)
    support_dprime = np.float32(1.0) + np.float32(1.0) * laplace_values
    sampled = porosity.impossible_fraction(np.asarray(y_d), support_dprime)
    tol = 5 * math.sqrt(result.fraction * (1 - result.fraction) / N)
    assert abs(sampled - result.fraction) < tol
    # and outputs on D' are always possible on D' (the enumeration misses nothing)
    y_dp = textbook_release(key, 1.0, N, 1.0, "laplace", jnp.float32)
    assert porosity.impossible_fraction(np.asarray(y_dp), support_dprime) == 0.0


def test_discrete_laplace_is_not_porous(key):
    result = porosity.discrete_laplace_porosity(f_d=0.0, f_dprime=1.0, **GRID)
    assert result.fraction == 0.0
    assert result.outputs == 2 * 8 * 64 + 1  # every grid point in [-B, B] is attainable
    support = porosity.discrete_laplace_support(f=1.0, **GRID)
    # N independent scalar releases (a length-N vector would be ONE release of d = N coordinates)
    y = jax.vmap(lambda k: mechanisms.discrete_laplace(k, jnp.float32(0.0), **GRID))(
        jax.random.split(key, N)
    )
    assert np.isin(np.asarray(y), support).all()


def _discrete_laplace_pmf(k, r):
    return (1 - r) / (1 + r) * r ** np.abs(k)


def test_discrete_laplace_distribution_and_wrong_scale(key):
    # f = 0 far from the clamp at +-8: output/g is discrete Laplace with r = exp(-eps g/Delta_g)
    g = GRID["granularity"]
    delta_g = g * (math.floor(1.0 / g) + 1)
    r = math.exp(-1.0 * g / delta_g)
    y = jax.vmap(lambda k: mechanisms.discrete_laplace(k, jnp.float64(0.0), **GRID))(
        jax.random.split(key, N)
    )
    k = np.round(np.asarray(y) / g).astype(np.int64)
    assert np.all(k * g == np.asarray(y))  # exactly on the grid
    edges = np.arange(-300, 301, 20)
    observed = np.histogram(k, bins=np.append(edges, 10**6) - 0.5)[0][:-1]

    def chi2(r_ref):
        cells = np.arange(-300, 300)
        p = np.add.reduceat(_discrete_laplace_pmf(cells, r_ref), np.arange(0, 600, 20))
        expected = N * p
        return float(np.sum((observed - expected) ** 2 / expected)), len(p) - 1

    stat, dof = chi2(r)
    crit = stats.chi2.isf(1e-4, dof)
    assert stat < crit
    wrong_r = math.exp(-1.0 * g / delta_g / 1.5)  # noise scale x1.5
    assert chi2(wrong_r)[0] > crit


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(GRID, granularity=0.01), "granularity"),
        (dict(GRID, bound=2.0**30), "bound"),
        (dict(GRID, epsilon=0.0), "epsilon"),
        (dict(GRID, sensitivity=-1.0), "sensitivity"),
        (dict(GRID, granularity=2.0**-20), "granularity"),  # float32 cannot resolve it
    ],
)
def test_discrete_laplace_bad_arguments(kwargs, match, key):
    with pytest.raises(ValueError, match=match):
        mechanisms.discrete_laplace(key, jnp.zeros(3, jnp.float32), **kwargs)


@pytest.mark.slow
@pytest.mark.parametrize("epsilon", [0.1, 2.0])
def test_textbook_laplace_porosity_other_epsilons(epsilon):
    result = porosity.textbook_laplace_porosity(f_d=0.0, f_dprime=1.0, scale=1.0 / epsilon)
    assert 0.85 < result.fraction < 0.95  # literature §4.3: 0.905 (0.1), 0.910 (2)


def test_textbook_gaussian_float32_is_porous(key):
    z = porosity.textbook_noise_float32_values("gaussian")
    assert np.isin(np.asarray(jax.random.normal(key, (N,), jnp.float32)), z).all()  # control
    sigma = mechanisms.classic_gaussian_sigma(sensitivity=1.0, epsilon=0.5, delta=1e-5)
    result = porosity.textbook_porosity(f_d=0.0, f_dprime=1.0, scale=sigma, noise="gaussian")
    assert 0.85 < result.fraction < 0.95


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_textbook_float64_is_still_porous(noise, key):
    # exact membership by binary search over the 2^52 uniform mantissas; controls: outputs drawn
    # under f are all attainable under f (the search and the float replay are faithful)
    n = 2000
    k_d, k_dp = jax.random.split(key)
    if noise == "laplace":
        scale = 1.0
    else:
        scale = mechanisms.gaussian_sigma(sensitivity=1.0, epsilon=1.0, delta=1e-5)
    y_d = textbook_release(k_d, 0.0, n, scale, noise, jnp.float64)
    y_dp = textbook_release(k_dp, 1.0, n, scale, noise, jnp.float64)
    assert porosity.attainable_float64(y_dp, f=1.0, scale=scale, noise=noise).all()
    assert porosity.attainable_float64(y_d, f=0.0, scale=scale, noise=noise).all()
    impossible = 1.0 - porosity.attainable_float64(y_d, f=1.0, scale=scale, noise=noise).mean()
    assert 0.85 < impossible < 0.95  # literature §4.3: 0.899 for Laplace at eps = 1
