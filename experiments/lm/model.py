"""A Llama forward pass in flax linen, in the layout of llama.cpp's GGUF files.

The model (Touvron et al. 2023, "LLaMA", https://arxiv.org/abs/2302.13971): token embedding;
``n_blocks`` pre-norm blocks, each ``x += Attn(RMSNorm(x))`` and ``x += MLP(RMSNorm(x))`` with
grouped-query causal attention (``n_heads`` query heads sharing ``n_kv_heads`` key/value heads),
rotary position embeddings (RoPE, Su et al. 2021) and a SwiGLU MLP ``down(silu(gate(x)) ·
up(x))``; a final RMSNorm and a head (SmolLM2 ties it to the embedding table). No biases.

Layout. Every projection is a dense layer dict ``{"kernel": (d_in, d_out)}`` applied by
:func:`dpjax.dp_sgd.finetune.lora_dense`, so LoRA adapters (``lora_a``, ``lora_b``) added by
:func:`dpjax.dp_sgd.finetune.add_lora` are picked up, and ghost clipping sees every kernel as
a dense layer. llama.cpp's converter permutes the rows of the query and key projections so that
RoPE rotates ADJACENT pairs of a head's coordinates (2i, 2i+1) instead of Hugging Face's halves
(i, i + head_dim/2); the forward here follows the GGUF layout (interleaved pairs), so the weights
are used as stored. :func:`unpermute_rope` is the inverse map, for an implementation in the
Hugging Face layout (the numpy reference of the tests uses it).

Parameter names: ``embed`` (``{"embedding": (V, D)}``), ``blocks_<i>`` with ``attn_norm``,
``q``, ``k``, ``v``, ``o``, ``mlp_norm``, ``gate``, ``up``, ``down``; ``final_norm``;
``head`` (``{"kernel": (D, V)}``). Norm layers hold ``{"scale": (D,)}``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from dpjax.dp_sgd.finetune import lora_dense

LORA_ALPHA = 16.0


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """Static shape of a Llama model (SmolLM2-135M: 30 blocks, D = 576, 9/3 heads, 1536)."""

    vocab: int = 49152
    width: int = 576
    n_blocks: int = 30
    n_heads: int = 9
    n_kv_heads: int = 3
    mlp: int = 1536
    rope_base: float = 100000.0
    norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.width // self.n_heads

    def __post_init__(self):
        if self.width % self.n_heads or self.n_heads % self.n_kv_heads:
            raise ValueError(
                "n_heads must divide width and n_kv_heads must divide n_heads; got "
                f"width={self.width}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim = width / n_heads must be even; got {self.head_dim}")


def rope_interleaved(x, positions, base: float):
    """RoPE on ``x`` of shape (T, H, hd), rotating adjacent pairs (2i, 2i+1) (GGUF layout)."""
    hd = x.shape[-1]
    inv_freq = 1.0 / (base ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    angles = positions[:, None].astype(jnp.float32) * jnp.asarray(inv_freq, jnp.float32)
    cos, sin = jnp.cos(angles)[:, None, :], jnp.sin(angles)[:, None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    rotated = jnp.stack([even * cos - odd * sin, even * sin + odd * cos], axis=-1)
    return rotated.reshape(x.shape)


def unpermute_rope(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation: (out, in) GGUF rows -> Hugging Face rows."""
    out = weight.shape[0]
    return (
        weight.reshape(n_heads, out // n_heads // 2, 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


class Dense(nn.Module):
    """``x @ kernel`` (no bias), plus a LoRA term when the parameters hold ``lora_a/lora_b``."""

    features: int

    @nn.compact
    def __call__(self, x):
        layer = {"kernel": self.param("kernel", nn.initializers.lecun_normal(),
                                      (x.shape[-1], self.features))}  # fmt: skip
        if self.has_variable("params", "lora_a"):
            layer["lora_a"] = self.get_variable("params", "lora_a")
            layer["lora_b"] = self.get_variable("params", "lora_b")
        return lora_dense(layer, x, alpha=LORA_ALPHA)


class RMSNorm(nn.Module):
    eps: float

    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],))
        variance = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
        return x * jax.lax.rsqrt(variance + np.float32(self.eps)) * scale


