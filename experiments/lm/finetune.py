"""DP fine-tuning of the Llama of :mod:`experiments.lm.model` on characters' lines.

Data. One example is one training sequence of ONE speaking character's lines: the lines of a
(play, speaker) pair, each followed by a newline, tokenized and cut into disjoint windows of
``seq_len + 1`` tokens; the last window of a character is padded with the pad token. The
user of an example is its (play, speaker) (:mod:`experiments.data.shakespeare`).

Loss. Next-token cross-entropy averaged over the REAL target positions of the sequence.
Padding is a suffix (validated): a padded position is never a real target (its term is
selected away by ``jnp.where``, so its cotangent is exactly 0), and attention is causal, so a
padded token is never seen by a real position. Changing a padded token's id therefore changes
neither the loss nor any per-example gradient, exactly (the default test checks the DP update).

Frozen lower blocks. The pretrained model is PUBLIC (its weights do not depend on the private
data), so blocks ``0 .. n_lower - 1`` and the embedding, frozen in every fine-tuning mode here,
are run ONCE on every sequence (:func:`lower_hidden_states`) and training sees the hidden
states after them: the trainable window is ``Llama(first_block=n_lower)`` (its blocks, the final
norm and the head). This is post-processing of public weights and the private records, per
record, so each example is still a function of its own sequence only.

Modes (the trainable part of the window; everything else frozen by
:func:`dpjax.dp_sgd.finetune.partition`, never clipped or noised):

* ``lora``: rank-r adapters on every projection of the window's blocks (q, k, v, o, gate, up,
  down; Yu et al. 2022);
* ``norm``: the RMSNorm scales of the window (DP-BiTFiT, Bu et al. 2022, trains the biases;
  Llama has NO biases, so the analogue here is norm-only);
* ``last_blocks``: every parameter of the window's last ``last_blocks`` blocks;
* ``full``: every parameter of the window's blocks and its final norm. The head (49 152 × 576,
  tied to the embedding table in the file) stays frozen: dpjax's certified ghost clipping
  refuses a float32 layer whose per-example gradient has more than 2²³ entries (the rounding
  bound of its norm would not hold), and 28.3 M noise coordinates would swamp the signal;

* ``scratch``: a small Llama (same tokenizer) from a random initialisation, all parameters.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from dpjax.dp_sgd import finetune as ft
from experiments.lm import model

MODES = ("lora", "norm", "last_blocks", "full")
LORA_LAYERS = ("q", "k", "v", "o", "gate", "up", "down")


# -- data -----------------------------------------------------------------------------------------


def character_texts(plays: dict) -> list[tuple[str, str, str]]:
    """(play, speaker, text) per (play, speaker) pair, in play order then first appearance."""
    out = []
    for play, pairs in plays.items():
        lines: dict[str, list[str]] = {}
        for speaker, line in pairs:
            lines.setdefault(speaker, []).append(line)
        out += [(play, s, "".join(f"{line}\n" for line in ls)) for s, ls in lines.items()]
    return out


def windows(ids: list[int], seq_len: int, pad_id: int, max_windows: int | None = None):
    """Disjoint windows of ``seq_len + 1`` token ids (last one padded) and their target masks."""
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1; got {seq_len}")
    tokens, masks = [], []
    for start in range(0, max(len(ids) - 1, 0), seq_len + 1):
        chunk = ids[start : start + seq_len + 1]
        if len(chunk) < 2:
            break
        real = len(chunk) - 1
        tokens.append(chunk + [pad_id] * (seq_len + 1 - len(chunk)))
        masks.append([1.0] * real + [0.0] * (seq_len - real))
        if max_windows is not None and len(tokens) == max_windows:
            break
    return tokens, masks


def character_sequences(texts, tokenizer, seq_len: int, pad_id: int,
                        max_windows_per_user: int | None = None) -> dict:  # fmt: skip
    """Token windows of each character: ``tokens`` (n, T+1) int32, ``mask`` (n, T) float32,
    ``user`` (n,) int32 (index into ``users``), ``users`` [(play, speaker)]."""
    tokens, masks, user, users = [], [], [], []
    for play, speaker, text in texts:
        ids = tokenizer(text)["input_ids"]
        t, m = windows(ids, seq_len, pad_id, max_windows_per_user)
        if not t:
            continue
        tokens += t
        masks += m
        user += [len(users)] * len(t)
        users.append((play, speaker))
    return dict(tokens=np.asarray(tokens, np.int32).reshape(-1, seq_len + 1),
                mask=np.asarray(masks, np.float32).reshape(-1, seq_len),
                user=np.asarray(user, np.int32), users=users)  # fmt: skip


def check_suffix_padding(mask: np.ndarray) -> None:
    """Refuse masks that are not 1…1 0…0 per row (padding must be a suffix, see the module)."""
    mask = np.asarray(mask)
    if mask.ndim != 2 or not np.isin(mask, (0.0, 1.0)).all():
        raise ValueError("mask must be a (n, T) array of 0/1")
    if (np.diff(mask, axis=1) > 0).any():
        raise ValueError("mask must be a suffix padding per row (ones, then zeros)")


# -- model pieces ---------------------------------------------------------------------------------


def lower_hidden_states(config, lower_params, tokens, batch: int = 32) -> np.ndarray:
    """Hidden states (n, T, D) after the frozen lower blocks, computed once (public weights).

    The blocks run under ``lax.scan`` over their stacked weights: XLA compiles ONE block, not
    ``n_lower`` unrolled copies (the same function; float32 rounding may differ by fusion)."""
    n_lower = sum(1 for k in lower_params if k.startswith("blocks_"))
    run = _lower_runner(config)
    stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves),
                           *[lower_params[f"blocks_{i}"] for i in range(n_lower)])  # fmt: skip
    embedding = lower_params["embed"]["embedding"]
    out = []
    for start in range(0, len(tokens), batch):
        chunk = np.asarray(tokens[start : start + batch])
        size = len(chunk)
        if size < batch:  # one compiled shape
            chunk = np.concatenate([chunk, np.repeat(chunk[-1:], batch - size, 0)])
        out.append(np.asarray(run(embedding, stacked, jnp.asarray(chunk)))[:size])
    return np.concatenate(out).astype(np.float32)


_LOWER_RUNNERS: dict = {}


def _lower_runner(config):
    """``run(embedding, stacked_blocks, tokens (B, T)) -> (B, T, D)``, jitted once per config;
    the weights are ARGUMENTS of the compiled function, not constants folded into it."""
    if config not in _LOWER_RUNNERS:
        block = model.Block(config)

        def one(embedding, stacked, tokens):
            def body(x, p):
                return block.apply({"params": p}, x), None

            return jax.lax.scan(body, jnp.take(embedding, tokens, axis=0), stacked)[0]

        _LOWER_RUNNERS[config] = jax.jit(jax.vmap(one, in_axes=(None, None, 0)))
    return _LOWER_RUNNERS[config]


def window_model(config, n_lower: int) -> model.Llama:
    return model.Llama(config, first_block=n_lower)


def example_loss_fn(net):
    """``loss(params, example)``: masked next-token cross-entropy of ONE sequence;
    ``example`` = {"x": (T,) ids or (T, D) hidden states, "y": (T,), "mask": (T,)}."""

    def loss(params, example):
        logits = net.apply({"params": params}, example["x"])
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        nll = -jnp.take_along_axis(logp, example["y"][:, None], axis=-1)[:, 0]
        real = example["mask"] > 0
        total = jnp.sum(jnp.where(real, nll, jnp.zeros_like(nll)))
        return total / jnp.maximum(jnp.sum(real), 1).astype(total.dtype)

    return loss


_NLL_RUNNERS: dict = {}


def sequence_nll(net, params, x, y, mask, batch: int = 32) -> tuple[float, float]:
    """(summed NLL over real target tokens, number of real targets) on held-out sequences."""

    def one(p, x1, y1, m1):
        logp = jax.nn.log_softmax(net.apply({"params": p}, x1).astype(jnp.float32), -1)
        nll = -jnp.take_along_axis(logp, y1[:, None], axis=-1)[:, 0]
        return jnp.sum(jnp.where(m1 > 0, nll, 0.0))

    run = _NLL_RUNNERS.get(net)
    if run is None:  # one compiled evaluation per window model (the params are arguments)
        run = _NLL_RUNNERS[net] = jax.jit(jax.vmap(one, in_axes=(None, 0, 0, 0)))
    total, count = 0.0, float(np.sum(mask))
    for start in range(0, len(y), batch):
        sl = slice(start, start + batch)
        sums = run(params, jnp.asarray(x[sl]), jnp.asarray(y[sl]), jnp.asarray(mask[sl]))
        total += float(np.sum(np.asarray(sums, np.float64)))
    return total, count


def mode_parts(mode: str, window_params: dict, *, rank: int, last_blocks: int, key):
    """(trainable, frozen) of the window for ``mode`` (see the module docstring)."""
    params = window_params
    if mode == "lora":
        params = ft.add_lora(key, params, rank, layers=lambda path, _: path[-1] in LORA_LAYERS)
        predicate = ft.is_lora
    elif mode == "norm":
        predicate = lambda path, _=None: path[-1] == "scale"  # noqa: E731
    elif mode == "last_blocks":
        blocks = sorted((k for k in params if k.startswith("blocks_")), key=lambda k: int(k[7:]))
        if not 1 <= last_blocks <= len(blocks):
            raise ValueError(f"last_blocks must be in [1, {len(blocks)}]; got {last_blocks}")
        predicate = ft.under(*blocks[-last_blocks:])
    elif mode == "full":
        predicate = lambda path, _=None: path[0] != "head"  # noqa: E731
    else:
        raise ValueError(f"mode must be one of {MODES}; got {mode!r}")
    return ft.partition(params, predicate)


def scratch_config(config) -> model.LlamaConfig:
    """The from-scratch model: 2 blocks, width 64, 4/2 heads, MLP 128, the same vocabulary."""
    return dataclasses.replace(config, width=64, n_blocks=2, n_heads=4, n_kv_heads=2, mlp=128)


def scratch_params(config, key, seq_len: int) -> dict:
    net = model.Llama(scratch_config(config))
    return net.init(key, jnp.zeros(seq_len, jnp.int32))["params"]
