"""The same models in PyTorch, and Opacus's DP-SGD step on them (the ``bench-torch`` extra).

Only imported when torch and opacus are installed (``pip install -e ".[bench-torch]"``);
dpjax never depends on them. :data:`TORCH_MODELS` mirrors :data:`benchmarks.models.MODELS`
layer for layer (same shapes, activations, padding, pooling, loss); a model with no entry here
gets no Opacus column. The weights are each framework's default initialisation (a step's time
does not depend on them).

The transformer's twin (:mod:`benchmarks.transformer`, sizes from its ``SIZE``) has the JAX
model's parameters one for one: token and positional ``nn.Embedding`` (positions fed as a
``(batch, seq)`` batch of ids), per block LayerNorm (ε = 1e-6, flax's), causal self-attention
as four ``nn.Linear`` q/k/v/out with ``scaled_dot_product_attention(is_causal=True)``,
LayerNorm, MLP with tanh-approximate GELU (``nnx.gelu``), then LayerNorm and an untied head.
Its criterion :class:`SequenceCrossEntropy` is dpjax's loss: each sequence's mean next-token
cross-entropy, one sequence per privacy unit, averaged over the batch. Everything follows the
device of the module and the data (``torch_steps(..., device="cuda")``).

Each Opacus mode is a complete DP-SGD step: per-example clipping to C = 1, Gaussian noise
σ = 1, division by the batch size, SGD (lr 0.1) — dpjax's step in :mod:`benchmarks.steps`.
Modes: ``hooks`` (per-sample gradients by module hooks, Opacus's default), ``functorch``
(``torch.func.vmap``), ``ew`` (expanded weights) and ``ghost`` (fast gradient / ghost
clipping, Opacus ≥ 1.5: two backward passes, per-sample norms without per-sample gradients).
The benchmark times every mode that builds and reports the fastest ("Opacus's best mode").
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import nn

__all__ = [
    "TORCH_MODELS",
    "OPACUS_MODES",
    "SequenceCrossEntropy",
    "SequenceMSE",
    "opacus_step",
    "torch_steps",
    "register_torch",
]

OPACUS_MODES = ("hooks", "functorch", "ew", "ghost")
LR, CLIP, NOISE_MULTIPLIER = 0.1, 1.0, 1.0


def _mlp() -> nn.Module:
    return nn.Sequential(
        nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
    )


def _cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 5, stride=2),
        nn.ReLU(),
        nn.Conv2d(16, 32, 4, stride=2),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(32 * 5 * 5, 32),  # 28 → 12 → 5
        nn.ReLU(),
        nn.Linear(32, 10),
    )


def _cnn_tanh() -> nn.Module:
    """Papernot et al.'s tempered-sigmoid CNN, as in Opacus's MNIST example."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 8, stride=2, padding=3),
        nn.Tanh(),
        nn.MaxPool2d(2, 1),
        nn.Conv2d(16, 32, 4, stride=2),
        nn.Tanh(),
        nn.MaxPool2d(2, 1),
        nn.Flatten(),
        nn.Linear(32 * 4 * 4, 32),
        nn.Tanh(),
        nn.Linear(32, 10),
    )


def _logreg() -> nn.Module:
    return nn.Sequential(nn.Linear(10_000, 1), nn.Flatten(0))


class _LoRALayer(nn.Module):
    """relu(x·W0 + b0 + (x·A)·B) with W0, b0 frozen (``requires_grad=False``)."""

    def __init__(self, d_in: int, d_out: int, rank: int = 8):
        super().__init__()
        self.base = nn.Linear(d_in, d_out)
        self.base.requires_grad_(False)
        self.a = nn.Linear(d_in, rank, bias=False)
        self.b = nn.Linear(rank, d_out, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.base(x) + self.b(self.a(x)))


def _lora_mlp() -> nn.Module:
    """benchmarks.models' LoRA MLP: two frozen 784-512-512 layers with rank-8 adapters, head."""
    return nn.Sequential(_LoRALayer(784, 512), _LoRALayer(512, 512), nn.Linear(512, 10, bias=False))