class Block(nn.Module):
    config: LlamaConfig

    @nn.compact
    def __call__(self, x):
        c = self.config
        t, hd = x.shape[0], c.head_dim
        h = RMSNorm(c.norm_eps, name="attn_norm")(x)
        q = Dense(c.n_heads * hd, name="q")(h).reshape(t, c.n_heads, hd)
        k = Dense(c.n_kv_heads * hd, name="k")(h).reshape(t, c.n_kv_heads, hd)
        v = Dense(c.n_kv_heads * hd, name="v")(h).reshape(t, c.n_kv_heads, hd)
        positions = jnp.arange(t)
        q = rope_interleaved(q, positions, c.rope_base)
        k = rope_interleaved(k, positions, c.rope_base)
        group = c.n_heads // c.n_kv_heads
        q = q.reshape(t, c.n_kv_heads, group, hd)
        scores = jnp.einsum("tkgd,skd->kgts", q, k) / np.float32(np.sqrt(hd))
        causal = jnp.tril(jnp.ones((t, t), bool))
        scores = jnp.where(causal, scores, np.float32(-1e30))
        weights = jax.nn.softmax(scores, axis=-1)
        mixed = jnp.einsum("kgts,skd->tkgd", weights, v).reshape(t, c.n_heads * hd)
        x = x + Dense(c.width, name="o")(mixed)
        h = RMSNorm(c.norm_eps, name="mlp_norm")(x)
        gated = jax.nn.silu(Dense(c.mlp, name="gate")(h)) * Dense(c.mlp, name="up")(h)
        return x + Dense(c.width, name="down")(gated)


class Llama(nn.Module):
    """Blocks ``first_block .. n_blocks - 1`` of a Llama model on ONE sequence.

    ``__call__(tokens)`` with ``first_block = 0`` maps token ids (T,) to logits (T, V);
    with ``first_block = k > 0`` it maps the hidden states (T, D) after block k - 1 (see
    :func:`hidden_states`) to logits, so frozen lower blocks are run once, outside training.
    """

    config: LlamaConfig
    first_block: int = 0

    @nn.compact
    def __call__(self, inputs):
        c = self.config
        if self.first_block == 0:
            x = nn.Embed(c.vocab, c.width, name="embed")(inputs)
        else:
            x = inputs
        for i in range(self.first_block, c.n_blocks):
            x = Block(c, name=f"blocks_{i}")(x)
        x = RMSNorm(c.norm_eps, name="final_norm")(x)
        return Dense(c.vocab, name="head")(x)


class LowerBlocks(nn.Module):
    """The embedding and blocks ``0 .. n_lower - 1``: token ids (T,) -> hidden states (T, D)."""

    config: LlamaConfig
    n_lower: int

    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(self.config.vocab, self.config.width, name="embed")(tokens)
        for i in range(self.n_lower):
            x = Block(self.config, name=f"blocks_{i}")(x)
        return x


def split_params(params: dict, n_lower: int) -> tuple[dict, dict]:
    """(lower part for :class:`LowerBlocks`, upper part for ``Llama(first_block=n_lower)``)."""
    lower = {k: v for k, v in params.items()
             if k == "embed" or (k.startswith("blocks_") and int(k[7:]) < n_lower)}  # fmt: skip
    upper = {k: v for k, v in params.items() if k not in lower}
    return lower, upper


def logits(config: LlamaConfig, params: dict, tokens) -> Any:
    """Next-token logits (T, V) of the whole model on one sequence of token ids (T,)."""
    return Llama(config).apply({"params": params}, tokens)
