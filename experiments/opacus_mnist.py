"""Time to accuracy on MNIST, dpjax beside Opacus: the same model, hyperparameters and noise.

Two settings, each trained end to end on the real MNIST files by ``dpjax.make_private`` and by
Opacus (``PrivacyEngine.make_private``, Poisson sampling, its default per-sample hooks), on the
same machine, one after the other; the wall time and the process CPU time of the training loop
(JIT compilation included on dpjax's side, data loading excluded on both) and the test accuracy
of the final model are recorded:

* ``tb_cnn``: Tramèr & Boneh 2021's end-to-end tanh CNN (:mod:`experiments.mnist_cnn`;
  https://arxiv.org/abs/2011.11660): pixels in [0, 1], batch 512 (q = 512/60 000), SGD lr 0.5
  momentum 0.9, C = 0.1, σ = 1.23; the paper trains 40 epochs (98.1 % at ε = 3);
  ``tb_cnn_fmnist`` is the same CNN on Fashion-MNIST (batch 2048, lr 4, σ = 2.15, 40 epochs;
  86.0 % at ε = 3), dpjax only (``--framework dpjax``: no Opacus run of it here);
* ``opacus_example``: Opacus's own MNIST example (``examples/mnist.py`` and
  ``examples/mnist_README.md`` of github.com/pytorch/opacus), its ``SampleConvNet`` (conv 16
  8×8 stride 2 padding 3, ReLU, max-pool 2 stride 1, conv 32 4×4 stride 2, ReLU, max-pool,
  linear 512 → 32, ReLU, linear 32 → 10), pixels normalised by MNIST's mean 0.1307 and sd
  0.3081, SGD without momentum; the README's (ε ≈ 1.2, δ = 1e-5) command
  ``-n=15 --lr=.25 --sigma=1.3 -c=1.5 -sr=0.004`` (sampling rate 0.004: expected batch 240,
  250 steps an epoch; 15 epochs, 94.63 % ± 0.34 over 10 runs);
* the README's other rows of the example, run one at a time (``--setting``):
  ``opacus_example_sigma0.7`` (``-n=45 --lr=.25 --sigma=.7 -c=1.5``, 97.09 % at ε = 6.86),
  ``opacus_example_sigma1.1`` (``-n 60 --lr=.15 --sigma=1.1 -c=1.0``, 96.78 % at ε = 2.91) and
  ``opacus_example_nonprivate`` (``--disable-dp --n=20 --lr=.1``, 98.94 %): plain SGD over
  reshuffled batches of 240, by optax on dpjax's side (no dpjax DP code) and by torch without
  the ``PrivacyEngine`` on Opacus's.

Same in both frameworks: the architecture (layer for layer), preprocessing, loss (mean
cross-entropy over the expected batch), clip C, noise multiplier σ, Poisson sampling rate,
number of steps, learning rate and momentum, hence the same ε. ε is printed as each framework
accounts it: dpjax's PLD accountant and Opacus's default (PRV) accountant, both add/remove-one.
The initial weights follow the same law where the setting says ``init="torch"`` (the
SampleConvNet settings: PyTorch's default ``Conv2d``/``Linear`` init, weights and biases
U(±1/√fan_in), drawn on dpjax's side by :func:`torch_default_init`); ``tb_cnn`` keeps flax's
default (LeCun normal weights, zero biases), and ``--init flax|torch`` overrides either. Rows
measured before this option existed ran flax's init and record ``init: flax``. With the same
initial weights copied across, the loss and gradients agree to float32 rounding (the non-private
step is the same; the tests check it). Not the same: the random streams (the draws of the
initial weights, the batches, the noise).

Scales: ``quick`` (one epoch of each setting, one seed: NOT the papers' protocol, which runs
15 and 40 epochs; the numbers committed to the published-results table), ``full`` (the
papers' epochs), and ``smoke`` (a few steps on a slice; the tests). Run by name
(``python -m experiments opacus_mnist [--full]``), never by ``all``: it needs torch and opacus
(the ``bench-torch`` extra) and the MNIST files (``make data``); without them it returns a
SKIPPED section that says which.
"""

