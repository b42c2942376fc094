"""The non-finite rule of dpjax's mechanisms, written once.

A NaN or ±inf input has no bounded sensitivity, and a release that is NaN on D and finite on
D′ (or that ignores the noise, like ``inf + noise``) distinguishes them with probability 1.
Every mechanism that calls these helpers applies one data-independent rule:

* **concrete input** (a value known when the mechanism is called: an eager call, or a
  constant closed over inside ``jit``/``vmap``, which then raises at trace time): a
  non-finite entry is a caller bug and raises ``ValueError`` naming the argument;
* **traced input** (inside ``jit``/``vmap``, where values are unknown): non-finite entries are
  mapped to a fixed value *before* the sensitivity-bounded step — 0 for additive noise
  (:func:`zero_nonfinite`), the lowest finite score for score vectors
  (:func:`sanitise_scores`) — so the output is always a noisy release, never inf/NaN.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dpjax import _validate

__all__ = ["refuse_nonfinite", "zero_nonfinite", "sanitise_scores"]


def _is_inexact(x: Any) -> bool:
    return bool(jnp.issubdtype(jnp.result_type(x), jnp.inexact))


#: The words that mark this refusal in an error (see :func:`dpjax.tuning.private_selection`).
REFUSAL_PHRASE = "must be finite in every entry (NaN/inf have unbounded sensitivity)"


def refuse_nonfinite(name: str, tree: Any) -> None:
    """Raise ``ValueError`` if a concrete floating leaf of ``tree`` has a NaN or ±inf entry.

    The check runs in numpy on the concrete array, so it is also correct when the array is a
    constant closed over by a function that an outer ``jit``/``vmap`` is tracing (``jnp`` on it
    would give a tracer there). The message is data-free: it names the argument and the valid
    range, never how many entries are bad or their values (private data must not leave through
    an exception message).
    """
    for leaf in jax.tree.leaves(tree):
        if not _validate.is_concrete(leaf) or not _is_inexact(leaf):
            continue
        values = np.asarray(leaf).ravel()  # numpy: also correct while an outer jit traces
        if not np.all(np.isfinite(values)):
            raise ValueError(
                f"{name} {REFUSAL_PHRASE}; "
                "got an array with non-finite entries (their number and values are not shown)"
            )


def zero_nonfinite(name: str, tree: Any) -> Any:
    """The rule for additive noise: refuse concrete non-finite input; traced → 0 there."""
    refuse_nonfinite(name, tree)

    def zero(leaf: Any) -> Any:
        if _validate.is_concrete(leaf) or not _is_inexact(leaf):
            return leaf
        return jnp.where(jnp.isfinite(leaf), leaf, jnp.zeros_like(leaf))

    return jax.tree.map(zero, tree)


def sanitise_scores(scores: jax.Array) -> jax.Array:
    """The rule for score vectors (last axis = candidates), for concrete and traced input.

    NaN → the lowest finite score of its row; +inf / −inf → the highest / lowest finite score
    of its row (clipping to the finite range); a row with no finite score → all zeros
    (uniform selection). It is the identity on rows whose scores are all finite.
    """
    finite = jnp.isfinite(scores)
    big = jnp.asarray(jnp.finfo(scores.dtype).max, scores.dtype)
    zero = jnp.zeros((), scores.dtype)
    any_finite = jnp.any(finite, axis=-1, keepdims=True)
    low = jnp.min(jnp.where(finite, scores, big), axis=-1, keepdims=True)
    high = jnp.max(jnp.where(finite, scores, -big), axis=-1, keepdims=True)
    low = jnp.where(any_finite, low, zero)
    high = jnp.where(any_finite, high, zero)
    return jnp.where(jnp.isnan(scores), low, jnp.clip(scores, low, high))
