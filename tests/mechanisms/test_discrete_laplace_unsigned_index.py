"""discrete_laplace indexes an unsigned integer query the same way traced and concrete.

A traced uint32 value was clamped with ``jnp.clip(x, -limit, limit)``: the negative lower end
wraps to 2^32 − limit in uint32, so clip returned ``limit`` for EVERY input (uint32 1 was
released as 2 at bound 2.5, granularity 1/2, ε = 50). The concrete (host) path indexes the same
input correctly, so the two paths had different laws for the same input type. And a traced
integer was clamped to ±⌊half·g⌋ where the host clamps to ±half·g: int32 3 at bound 2.5,
granularity 1/2 had index 4 traced and 5 on the host.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpjax.mechanisms import discrete

VALUES = [0, 1, 2, 3, 1000, 2**31 + 5, 2**32 - 1]


@pytest.mark.parametrize("bound, granularity", [(2.5, 0.5), (1000.0, 1.0), (8.0, 2.0**-6)])
def test_traced_uint32_index_matches_the_host_index(bound, granularity):
    g, half = granularity, int(np.floor(bound / granularity))
    x = np.array(VALUES, np.uint32)
    # the index of the clamped value, in exact integer arithmetic (x ≥ 0, g a power of two)
    expected = np.array([min(int(v), half * g) / g for v in VALUES]).round().astype(np.int64)
    expected = np.minimum(expected, half)
    traced = jax.jit(
        lambda v: discrete._grid_index(
            discrete._exact_traced(v, jnp.float32, g=g, half=half), g=g, half=half
        )
    )(jnp.asarray(x))
    host = discrete._host_grid_index(x, g=g, half=half)
    np.testing.assert_array_equal(np.asarray(host), expected)
    np.testing.assert_array_equal(np.asarray(traced), expected)


def test_jitted_uint32_release_is_not_the_bound():
    """At ε = 50 the release is the value itself (noise 0 with probability 1 − 2e^{-25})."""
    kw = {"sensitivity": 1.0, "epsilon": 50.0, "bound": 1000.0, "granularity": 1.0}
    release = jax.jit(lambda k, v: discrete.discrete_laplace(k, v, **kw))
    for value in (1, 7, 300):
        got = release(jax.random.key(value), jnp.uint32(value))
        assert float(got) == float(value), (value, float(got))


@pytest.mark.parametrize("dtype", [np.int32, np.int8, np.uint8, np.uint32])
def test_traced_and_host_index_agree_when_the_bound_is_not_an_integer(dtype):
    g, half = 0.5, 5  # bound 2.5: half·g = 2.5 is on the grid but not an integer
    values = [0, 1, 2, 3, 4, 100] + (
        [-1, -2, -3, -100] if np.issubdtype(dtype, np.signedinteger) else []
    )
    x = np.array(values, dtype)
    traced = jax.jit(
        lambda v: discrete._grid_index(
            discrete._exact_traced(v, jnp.float32, g=g, half=half), g=g, half=half
        )
    )(jnp.asarray(x))
    expected = np.clip(np.array(values) * 2, -half, half)  # v/g, clamped to ±half
    np.testing.assert_array_equal(
        np.asarray(discrete._host_grid_index(x, g=g, half=half)), expected
    )
    np.testing.assert_array_equal(np.asarray(traced), expected)
