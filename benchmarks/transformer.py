"""A flax nnx transformer under DP-SGD: ghost clipping with embeddings and sequences.

The model is a pre-norm causal language model: token embedding + learned positional embedding
(both ``nnx.Embed``), ``layers`` blocks of (LayerNorm, ``nnx.MultiHeadAttention`` with a causal
mask, residual; LayerNorm, MLP width → 4·width → width with GELU, residual), a final LayerNorm
and an untied output head. One example is a sequence of ``seq`` tokens; its loss is the mean
next-token cross-entropy over the positions. Default size: 2 layers, width 256, 4 heads,
sequence 128, vocabulary 8192, batch 32 and 128.

Under ``dpjax.clipped_grad(backend="auto")`` every kernel (attention q/k/v/out, MLP, head) and
both embedding tables are ghost taps; the biases and layer-norm scales get per-example
gradients in the same backward pass.

``python -m benchmarks.transformer [--batches 32,128] [--repeats 7] [--no-vmap]`` compiles the
non-private step, the DP step (ghost, clipping + Gaussian noise + SGD, :mod:`benchmarks.steps`)
and, unless ``--no-vmap``, the DP step on the vmap path; it reports compile times, XLA's buffer
plan (``compiled.memory_analysis()``: temporaries + arguments + outputs; RSS on a loaded CPU is
too noisy) and step times interleaved round-robin (medians), as one JSON line per method
(``BENCH {...}``) and a table. :func:`transformer_model` is a :class:`benchmarks.models.Model`,
so the shared runner can list it (``MODELS["transformer"] = transformer_model``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from benchmarks.models import Model, register
from benchmarks.steps import make_step

__all__ = ["Transformer", "transformer_model", "SIZE"]

SIZE = {"vocab": 8192, "width": 256, "heads": 4, "layers": 2, "seq": 128}


class Block(nnx.Module):
    """Pre-norm block: x + attn(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, width: int, heads: int, *, rngs: nnx.Rngs, dtype: Any = jnp.float32):
        kw = dict(param_dtype=dtype, dtype=dtype, rngs=rngs)
        self.ln1 = nnx.LayerNorm(width, **kw)
        self.attn = nnx.MultiHeadAttention(num_heads=heads, in_features=width, decode=False, **kw)
        self.ln2 = nnx.LayerNorm(width, **kw)
        self.up = nnx.Linear(width, 4 * width, **kw)
        self.down = nnx.Linear(4 * width, width, **kw)

    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        x = x + self.attn(self.ln1(x), mask=mask)
        return x + self.down(nnx.gelu(self.up(self.ln2(x))))


class Transformer(nnx.Module):
    """Token + positional embedding, ``layers`` blocks, final LayerNorm, untied head."""

    def __init__(
        self,
        vocab: int,
        width: int,
        heads: int,
        layers: int,
        seq: int,
        *,
        rngs: nnx.Rngs,
        dtype: Any = jnp.float32,
    ):
        self.tokens = nnx.Embed(vocab, width, param_dtype=dtype, dtype=dtype, rngs=rngs)
        self.positions = nnx.Embed(seq, width, param_dtype=dtype, dtype=dtype, rngs=rngs)
        self.blocks = nnx.List([Block(width, heads, rngs=rngs, dtype=dtype) for _ in range(layers)])
        self.ln = nnx.LayerNorm(width, param_dtype=dtype, dtype=dtype, rngs=rngs)
        self.head = nnx.Linear(width, vocab, param_dtype=dtype, dtype=dtype, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        """Logits ``(..., T, vocab)`` for token ids ``(..., T)``."""
        x = self.tokens(tokens) + self.positions(jnp.arange(tokens.shape[-1]))
        mask = nnx.make_causal_mask(tokens)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln(x))