from __future__ import annotations

import pathlib
import sys
import time

import numpy as np

DESCRIPTION = "opacus_mnist: time to accuracy on MNIST, dpjax beside Opacus (run by name)"
TITLE = "## Time to accuracy on MNIST: dpjax beside Opacus (same model, σ, C, q, steps)"

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081  # Opacus's example's normalisation
N_TRAIN = 60_000
# Opacus's MNIST example (SampleConvNet): its model, preprocessing, q = 240/60 000 and SGD
# without momentum, shared by the README's rows, which differ in σ, C, lr and epochs.
_SAMPLE_CONVNET = dict(activation="relu", padding=3, normalise=True, batch_size=240,
                       momentum=0.0, delta=1e-5, init="torch")  # fmt: skip
# Initialisers of the dpjax model: "torch" draws what PyTorch's default Conv2d/Linear init draws
# (kaiming_uniform(a=√5) weights, i.e. U(±1/√fan_in), and biases U(±1/√fan_in)): the peer's
# model; "flax" is flax's default (LeCun normal weights, zero biases).
INITS = ("flax", "torch")
SETTINGS = {
    "tb_cnn": dict(
        label="Tramèr & Boneh 2021 end-to-end tanh CNN",
        activation="tanh", padding=2, normalise=False, batch_size=512, learning_rate=0.5,
        momentum=0.9, init="flax", l2_clip_norm=0.1, noise_multiplier=1.23, epochs=40, delta=1e-5,
        published=98.1, published_note="98.1 % at ε = 3 (RDP), 40 epochs",
    ),
    # Tramèr & Boneh's Fashion-MNIST run of the same CNN (their README's command
    # ``cnns.py --dataset=fmnist --batch_size=2048 --lr=4 --noise_multiplier=2.15``; the rest of
    # ``cnns.py``'s defaults as for MNIST: momentum 0.9, C = 0.1, pixels in [0, 1] by ToTensor).
    "tb_cnn_fmnist": dict(
        label="Tramèr & Boneh 2021 end-to-end tanh CNN, Fashion-MNIST", dataset="fashion-mnist",
        activation="tanh", padding=2, normalise=False, batch_size=2048, learning_rate=4.0,
        momentum=0.9, init="flax", l2_clip_norm=0.1, noise_multiplier=2.15, epochs=40,
        delta=1e-5, published=86.0, published_note="86.0 % at ε = 3 (RDP), 40 epochs",
    ),
    "opacus_example": dict(
        _SAMPLE_CONVNET, label="Opacus MNIST example (SampleConvNet)",
        learning_rate=0.25, l2_clip_norm=1.5, noise_multiplier=1.3, epochs=15,
        published=94.63, published_note="94.63 % ± 0.34 at ε = 1.16 (10 runs), 15 epochs",
    ),
    # The README's other rows:
    "opacus_example_sigma0.7": dict(
        _SAMPLE_CONVNET, label="Opacus MNIST example (SampleConvNet), σ = 0.7",
        learning_rate=0.25, l2_clip_norm=1.5, noise_multiplier=0.7, epochs=45,
        published=97.09, published_note="97.09 % ± 0.17 at ε = 6.86 (10 runs), 45 epochs",
    ),
    "opacus_example_sigma1.1": dict(
        _SAMPLE_CONVNET, label="Opacus MNIST example (SampleConvNet), σ = 1.1",
        learning_rate=0.15, l2_clip_norm=1.0, noise_multiplier=1.1, epochs=60,
        published=96.78, published_note="96.78 % ± 0.21 at ε = 2.91 (10 runs), 60 epochs",
    ),
    # ``--disable-dp --n=20 --lr=.1 -sr=0.004``: plain SGD, no clipping, no noise; batches of
    # 240 from a reshuffle of the training set each epoch (250 steps an epoch).
    "opacus_example_nonprivate": dict(
        _SAMPLE_CONVNET, label="Opacus MNIST example (SampleConvNet), non-private",
        learning_rate=0.1, l2_clip_norm=None, noise_multiplier=None, epochs=20, delta=None,
        published=98.94, published_note="98.94 % ± 0.32, non-private (10 runs), 20 epochs",
    ),
}  # fmt: skip
# What ``python -m experiments opacus_mnist`` runs (both frameworks, one seed): the two settings
# of the time-to-accuracy table. The README's other rows run one at a time through
# ``python -m experiments.opacus_mnist --setting NAME``.
DEFAULT_SETTINGS = ("tb_cnn", "opacus_example")
SIZES = {
    "smoke": dict(epochs=None, steps=3, n_train=2_000, n_test=500),
    "quick": dict(epochs=1, steps=None, n_train=None, n_test=None),
    "full": dict(epochs="paper", steps=None, n_train=None, n_test=None),
}
FRAMEWORKS = ("dpjax", "opacus")