class _CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention from four ``nn.Linear`` (flax's q/k/v/out, with bias).

    Every parameter sits in an ``nn.Linear`` acting on ``(batch, seq, width)``, so each Opacus
    mode has a per-sample rule for it (ghost: Linear's norm sampler). Opacus 1.6's
    ``DPMultiheadAttention`` is not used: with ``batch_first=True`` it reshapes the heads'
    output as ``(batch, seq, width)`` without transposing (a different function from
    ``nn.MultiheadAttention``) and rejects a ``(seq, seq)`` causal mask unless batch = seq.
    The attention itself is ``scaled_dot_product_attention(is_causal=True)``: scale
    1/√head_dim, key j ≤ query i, as ``nnx.make_causal_mask``.
    """

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value, self.out = (nn.Linear(width, width) for _ in range(4))

    def _split(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, W) -> (B, H, T, W / H)
        return x.unflatten(-1, (self.heads, -1)).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (self._split(f(x)) for f in (self.query, self.key, self.value))
        att = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(att.transpose(1, 2).flatten(2))


class _Block(nn.Module):
    """Pre-norm block: x + attn(LN(x)), then x + MLP(LN(x)); flax's LayerNorm ε = 1e-6 and
    tanh-approximate GELU (``nnx.gelu``'s default)."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width, eps=1e-6), nn.LayerNorm(width, eps=1e-6)
        self.attn = _CausalSelfAttention(width, heads)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
        self.gelu = nn.GELU(approximate="tanh")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.down(self.gelu(self.up(self.ln2(x))))


class _Transformer(nn.Module):
    """benchmarks.transformer's causal LM: token + positional embedding, blocks, LN, head."""

    def __init__(self, vocab: int, width: int, heads: int, layers: int, seq: int):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(seq, width)
        self.blocks = nn.ModuleList(_Block(width, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(width, eps=1e-6)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``(B, T, vocab)`` for token ids ``(B, T)``."""
        # positions as a contiguous (B, T) batch: Opacus's per-sample rules read dim 0 as the
        # example, and its ghost embedding norm views the ids flat
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        positions = positions.expand_as(tokens).contiguous()
        x = self.tokens(tokens) + self.positions(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


class SequenceCrossEntropy(nn.Module):
    """Per sequence: the mean next-token cross-entropy over its positions (dpjax's loss).

    ``reduction`` ``"mean"`` / ``"sum"`` reduces over the sequences, ``"none"`` returns one
    loss per sequence ``(B,)`` — what Opacus's ghost mode sets to get per-example losses (a
    sequence is the privacy unit, as in dpjax's ``loss(params, tokens, targets)``).
    """

    def __init__(self, reduction: str = "mean"):
        super().__init__()
        self.reduction = reduction

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        tokens = nn.functional.cross_entropy(
            logits.flatten(0, 1), targets.flatten(), reduction="none"
        )
        per_sequence = tokens.view(targets.shape).mean(dim=1)
        if self.reduction not in ("mean", "sum", "none"):  # Opacus sets the attribute itself
            raise ValueError(f"reduction must be 'mean', 'sum' or 'none'; got {self.reduction!r}")
        if self.reduction == "none":
            return per_sequence
        return per_sequence.sum() if self.reduction == "sum" else per_sequence.mean()


def _transformer(**size: int) -> nn.Module:
    """The twin of ``benchmarks.transformer.transformer_model(**size)`` (default: its SIZE)."""
    from benchmarks.transformer import SIZE

    return _Transformer(**(SIZE | size))


def _token_data(batch: int, **size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token streams of ``seq + 1``: inputs and their next-token targets."""
    from benchmarks.transformer import SIZE

    vocab, seq = (SIZE | size)["vocab"], (SIZE | size)["seq"]
    gen = torch.Generator().manual_seed(1)
    stream = torch.randint(0, vocab, (batch, seq + 1), generator=gen)
    return stream[:, :-1].contiguous(), stream[:, 1:].contiguous()


class _LoRALinear(nn.Module):
    """x·W0 + (x·A)·B: frozen ``base`` (no bias), trainable ``a`` (d_in → r), ``b`` (r → d_out)."""

    def __init__(self, d_in: int, d_out: int, rank: int):
        super().__init__()
        self.base = nn.Linear(d_in, d_out, bias=False)
        self.base.requires_grad_(False)
        self.a = nn.Linear(d_in, rank, bias=False)
        self.b = nn.Linear(rank, d_out, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.b(self.a(x))


class _RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + ε) · scale with a frozen scale (ones), as the JAX block's."""

    def __init__(self, width: int, eps: float):
        super().__init__()
        self.eps = eps
        self.register_buffer("scale", torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.scale


class _LlamaBlock(nn.Module):
    """benchmarks.llama_block's block: RMSNorm, GQA causal attention with RoPE, RMSNorm, SwiGLU;
    every projection a frozen weight plus a rank-r LoRA adapter (the only trainable weights)."""

    def __init__(self, width: int, heads: int, kv_heads: int, mlp: int, seq: int, rank: int):
        super().__init__()
        from benchmarks.llama_block import RMS_EPS, ROPE_THETA, projection_shapes

        size = dict(width=width, heads=heads, kv_heads=kv_heads, mlp=mlp)
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, width // heads
        for name, (d_in, d_out) in projection_shapes(size).items():
            setattr(self, name, _LoRALinear(d_in, d_out, rank))
        self.norm1, self.norm2 = _RMSNorm(width, RMS_EPS), _RMSNorm(width, RMS_EPS)
        dim = self.head_dim
        inv_freq = ROPE_THETA ** (-torch.arange(0, dim, 2, dtype=torch.float32) / dim)
        angles = torch.arange(seq, dtype=torch.float32)[:, None] * inv_freq[None, :]
        self.register_buffer("cos", torch.cat([angles.cos()] * 2, -1)[:, None, :])
        self.register_buffer("sin", torch.cat([angles.sin()] * 2, -1)[:, None, :])

    def _rope(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, H, D)
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * self.cos + rotated * self.sin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        h = self.norm1(x)
        q = self._rope(self.q(h).view(batch, seq, self.heads, self.head_dim))
        k = self._rope(self.k(h).view(batch, seq, self.kv_heads, self.head_dim))
        v = self.v(h).view(batch, seq, self.kv_heads, self.head_dim)
        groups = self.heads // self.kv_heads
        k, v = (t.repeat_interleave(groups, dim=2) for t in (k, v))
        att = nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.o(att.transpose(1, 2).flatten(2))
        h = self.norm2(x)
        return x + self.down(nn.functional.silu(self.gate(h)) * self.up(h))


class SequenceMSE(nn.Module):
    """Per sequence: half the mean squared error over its positions and features (the JAX
    block's loss); ``reduction`` as :class:`SequenceCrossEntropy`'s."""

    def __init__(self, reduction: str = "mean"):
        super().__init__()
        self.reduction = reduction

    def forward(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        per_sequence = 0.5 * (output - target).pow(2).flatten(1).mean(dim=1)
        if self.reduction not in ("mean", "sum", "none"):
            raise ValueError(f"reduction must be 'mean', 'sum' or 'none'; got {self.reduction!r}")
        if self.reduction == "none":
            return per_sequence
        return per_sequence.sum() if self.reduction == "sum" else per_sequence.mean()


def _llama_block(**size: int) -> nn.Module:
    """The twin of ``benchmarks.llama_block.llama_block_model(**size)``."""
    from benchmarks.llama_block import SIZE

    return _LlamaBlock(**(SIZE | size))


def _hidden_states(batch: int, **size: int) -> tuple[torch.Tensor, torch.Tensor]:
    from benchmarks.llama_block import SIZE

    full = SIZE | size
    gen = torch.Generator().manual_seed(1)
    shape = (batch, full["seq"], full["width"])
    return torch.randn(*shape, generator=gen), torch.randn(*shape, generator=gen)


def _images(batch: int, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return torch.randn(batch, *shape, generator=gen), torch.randint(0, 10, (batch,), generator=gen)


def _logreg_data(batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    xs = torch.randn(batch, 10_000, generator=gen) / 100.0
    return xs, torch.randint(0, 2, (batch,), generator=gen).float()


# name -> (module factory, data(batch) -> (xs, ys), criterion factory)
TORCH_MODELS: dict[str, tuple[Callable, Callable, Callable]] = {
    "mlp": (_mlp, lambda b: _images(b, (784,)), nn.CrossEntropyLoss),
    "cnn": (_cnn, lambda b: _images(b, (1, 28, 28)), nn.CrossEntropyLoss),
    "cnn_tanh": (_cnn_tanh, lambda b: _images(b, (1, 28, 28)), nn.CrossEntropyLoss),
    # the same function as "cnn" (JAX writes its convolutions as im2col patches @ kernel)
    "cnn_im2col": (_cnn, lambda b: _images(b, (1, 28, 28)), nn.CrossEntropyLoss),
    "logreg": (_logreg, _logreg_data, nn.BCEWithLogitsLoss),
    "lora_mlp": (_lora_mlp, lambda b: _images(b, (784,)), nn.CrossEntropyLoss),
    "transformer": (_transformer, _token_data, SequenceCrossEntropy),
    "llama_block": (_llama_block, _hidden_states, SequenceMSE),
}


def register_torch(name: str, module: Callable, data: Callable, criterion: Callable) -> None:
    """Add the PyTorch twin of benchmark model ``name`` (for its Opacus column)."""
    TORCH_MODELS[name] = (module, data, criterion)


def _synchronise(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _build(name: str, batch: int, device: str):
    module_fn, data_fn, criterion_fn = TORCH_MODELS[name]
    xs, ys = data_fn(batch)
    return module_fn().to(device), criterion_fn(), xs.to(device), ys.to(device)


def _nonprivate(name: str, batch: int, device: str) -> Callable[[], None]:
    model, criterion, xs, ys = _build(name, batch, device)
    opt = torch.optim.SGD(model.parameters(), lr=LR)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        criterion(model(xs), ys).backward()
        opt.step()
        _synchronise(device)

    return step


def _opacus(name: str, batch: int, mode: str, device: str) -> Callable[[], None]:
    return opacus_step(*_build(name, batch, device), mode)


def opacus_step(
    model: nn.Module,
    criterion: nn.Module,
    xs: torch.Tensor,
    ys: torch.Tensor,
    mode: str,
    *,
    noise_multiplier: float = NOISE_MULTIPLIER,
    max_grad_norm: float = CLIP,
) -> Callable[[], None]:
    """Opacus's DP-SGD step in ``mode`` (one of :data:`OPACUS_MODES`) on one fixed batch.

    ``model`` is made private in place; each call of the returned ``step()`` clips every
    example's gradient to ``max_grad_norm``, adds noise σ = ``noise_multiplier``·C, divides by
    the batch size and takes an SGD step (lr :data:`LR`) on ``model``'s parameters, then
    synchronises the device of ``xs``.
    """
    from opacus import PrivacyEngine

    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(xs, ys), batch_size=xs.shape[0]
    )
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        made = PrivacyEngine(accountant="rdp").make_private(
            module=model,
            optimizer=opt,
            criterion=criterion,
            data_loader=loader,
            noise_multiplier=noise_multiplier,
            max_grad_norm=max_grad_norm,
            poisson_sampling=False,
            grad_sample_mode=mode,
        )
    if mode == "ghost":
        dp_model, dp_opt, dp_criterion, _ = made
    else:
        (dp_model, dp_opt, _), dp_criterion = made, criterion
    device = xs.device.type

    def step() -> None:
        dp_criterion(dp_model(xs), ys).backward()
        dp_opt.step()
        # cleared after the step, not before the next: the per-sample gradients (GiBs for the
        # transformer's embedding and head at batch 128) are not held between calls, while the
        # worker probes every mode (same work per call either way)
        dp_opt.zero_grad(set_to_none=True)
        _synchronise(device)

    return step


def torch_steps(
    name: str, batch: int, device: str = "cpu"
) -> tuple[dict[str, Callable[[], None]], dict[str, str]]:
    """``({method: step()}, {mode: why it failed})``: torch non-private + each Opacus mode.

    Methods are named ``torch_nonprivate`` and ``opacus_<mode>``; each step is synchronous on
    CPU and synchronises CUDA when ``device`` is a GPU.
    """
    steps: dict[str, Callable[[], None]] = {}
    failed: dict[str, str] = {}
    if name not in TORCH_MODELS:
        return steps, {"all": f"no PyTorch twin of {name!r} in TORCH_MODELS"}
    steps["torch_nonprivate"] = _nonprivate(name, batch, device)
    for mode in OPACUS_MODES:
        try:
            step = _opacus(name, batch, mode, device)
            step()  # builds hooks / checks the mode supports every layer
        except Exception as err:  # noqa: BLE001 - an unsupported mode is a result, not a crash
            failed[mode] = f"{type(err).__name__}: {str(err)[:200]}"
            continue
        steps[f"opacus_{mode}"] = step
    return steps, failed
