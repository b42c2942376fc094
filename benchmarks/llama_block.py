"""One Llama-style transformer block of SmolLM2-135M's width, LoRA-adapted, under DP-SGD.

The block (synthetic weights, no checkpoint): width d = 576, 9 query heads and 3 key/value heads
of dimension 64 (grouped-query attention: key/value head j serves query heads 3j, 3j+1, 3j+2),
rotary position embedding (RoPE, θ = 100 000, the rotate-half layout), causal softmax attention,
RMSNorm (ε = 1e-5) before the attention and before the SwiGLU MLP ``down(silu(gate(h))·up(h))``
of width 1536, residuals around both. Every projection (q, k, v, o, gate, up, down) is a frozen
``W0`` plus a trainable rank-8 LoRA adapter ``(x·A)·B`` (Hu et al. 2022, "LoRA: Low-Rank
Adaptation of Large Language Models", https://arxiv.org/abs/2106.09685); the frozen weights and
the norms' scales are constants closed over by the loss (a public pre-trained model), the 14
adapter matrices (~0.1 M numbers) are the private parameters, ``B`` zero at init as LoRA's.

One example is a sequence of ``seq`` hidden states ``(seq, 576)`` (default 128) with a target
of the same shape; its loss is the mean squared error of the block's output. Under
``dpjax.clipped_grad(backend="auto")`` each adapter product is a ghost tap (a dense layer over
the sequence axis). :func:`llama_block_model` is registered as the ``llama_block`` row of
``python -m benchmarks``; its PyTorch twin (:mod:`benchmarks.torch_side`) has the same
parameters one for one, for the Opacus columns.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.models import Model, register

__all__ = ["SIZE", "PROJECTIONS", "frozen_weights", "llama_block_model", "block_forward"]

SIZE = {"width": 576, "heads": 9, "kv_heads": 3, "mlp": 1536, "seq": 128, "rank": 8}
ROPE_THETA = 100_000.0
RMS_EPS = 1e-5
# name -> (input width key, output width as a function of the size)
PROJECTIONS = ("q", "k", "v", "o", "gate", "up", "down")


def projection_shapes(size: dict) -> dict[str, tuple[int, int]]:
    """``{projection: (d_in, d_out)}`` for a block of ``size`` (keys of :data:`SIZE`)."""
    width, mlp = size["width"], size["mlp"]
    kv = size["kv_heads"] * (width // size["heads"])
    return {
        "q": (width, width),
        "k": (width, kv),
        "v": (width, kv),
        "o": (width, width),
        "gate": (width, mlp),
        "up": (width, mlp),
        "down": (mlp, width),
    }


def frozen_weights(size: dict, seed: int = 1234) -> dict[str, np.ndarray]:
    """The block's frozen weights (float32 NumPy, no compile): each projection's ``W0``
    (d_in, d_out) drawn N(0, 1/d_in) from ``seed``, and the two RMSNorm scales (ones)."""
    rng = np.random.default_rng(seed)
    frozen = {
        name: (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)
        for name, shape in projection_shapes(size).items()
    }
    frozen["norm1"] = np.ones((size["width"],), np.float32)
    frozen["norm2"] = np.ones((size["width"],), np.float32)
    return frozen


def _rms_norm(x: jax.Array, scale: jax.Array) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + RMS_EPS) * scale


def _rope(x: jax.Array) -> jax.Array:
    """Rotary embedding of ``x`` (..., T, heads, head_dim), rotate-half layout."""
    seq, dim = x.shape[-3], x.shape[-1]
    inv_freq = ROPE_THETA ** (-jnp.arange(0, dim, 2, dtype=jnp.float32) / dim)
    angles = jnp.arange(seq, dtype=jnp.float32)[:, None] * inv_freq[None, :]
    cos = jnp.concatenate([jnp.cos(angles)] * 2, axis=-1)[:, None, :]
    sin = jnp.concatenate([jnp.sin(angles)] * 2, axis=-1)[:, None, :]
    half = dim // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def _attention(q: jax.Array, k: jax.Array, v: jax.Array, heads: int) -> jax.Array:
    """Causal GQA: q (..., T, H, D), k and v (..., T, H_kv, D) -> (..., T, H·D)."""
    groups = heads // k.shape[-2]
    k, v = jnp.repeat(k, groups, axis=-2), jnp.repeat(v, groups, axis=-2)
    scores = jnp.einsum("...qhd,...khd->...hqk", q, k) / jnp.sqrt(float(q.shape[-1]))
    seq = q.shape[-3]
    causal = jnp.tril(jnp.ones((seq, seq), bool))
    weights = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1)
    out = jnp.einsum("...hqk,...khd->...qhd", weights, v)
    return out.reshape(*out.shape[:-2], -1)


def block_forward(params: Any, frozen: dict, x: jax.Array, heads: int) -> jax.Array:
    """The block on a sequence ``x`` (T, d), or a batch of them (..., T, d): LoRA params
    ``A_<proj>``, ``B_<proj>``."""

    def proj(name: str, h: jax.Array) -> jax.Array:
        return h @ frozen[name] + (h @ params[f"A_{name}"]) @ params[f"B_{name}"]

    lead, head_dim = x.shape[:-1], x.shape[-1] // heads
    h = _rms_norm(x, frozen["norm1"])
    q = _rope(proj("q", h).reshape(*lead, heads, head_dim))
    k = _rope(proj("k", h).reshape(*lead, -1, head_dim))
    v = proj("v", h).reshape(*lead, -1, head_dim)
    x = x + proj("o", _attention(q, k, v, heads))
    h = _rms_norm(x, frozen["norm2"])
    return x + proj("down", jax.nn.silu(proj("gate", h)) * proj("up", h))


def llama_block_model(**size: int) -> Model:
    """The benchmark :class:`~benchmarks.models.Model` (sizes: :data:`SIZE`, overridable).

    ``loss(params, x, y)`` takes ONE sequence, ``x`` and ``y`` of shape ``(seq, width)``.
    """
    size = SIZE | size
    frozen = frozen_weights(size)
    shapes = projection_shapes(size)
    rank, heads = size["rank"], size["heads"]

    def init(key: jax.Array) -> dict[str, jax.Array]:
        keys = jax.random.split(key, len(shapes))
        params = {}
        for k, (name, (d_in, d_out)) in zip(keys, shapes.items(), strict=True):
            params[f"A_{name}"] = jax.random.normal(k, (d_in, rank), jnp.float32) / jnp.sqrt(d_in)
            params[f"B_{name}"] = jnp.zeros((rank, d_out), jnp.float32)
        return params

    def loss(params: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        return 0.5 * jnp.mean((block_forward(params, frozen, x, heads) - y) ** 2)

    def batch_loss(params: Any, xs: jax.Array, ys: jax.Array) -> jax.Array:
        """The mean of :func:`loss` over the batch, from one batched forward pass."""
        return 0.5 * jnp.mean((block_forward(params, frozen, xs, heads) - ys) ** 2)

    def data(key: jax.Array, batch: int) -> tuple[jax.Array, jax.Array]:
        kx, ky = jax.random.split(key)
        shape = (batch, size["seq"], size["width"])
        return jax.random.normal(kx, shape, jnp.float32), jax.random.normal(ky, shape, jnp.float32)

    return Model("llama_block", init, loss, batch_loss, data)


# `make bench`: batch 8 (1 024 tokens); `make bench-full`: 8 and 32.
register("llama_block", llama_block_model, batches=(8, 32), quick_batches=(8,))