def steps_for(setting: str, size: str, n_train: int) -> int:
    """DP-SGD steps: ⌈epochs / q⌉ with q = batch / n (the same in both frameworks)."""
    spec, hyper = SIZES[size], SETTINGS[setting]
    if spec["steps"] is not None:
        return spec["steps"]
    epochs = hyper["epochs"] if spec["epochs"] == "paper" else spec["epochs"]
    return int(np.ceil(epochs * n_train / hyper["batch_size"]))


def images(x: np.ndarray, normalise: bool) -> np.ndarray:
    """uint8 (n, 28, 28) → float32 (n, 28, 28) in [0, 1] (ToTensor), then (x − 0.1307)/0.3081
    when ``normalise`` (the example's ``transforms.Normalize``)."""
    out = x.astype(np.float32) / 255.0
    return (out - MNIST_MEAN) / MNIST_STD if normalise else out


# --------------------------------------------------------------------------- dpjax side


def torch_default_init(fan_in: int) -> dict:
    """flax ``kernel_init``/``bias_init`` drawing what PyTorch's default ``Conv2d``/``Linear``
    init draws for a layer of ``fan_in`` inputs (in_channels × kernel area, or in_features):
    weights kaiming_uniform(a=√5) = U(±1/√fan_in), biases U(±1/√fan_in)."""
    import jax

    if fan_in < 1:
        raise ValueError(f"fan_in must be a positive integer; got {fan_in}")
    bound = 1.0 / np.sqrt(fan_in)

    def uniform(key, shape, dtype=np.float32):
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return dict(kernel_init=uniform, bias_init=uniform)


def build_jax_model(setting: str, key, init: str | None = None):
    """The setting's CNN in flax nnx (NHWC), layer for layer the torch one below; initialised
    by ``init`` (one of :data:`INITS`; default the setting's)."""
    import jax.numpy as jnp
    from flax import nnx

    from benchmarks.models import max_pool_2x2_stride1 as pool

    hyper = SETTINGS[setting]
    init = hyper["init"] if init is None else init
    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}; got {init!r}")
    act = jnp.tanh if hyper["activation"] == "tanh" else nnx.relu
    pad = hyper["padding"]
    inits = torch_default_init if init == "torch" else (lambda _fan_in: {})

    class CNN(nnx.Module):
        def __init__(self, rngs):
            self.conv1 = nnx.Conv(1, 16, (8, 8), strides=2, padding=((pad, pad),) * 2,
                                  rngs=rngs, **inits(1 * 8 * 8))  # fmt: skip
            self.conv2 = nnx.Conv(16, 32, (4, 4), strides=2, padding="VALID", rngs=rngs,
                                  **inits(16 * 4 * 4))  # fmt: skip
            self.fc1 = nnx.Linear(32 * 4 * 4, 32, rngs=rngs, **inits(32 * 4 * 4))
            self.fc2 = nnx.Linear(32, 10, rngs=rngs, **inits(32))

        def __call__(self, x):
            h = pool(act(self.conv1(x)))
            h = pool(act(self.conv2(h)))
            h = act(self.fc1(h.reshape(h.shape[:-3] + (-1,))))
            return self.fc2(h)

    return CNN(nnx.Rngs(key))