def _xent(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Mean next-token cross-entropy over the last axis of ``targets``."""
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0], axis=-1)


def transformer_model(
    vocab: int = SIZE["vocab"],
    width: int = SIZE["width"],
    heads: int = SIZE["heads"],
    layers: int = SIZE["layers"],
    seq: int = SIZE["seq"],
    dtype: Any = jnp.float32,
) -> Model:
    """The benchmark :class:`~benchmarks.models.Model`: params are the nnx ``Param`` state.

    ``loss(params, tokens, targets)`` takes ONE sequence (``(seq,)`` int32 each);
    ``data(key, batch)`` gives random tokens and their next-token targets.
    """

    def build(key: jax.Array) -> Transformer:
        return Transformer(vocab, width, heads, layers, seq, rngs=nnx.Rngs(key), dtype=dtype)

    graphdef, _ = nnx.split(nnx.eval_shape(lambda: build(jax.random.key(0))), nnx.Param)

    def init(key: jax.Array) -> Any:
        return nnx.split(build(key), nnx.Param)[1]

    def loss(params: Any, tokens: jax.Array, targets: jax.Array) -> jax.Array:
        return _xent(nnx.merge(graphdef, params)(tokens), targets)

    def batch_loss(params: Any, tokens: jax.Array, targets: jax.Array) -> jax.Array:
        return jnp.mean(_xent(nnx.merge(graphdef, params)(tokens), targets))

    def data(key: jax.Array, batch: int) -> tuple[jax.Array, jax.Array]:
        stream = jax.random.randint(key, (batch, seq + 1), 0, vocab, jnp.int32)
        return stream[:, :-1], stream[:, 1:]

    return Model(f"transformer{layers}x{width}", init, loss, batch_loss, data)


# ----------------------------------------------------------------------------- measurement


def _compile(model: Model, method: str, args: tuple) -> tuple[Any, dict]:
    start = time.perf_counter()
    compiled = make_step(model, method).lower(*args).compile()
    seconds = time.perf_counter() - start
    rec: dict[str, Any] = {"compile_s": seconds}
    try:
        mem = compiled.memory_analysis()
        rec["temp_mb"] = mem.temp_size_in_bytes / 2**20
        rec["buffers_mb"] = (
            mem.temp_size_in_bytes + mem.argument_size_in_bytes + mem.output_size_in_bytes
        ) / 2**20
    except Exception:  # noqa: BLE001 - not every backend reports it
        rec["temp_mb"] = rec["buffers_mb"] = float("nan")
    return compiled, rec


def measure(batch: int, methods: tuple[str, ...], repeats: int, **size: Any) -> list[dict]:
    """Compile ``methods`` for one batch size, then time them round-robin (medians)."""
    model = transformer_model(**size)
    params = model.init(jax.random.key(0))
    xs, ys = model.data(jax.random.key(1), batch)
    keys = jax.random.split(jax.random.key(2), repeats + 1)
    compiled, records = {}, {}
    for method in methods:
        fn, rec = _compile(model, method, (params, keys[0], xs, ys))
        jax.block_until_ready(fn(params, keys[0], xs, ys))  # warm-up
        compiled[method], records[method] = fn, rec | {"times_ms": []}
    for r in range(repeats):
        order = methods if r % 2 == 0 else methods[::-1]
        for method in order:
            start = time.perf_counter()
            jax.block_until_ready(compiled[method](params, keys[r + 1], xs, ys))
            records[method]["times_ms"].append(1e3 * (time.perf_counter() - start))
    base = records.get("nonprivate")
    out = []
    for method in methods:
        rec = records[method]
        rec["median_ms"] = statistics.median(rec["times_ms"])
        if base is not None:
            base_ms = statistics.median(base["times_ms"])
            rec["ratio_to_nonprivate"] = rec["median_ms"] / base_ms
            rec["compile_ratio"] = rec["compile_s"] / base["compile_s"]
            rec["buffers_ratio"] = rec["buffers_mb"] / base["buffers_mb"]
            rec["temp_ratio"] = rec["temp_mb"] / base["temp_mb"]
        out.append({"model": model.name, "batch": batch, "method": method, **rec})
    return out


def _table(records: list[dict]) -> list[str]:
    lines = [
        "| batch | method | median ms | × non-private | XLA buffers MB (×) | temp MB (×) "
        "| compile s (×) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in records:
        lines.append(
            f"| {r['batch']} | {r['method']} | {r['median_ms']:.0f} | "
            f"{r.get('ratio_to_nonprivate', float('nan')):.2f} | "
            f"{r['buffers_mb']:.0f} ({r.get('buffers_ratio', float('nan')):.2f}) | "
            f"{r['temp_mb']:.0f} ({r.get('temp_ratio', float('nan')):.2f}) | "
            f"{r['compile_s']:.1f} ({r.get('compile_ratio', float('nan')):.2f}) |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.transformer", description=__doc__)
    parser.add_argument("--batches", default="32,128")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--no-vmap", action="store_true", help="skip the vmap DP step")
    parser.add_argument("--vmap-max-batch", type=int, default=32)
    args = parser.parse_args(argv)
    records: list[dict] = []
    for batch in (int(b) for b in args.batches.split(",")):
        methods = ("nonprivate", "dpjax")
        if not args.no_vmap and batch <= args.vmap_max_batch:
            methods += ("dpjax_vmap",)
        recs = measure(batch, methods, args.repeats)
        for rec in recs:
            print("BENCH " + json.dumps(rec), flush=True)
        records += recs
    print("\n".join(_table(records)), flush=True)
    return 0


# `make bench` rows: batch 32 in --quick, 32 and 128 in the full table.
register("transformer", transformer_model, batches=(32, 128), quick_batches=(32,))


if __name__ == "__main__":
    raise SystemExit(main())
