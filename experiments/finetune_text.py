"""Public pre-training, private fine-tuning of a small transformer on synthetic text.

The text half of the fine-tuning experiment (the vision half is
:mod:`experiments.finetune`, which runs this module and appends its section). No text can be
downloaded here, so both corpora come from fixed generative processes:

* the PUBLIC process: a sparse first-order Markov chain over V = 32 tokens. Each token has
  K = 4 successors (drawn without replacement) with probabilities ~ Dirichlet(0.5, ..., 0.5);
  the first token is uniform. Its rows are drawn once from a fixed generator seed.
* the PRIVATE process: the same chain with half of its rows (16 tokens, chosen by the same
  fixed seed) re-drawn: "related but shifted". The private records are sequences of this
  chain; the public corpus is drawn from the public chain with its own random stream, so it
  never contains, nor was chosen by looking at, a private record. Which rows shift and how
  much was fixed in advance (a design constant), not tuned on the private data.
* the task: next-token prediction on sequences of T = 16 (+1) tokens. One record is one
  sequence; its loss is the mean next-token cross-entropy over its 16 positions. Metric:
  next-token accuracy on the private test sequences (all positions). The Bayes (oracle)
  accuracy — argmax of the true private row — is reported as the ceiling, and the public
  model used as is (ε = 0: no private training) as the floor fine-tuning has to beat.
* the model: a pre-norm causal transformer written as a plain parameter dict (token and
  position embeddings, width 32; one block of LayerNorm, 2-head causal self-attention with a
  fused query/key/value dense layer 32 → 96 and an output layer 32 → 32, residual, LayerNorm,
  MLP 32 → 64 → 32 (GELU), residual; final LayerNorm; untied head 32 → 32; 11 200
  parameters). Every dense layer goes through
  :func:`dpjax.dp_sgd.finetune.lora_dense`, so ghost clipping sees the kernels, the LoRA
  adapters and the embedding tables as taps and the frozen kernels as constants.
* pre-training: NON-private Adam (step 3e-3, minibatch 128) on the public corpus only.
* modes (everything not trainable is frozen by :func:`dpjax.dp_sgd.finetune.partition`, never
  clipped or noised): ``scratch`` (all, random init per seed), ``full`` (all, from the public
  model), ``lora`` (rank-4 adapters, α = 8, on the four dense layers of the block: attention
  qkv and out, the MLP's two; the head and embeddings frozen), ``bias`` (DP-BiTFiT: every bias,
  layer-norm biases included) and ``last_layer`` (the head, kernel and bias). The head is the
  pre-trained one in every fine-tuning mode (the vocabulary is the same).
* DP-SGD exactly as the vision half (:func:`experiments.finetune.make_trainer`): Poisson
  sampling (expected batch 64, padded), per-example clipping by :func:`dpjax.clipped_grad`
  (C = 1, backend "auto"), N(0, σ²C²) once on the d trainable coordinates, ÷ the public q·n,
  SGD with momentum 0.9 (one step size for every mode). σ calibrated for (ε, δ = 1e-5),
  add/remove-one, PLD, at δ minus the sampler's truncation slack.

Accuracy: mean and 95% Student-t CI over S seeds (fresh sampling, noise and — scratch —
initialisation per seed); scratch and full share one compiled ``jit(vmap(scan))`` over
(schedule, ε, seed), every other mode has its own. Float32 throughout (no exactness needed
beyond what dpjax certifies). Sizes: ``tiny`` (the tests: ε = 1, 2 seeds, half an epoch),
``quick`` (``make reproduce``: ε ∈ {1, 3, 8}, 4 seeds, 3 epochs = 47 steps; 90–100 s of CPU
measured on 2 busy cores) and ``full`` (20 seeds, 3 and 10 epochs). The step size (the vision
half's) and the chains were fixed before the first pilot; the private corpus size, the
schedule, the model's size and the number of seeds were cut after pilots on this test split,
for the CPU budget (see the report's last paragraph); nothing was tuned per mode or per ε.
"""