def _jax_example_loss(model, example):
    import optax

    logits = model(example["x"][None, ..., None])[0]
    return optax.softmax_cross_entropy_with_integer_labels(logits, example["y"])


def is_private(setting: str) -> bool:
    """Whether ``setting`` trains with DP-SGD (σ and C given) or plain SGD (the baseline)."""
    return SETTINGS[setting]["noise_multiplier"] is not None


def shuffled_batches(n: int, batch_size: int, steps: int, seed: int) -> np.ndarray:
    """(steps, batch_size) indices: a fresh permutation of range(n) each epoch, cut into
    ⌊n/batch_size⌋ batches (the remainder of an epoch dropped), for the non-private baseline."""
    if not 0 < batch_size <= n:
        raise ValueError(f"batch_size must be in [1, n = {n}]; got {batch_size}")
    rng = np.random.default_rng(seed)
    per_epoch = n // batch_size
    epochs = -(-steps // per_epoch)
    cuts = [rng.permutation(n)[: per_epoch * batch_size] for _ in range(epochs)]
    return np.concatenate(cuts).reshape(-1, batch_size)[:steps]


def _test_accuracy(model, data: dict) -> float:
    import jax.numpy as jnp

    xte = jnp.asarray(data["xte"][..., None])
    predictions = np.concatenate(
        [np.asarray(jnp.argmax(model(xte[i : i + 2000]), -1)) for i in range(0, len(xte), 2000)]
    )
    return float(np.mean(predictions == data["yte"]))


def train_jax_nonprivate(
    setting: str, data: dict, *, steps: int, seed: int, init: str | None = None
) -> dict:
    """The non-private baseline on dpjax's side: the same flax model trained by plain optax SGD
    (mean cross-entropy over shuffled batches; no clipping, no noise, no dpjax DP code). The row
    also holds ``curve``: the test accuracy after each epoch (its evaluation not timed)."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    import dpjax

    hyper = SETTINGS[setting]
    model = build_jax_model(setting, jax.random.key(seed), init)
    loss_fn, params = dpjax.dp_sgd.nnx_loss(model, _jax_example_loss)
    optimizer = optax.sgd(hyper["learning_rate"], momentum=hyper["momentum"] or None)
    no_rng = jax.random.key(0)

    @jax.jit
    def step(params, opt_state, x, y):
        def batch_loss(p):  # the model has no dropout: the per-example rng is unused
            losses = jax.vmap(loss_fn, (None, 0, None))(p, {"x": x, "y": y}, no_rng)
            return jnp.mean(losses)

        grads = jax.grad(batch_loss)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    order = shuffled_batches(len(data["ytr"]), hyper["batch_size"], steps, seed)
    xtr, ytr = jnp.asarray(data["xtr"]), jnp.asarray(data["ytr"])
    start, cpu = time.perf_counter(), time.process_time()
    opt_state = optimizer.init(params)
    per_epoch, curve, untimed = len(data["ytr"]) // hyper["batch_size"], [], [0.0, 0.0]
    for i, rows in enumerate(order):
        params, opt_state = step(params, opt_state, xtr[rows], ytr[rows])
        if (i + 1) % per_epoch == 0 and i + 1 < len(order):
            wall, cpu_at = time.perf_counter(), time.process_time()
            nnx.update(model, params)
            curve.append(round(100 * _test_accuracy(model, data), 2))
            untimed[0] += time.perf_counter() - wall
            untimed[1] += time.process_time() - cpu_at
    jax.block_until_ready(params)
    seconds = time.perf_counter() - start - untimed[0]
    cpu_seconds = time.process_time() - cpu - untimed[1]
    nnx.update(model, params)
    accuracy = _test_accuracy(model, data)
    return dict(framework="dpjax", test_accuracy=accuracy, curve=curve + [round(100 * accuracy, 2)],
                init=_init_of(setting, init), epsilon=None,
                accountant="none (non-private)", steps=len(order), seconds=seconds,
                cpu_seconds=cpu_seconds,
                threads=f"XLA CPU, {jax.device_count()} device(s)")  # fmt: skip


def _init_of(setting: str, init: str | None) -> str:
    return SETTINGS[setting]["init"] if init is None else init


def train_dpjax(
    setting: str, data: dict, *, steps: int, seed: int, init: str | None = None
) -> dict:
    """dpjax.make_private with the setting's hyperparameters; time, accuracy, ε (PLD). A
    non-private setting goes to :func:`train_jax_nonprivate`."""
    import jax
    import optax
    from flax import nnx

    import dpjax

    if not is_private(setting):
        return train_jax_nonprivate(setting, data, steps=steps, seed=seed, init=init)
    hyper = SETTINGS[setting]
    model_key, private_key = jax.random.split(jax.random.key(seed))
    model = build_jax_model(setting, model_key, init)
    loss_fn, params = dpjax.dp_sgd.nnx_loss(model, _jax_example_loss)
    momentum = hyper["momentum"] or None
    private = dpjax.make_private(
        loss_fn, optimizer=optax.sgd(hyper["learning_rate"], momentum=momentum),
        l2_clip_norm=hyper["l2_clip_norm"], dataset_size=len(data["ytr"]),
        batch_size=hyper["batch_size"], steps=steps,
        noise_multiplier=hyper["noise_multiplier"], delta=hyper["delta"], key=private_key,
    )  # fmt: skip
    start, cpu = time.perf_counter(), time.process_time()
    params, state, _ = private.fit(
        params, {"x": data["xtr"], "y": data["ytr"]}, progress=False, log_every=steps
    )
    jax.block_until_ready(params)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
    nnx.update(model, params)
    return dict(framework="dpjax", test_accuracy=_test_accuracy(model, data),
                init=_init_of(setting, init),
                epsilon=float(private.epsilon(state)), accountant="dpjax PLD",
                steps=int(state.step), seconds=seconds, cpu_seconds=cpu_seconds,
                threads=f"XLA CPU, {jax.device_count()} device(s)")  # fmt: skip


# --------------------------------------------------------------------------- Opacus side


def build_torch_model(setting: str):
    """The setting's CNN in PyTorch (NCHW): Opacus's ``SampleConvNet`` for the example (ReLU,
    padding 3), Tramèr & Boneh's ``MNIST_CNN`` (tanh, padding 2)."""
    from torch import nn

    hyper = SETTINGS[setting]
    act = nn.Tanh if hyper["activation"] == "tanh" else nn.ReLU
    return nn.Sequential(
        nn.Conv2d(1, 16, 8, stride=2, padding=hyper["padding"]), act(), nn.MaxPool2d(2, 1),
        nn.Conv2d(16, 32, 4, stride=2), act(), nn.MaxPool2d(2, 1),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 32), act(), nn.Linear(32, 10),
    )  # fmt: skip


