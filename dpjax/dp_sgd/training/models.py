"""Per-example losses for :func:`~dpjax.make_private` from model libraries: flax nnx.

:func:`nnx_loss` splits an ``nnx.Module`` into the parameters DP-SGD differentiates and the
rest (RNG streams reseeded per example, other variables constant), and refuses a BatchNorm in
training mode (it mixes the examples of a batch).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from dpjax import _validate

__all__ = ["nnx_loss"]


def nnx_loss(model: Any, loss: Callable[[Any, Any], jax.Array]) -> tuple[Callable, Any]:
    """A ``loss_fn(params, example, rng)`` for :func:`make_private` from a flax nnx Module.

    The module is split once (``nnx.split(model, nnx.Param, nnx.RngKey, ...)``): the
    ``nnx.Param`` state is what DP-SGD differentiates and updates; RNG keys, RNG counters and
    other variables (e.g. batch statistics) are NOT differentiated. Inside ``loss_fn`` a fresh
    module is merged in the current trace (so no ``TraceContextError``), and every RNG stream
    (e.g. Dropout's) is reseeded from the per-example ``rng``, so each example of each step gets
    its own dropout mask. No uint32/key leaf reaches ``jax.grad`` (no float0 errors).

    After training, ``nnx.update(model, params)`` writes the parameters back; call
    ``model.eval()`` for deterministic evaluation. Non-parameter variables are constants here
    (batch statistics are not updated): use LayerNorm/GroupNorm — BatchNorm mixes the examples
    of a batch, which per-example clipping cannot bound, and on the ONE example the loss sees
    it outputs 0, so a BatchNorm in training mode is refused (``ValueError``).

    Args:
        model: an ``nnx.Module`` (in training mode: Dropout not deterministic).
        loss: ``loss(module, example) -> scalar``, the loss of ONE example.

    Returns:
        ``(loss_fn, params)``: the per-example loss for :func:`make_private` and the initial
        ``nnx.Param`` state.

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> model = nnx.Sequential(nnx.Linear(3, 2, rngs=nnx.Rngs(0)), nnx.Dropout(0.5,
        ...     rngs=nnx.Rngs(1)))
        >>> loss_fn, params = nnx_loss(model, lambda m, ex: jnp.sum(m(ex)))
        >>> loss_fn(params, jnp.ones(3, jnp.float32), jax.random.key(0)).shape
        ()
    """
    from flax import nnx  # lazy: flax is optional

    if not isinstance(model, nnx.Module):
        _validate.fail("model", type(model).__name__, "an nnx.Module")
    if not callable(loss):
        _validate.fail("loss", loss, "a callable loss(module, example) -> scalar")
    _refuse_batch_norm(model)
    graphdef, params, rng_keys, rest = nnx.split(model, nnx.Param, nnx.RngKey, ...)
    key_leaves, key_tree = jax.tree.flatten(nnx.to_pure_dict(rng_keys))

    def loss_fn(params: Any, example: Any, rng: jax.Array) -> jax.Array:
        # fresh Variables in this trace: mutating the originals (created outside) would raise
        keys = jax.tree.map(lambda v: v, rng_keys)
        fresh = [jax.random.fold_in(rng, i) for i in range(len(key_leaves))]
        nnx.replace_by_pure_dict(keys, jax.tree.unflatten(key_tree, fresh))
        module = nnx.merge(graphdef, params, keys, jax.tree.map(lambda v: v, rest))
        return loss(module, example)

    return loss_fn, params


def _refuse_batch_norm(model: Any) -> None:
    """A BatchNorm in training mode normalises ONE example by its own statistics (its output
    is then 0: nothing is learnt through it), and its batch statistics would mix examples."""
    from flax import nnx

    for _, node in nnx.iter_graph(model):
        if isinstance(node, nnx.BatchNorm) and not node.use_running_average:
            _validate.fail(
                "model",
                "a module with an nnx.BatchNorm in training mode",
                "one without batch statistics: nnx.LayerNorm / nnx.GroupNorm (per-example "
                "clipping runs the model on ONE example, where BatchNorm outputs 0)",
            )
