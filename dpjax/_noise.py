"""The one noise path: independent noise for every leaf of a pytree.

Every additive mechanism in dpjax (Laplace, Gaussian, the optax noise transforms) draws its
noise here, so that key handling is written once: the key is split into one subkey per leaf,
never reused, and the noise has the leaf's floating dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["float_dtype_of", "tree_noise_like", "tree_add_noise"]

Sampler = Callable[[jax.Array, tuple[int, ...], Any], jax.Array]


def float_dtype_of(x: Any) -> Any:
    """The floating dtype noise for ``x`` is drawn in (x's own, or JAX's default float)."""
    dtype = jnp.result_type(x)
    if jnp.issubdtype(dtype, jnp.floating):
        return dtype
    return jnp.result_type(float)


def tree_noise_like(key: jax.Array, tree: Any, sampler: Sampler) -> Any:
    """Draw ``sampler(subkey, shape, dtype)`` for every leaf, one fresh subkey per leaf."""
    leaves, treedef = jax.tree.flatten(tree)
    keys = jax.random.split(key, max(len(leaves), 1))
    noise = [
        sampler(k, jnp.shape(leaf), float_dtype_of(leaf))
        for k, leaf in zip(keys, leaves, strict=False)
    ]
    return jax.tree.unflatten(treedef, noise)


def tree_add_noise(key: jax.Array, tree: Any, sampler: Sampler, scale: Any) -> Any:
    """Return ``tree + scale * noise`` leaf by leaf (leaves are promoted to a float dtype)."""
    noise = tree_noise_like(key, tree, sampler)

    def add(leaf: Any, z: jax.Array) -> jax.Array:
        leaf = jnp.asarray(leaf, dtype=z.dtype)
        return leaf + jnp.asarray(scale, dtype=z.dtype) * z

    return jax.tree.map(add, tree, noise)
