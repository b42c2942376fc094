"""The sound samplers compile their word -> sample transform once (issue 15, compile time).

The inverse-normal chain of :func:`dpjax._random.normal` used to be fused by XLA into every
consumer of the draw: one copy per leaf slice of :func:`dpjax._noise.tree_iid_noise_like`'s
flat draw, so compile time grew with the number of leaves. Large draws now run the transform
in a loop over chunks (same values: tests/core/test_sampler_support.py,
tests/dp_sgd/test_noise_transforms.py).
"""

from __future__ import annotations

import collections
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend import core as jax_core

from dpjax import _noise, _random

SAMPLERS = (_random.normal, _random.laplace, _random.exponential, _random.gumbel)


def _multiplies(leaves: int, total: int) -> int:
    """Multiply ops in the optimised HLO of adding noise to ``leaves`` leaves of ``total``."""
    tree = [jnp.zeros((total // leaves,), jnp.float32) for _ in range(leaves)]
    compiled = (
        jax.jit(lambda key, t: _noise.tree_add_iid_noise(key, t, _random.normal, 1.0))
        .lower(jax.random.key(0), tree)
        .compile()
    )
    return len(re.findall(r" multiply\(", compiled.as_text()))


def test_inverse_normal_chain_is_compiled_once_for_many_leaves():
    # 24 leaves of 200 vs one leaf of 4800: the same program size for the noise. Before the
    # chunked transform the 24-leaf program had one copy of the rational chain per leaf.
    assert _multiplies(24, 4800) == _multiplies(1, 4800)


# Every sampler in float32 and the normal in float64 by default; the other float64 twins (the
# same chunking, a wider word) run in the slow suite.
_CHUNKED_CASES = [
    pytest.param(
        sampler,
        dtype,
        id=f"{np.dtype(dtype).name}-{sampler.__name__}",
        marks=pytest.mark.slow if dtype == np.float64 and sampler is not _random.normal else (),
    )
    for dtype in (np.float32, np.float64)
    for sampler in SAMPLERS
]


@pytest.mark.parametrize("sampler, dtype", _CHUNKED_CASES)
def test_chunked_draw_equals_unchunked_transform(sampler, dtype):
    # The chunked path (≥ _MIN_CHUNKED coordinates, padded last chunk) gives exactly the
    # transform of the same words applied in one piece under jit.
    key = jax.random.key(11)
    shape = (3, _random._MIN_CHUNKED + 5)
    transform = {
        _random.normal: _random._normal_of_words,
        _random.laplace: _random._laplace_of_words,
        _random.exponential: _random._exponential_of_words,
        _random.gumbel: _random._gumbel_of_words,
    }[sampler]

    @jax.jit
    def whole(key):
        if sampler is _random.normal and dtype == np.float32:  # one word a lane (issue 24)
            size = int(np.prod(shape))
            words = _random._normal32_words(key, size)
            return _random._normal32_of_words(*words).reshape(shape)
        hi, lo = jax.random.bits(key, (2, *shape), jnp.uint32)
        return transform(hi, lo, dtype)

    drawn = np.asarray(jax.jit(lambda k: sampler(k, shape, dtype))(key))
    assert drawn.shape == shape and drawn.dtype == dtype
    np.testing.assert_array_equal(drawn, np.asarray(whole(key)))


def test_large_draw_same_with_and_without_jit():
    # Eager and jitted draws of the same key agree bit for bit (before, eager evaluation of the
    # unfused chain rounded ~6% of float32 coordinates differently from the jitted one).
    key = jax.random.key(3)
    shape = (_random._MIN_CHUNKED * 3 + 1,)
    eager = np.asarray(_random.normal(key, shape, np.float32))
    jitted = np.asarray(jax.jit(lambda k: _random.normal(k, shape, np.float32))(key))
    np.testing.assert_array_equal(eager, jitted)


def _primitive_counts(fn, *args) -> collections.Counter:
    """How often each primitive occurs in ``fn``'s jaxpr, nested jaxprs (jit, loops) included."""
    counts: collections.Counter = collections.Counter()

    def walk(jaxpr) -> None:
        for eqn in jaxpr.eqns:
            counts[eqn.primitive.name] += 1
            for sub in jax_core.jaxprs_in_params(eqn.params):
                walk(sub)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return counts


@pytest.mark.parametrize("size", [1, 4096 * 3 + 5])
def test_float32_normal_compiles_one_generator_one_reduction_and_no_loop(size):
    # Issue 24 (compile time of the DP step): the float32 sampler's program is the part of the
    # noise that compiles. It draws its lane and tail words with ONE generator call (a key
    # split and two draws compiled three threefry loops), finds both tail-lane ends of every
    # block with ONE (variadic) reduction (jnp.min + jnp.max compiled six kernels) and has no
    # loop of its own (jax.scipy.special.ndtri compiled six polyval scans for the tail lanes).
    counts = _primitive_counts(lambda k: _random.normal(k, (size,), np.float32), jax.random.key(0))
    generators = {"random_bits", "random_split", "random_fold_in", "threefry2x32"}
    assert sum(counts[p] for p in generators) == 1, counts
    reductions = [p for p in counts if p.startswith("reduce") or p.startswith("argm")]
    assert sum(counts[p] for p in reductions) == 1, counts
    assert not {"scan", "while", "cond"} & set(counts), counts