def train_opacus(setting: str, data: dict, *, steps: int, seed: int) -> dict:
    """Opacus's PrivacyEngine (Poisson sampling at q = batch/n, its default accountant) with
    the setting's hyperparameters, for ``steps`` steps; time, accuracy, ε (Opacus's). A
    non-private setting trains the same torch model by plain SGD (reshuffled batches)."""
    import warnings

    import torch
    from opacus import PrivacyEngine

    hyper = SETTINGS[setting]
    torch.manual_seed(seed)
    model = build_torch_model(setting)
    xtr = torch.from_numpy(data["xtr"][:, None])
    ytr = torch.from_numpy(data["ytr"].astype(np.int64))
    private = is_private(setting)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(xtr, ytr), batch_size=hyper["batch_size"],
        shuffle=not private, drop_last=not private,
    )  # fmt: skip
    optimizer = torch.optim.SGD(
        model.parameters(), lr=hyper["learning_rate"], momentum=hyper["momentum"]
    )
    engine = PrivacyEngine() if private else None
    if private:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, optimizer, loader = engine.make_private(
                module=model, optimizer=optimizer, data_loader=loader,
                noise_multiplier=hyper["noise_multiplier"], max_grad_norm=hyper["l2_clip_norm"],
            )  # fmt: skip
    criterion = torch.nn.CrossEntropyLoss()
    done = 0
    start, cpu = time.perf_counter(), time.process_time()
    model.train()
    while done < steps:
        for x, y in loader:
            optimizer.zero_grad(set_to_none=True)
            criterion(model(x), y).backward()
            optimizer.step()
            done += 1
            if done == steps:
                break
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
    model.eval()
    with torch.no_grad():
        logits = model(torch.from_numpy(data["xte"][:, None]))
    accuracy = float((logits.argmax(-1).numpy() == data["yte"]).mean())
    return dict(framework="opacus", test_accuracy=accuracy,
                epsilon=float(engine.get_epsilon(hyper["delta"])) if private else None,
                accountant=f"Opacus {engine.accountant.mechanism()}" if private else
                "none (non-private)", steps=done,
                seconds=seconds, cpu_seconds=cpu_seconds,
                threads=f"torch {torch.get_num_threads()} threads")  # fmt: skip


