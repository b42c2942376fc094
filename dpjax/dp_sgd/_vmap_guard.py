"""Refuse a noise update batched by a ``jax.vmap`` that its noise key is not batched by.

Inside ``jax.vmap(tx.update, in_axes=(0, None, None))`` over per-example gradients every row
looks like params, so the shape check passes, and the (unbatched) key draws ONE noise vector
that is added to every row: the rows' differences are noise-free (review finding). A vmap over
independent runs is legitimate: there the state, hence the key, is batched too.

The guard is the shared one of :mod:`dpjax._vmap_guard` (a ``custom_vmap`` identity on the key
data, checked at every vmap level; its docstring says what it sees and what it cannot), with
the noise transforms' messages: the ``updates`` are the values, the noise ``state`` holds the
key. A vmap that batches updates AND keys with a repeated key raises eagerly; under ``jit`` the
rows' noisy updates are replaced by NaN (:func:`void_unless`).
"""

from __future__ import annotations

from typing import Any

import jax

from dpjax._vmap_guard import Refusal, key_guard, void_unless

__all__ = ["guard_key", "void_unless"]

_UNMATCHED = Refusal(
    "updates",
    "updates batched by a vmap the noise key is not",
    "the clipped SUM of one run (shaped like params): these updates are batched by a jax.vmap "
    "that the noise state is not batched by (e.g. jax.vmap(tx.update, in_axes=(0, None, "
    "None)) over per-example gradients), so one noise draw would be added to every row and "
    "the rows' differences released noise-free; clip and sum first (dpjax.clipped_grad), or, "
    "to vmap over independent runs, batch the noise state too (one distinct key per run)",
)
_REPEATED = Refusal(
    "state",
    "a vmapped batch of noise states with repeated keys",
    "a batch of noise states with distinct keys (one per independent run): rows of this vmap "
    "share a key, so they get the same noise draw and their differences are released "
    "noise-free; build each run's state from its own key",
)

_guard = key_guard(unmatched=_UNMATCHED, repeated=_REPEATED)


def guard_key(updates: Any, key_data: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(key_data, ok)``: the key data unchanged, checked against the vmaps of ``updates``.

    Args:
        updates: the update tree of a noise transform.
        key_data: the noise state's raw key data.

    Returns:
        ``key_data`` unchanged and a bool scalar ``ok`` (False only under ``jit`` when a vmap
        batches ``updates`` and the keys with repeated keys: :func:`void_unless` then voids).

    Raises:
        ValueError: (naming ``updates``) a vmap batches ``updates`` but not the key;
            (naming ``state``) eagerly, a vmap batches both with a repeated key.
    """
    return _guard(updates, key_data)
