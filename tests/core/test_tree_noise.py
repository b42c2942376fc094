"""The shared noise path: per-leaf and flat i.i.d. draws."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from dpjax import _noise
from tests.helpers import assert_distribution, float32_at_or_above


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


_SCALES = [0.7 * 1.1, 1.3, 1 / 3, 4.05 * 0.1, 7119.9, 1.5 * 2.0**-126, 2.0**-20 / 3, 1.0, 0.0]


def test_noise_scale_in_float32_is_the_smallest_float32_not_below_it():
    """Concrete (host) and traced float64 (in the graph) scales land on the smallest float32 ≥
    the charged float64 value; nearest rounding lands below for some of them."""
    want = np.array([float32_at_or_above(x) for x in _SCALES], np.float32)
    assert np.any(np.float32(_SCALES) < np.array(_SCALES))  # nearest would lose noise here
    host = np.array([_noise.scale_rounded_up(x, np.float32) for x in _SCALES])
    assert host.dtype == np.float32 and host.tobytes() == want.tobytes()
    traced = jax.jit(lambda s: _noise.scale_rounded_up(s, np.float32))(np.array(_SCALES))
    assert traced.dtype == jnp.float32 and np.asarray(traced).tobytes() == want.tobytes()


@pytest.mark.parametrize("sigma", [1.3, 0.7 * 1.1])
def test_float32_release_noise_is_the_rounded_up_scale_times_z(key, sigma):
    """With x64 off, value 0 + σ·Z is released as fl(s·Z) with s the smallest float32 ≥ σ."""
    with jax.enable_x64(False):
        zeros = {"w": jnp.zeros((5000,), jnp.float32)}
        z = _noise.tree_add_iid_noise(key, zeros, jax.random.normal, 1.0)["w"]
        got = _noise.tree_add_iid_noise(key, zeros, jax.random.normal, sigma)["w"]
    want = float32_at_or_above(sigma) * np.asarray(z)
    assert np.asarray(got).tobytes() == want.tobytes()