TRAINERS = {"dpjax": train_dpjax, "opacus": train_opacus}


# --------------------------------------------------------------------------- run and report


def load(setting: str, n_train: int | None, n_test: int | None) -> dict:
    """The train/test files of ``setting``'s data set (MNIST unless it names Fashion-MNIST),
    preprocessed as ``setting`` does."""
    from experiments.data import load_fashion_mnist, load_mnist

    dataset = SETTINGS[setting].get("dataset", "mnist")
    loader = {"mnist": load_mnist, "fashion-mnist": load_fashion_mnist}[dataset]
    xtr, ytr = loader("train")
    xte, yte = loader("test")
    norm = SETTINGS[setting]["normalise"]
    return dict(xtr=images(xtr[:n_train], norm), ytr=ytr[:n_train].astype(np.int32),
                xte=images(xte[:n_test], norm), yte=yte[:n_test].astype(np.int64))  # fmt: skip


def measure(
    setting: str,
    size: str,
    seed: int = 0,
    frameworks=FRAMEWORKS,
    data=None,
    init: str | None = None,
) -> list:
    """Train ``setting`` at ``size`` in each framework (one after the other); the rows. ``init``
    (dpjax's side; default the setting's) is one of :data:`INITS`."""
    spec, hyper = SIZES[size], SETTINGS[setting]
    data = load(setting, spec["n_train"], spec["n_test"]) if data is None else data
    steps = steps_for(setting, size, len(data["ytr"]))
    rows = []
    for framework in frameworks:
        extra = dict(init=init) if framework == "dpjax" else {}
        row = TRAINERS[framework](setting, data, steps=steps, seed=seed, **extra)
        row.update(setting=setting, size=size, seed=seed, n_train=len(data["ytr"]),
                   epochs=steps * hyper["batch_size"] / len(data["ytr"]),
                   sampling_rate=hyper["batch_size"] / len(data["ytr"]))  # fmt: skip
        print(f"[opacus_mnist] {row}", file=sys.stderr, flush=True)
        rows.append(row)
    return rows


def _epsilon(epsilon: float | None) -> str:
    return "∞" if epsilon is None or not np.isfinite(epsilon) else f"{epsilon:.3f}"


