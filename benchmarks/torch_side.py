"""The same models in PyTorch, and Opacus's DP-SGD step on them (the ``bench-torch`` extra).

Only imported when torch and opacus are installed (``pip install -e ".[bench-torch]"``);
dpjax never depends on them. :data:`TORCH_MODELS` mirrors :data:`benchmarks.models.MODELS`
layer for layer (same shapes, activations, padding, pooling, loss); a model with no entry here
gets no Opacus column. The weights are each framework's default initialisation (a step's time
does not depend on them).

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

__all__ = ["TORCH_MODELS", "OPACUS_MODES", "torch_steps", "register_torch"]

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
    "logreg": (_logreg, _logreg_data, nn.BCEWithLogitsLoss),
    "lora_mlp": (_lora_mlp, lambda b: _images(b, (784,)), nn.CrossEntropyLoss),
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
    from opacus import PrivacyEngine

    model, criterion, xs, ys = _build(name, batch, device)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, ys), batch_size=batch)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        made = PrivacyEngine(accountant="rdp").make_private(
            module=model,
            optimizer=opt,
            criterion=criterion,
            data_loader=loader,
            noise_multiplier=NOISE_MULTIPLIER,
            max_grad_norm=CLIP,
            poisson_sampling=False,
            grad_sample_mode=mode,
        )
    if mode == "ghost":
        dp_model, dp_opt, dp_criterion, _ = made
    else:
        (dp_model, dp_opt, _), dp_criterion = made, criterion

    def step() -> None:
        dp_opt.zero_grad(set_to_none=True)
        dp_criterion(dp_model(xs), ys).backward()
        dp_opt.step()
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
