"""One training step per method, all jitted, all with the same signature.

``step(params, key, xs, ys) -> params``. The DP steps clip per example, sum, add Gaussian noise
once (σ = z·C through :func:`dpjax._noise.tree_add_noise`, the library's noise path), divide
by the public batch size and take an SGD step; the non-private step is ``jax.grad`` of the mean.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from benchmarks.models import Model
from dpjax._noise import tree_add_noise
from dpjax.dp_sgd.clipping import clipped_grad

__all__ = ["METHODS", "available_methods", "make_step"]

LR = 0.1
CLIP = 1.0
NOISE_MULTIPLIER = 1.0

METHODS = ("nonprivate", "dpjax", "dpjax_vmap", "optax_contrib")
DIAGNOSTIC = "dpjax_clip_only"  # dpjax's clipped sum without the noise: NOT private, a breakdown


def available_methods() -> tuple[str, ...]:
    """The methods whose dependencies are importable here (plus the no-noise breakdown)."""
    try:
        import optax.contrib  # noqa: F401
    except ImportError:
        return METHODS[:3] + (DIAGNOSTIC,)
    return METHODS + (DIAGNOSTIC,)


def _sgd(params: Any, update: Any) -> Any:
    return jax.tree.map(lambda p, u: p - LR * u.astype(p.dtype), params, update)


def _nonprivate(model: Model) -> Callable:
    def step(params, key, xs, ys):
        del key
        return _sgd(params, jax.grad(model.batch_loss)(params, xs, ys))

    return step


def _dpjax(model: Model, method: str, noise: bool = True) -> Callable:
    grad_fn = clipped_grad(model.loss, l2_clip_norm=CLIP, backend=method)

    def step(params, key, xs, ys):
        clipped_sum, _ = grad_fn(params, xs, ys)
        noisy = clipped_sum
        if noise:
            noisy = tree_add_noise(key, clipped_sum, jax.random.normal, NOISE_MULTIPLIER * CLIP)
        batch_size = xs.shape[0]  # public: the benchmark's fixed batch size
        return _sgd(params, jax.tree.map(lambda g: g / batch_size, noisy))

    return step


def _optax_contrib(model: Model) -> Callable:
    from optax.contrib import differentially_private_aggregate

    def step(params, key, xs, ys):
        per_example = jax.vmap(jax.grad(model.loss), in_axes=(None, 0, 0))(params, xs, ys)
        tx = differentially_private_aggregate(CLIP, NOISE_MULTIPLIER, key)
        update, _ = tx.update(per_example, tx.init(params), params)
        return _sgd(params, update)

    return step


def make_step(model: Model, method: str) -> Callable:
    """The jitted step of ``method`` (one of :data:`METHODS`) for ``model``."""
    if method == "nonprivate":
        step = _nonprivate(model)
    elif method == "dpjax":
        step = _dpjax(model, "auto")
    elif method == "dpjax_vmap":
        step = _dpjax(model, "vmap")
    elif method == DIAGNOSTIC:
        step = _dpjax(model, "auto", noise=False)
    elif method == "optax_contrib":
        step = _optax_contrib(model)
    else:
        raise ValueError(f"method must be one of {METHODS + (DIAGNOSTIC,)}; got {method!r}")
    return jax.jit(step)


def noise_only(tree: Any) -> Callable:
    """A jitted draw of Gaussian noise shaped like ``tree`` (to time the noise alone)."""
    return jax.jit(lambda key: tree_add_noise(key, tree, jax.random.normal, 1.0))


def zeros_like_tree(tree: Any) -> Any:
    return jax.tree.map(jnp.zeros_like, tree)