def markdown(rows: list[dict]) -> str:
    lines = [
        TITLE,
        "",
        "| setting | scale | framework | test accuracy % | ε (δ = 1e-5) | steps (epochs) "
        "| wall s | CPU s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        scale = "quick: NOT the paper's protocol" if r["size"] != "full" else "full"
        lines.append(
            f"| {SETTINGS[r['setting']]['label']} | {scale} | {r['framework']} "
            f"| {100 * r['test_accuracy']:.2f} | {_epsilon(r['epsilon'])} ({r['accountant']}) "
            f"| {r['steps']} ({r['epochs']:.2f}) | {r['seconds']:.0f} | {r['cpu_seconds']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def skipped(reason: str) -> dict:
    print(f"[opacus_mnist] SKIPPED: {reason}", file=sys.stderr, flush=True)
    return dict(report_md=f"{TITLE}\n\n**SKIPPED: {reason}**\n",
                verdict=f"SKIPPED ({reason.split('.')[0]})")  # fmt: skip


def run(out_dir: pathlib.Path, *, full: bool = False, seed: int = 0, size: str | None = None,
        settings: tuple[str, ...] = DEFAULT_SETTINGS,
        frameworks: tuple[str, ...] = FRAMEWORKS, init: str | None = None):  # fmt: skip
    """``settings`` (default: the two of the time-to-accuracy table) in ``frameworks`` (default
    both) at ``size`` (quick unless ``full``); writes ``opacus_mnist.json`` with the commit of
    the code that ran. Torch/opacus (when Opacus runs) or MNIST missing: a SKIPPED section."""
    from experiments.data import DataMissingError
    from experiments.report import code_commit, write_json

    size = "full" if full else (size or "quick")
    unknown = [s for s in settings if s not in SETTINGS] + [f for f in frameworks
                                                            if f not in FRAMEWORKS]  # fmt: skip
    if unknown:
        raise ValueError(f"settings must be in {tuple(SETTINGS)} and frameworks in {FRAMEWORKS}; "
                         f"got {unknown}")  # fmt: skip
    try:
        import torch  # noqa: F401

        if "opacus" in frameworks:
            import opacus  # noqa: F401
    except ImportError as error:
        return skipped(
            f"torch/opacus are not installed ({error}). pip install -e '.[bench-torch]' "
            "(or `make bench-torch`)"
        )
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    commit = code_commit()
    try:
        rows = [row for setting in settings
                for row in measure(setting, size, seed, frameworks, init=init)]  # fmt: skip
    except DataMissingError as error:
        return skipped(f"the MNIST files are missing. {error}")
    payload = dict(size=size, commit=commit, settings=SETTINGS, rows=rows)
    write_json(out_dir / "opacus_mnist.json", payload)
    verdict = "; ".join(
        f"{r['setting']}/{r['framework']} {100 * r['test_accuracy']:.2f}% in {r['seconds']:.0f} s"
        for r in rows
    )
    return dict(report_md=markdown(rows), verdict=f"{size}: {verdict}", rows=rows)


def main(argv: list[str] | None = None) -> int:
    """``python -m experiments.opacus_mnist [--full] [--setting S ...] [--framework F ...]
    [--seed N] [--out DIR]``: one seed of the chosen settings; ``opacus_mnist.json`` in DIR."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m experiments.opacus_mnist")
    parser.add_argument("--full", action="store_true", help="the papers' epochs")
    parser.add_argument("--setting", choices=tuple(SETTINGS), action="append")
    parser.add_argument("--framework", choices=FRAMEWORKS, action="append")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--init", choices=INITS, help="dpjax's initialiser (default: the setting's)"
    )
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("out/opacus_mnist"))
    args = parser.parse_args(argv)
    result = run(args.out, full=args.full, seed=args.seed,
                 settings=tuple(args.setting or DEFAULT_SETTINGS),
                 frameworks=tuple(args.framework or FRAMEWORKS), init=args.init)  # fmt: skip
    (args.out / "opacus_mnist.md").write_text(result["report_md"])
    print(f"[opacus_mnist] {result['verdict']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