from __future__ import annotations

import math
import time

import numpy as np

from experiments import finetune as vision

VOCAB = 32
SUCCESSORS = 4
DIRICHLET = 0.5
SHIFTED_ROWS = 16
SEQ = 16
WIDTH = 32
HEADS = 2
MLP = 2 * WIDTH
RANK = 4
LORA_ALPHA = 8.0
GENERATOR_SEED = 2024  # the chains (a design constant, the same for every --seed)
N_PUBLIC = 4000
N_PRIVATE_TRAIN = 1000
N_PRIVATE_TEST = 500
PRETRAIN_LR = 3e-3
PRETRAIN_BATCH = 128
LEARNING_RATE = 0.5
MODES = vision.MODES
LORA_LAYERS = ("qkv", "out", "up", "down")
SIZES = {
    "tiny": dict(epsilons=(1.0,), seeds=2, epochs=(0.5,), pretrain_steps=20),
    "quick": dict(epsilons=(1.0, 3.0, 8.0), seeds=4, epochs=(3.0,), pretrain_steps=400),
    "full": dict(epsilons=(1.0, 3.0, 8.0), seeds=20, epochs=(3.0, 10.0), pretrain_steps=400),
}


# -- data ---------------------------------------------------------------------------------------


def _chain(rng: np.random.Generator) -> np.ndarray:
    """A (V, V) transition matrix with K successors per row, Dirichlet(0.5) weights."""
    matrix = np.zeros((VOCAB, VOCAB))
    for a in range(VOCAB):
        matrix[a] = _row(rng)
    return matrix


def _row(rng: np.random.Generator) -> np.ndarray:
    row = np.zeros(VOCAB)
    row[rng.choice(VOCAB, SUCCESSORS, replace=False)] = rng.dirichlet([DIRICHLET] * SUCCESSORS)
    return row


def chains() -> tuple[np.ndarray, np.ndarray]:
    """(public, private) transition matrices: the private one has ``SHIFTED_ROWS`` rows
    re-drawn. Fixed by ``GENERATOR_SEED`` (no private data involved)."""
    rng = np.random.default_rng(GENERATOR_SEED)
    public = _chain(rng)
    private = public.copy()
    for a in rng.choice(VOCAB, SHIFTED_ROWS, replace=False):
        private[a] = _row(rng)
    return public, private


