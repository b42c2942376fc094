"""Type aliases used in dpjax's signatures."""

from __future__ import annotations

from typing import Any, TypeAlias

import jax

#: A pytree of arrays (parameters, gradients, a batch of data): any nesting of tuples, lists,
#: dicts, NamedTuples and registered nodes whose leaves are arrays.
PyTree: TypeAlias = Any

#: A JAX PRNG key: a typed key (``jax.random.key``) or a raw uint32[2] key
#: (``jax.random.PRNGKey``). Every random function takes one explicitly.
PRNGKey: TypeAlias = jax.Array

__all__ = ["PRNGKey", "PyTree"]
