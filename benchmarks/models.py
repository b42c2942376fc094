"""The benchmark models and their per-example / batch losses, in a registry.

Each model gives ``init(key) -> params``, ``loss(params, x, y)`` for ONE example (what
``dpjax.clipped_grad`` takes) and ``batch_loss(params, X, Y)`` (the mean, for the non-private
step), plus a synthetic batch of the right shapes.

Registry: :data:`MODELS` maps a name to a factory, :data:`CONFIGS` lists the (model, batch)
rows ``python -m benchmarks`` runs, and :data:`TORCH_MODELS` (in :mod:`benchmarks.torch_side`)
the identical PyTorch modules Opacus is timed on. Another module adds rows with
:func:`register` (``benchmarks.transformer`` is imported by :func:`load_plugins` when it
exists)::

    register("transformer", make_transformer, batches=(32, 128), quick_batches=(32,))
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

__all__ = ["Model", "MODELS", "CONFIGS", "register", "load_plugins", "make_model"]


@dataclasses.dataclass(frozen=True)
class Model:
    """A benchmark model: parameter init, per-example loss, batch loss, data maker."""

    name: str
    init: Callable[[jax.Array], Any]
    loss: Callable[..., jax.Array]
    batch_loss: Callable[..., jax.Array]
    data: Callable[[jax.Array, int], tuple[jax.Array, jax.Array]]


def _xent(logits: jax.Array, y: jax.Array) -> jax.Array:
    return -jnp.take_along_axis(jax.nn.log_softmax(logits), y[..., None], axis=-1)[..., 0]


def _images(key: jax.Array, batch: int, shape: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
    kx, ky = jax.random.split(key)
    return jax.random.normal(kx, (batch, *shape), jnp.float32), jax.random.randint(
        ky, (batch,), 0, 10
    )


class MLP(nn.Module):
    """784-512-512-10 with ReLU."""

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.relu(nn.Dense(512)(x))
        x = nn.relu(nn.Dense(512)(x))
        return nn.Dense(10)(x)


class CNN(nn.Module):
    """16c5s2-32c4s2-32-10 (flax ``nn.Conv``, NHWC)."""

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.relu(nn.Conv(16, (5, 5), strides=2, padding="VALID")(x))
        x = nn.relu(nn.Conv(32, (4, 4), strides=2, padding="VALID")(x))
        x = x.reshape(x.shape[:-3] + (-1,))
        x = nn.relu(nn.Dense(32)(x))
        return nn.Dense(10)(x)


def max_pool_2x2_stride1(x: jax.Array) -> jax.Array:
    """``nn.max_pool(x, (2, 2), strides=(1, 1))`` on NHWC as the max of four shifted slices.

    The same function (a max is exact, whatever the order) and the same gradient almost
    everywhere, but its gradient is elementwise selects and pads instead of XLA's
    ``select_and_scatter``, which is slow on XLA:CPU. On ties the two differ only in which
    input receives the gradient: each ``jnp.maximum`` splits it evenly between equal
    operands, ``select_and_scatter`` gives it all to the first maximum of the window.
    """
    top = jnp.maximum(x[..., :-1, :-1, :], x[..., :-1, 1:, :])
    bottom = jnp.maximum(x[..., 1:, :-1, :], x[..., 1:, 1:, :])
    return jnp.maximum(top, bottom)


class TemperedSigmoidCNN(nn.Module):
    """Papernot et al. 2021's MNIST CNN (Opacus's MNIST example), tanh activations.

    conv 16 8×8 stride 2 padding 3 → max-pool 2 stride 1 → conv 32 4×4 stride 2 → max-pool 2
    stride 1 → dense 32 → dense 10 (NHWC; 28×28 → 14 → 13 → 5 → 4, 512 features).

    The max-pools are :func:`max_pool_2x2_stride1` (four shifted slices), not flax's
    ``nn.max_pool``: the same function, and on XLA:CPU its gradient is ~3× cheaper (flax's
    pools differentiate through ``select_and_scatter``, the slowest op of this model's
    backward pass on the CPU). Both the non-private and the DP steps use it; the PyTorch twin
    keeps ``nn.MaxPool2d``.
    """

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = jnp.tanh(nn.Conv(16, (8, 8), strides=2, padding=((3, 3), (3, 3)))(x))
        x = max_pool_2x2_stride1(x)
        x = jnp.tanh(nn.Conv(32, (4, 4), strides=2, padding="VALID")(x))
        x = max_pool_2x2_stride1(x)
        x = x.reshape(x.shape[:-3] + (-1,))
        x = jnp.tanh(nn.Dense(32)(x))
        return nn.Dense(10)(x)


def _patches(x: jax.Array, size: int, stride: int) -> jax.Array:
    """(N, H, W, C) -> (N, H', W', size*size*C) by strided slices (a matmul-ready im2col)."""
    n, h, w, c = x.shape
    ho, wo = (h - size) // stride + 1, (w - size) // stride + 1
    cols = [
        x[:, i : i + stride * (ho - 1) + 1 : stride, j : j + stride * (wo - 1) + 1 : stride, :]
        for i in range(size)
        for j in range(size)
    ]
    return jnp.concatenate(cols, axis=-1)


class CNNIm2col(nn.Module):
    """The same CNN with each convolution written as im2col patches @ kernel (plain Dense).

    The same function as :class:`CNN` (its conv kernels ``(f, f, I, O)`` flattened to
    ``(f·f·I, O)``; tested), a formulation a user may choose on XLA:CPU: its non-private step
    costs what the ``nn.Conv`` one does, while dpjax's ghost step reuses the patches of the
    forward pass as the layers' activations (no second im2col, no transposed convolution in
    the backward pass), ~15% less CPU time than the ``nn.Conv`` model's (2-core CPU). The
    ``cnn_im2col`` row times it against Opacus on the same PyTorch twin as ``cnn``.
    """

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.relu(nn.Dense(16)(_patches(x, 5, 2)))
        x = nn.relu(nn.Dense(32)(_patches(x, 4, 2)))
        x = x.reshape(x.shape[:-3] + (-1,))
        x = nn.relu(nn.Dense(32)(x))
        return nn.Dense(10)(x)


def _flax_model(name: str, module: nn.Module, shape: tuple[int, ...]) -> Model:
    def init(key: jax.Array) -> Any:
        return module.init(key, jnp.zeros((1, *shape), jnp.float32))["params"]

    def loss(params: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        return _xent(module.apply({"params": params}, x[None]), y[None])[0]

    def batch_loss(params: Any, xs: jax.Array, ys: jax.Array) -> jax.Array:
        return jnp.mean(_xent(module.apply({"params": params}, xs), ys))

    return Model(name, init, loss, batch_loss, lambda key, b: _images(key, b, shape))


def _logistic(dim: int) -> Model:
    def init(key: jax.Array) -> Any:
        return {"w": jnp.zeros((dim,), jnp.float32), "b": jnp.zeros((), jnp.float32)}

    def margin(params: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        return (2.0 * y.astype(jnp.float32) - 1.0) * (x @ params["w"] + params["b"])

    def loss(params: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        return jax.nn.softplus(-margin(params, x, y))

    def batch_loss(params: Any, xs: jax.Array, ys: jax.Array) -> jax.Array:
        return jnp.mean(jax.nn.softplus(-margin(params, xs, ys)))

    def data(key: jax.Array, batch: int) -> tuple[jax.Array, jax.Array]:
        kx, ky = jax.random.split(key)
        xs = jax.random.normal(kx, (batch, dim), jnp.float32) / jnp.sqrt(float(dim))
        return xs, jax.random.bernoulli(ky, 0.5, (batch,)).astype(jnp.int32)

    return Model(f"logreg{dim}", init, loss, batch_loss, data)


LORA_RANK = 8


def _lora_mlp(rank: int = LORA_RANK) -> Model:
    """784-512-512-10 whose two hidden layers are frozen ``W0`` plus trainable ``A·B`` (LoRA).

    ``h = relu(x·W0 + b0 + (x·A)·B)`` (Hu et al. 2022, "LoRA: Low-Rank Adaptation of Large
    Language Models"): ``W0`` and ``b0`` are constants closed over by the loss (a public
    pre-trained model, never clipped or noised), ``A`` (d_in × r) and ``B`` (r × d_out, zero at
    init) are the private parameters, with the 512-10 head. Under ghost clipping every
    trainable weight is a tapped dense layer (``x·A``, then ``(x·A)·B``).
    """
    widths = (784, 512, 512)
    frozen_keys = jax.random.split(jax.random.key(1234), len(widths) - 1)
    frozen = [
        (jax.random.normal(k, (i, o), jnp.float32) / jnp.sqrt(float(i)), jnp.zeros((o,)))
        for k, i, o in zip(frozen_keys, widths[:-1], widths[1:], strict=True)
    ]

    def init(key: jax.Array) -> Any:
        keys = jax.random.split(key, len(frozen) + 1)
        params: dict[str, Any] = {}
        for j, (k, (w0, _)) in enumerate(zip(keys, frozen, strict=False)):
            d_in, d_out = w0.shape
            params[f"A{j}"] = jax.random.normal(k, (d_in, rank), jnp.float32) / jnp.sqrt(d_in)
            params[f"B{j}"] = jnp.zeros((rank, d_out), jnp.float32)
        params["head"] = jax.random.normal(keys[-1], (widths[-1], 10), jnp.float32) * 0.01
        return params

    def logits(params: Any, x: jax.Array) -> jax.Array:
        for j, (w0, b0) in enumerate(frozen):
            x = jax.nn.relu(x @ w0 + b0 + (x @ params[f"A{j}"]) @ params[f"B{j}"])
        return x @ params["head"]

    def loss(params: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        return _xent(logits(params, x), y)

    def batch_loss(params: Any, xs: jax.Array, ys: jax.Array) -> jax.Array:
        return jnp.mean(_xent(logits(params, xs), ys))

    return Model("lora_mlp", init, loss, batch_loss, lambda key, b: _images(key, b, (784,)))


MODELS: dict[str, Callable[[], Model]] = {
    "mlp": lambda: _flax_model("mlp", MLP(), (784,)),
    "cnn": lambda: _flax_model("cnn", CNN(), (28, 28, 1)),
    "cnn_tanh": lambda: _flax_model("cnn_tanh", TemperedSigmoidCNN(), (28, 28, 1)),
    "cnn_im2col": lambda: _flax_model("cnn_im2col", CNNIm2col(), (28, 28, 1)),
    "logreg": lambda: _logistic(10_000),
    "lora_mlp": _lora_mlp,
}

# (model, batch, in the --quick run too): the rows of the table, in order.
CONFIGS: list[tuple[str, int, bool]] = [
    ("mlp", 256, True),
    ("mlp", 1024, True),
    ("cnn", 256, True),
    ("cnn_im2col", 256, True),
    ("cnn_tanh", 256, True),
    ("logreg", 1024, True),
    ("lora_mlp", 256, True),
]

PLUGINS = ("benchmarks.transformer", "benchmarks.llama_block")


def register(
    name: str,
    factory: Callable[[], Model],
    *,
    batches: tuple[int, ...],
    quick_batches: tuple[int, ...] | None = None,
) -> None:
    """Add model ``name`` (``factory() -> Model``) and its rows (one per batch) to the table.

    ``quick_batches`` (default: all of ``batches``) are the rows ``--quick`` keeps.
    """
    quick = batches if quick_batches is None else quick_batches
    MODELS[name] = factory
    CONFIGS[:] = [c for c in CONFIGS if c[0] != name]
    CONFIGS.extend((name, b, b in quick) for b in batches)


def load_plugins() -> list[str]:
    """Import the optional model modules of :data:`PLUGINS` that exist (they call register)."""
    loaded = []
    for module in PLUGINS:
        if importlib.util.find_spec(module) is not None:
            importlib.import_module(module)
            loaded.append(module)
    return loaded


def make_model(name: str) -> Model:
    """The benchmark model called ``name`` (a key of :data:`MODELS`)."""
    if name not in MODELS:
        load_plugins()
    return MODELS[name]()