def sample(matrix: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` sequences of ``SEQ + 1`` tokens (int32) of the chain ``matrix``."""
    out = np.empty((n, SEQ + 1), np.int32)
    out[:, 0] = rng.integers(VOCAB, size=n)
    cumulative = np.cumsum(matrix, axis=1)
    for t in range(1, SEQ + 1):
        u = rng.random(n)[:, None]
        out[:, t] = np.minimum((u > cumulative[out[:, t - 1]]).sum(1), VOCAB - 1)
    return out


def load_data(seed: int = 0) -> dict:
    """Public corpus, private train/test split (inputs x = tokens[:-1], targets y = tokens[1:]),
    and the private chain's Bayes next-token accuracy on the test targets."""
    public_chain, private_chain = chains()
    public = sample(public_chain, N_PUBLIC, np.random.default_rng([seed, 1]))
    private = sample(
        private_chain, N_PRIVATE_TRAIN + N_PRIVATE_TEST, np.random.default_rng([seed, 2])
    )
    train, test = private[:N_PRIVATE_TRAIN], private[N_PRIVATE_TRAIN:]
    bayes = float(np.mean(np.argmax(private_chain[test[:, :-1]], -1) == test[:, 1:]))
    return dict(x_public=public[:, :-1], y_public=public[:, 1:], x_train=train[:, :-1],
                y_train=train[:, 1:], x_test=test[:, :-1], y_test=test[:, 1:],
                bayes_accuracy=bayes)  # fmt: skip


# -- model --------------------------------------------------------------------------------------


def init_transformer(key) -> dict:
    import jax
    import jax.numpy as jnp

    keys = iter(jax.random.split(key, 16))

    def dense(m, n):
        kernel = jax.random.normal(next(keys), (m, n), jnp.float32) / np.float32(math.sqrt(m))
        return {"kernel": kernel, "bias": jnp.zeros(n, jnp.float32)}

    def norm():
        return {"scale": jnp.ones(WIDTH, jnp.float32), "bias": jnp.zeros(WIDTH, jnp.float32)}

    def embed(rows):
        return {"embedding": jax.random.normal(next(keys), (rows, WIDTH), jnp.float32)}

    block = {"ln_1": norm(), "qkv": dense(WIDTH, 3 * WIDTH), "out": dense(WIDTH, WIDTH),
             "ln_2": norm(), "up": dense(WIDTH, MLP), "down": dense(MLP, WIDTH)}  # fmt: skip
    return {"tokens": embed(VOCAB), "positions": embed(SEQ), "block": block, "ln_f": norm(),
            "head": dense(WIDTH, VOCAB)}  # fmt: skip


def _layer_norm(p: dict, x):
    import jax.numpy as jnp

    mean = jnp.mean(x, -1, keepdims=True)
    var = jnp.mean((x - mean) ** 2, -1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + np.float32(1e-5)) * p["scale"] + p["bias"]


def _attention(p: dict, x):
    import jax
    import jax.numpy as jnp

    from dpjax.dp_sgd.finetune import lora_dense

    t, head_dim = x.shape[-2], WIDTH // HEADS
    qkv = lora_dense(p["qkv"], x, alpha=LORA_ALPHA).reshape(t, 3, HEADS, head_dim)
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    scores = jnp.einsum("thd,shd->hts", q, k) / np.float32(math.sqrt(head_dim))
    causal = jnp.tril(jnp.ones((t, t), bool))
    weights = jax.nn.softmax(jnp.where(causal, scores, np.float32(-1e9)), axis=-1)
    mixed = jnp.einsum("hts,shd->thd", weights, v).reshape(t, WIDTH)
    return lora_dense(p["out"], mixed, alpha=LORA_ALPHA)


def logits(params: dict, tokens):
    """Next-token logits ``(T, V)`` for ONE sequence of token ids ``(T,)``."""
    import jax

    from dpjax.dp_sgd.finetune import lora_dense

    block = params["block"]
    x = params["tokens"]["embedding"][tokens] + params["positions"]["embedding"]
    x = x + _attention(block, _layer_norm(block["ln_1"], x))
    h = jax.nn.gelu(lora_dense(block["up"], _layer_norm(block["ln_2"], x), alpha=LORA_ALPHA))
    x = x + lora_dense(block["down"], h, alpha=LORA_ALPHA)
    return lora_dense(params["head"], _layer_norm(params["ln_f"], x), alpha=LORA_ALPHA)


def example_loss(params: dict, example: dict):
    """Mean next-token cross-entropy over the positions of ONE sequence."""
    import jax.numpy as jnp
    import optax

    return jnp.mean(
        optax.softmax_cross_entropy_with_integer_labels(logits(params, example["x"]), example["y"])
    )


def _batch_accuracy(params: dict, x, y):
    import jax
    import jax.numpy as jnp

    predicted = jnp.argmax(jax.vmap(logits, in_axes=(None, 0))(params, x), -1).astype(y.dtype)
    return jnp.mean((predicted == y).astype(jnp.float32))


def pretrain(data: dict, steps: int, seed: int) -> dict:
    """Non-private Adam on the PUBLIC corpus only (minibatches of ``PRETRAIN_BATCH``)."""
    import jax
    import jax.numpy as jnp
    import optax

    params = init_transformer(jax.random.key(20_000 + seed))
    x, y = jnp.asarray(data["x_public"]), jnp.asarray(data["y_public"])
    tx = optax.adam(PRETRAIN_LR)

    def loss(p, idx):
        per = jax.vmap(example_loss, in_axes=(None, 0))(p, {"x": x[idx], "y": y[idx]})
        return jnp.mean(per)

    def step(carry, k):
        p, s = carry
        idx = jax.random.randint(k, (PRETRAIN_BATCH,), 0, x.shape[0])
        g = jax.grad(loss)(p, idx)
        u, s = tx.update(g, s, p)
        return (optax.apply_updates(p, u), s), None

    keys = jax.random.split(jax.random.key(30_000 + seed), steps)
    run = jax.jit(lambda p: jax.lax.scan(step, (p, tx.init(p)), keys)[0][0])
    with jax.numpy_dtype_promotion("standard"):  # optax.adam's bias correction mixes dtypes
        return run(params)


def mode_parameters(mode: str, public: dict, seed_keys) -> tuple[dict, dict, bool]:
    """(initial trainable part, frozen part, whether the trainable init varies per seed)."""
    import jax

    from dpjax.dp_sgd import finetune as ft

    if mode == "scratch":
        inits = jax.vmap(init_transformer)(seed_keys)
        return inits, jax.tree.map(lambda _: None, inits), True
    params = public
    if mode == "full":
        return params, jax.tree.map(lambda _: None, params), False
    if mode == "lora":
        params = ft.add_lora(jax.random.key(7), params, RANK,
                             layers=lambda path, _: path[-1] in LORA_LAYERS)  # fmt: skip
        predicate = ft.is_lora
    elif mode == "bias":
        predicate = ft.is_bias
    elif mode == "last_layer":
        predicate = ft.under("head")
    else:
        raise ValueError(f"mode must be one of {MODES}; got {mode!r}")
    trainable, frozen = ft.partition(params, predicate)
    return trainable, frozen, False


# -- experiment ---------------------------------------------------------------------------------


def evaluate(size: str = "quick", seed: int = 0, modes=MODES, backend: str = "auto") -> dict:
    """Pre-train on the public corpus, fine-tune privately in every mode; rows as the vision
    half's (mode, epochs, ε, σ, d, accuracy mean and 95% CI). ``result["trained"]`` holds each
    mode's (trainable, frozen) after fine-tuning (leading axis: runs) for the tests."""
    import jax
    import jax.numpy as jnp

    from dpjax.dp_sgd import finetune as ft

    spec = SIZES[size]
    data = load_data(seed)
    n = len(data["y_train"])
    cpu_start = time.process_time()
    public = pretrain(data, spec["pretrain_steps"], seed)
    cpu = {"pretrain": time.process_time() - cpu_start}
    sampler = vision.make_sampler(n)
    cells = [(ep, eps) for ep in spec["epochs"] for eps in spec["epsilons"]]
    schedule = {ep: max(1, math.ceil(ep * n / vision.BATCH)) for ep in spec["epochs"]}
    cal = [vision.calibrate(sampler, schedule[ep], eps) for ep, eps in cells]
    seeds, runs = spec["seeds"], len(cells) * spec["seeds"]
    sigmas = jnp.repeat(jnp.asarray([c["sigma"] for c in cal], jnp.float32), seeds)
    steps = jnp.repeat(jnp.asarray([schedule[ep] for ep, _ in cells], jnp.int32), seeds)
    x, y = jnp.asarray(data["x_train"]), jnp.asarray(data["y_train"])
    xt, yt = jnp.asarray(data["x_test"]), jnp.asarray(data["y_test"])
    root = jax.random.key(1_000 + seed)
    train = vision.make_trainer(sampler, max(schedule.values()), x, y, backend, example_loss)
    accuracy = jax.jit(jax.vmap(
        lambda p, f: _batch_accuracy(ft.combine(p, f), xt, yt), in_axes=(0, None)
    ))  # fmt: skip
    public_accuracy = float(jax.jit(_batch_accuracy)(public, xt, yt))
    rows, timing, trained_parts = [], {}, {}
    for mode in modes:
        m_i = MODES.index(mode)
        start, cpu_start = time.perf_counter(), time.process_time()
        init_keys = jax.random.split(jax.random.fold_in(root, 100 + m_i), seeds)
        trainable, frozen, per_seed = mode_parameters(mode, public, init_keys)
        d = ft.num_params(jax.tree.map(lambda a: a[0], trainable) if per_seed else trainable)
        if per_seed:  # the same seed's init in every cell
            reps = len(cells)
            inits = jax.tree.map(
                lambda a, r=reps: jnp.tile(a, (r,) + (1,) * (a.ndim - 1)), trainable
            )
        else:
            inits = jax.tree.map(lambda a: jnp.broadcast_to(a, (runs, *a.shape)), trainable)
        keys = jax.random.split(jax.random.fold_in(root, m_i), runs)
        trained = train(keys, inits, frozen, sigmas, steps, LEARNING_RATE)
        acc = np.asarray(accuracy(trained, frozen)).reshape(len(cells), seeds)
        timing[mode] = time.perf_counter() - start
        cpu[mode] = time.process_time() - cpu_start
        trained_parts[mode] = (trained, frozen)
        for c_i, ((ep, eps), c) in enumerate(zip(cells, cal, strict=True)):
            mean, lo, hi = vision._mean_ci(acc[c_i])
            rows.append(dict(mode=mode, epochs=ep, steps=schedule[ep], target_epsilon=eps,
                             epsilon=c["epsilon"], sigma=c["sigma"], d=d, accuracy_mean=mean,
                             ci_low=lo, ci_high=hi, seeds=seeds))  # fmt: skip
    return dict(rows=rows, n_train=n, n_test=len(data["y_test"]),
                n_public=len(data["y_public"]), public_accuracy=public_accuracy,
                bayes_accuracy=data["bayes_accuracy"], d_total=ft.num_params(public),
                sampling_rate=sampler.sampling_rate, max_batch_size=sampler.max_batch_size,
                seconds_per_mode=timing, cpu_seconds=cpu, trained=trained_parts,
                public=public)  # fmt: skip


# -- report -------------------------------------------------------------------------------------


def markdown(result: dict, plot_name: str | None, size: str) -> str:
    rows = result["rows"]
    v = vision.verdict(rows)
    d_of = {r["mode"]: r["d"] for r in rows}
    lines = [
        "### A small transformer on synthetic public text",
        "",
        f"Causal transformer (token + position embeddings, width {WIDTH}, one pre-norm block "
        f"with {HEADS}-head attention and an MLP {WIDTH}→{MLP}→{WIDTH}, untied head; "
        f"{result['d_total']} parameters) on sequences of {SEQ} next-token predictions over "
        f"{VOCAB} tokens. Public text: {result['n_public']} sequences of a sparse Markov chain "
        f"({SUCCESSORS} successors per token, Dirichlet({DIRICHLET:g}) weights), pre-trained "
        "NON-privately (Adam). Private text: the same chain with "
        f"{SHIFTED_ROWS} of its {VOCAB} rows re-drawn ({result['n_train']} training, "
        f"{result['n_test']} test sequences); the metric is next-token accuracy on the private "
        f"test sequences: Bayes (the true private chain) {result['bayes_accuracy']:.3f}, the "
        f"public model as is (no private training, ε = 0) {result['public_accuracy']:.3f}. "
        f"DP-SGD as above (Poisson q = {result['sampling_rate']:.4f}, padded to "
        f"{result['max_batch_size']}, C = {vision.CLIP:g}, SGD step {LEARNING_RATE:g}, momentum "
        f"{vision.MOMENTUM}, δ = {vision.DELTA:g}); one record = one sequence. Modes: scratch, "
        f"full, LoRA (rank {RANK}, α = {LORA_ALPHA:g}, on attention qkv/out and the MLP; "
        "head and embeddings frozen), bias (every bias, layer norms' included), last layer "
        f"(the head). Size `{size}`: {rows[0]['seeds']} seeds per cell.",
        "",
        "| mode | d | epochs (T) | ε | σ | next-token accuracy (95% CI) |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['mode']} | {r['d']} | {r['epochs']:g} ({r['steps']}) | {r['epsilon']:.2f} | "
            f"{r['sigma']:.2f} | {r['accuracy_mean']:.3f} [{r['ci_low']:.3f}, "
            f"{r['ci_high']:.3f}] |"
        )
    if plot_name:
        lines += ["", f"![finetune text]({plot_name})"]
    detail = "; ".join(
        f"{s['epochs']:g} epochs: `{s['best']}` [{s['best_ci'][0]:.3f}, {s['best_ci'][1]:.3f}] "
        f"vs scratch [{s['scratch_ci'][0]:.3f}, {s['scratch_ci'][1]:.3f}]"
        for s in v["schedules"]
    )
    below = sorted(
        {
            r["mode"]
            for r in rows
            if r["target_epsilon"] == 1.0
            and r["mode"] != "scratch"
            and r["ci_high"] < result["public_accuracy"]
        }
    )
    lines += [
        "",
        f"{'✓' if v['ok'] else '✗'} text: private fine-tuning from the public model beats "
        f"scratch at ε = 1 (CIs disjoint, at every schedule): {detail}.",
        "",
        "The public corpus is drawn from the public chain with its own random stream; the "
        "chains and which rows shift are design constants fixed in advance, so pre-training "
        f"costs no ε. d per mode: {', '.join(f'{m} {d}' for m, d in d_of.items())}. "
        "Fine-tuning modes whose whole CI at ε = 1 lies below the public model used as is "
        f"(the noise undoes more than the private data teach): {', '.join(below) or 'none'}. "
        + PILOT_NOTE,
    ]
    return "\n".join(lines)


PILOT_NOTE = (
    "Pilots, all on this test split: a smoke run (2000 private training sequences, half an "
    "epoch), then, at the quick scale, 1000 sequences, 3 epochs, 5 seeds, an MLP 32→128→32 "
    "and separate q/k/v layers, which gave the same picture (ε = 1: last layer 0.678 "
    "[0.672, 0.684], scratch 0.464 [0.450, 0.478]); the MLP width, the fused qkv layer and "
    "4 seeds then came from the CPU budget. The step size (0.5, the vision half's) and the "
    "chains were never changed, nothing was tuned per mode or per ε, and the public corpus "
    "never saw a private sequence."
)


def run(out_dir, *, size: str = "quick", seed: int = 0) -> dict:
    """Run the text half; write finetune_text.json and finetune_text.png; return the section."""
    import pathlib

    from experiments.report import write_json

    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    result = evaluate(size, seed)
    plot_name = vision.plot(
        out_dir / "finetune_text.png", result["rows"],
        title=f"transformer: private fine-tuning on a shifted chain ({SHIFTED_ROWS}/{VOCAB} "
              "rows),\npublic pre-training on the original chain",
        references={"Bayes (true private chain)": result["bayes_accuracy"],
                    "public model, no private training": result["public_accuracy"]},
    )  # fmt: skip
    seconds = time.perf_counter() - start
    record = {k: v for k, v in result.items() if k not in ("trained", "public")}
    write_json(out_dir / "finetune_text.json", dict(size=size, seed=seed, seconds=seconds,
                                                    **record))  # fmt: skip
    v = vision.verdict(result["rows"])
    return dict(report_md=markdown(result, plot_name, size), rows=result["rows"], ok=v["ok"],
                best=", ".join(s["best"] for s in v["schedules"]), seconds=seconds)  # fmt: skip
