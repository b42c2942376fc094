"""One training step per method, all jitted, all with the same signature.

``step(params, key, xs, ys) -> params``. The DP steps clip per example
(:func:`dpjax.clipped_grad`), add Gaussian noise σ = z·C through the library's optax transform
:func:`dpjax.dp_sgd.transforms.add_gaussian_noise` (what a user's step calls), divide by the
public batch size (:func:`normalize_by`) and take an SGD step; the non-private step is
``jax.grad`` of the mean. Diagnostics (NOT private, a breakdown of the DP step):

* ``dpjax_clip_only``: the same step without the noise;
* ``dpjax_nobarrier``: the same noise drawn straight from :mod:`dpjax._noise`, without the
  transform's fusion barrier (the plain draw, for comparison);
* :func:`bare_draw`: a jitted draw of as many normals as the model has parameters, with the
  library's sound sampler (``draw``) and with ``jax.random.normal`` (``draw_jax``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.models import Model
from dpjax import _noise, _random
from dpjax.dp_sgd.clipping import clipped_grad
from dpjax.dp_sgd.transforms import NoiseState, add_gaussian_noise, normalize_by

__all__ = [
    "METHODS",
    "DIAGNOSTICS",
    "available_methods",
    "make_step",
    "bare_draw",
    "num_params",
]

LR = 0.1
CLIP = 1.0
NOISE_MULTIPLIER = 1.0

METHODS = ("nonprivate", "dpjax", "dpjax_vmap", "optax_contrib")
DIAGNOSTICS = ("dpjax_clip_only", "dpjax_nobarrier")
DIAGNOSTIC = DIAGNOSTICS[0]


def available_methods(*, slow: bool = True) -> tuple[str, ...]:
    """The methods to time: dpjax's and its breakdown, plus (``slow``) the vmap paths."""
    fast = ("nonprivate", "dpjax", *DIAGNOSTICS)
    if not slow:
        return fast
    try:
        import optax.contrib  # noqa: F401
    except ImportError:
        return (*fast, "dpjax_vmap")
    return (*fast, "dpjax_vmap", "optax_contrib")


def _sgd(params: Any, update: Any) -> Any:
    return jax.tree.map(lambda p, u: p - LR * u.astype(p.dtype), params, update)


def _nonprivate(model: Model) -> Callable:
    def step(params, key, xs, ys):
        del key
        return _sgd(params, jax.grad(model.batch_loss)(params, xs, ys))

    return step


def _noise_state(key: jax.Array) -> NoiseState:
    """The transform's state for this step's key (as if the optimizer state carried it)."""
    return NoiseState(key=jax.random.key_data(key), count=jnp.zeros([], jnp.int32))


def _dpjax(model: Model, method: str, noise: str = "transform") -> Callable:
    grad_fn = clipped_grad(model.loss, l2_clip_norm=CLIP, backend=method)
    stddev = NOISE_MULTIPLIER * CLIP
    noise_tx = add_gaussian_noise(stddev, key=jax.random.key(0))  # key: from the step's state

    def step(params, key, xs, ys):
        clipped_sum, _ = grad_fn(params, xs, ys)
        if noise == "transform":
            noisy, _ = noise_tx.update(clipped_sum, _noise_state(key), params)
        elif noise == "nobarrier":  # the transform's draw, same key, without its barrier
            _, noise_key = jax.random.split(key)
            noisy = _noise.tree_add_iid_noise(noise_key, clipped_sum, _random.normal, stddev)
        else:
            noisy = clipped_sum
        normalize = normalize_by(float(xs.shape[0]))  # public: the benchmark's fixed batch
        update, _ = normalize.update(noisy, normalize.init(params))
        return _sgd(params, update)

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
    """The jitted step of ``method`` (one of :data:`METHODS` or :data:`DIAGNOSTICS`)."""
    if method == "nonprivate":
        step = _nonprivate(model)
    elif method == "dpjax":
        step = _dpjax(model, "auto")
    elif method == "dpjax_vmap":
        step = _dpjax(model, "vmap")
    elif method == "dpjax_clip_only":
        step = _dpjax(model, "auto", noise="none")
    elif method == "dpjax_nobarrier":
        step = _dpjax(model, "auto", noise="nobarrier")
    elif method == "optax_contrib":
        step = _optax_contrib(model)
    else:
        raise ValueError(f"method must be one of {METHODS + DIAGNOSTICS}; got {method!r}")
    return jax.jit(step)


def num_params(params: Any) -> int:
    return int(sum(np.prod(jnp.shape(x), dtype=np.int64) for x in jax.tree.leaves(params)))


def bare_draw(size: int, sampler: str = "sound") -> Callable:
    """A jitted ``key -> size normals`` (float32): dpjax's sampler or ``jax.random.normal``."""
    if sampler == "sound":
        return jax.jit(lambda key: _random.normal(key, (size,), jnp.float32))
    return jax.jit(lambda key: jax.random.normal(key, (size,), jnp.float32))
