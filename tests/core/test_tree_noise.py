"""The shared noise path: per-leaf and flat i.i.d. draws."""

import math

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

from dpjax import _noise
from tests.helpers import assert_distribution


def _tree():
    return {
        "w": jnp.zeros((300, 200), jnp.float32),
        "b": jnp.zeros((200,), jnp.float32),
        "v": jnp.zeros((50_000,), jnp.float64),
    }


def test_iid_noise_shapes_dtypes_and_law(key):
    noise = _noise.tree_iid_noise_like(key, _tree(), jax.random.normal)
    assert noise["w"].shape == (300, 200) and noise["w"].dtype == jnp.float32
    assert noise["v"].dtype == jnp.float64
    both = np.concatenate([np.ravel(noise["w"]), np.ravel(noise["b"])])
    for sample in (both, np.asarray(noise["v"])):
        assert_distribution(
            sample,
            stats.norm.cdf,
            wrong_cdfs=[lambda x: stats.norm.cdf(x / 1.5), lambda x: stats.norm.cdf(x * 1.5)],
        )


def test_iid_noise_leaves_are_not_copies_and_uncorrelated(key):
    tree = {"a": jnp.zeros(4000), "b": jnp.zeros(4000)}
    noise = _noise.tree_iid_noise_like(key, tree, jax.random.normal)
    a, b = np.asarray(noise["a"]), np.asarray(noise["b"])
    assert not np.allclose(a, b)
    assert abs(np.corrcoef(a, b)[0, 1]) < 5 / math.sqrt(a.size)


def test_iid_noise_fresh_per_key_and_jit_matches_eager(key):
    k1, k2 = jax.random.split(key)
    tree = {"a": jnp.zeros(100)}
    n1 = _noise.tree_iid_noise_like(k1, tree, jax.random.normal)["a"]
    n2 = _noise.tree_iid_noise_like(k2, tree, jax.random.normal)["a"]
    assert not np.allclose(n1, n2)
    jitted = jax.jit(lambda k, t: _noise.tree_add_iid_noise(k, t, jax.random.normal, 2.0))
    np.testing.assert_allclose(
        jitted(k1, tree)["a"],
        _noise.tree_add_iid_noise(k1, tree, jax.random.normal, 2.0)["a"],
        rtol=1e-12,
    )
    np.testing.assert_allclose(jitted(k1, tree)["a"], 2.0 * n1, rtol=1e-12)
