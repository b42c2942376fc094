"""The flax Llama forward (experiments.lm.model) computes the Llama of the GGUF layout.

Default tests: a 2-block model with synthetic weights against an independent numpy reference
written in the Hugging Face layout (Q/K rows un-permuted, RoPE on halves); a tiny GGUF file
written by ``gguf``'s writer is read back into the same parameters. Torch test: the real
SmolLM2-135M GGUF file, next-token logits against Hugging Face ``transformers`` loading the
same file.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest

from experiments.lm import model

SMALL = model.LlamaConfig(
    vocab=50,
    width=24,
    n_blocks=2,
    n_heads=6,
    n_kv_heads=2,
    mlp=40,
    rope_base=10000.0,
    norm_eps=1e-5,
)


def synthetic_params(config, seed=0):
    """Random float32 weights in the GGUF (llama.cpp) layout, as torch-style (out, in) rows."""
    rng = np.random.default_rng(seed)
    hd = config.head_dim
    rows = {
        "q": config.n_heads * hd,
        "k": config.n_kv_heads * hd,
        "v": config.n_kv_heads * hd,
        "o": config.width,
        "gate": config.mlp,
        "up": config.mlp,
        "down": config.width,
    }
    cols = {k: config.width for k in rows} | {"o": config.n_heads * hd, "down": config.mlp}
    torch_style = {
        "embed": rng.normal(size=(config.vocab, config.width)).astype(np.float32),
        "final_norm": (1 + 0.1 * rng.normal(size=config.width)).astype(np.float32),
    }
    for i in range(config.n_blocks):
        for name in rows:
            w = rng.normal(size=(rows[name], cols[name])) / np.sqrt(cols[name])
            torch_style[f"{i}.{name}"] = w.astype(np.float32)
        for name in ("attn_norm", "mlp_norm"):
            torch_style[f"{i}.{name}"] = (1 + 0.1 * rng.normal(size=config.width)).astype(
                np.float32
            )
    return torch_style


def to_flax(config, torch_style):
    params = {
        "embed": {"embedding": torch_style["embed"]},
        "final_norm": {"scale": torch_style["final_norm"]},
        "head": {"kernel": torch_style["embed"].T.copy()},
    }
    for i in range(config.n_blocks):
        block = {}
        for name in ("q", "k", "v", "o", "gate", "up", "down"):
            block[name] = {"kernel": torch_style[f"{i}.{name}"].T.copy()}
        for name in ("attn_norm", "mlp_norm"):
            block[name] = {"scale": torch_style[f"{i}.{name}"]}
        params[f"blocks_{i}"] = block
    return params


def reference_logits(config, torch_style, tokens):
    """Hugging Face's Llama (rotate_half RoPE on un-permuted rows), float64 numpy."""
    hd, t = config.head_dim, len(tokens)

    def norm(x, w):
        return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + config.norm_eps) * w

    inv = 1.0 / config.rope_base ** (np.arange(0, hd, 2) / hd)
    ang = np.arange(t)[:, None] * inv[None]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))

    def rope(x):  # (H, T, hd)
        rotated = np.concatenate([-x[..., hd // 2 :], x[..., : hd // 2]], -1)
        return x * cos + rotated * sin

    x = torch_style["embed"][tokens].astype(np.float64)
    for i in range(config.n_blocks):
        w = {
            k.split(".")[1]: v.astype(np.float64)
            for k, v in torch_style.items()
            if k.startswith(f"{i}.")
        }
        h = norm(x, w["attn_norm"])
        wq = model.unpermute_rope(w["q"], config.n_heads)
        wk = model.unpermute_rope(w["k"], config.n_kv_heads)
        q = rope((h @ wq.T).reshape(t, config.n_heads, hd).transpose(1, 0, 2))
        k = rope((h @ wk.T).reshape(t, config.n_kv_heads, hd).transpose(1, 0, 2))
        v = (h @ w["v"].T).reshape(t, config.n_kv_heads, hd).transpose(1, 0, 2)
        rep = config.n_heads // config.n_kv_heads
        k, v = np.repeat(k, rep, 0), np.repeat(v, rep, 0)
        s = q @ k.transpose(0, 2, 1) / np.sqrt(hd)
        s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        x = x + (p @ v).transpose(1, 0, 2).reshape(t, -1) @ w["o"].T
        h = norm(x, w["mlp_norm"])
        gate = h @ w["gate"].T
        x = x + ((gate / (1 + np.exp(-gate))) * (h @ w["up"].T)) @ w["down"].T
    return norm(x, torch_style["final_norm"]) @ torch_style["embed"].T.astype(np.float64)


@functools.cache
def small_logits():
    import jax

    return jax.jit(lambda p, t: model.logits(SMALL, p, t))


TOKENS = np.array([3, 17, 42, 0, 9, 9, 31, 5, 12, 48, 1])


def test_two_block_forward_matches_an_independent_reference_in_the_hf_layout():
    import jax.numpy as jnp

    torch_style = synthetic_params(SMALL)
    tokens = TOKENS
    got = np.asarray(small_logits()(to_flax(SMALL, torch_style), jnp.asarray(tokens)))
    want = reference_logits(SMALL, torch_style, tokens)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_rope_permutation_matters():
    """Without the GGUF layout (rows used in HF order), the logits differ: the check has teeth."""
    import jax.numpy as jnp

    torch_style = synthetic_params(SMALL, seed=1)
    tokens = TOKENS
    wrong = dict(torch_style)
    for i in range(SMALL.n_blocks):
        wrong[f"{i}.q"] = model.unpermute_rope(torch_style[f"{i}.q"], SMALL.n_heads)
        wrong[f"{i}.k"] = model.unpermute_rope(torch_style[f"{i}.k"], SMALL.n_kv_heads)
    got = np.asarray(small_logits()(to_flax(SMALL, wrong), jnp.asarray(tokens)))
    want = reference_logits(SMALL, torch_style, tokens)
    assert np.abs(got - want).max() > 1e-2 * np.abs(want).max()


def test_a_gguf_written_by_gguf_reads_back_into_the_same_parameters(tmp_path):
    import gguf  # noqa: PLC0415  (in the dev extra: never skipped)

    from experiments.lm import weights

    torch_style = synthetic_params(SMALL, seed=2)
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(SMALL.n_blocks)
    writer.add_embedding_length(SMALL.width)
    writer.add_feed_forward_length(SMALL.mlp)
    writer.add_head_count(SMALL.n_heads)
    writer.add_head_count_kv(SMALL.n_kv_heads)
    writer.add_rope_freq_base(SMALL.rope_base)
    writer.add_layer_norm_rms_eps(SMALL.norm_eps)
    writer.add_token_list([f"t{i}" for i in range(SMALL.vocab)])
    names = {
        "q": "attn_q",
        "k": "attn_k",
        "v": "attn_v",
        "o": "attn_output",
        "gate": "ffn_gate",
        "up": "ffn_up",
        "down": "ffn_down",
        "attn_norm": "attn_norm",
        "mlp_norm": "ffn_norm",
    }
    writer.add_tensor("token_embd.weight", torch_style["embed"])
    writer.add_tensor("output_norm.weight", torch_style["final_norm"])
    for key, value in torch_style.items():
        if "." in key:
            i, name = key.split(".")
            writer.add_tensor(f"blk.{i}.{names[name]}.weight", value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    config, params = weights.load_params(path)
    assert config == dataclasses.replace(SMALL, norm_eps=float(np.float32(SMALL.norm_eps)))
    want = to_flax(SMALL, torch_style)
    import jax

    for (p1, a), (p2, b) in zip(
        jax.tree_util.tree_leaves_with_path(params),
        jax.tree_util.tree_leaves_with_path(want),
        strict=True,
    ):
        assert p1 == p2
        np.testing.assert_array_equal(a, b)


@pytest.mark.torch  # needs torch, transformers, accelerate and the GGUF file (`make data`)
def test_logits_match_transformers_on_the_smollm2_gguf():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # transformers loads a GGUF model only with it
    import jax
    import jax.numpy as jnp

    from experiments.data import cache
    from experiments.lm import weights

    try:
        path = weights.model_path()
    except cache.DataMissingError as error:
        pytest.skip(str(error))
    config, params = weights.load_params(path)
    tokenizer = weights.load_tokenizer(path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    hf.eval()
    apply = jax.jit(lambda p, t: model.logits(config, p, t))
    params = jax.tree.map(jnp.asarray, params)
    prompts = [
        "To be, or not to be, that is the question:",
        "ROMEO. But soft, what light through yonder window breaks?",
        "The capital of France is",
    ]
    for prompt in prompts:
        ids = tokenizer(prompt)["input_ids"]
        with torch.no_grad():
            want = hf(torch.tensor([ids])).logits[0].numpy()
        got = np.asarray(apply(params, jnp.asarray(ids)))
        scale = np.abs(want).max()
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-4 * scale)
        assert got[-1].argmax() == want[-1].argmax(), prompt
