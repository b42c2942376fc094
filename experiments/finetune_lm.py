"""Private fine-tuning of a real pretrained language model on Shakespeare, per line of a character.

The model: SmolLM2-135M-Instruct (Llama, 30 blocks, D = 576) from its llama.cpp GGUF file
(``make data``), in flax (:mod:`experiments.lm.model`); its weights are 4-bit quantised then
dequantised (:mod:`experiments.lm.weights`): a real pretrained LM, not a faithful SmolLM2. The
text: Shakespeare's plays with speaker labels (:mod:`experiments.data.shakespeare`); one example
is one window of ``seq_len`` next-token predictions of ONE character's lines
(:mod:`experiments.lm.finetune`); whole plays are held out for the test set, so its characters
are held out too. Metric: held-out perplexity, exp(summed NLL / real target tokens).

Rows: the pretrained model zero-shot; each DP mode (LoRA, norm-only, last blocks, full window)
at ε ∈ {1, 3, 8}; a small Llama trained from scratch with DP at the same ε; non-private LoRA
(the ceiling); LoRA at the USER level (user = a (play, speaker)), with the example-level run's
group-privacy translation beside it. δ = 1e-5 for every example-level run (add/remove-one
record); the user-level run uses the same δ per user. Each DP run: :func:`dpjax.make_private`
(Poisson sampling, per-example clipping C = 1 by ghost clipping — vmap for the user level,
which :func:`dpjax.make_private` requires — Gaussian noise once, PLD accounting), Adam.

Where the frozen part is computed once: the embedding and blocks ``0 .. 30 - window - 1`` are
frozen in every fine-tuning mode and public (pre-trained without the private data), so their
output on every training and test sequence is computed ONCE before training
(:func:`experiments.lm.finetune.lower_hidden_states`, here in :func:`prepare`); the modes train
parts of the top ``window`` blocks, the final norm and the head ("full" = all of the window; at
the full scale the window is all 30 blocks). The head (the tied embedding table) stays frozen
in every mode: see :mod:`experiments.lm.finetune` for why.

Compilation. The frozen (public) part of the window reaches the DP step through
``make_private(public=...)``: an argument of the compiled step, never differentiated, clipped,
noised or counted in d. σ·C is an argument too (passed by the step from its own plan), the
runs of a mode at every ε share one padded cap (``max_batch_size``: the cap of ε = 8, above
each run's own), and JAX's persistent compilation cache lives in a temporary folder for the
run: every run of a mode (each ε, each seed) lowers to the same step, so XLA compiles it once
per mode instead of once per (mode, ε, seed). Seeds: DP-LoRA at every ε and the scratch model
at ε = 8 (the headline comparison) over ``seeds``; the other cells over ``other_seeds``.

Nothing was tuned on the test plays: the step sizes (Adam 1e-3 for the adapters and norms,
1e-4 for pretrained weights, 3e-3 for the scratch model), clip norm, rank (8), window and
schedule were fixed before the first run, by the CPU budget (quick) and common practice
(Li et al. 2022; Yu et al. 2022).
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import sys
import time

import numpy as np

DESCRIPTION = "finetune_lm: DP fine-tuning of SmolLM2-135M (GGUF) on Shakespeare, LoRA/norm/full"

TEST_PLAYS = ("hamlet", "tempest")
DELTA = 1e-5
CLIP = 1.0
RANK = 8
LEARNING_RATES = {"lora": 1e-3, "norm": 1e-3, "last_blocks": 1e-4, "full": 1e-4,
                  "scratch": 3e-3}  # fmt: skip
SIZES = {
    # make reproduce: 2 CPU cores
    "quick": dict(seq_len=16, window=1, last_blocks=1, train_plays=("macbeth", "othello"),
                  windows_per_user=2, test_windows=32, batch=8, steps=4, seeds=3,
                  other_seeds=1, epsilons=(1.0, 3.0, 8.0), timing_batch=8),
    # a GPU: all 30 blocks trainable, every play but the test ones
    "full": dict(seq_len=128, window=30, last_blocks=2, train_plays=None, windows_per_user=8,
                 test_windows=512, batch=256, steps=200, seeds=3, other_seeds=3,
                 epsilons=(1.0, 3.0, 8.0), timing_batch=64),
}  # fmt: skip


@dataclasses.dataclass
class Prepared:
    config: object
    window_params: dict
    scratch_tokens: dict
    train: dict
    test: dict
    users: list
    seconds_lower: float


def _split(seq: dict, hidden: np.ndarray) -> dict:
    return dict(x=hidden, y=seq["tokens"][:, 1:], mask=seq["mask"], user=seq["user"],
                tokens=seq["tokens"])  # fmt: skip


def prepare(spec: dict) -> Prepared:
    """Load model, tokenizer and plays; windows of each character; frozen lower blocks run once
    on every training and test window (public weights: see the module docstring)."""
    import jax
    import jax.numpy as jnp

    from experiments.data.shakespeare import load_shakespeare
    from experiments.lm import finetune as lmft
    from experiments.lm import model, weights

    path = weights.model_path()
    plays = load_shakespeare()
    config, params = weights.load_params(path)
    tokenizer = weights.load_tokenizer(path)
    pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 2)
    train_names = spec["train_plays"] or [p for p in plays if p not in TEST_PLAYS]
    texts = lmft.character_texts({p: plays[p] for p in train_names})
    train = lmft.character_sequences(texts, tokenizer, spec["seq_len"], pad,
                                     spec["windows_per_user"])  # fmt: skip
    test_texts = lmft.character_texts({p: plays[p] for p in TEST_PLAYS})
    test = lmft.character_sequences(test_texts, tokenizer, spec["seq_len"], pad, None)
    pick = np.random.default_rng(0).permutation(len(test["mask"]))[: spec["test_windows"]]
    test = {k: (v[np.sort(pick)] if isinstance(v, np.ndarray) else v) for k, v in test.items()}
    n_lower = config.n_blocks - spec["window"]
    params = jax.tree.map(jnp.asarray, params)
    lower, upper = model.split_params(params, n_lower)
    start = time.perf_counter()
    if n_lower > 0:
        h_train = lmft.lower_hidden_states(config, lower, train["tokens"][:, :-1])
        h_test = lmft.lower_hidden_states(config, lower, test["tokens"][:, :-1])
    else:  # the whole model trains: the window starts at the embedding
        upper = params
        h_train, h_test = train["tokens"][:, :-1], test["tokens"][:, :-1]
    seconds = time.perf_counter() - start
    return Prepared(config, upper, {"train": train["tokens"], "test": test["tokens"]},
                    _split(train, h_train), _split(test, h_test), train["users"],
                    seconds)  # fmt: skip


def _perplexity(net, params, part: dict, x=None) -> float:
    from experiments.lm import finetune as lmft

    x = part["x"] if x is None else x
    total, count = lmft.sequence_nll(net, params, x, part["y"], part["mask"])
    return math.exp(total / count)


_LOSSES: dict = {}


def public_loss(net):
    """``loss(trainable, example, public)``: the window's loss with its frozen (public) part
    given as ``public`` — :func:`dpjax.make_private` passes it to the compiled step as an
    argument, so the 30 M frozen weights are not constants folded into it. One function per
    window model, so every run of a mode lowers to the same step."""
    if net not in _LOSSES:
        from dpjax.dp_sgd import finetune as ft
        from experiments.lm import finetune as lmft

        base = lmft.example_loss_fn(net)

        def loss(trainable, example, public=None):  # None: nothing frozen (scratch)
            return base(trainable if public is None else ft.combine(trainable, public), example)

        _LOSSES[net] = loss
    return _LOSSES[net]


def make_private_run(net, frozen, n: int, *, epsilon, spec, lr, seed, user_ids=None,
                     max_batch_size=None):  # fmt: skip
    """The :func:`dpjax.make_private` object of one run: example level (ghost clipping, q =
    batch/n over windows) or, with ``user_ids``, user level (q = b_u/U over the U characters,
    b_u = batch·U/n users expected per batch: the same expected number of windows).
    ``max_batch_size``: the padded cap shared by the runs at every ε (the cap of the largest
    ε, ≥ each run's own), so one compiled step serves them all."""
    import jax
    import optax

    import dpjax

    batch = spec["batch"]
    if user_ids is not None:
        batch = max(1, round(batch * len(np.unique(user_ids)) / n))
    return dpjax.make_private(
        public_loss(net), optimizer=optax.adam(lr), l2_clip_norm=CLIP, dataset_size=n,
        batch_size=batch, delta=DELTA, key=jax.random.key(10_000 + seed), steps=spec["steps"],
        target_epsilon=epsilon, clipping="vmap" if user_ids is not None else "ghost",
        user_ids=user_ids, public=frozen if jax.tree.leaves(frozen) else None,
        max_batch_size=max_batch_size,
    )  # fmt: skip


def shared_cap(net, frozen, n: int, spec, lr) -> int:
    """The padded cap of the largest ε (the largest of the runs' caps)."""
    return make_private_run(net, frozen, n, epsilon=max(spec["epsilons"]), spec=spec, lr=lr,
                            seed=0).max_batch_size  # fmt: skip


def _dp_run(net, trainable, frozen, data: dict, *, epsilon, spec, lr, seed, user_ids=None,
            max_batch_size=None):  # fmt: skip
    import jax
    import jax.numpy as jnp

    private = make_private_run(net, frozen, len(data["y"]), epsilon=epsilon, spec=spec, lr=lr,
                               seed=seed, user_ids=user_ids,
                               max_batch_size=max_batch_size)  # fmt: skip
    batch = private.expected_batch_size
    rows = {k: jnp.asarray(data[k]) for k in ("x", "y", "mask")}
    with jax.numpy_dtype_promotion("standard"):
        trained, state, _ = private.fit(trainable, rows, progress=False)
    return trained, dict(epsilon=private.epsilon(state), sigma=private.noise_multiplier,
                         q=private.sampling_rate, batch=batch)  # fmt: skip


def _non_private_run(net, trainable, frozen, data: dict, *, spec, lr, seed):
    """Adam on the mean loss of uniformly drawn batches of ``spec['batch']`` (no clipping,
    no noise): the ceiling."""
    import jax
    import jax.numpy as jnp
    import optax

    loss = public_loss(net)
    tx = optax.adam(lr)
    rows = {k: jnp.asarray(data[k]) for k in ("x", "y", "mask")}
    n = len(data["y"])

    @jax.jit
    def step(p, s, idx, public):  # the frozen part an argument, not a constant
        batch = jax.tree.map(lambda a: a[idx], rows)
        per_example = jax.vmap(loss, in_axes=(None, 0, None))
        g = jax.grad(lambda q: jnp.mean(per_example(q, batch, public)))(p)
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    rng = np.random.default_rng(20_000 + seed)
    state = tx.init(trainable)
    with jax.numpy_dtype_promotion("standard"):
        for _ in range(spec["steps"]):
            idx = rng.integers(0, n, spec["batch"])
            trainable, state = step(trainable, state, idx, frozen)
    return trainable


def _mode_parts(prep: Prepared, mode: str, spec: dict, seed: int):
    import jax

    from experiments.lm import finetune as lmft

    return lmft.mode_parts(mode, prep.window_params, rank=RANK, last_blocks=spec["last_blocks"],
                           key=jax.random.key(500 + seed))  # fmt: skip


def _everything(path, _=None) -> bool:
    return True


def _mean_ci(values) -> tuple[float, float, float]:
    from experiments import finetune as vision

    if len(values) == 1:
        return float(values[0]), float("nan"), float("nan")
    return vision._mean_ci(np.asarray(values))


def step_cost(net, trainable, frozen, data: dict, batch: int, seq_len: int) -> dict:
    """Seconds per step, tokens/s and compiled memory (temp + arguments) of the DP step (ghost
    clipping, no sampling: a fixed batch of ``batch`` rows) and of the non-private step."""
    import jax
    import jax.numpy as jnp

    from dpjax import clipped_grad

    loss = public_loss(net)
    rows = {k: jnp.asarray(data[k][:batch]) for k in ("x", "y", "mask")}

    def dp(p, b, public):
        bound = lambda q, ex: loss(q, ex, public)  # noqa: E731
        total, _ = clipped_grad(bound, l2_clip_norm=CLIP, backend="ghost")(p, b)
        return total

    def plain(p, b, public):
        per_example = jax.vmap(loss, in_axes=(None, 0, None))
        return jax.grad(lambda q: jnp.sum(per_example(q, b, public)))(p)

    out = {}
    for name, fn in (("dp", dp), ("non_private", plain)):
        compiled = jax.jit(fn).lower(trainable, rows, frozen).compile()
        memory = compiled.memory_analysis()
        jax.block_until_ready(compiled(trainable, rows, frozen))
        start, reps = time.perf_counter(), 3
        for _ in range(reps):
            jax.block_until_ready(compiled(trainable, rows, frozen))
        seconds = (time.perf_counter() - start) / reps
        out[name] = dict(seconds=seconds, tokens_per_s=batch * seq_len / seconds,
                         memory_mb=(memory.temp_size_in_bytes + memory.argument_size_in_bytes)
                         / 2**20 if memory is not None else float("nan"))  # fmt: skip
    return out


def evaluate(size: str = "quick", seed: int = 0) -> dict:
    """All rows, with JAX's persistent compilation cache in a temporary folder for the run:
    every run of a mode (each ε, each seed) lowers to the same step (σ·C, the frozen weights
    and the key are arguments; one padded cap per mode), so XLA compiles it once."""
    import tempfile

    import jax

    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")
    saved = {name: getattr(jax.config, name) for name in names}
    with tempfile.TemporaryDirectory(prefix="dpjax_finetune_lm_xla_") as folder:
        jax.config.update(names[0], folder)
        jax.config.update(names[1], 0.0)
        try:
            return _evaluate(size, seed)
        finally:
            for name, value in saved.items():
                jax.config.update(name, value)


def _evaluate(size: str, seed: int) -> dict:
    import jax

    from dpjax.accounting.composition import group_privacy
    from dpjax.dp_sgd import finetune as ft
    from experiments.lm import finetune as lmft
    from experiments.lm import model

    spec = SIZES[size]
    prep = prepare(spec)
    config = prep.config
    n_lower = config.n_blocks - spec["window"]
    net = lmft.window_model(config, n_lower) if n_lower > 0 else model.Llama(config)
    rows: list[dict] = []
    zero_shot = _perplexity(net, prep.window_params, prep.test)
    rows.append(dict(mode="zero-shot", level="-", target_epsilon=0.0, d=0, ppl=[zero_shot]))
    seeds = range(seed, seed + spec["seeds"])  # DP-LoRA (the headline rows)
    other_seeds = range(seed, seed + spec["other_seeds"])  # the other modes, scratch
    timing = {}
    n = len(prep.train["y"])
    for mode in lmft.MODES:
        trainable, frozen = _mode_parts(prep, mode, spec, seed)
        d = ft.num_params(trainable)
        cap = shared_cap(net, frozen, n, spec, LEARNING_RATES[mode])
        for eps in spec["epsilons"]:
            ppl, info = [], None
            for s in seeds if mode == "lora" else other_seeds:
                trainable, frozen = _mode_parts(prep, mode, spec, s)
                start = time.perf_counter()
                trained, info = _dp_run(net, trainable, frozen, prep.train, epsilon=eps,
                                        spec=spec, lr=LEARNING_RATES[mode], seed=s,
                                        max_batch_size=cap)  # fmt: skip
                timing[f"{mode} ε={eps:g}"] = time.perf_counter() - start
                ppl.append(_perplexity(net, ft.combine(trained, frozen), prep.test))
            rows.append(dict(mode=mode, level="example", target_epsilon=eps, d=d, ppl=ppl,
                             **info))  # fmt: skip
            print(f"[finetune_lm] {mode} ε={eps:g}: ppl {np.mean(ppl):.2f}", flush=True)
    # from scratch: a small Llama on the token ids (no frozen part)
    scratch_net = model.Llama(lmft.scratch_config(config))
    scratch_data = dict(prep.train, x=prep.scratch_tokens["train"][:, :-1])
    scratch_test = dict(prep.test, x=prep.scratch_tokens["test"][:, :-1])
    init = lmft.scratch_params(config, jax.random.key(700), spec["seq_len"])
    scratch_cap = shared_cap(scratch_net, ft.partition(init, _everything)[1], n, spec,
                             LEARNING_RATES["scratch"])  # fmt: skip
    for eps in spec["epsilons"]:
        ppl = []
        for s in seeds if eps == max(spec["epsilons"]) else other_seeds:  # CI at the headline ε
            init = lmft.scratch_params(config, jax.random.key(700 + s), spec["seq_len"])
            trainable, frozen = ft.partition(init, _everything)
            trained, info = _dp_run(scratch_net, trainable, frozen, scratch_data, epsilon=eps,
                                    spec=spec, lr=LEARNING_RATES["scratch"], seed=s,
                                    max_batch_size=scratch_cap)  # fmt: skip
            ppl.append(_perplexity(scratch_net, ft.combine(trained, frozen), scratch_test))
        rows.append(dict(mode="scratch", level="example", target_epsilon=eps,
                         d=ft.num_params(trainable), ppl=ppl, **info))  # fmt: skip
        print(f"[finetune_lm] scratch ε={eps:g}: ppl {np.mean(ppl):.2f}", flush=True)
    # the ceiling: non-private LoRA
    ppl = []
    for s in other_seeds:
        trainable, frozen = _mode_parts(prep, "lora", spec, s)
        trained = _non_private_run(net, trainable, frozen, prep.train, spec=spec,
                                   lr=LEARNING_RATES["lora"], seed=s)  # fmt: skip
        ppl.append(_perplexity(net, ft.combine(trained, frozen), prep.test))
    rows.append(dict(mode="lora (non-private)", level="-", target_epsilon=math.inf,
                     d=ft.num_params(trainable), ppl=ppl))  # fmt: skip
    # user level: a user is a (play, speaker); LoRA at the largest ε
    eps = max(spec["epsilons"])
    ppl = []
    for s in other_seeds:
        trainable, frozen = _mode_parts(prep, "lora", spec, s)
        trained, info = _dp_run(net, trainable, frozen, prep.train, epsilon=eps, spec=spec,
                                lr=LEARNING_RATES["lora"], seed=s,
                                user_ids=prep.train["user"])  # fmt: skip
        ppl.append(_perplexity(net, ft.combine(trained, frozen), prep.test))
    rows.append(dict(mode="lora", level="user (play, speaker)", target_epsilon=eps,
                     d=ft.num_params(trainable), ppl=ppl, **info))  # fmt: skip
    k = int(np.bincount(prep.train["user"]).max())
    example_row = next(r for r in rows if r["mode"] == "lora" and r["target_epsilon"] == eps
                       and r["level"] == "example")  # fmt: skip
    group = group_privacy(epsilon=example_row["epsilon"], delta=DELTA, group_size=k)
    # speed and memory of the DP step against the non-private step
    costs = {}
    for mode in ("lora", "full"):
        trainable, frozen = _mode_parts(prep, mode, spec, seed)
        costs[mode] = step_cost(net, trainable, frozen, prep.train, spec["timing_batch"],
                                spec["seq_len"])  # fmt: skip
    for r in rows:
        r["ppl_mean"], r["ci_low"], r["ci_high"] = _mean_ci(r["ppl"])
    return dict(size=size, rows=rows, n_train=len(prep.train["y"]), n_users=len(prep.users),
                n_test=len(prep.test["y"]), test_tokens=float(prep.test["mask"].sum()),
                max_windows_per_user=k, group_privacy=dict(epsilon=group[0], delta=group[1]),
                example_epsilon=example_row["epsilon"], n_lower=n_lower,
                seconds_lower=prep.seconds_lower, step_costs=costs, seconds_per_run=timing,
                spec={k2: v for k2, v in spec.items()}, device=str(jax.devices()[0]))  # fmt: skip


def verdict(result: dict) -> dict:
    rows = result["rows"]
    eps = max(r["target_epsilon"] for r in rows if r["level"] == "example")
    zero = rows[0]["ppl_mean"]
    lora = next(r for r in rows if r["mode"] == "lora" and r["level"] == "example"
                and r["target_epsilon"] == eps)  # fmt: skip
    scratch = next(r for r in rows if r["mode"] == "scratch" and r["target_epsilon"] == eps)
    hi = lora["ci_high"] if not math.isnan(lora["ci_high"]) else lora["ppl_mean"]
    lo = scratch["ci_low"] if not math.isnan(scratch["ci_low"]) else scratch["ppl_mean"]
    return dict(
        below_zero_shot=hi < zero,
        below_scratch=hi < lo,
        lora=lora["ppl_mean"],
        zero_shot=zero,
        scratch=scratch["ppl_mean"],
        epsilon=eps,
    )


def markdown(result: dict) -> str:
    rows, spec = result["rows"], result["spec"]
    v = verdict(result)
    lines = [
        "## Private fine-tuning of a pretrained LM: SmolLM2-135M (4-bit GGUF) on Shakespeare",
        "",
        "SmolLM2-135M-Instruct (Llama, 30 blocks, D = 576, 9/3 heads) from its llama.cpp GGUF "
        "file: Q4_1/Q8_0 weights dequantised to float32 (a real pretrained LM, not a faithful "
        "SmolLM2); flax forward checked against `transformers` on the same file. Text: one "
        f"example = one window of {spec['seq_len']} next-token predictions of one speaking "
        f"character's lines (padding masked); {result['n_train']} training windows of "
        f"{result['n_users']} characters (≤ {spec['windows_per_user']} windows each), test: "
        f"{result['n_test']} windows ({result['test_tokens']:.0f} tokens) of the held-out plays "
        f"{', '.join(TEST_PLAYS)}. The {result['n_lower']} lower blocks are public and frozen: "
        f"their activations were computed once ({result['seconds_lower']:.0f} s); the modes "
        f"train parts of the top {spec['window']} block(s) and the final norm (the head stays "
        "frozen). DP: "
        f"make_private, Poisson batch {spec['batch']} (expected), {spec['steps']} steps, C = "
        f"{CLIP:g}, ghost clipping, Adam, δ = {DELTA:g} (add/remove one window; user level: "
        "one character). Norm-only replaces DP-BiTFiT: Llama has no biases. Size "
        f"`{result['size']}`: {spec['seeds']} seeds for DP-LoRA at every ε and for the scratch "
        f"model at ε = {max(spec['epsilons']):g}, {spec['other_seeds']} elsewhere (95% CI: t "
        "over seeds; the zero-shot model is deterministic); device "
        f"{result['device']}, {result.get('seconds', float('nan')):.0f} s wall, "
        f"{result.get('cpu_seconds', float('nan')):.0f} CPU-s."
        + (
            " A setting of our own sized for 2 CPU cores (not a paper's): 4 noisy steps move "
            "the model little; `--full` (all 30 blocks, windows of 128, batch 256, 200 steps, "
            "3 seeds everywhere) is sized for a GPU and has not been run (no GPU was available)."
            if result["size"] == "quick"
            else ""
        ),
        "",
        "| mode | level | d | ε | σ | seeds | held-out perplexity (95% CI) |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        eps = "—" if r["target_epsilon"] in (0.0, math.inf) else f"{r.get('epsilon', 0):.2f}"
        sigma = f"{r['sigma']:.2f}" if "sigma" in r else "—"
        ci = "" if math.isnan(r["ci_low"]) else f" [{r['ci_low']:.2f}, {r['ci_high']:.2f}]"
        lines.append(f"| {r['mode']} | {r['level']} | {r['d']} | {eps} | {sigma} | "
                     f"{len(r['ppl'])} | {r['ppl_mean']:.2f}{ci} |")  # fmt: skip
    g = result["group_privacy"]
    lines += [
        "",
        f"Whose privacy: the example-level LoRA run at ε = {result['example_epsilon']:.2f} "
        f"protects one window; a character has up to {result['max_windows_per_user']} windows, "
        f"so by group privacy it protects a character only at (ε, δ) = ({g['epsilon']:.1f}, "
        f"{g['delta']:.2g}). The user-level row is accounted per character "
        "(make_private(user_ids=...): all of a character's windows move the update by ≤ C).",
        "",
        "| step (batch of " + str(spec["timing_batch"]) + ") | DP s/step | non-private s/step "
        "| DP tokens/s | non-private tokens/s | DP memory MB | non-private memory MB |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for mode, c in result["step_costs"].items():
        dp, npv = c["dp"], c["non_private"]
        lines.append(f"| {mode} | {dp['seconds']:.3f} | {npv['seconds']:.3f} | "
                     f"{dp['tokens_per_s']:.0f} | {npv['tokens_per_s']:.0f} | "
                     f"{dp['memory_mb']:.0f} | {npv['memory_mb']:.0f} |")  # fmt: skip
    lines += [
        "",
        "(The DP step here is the clipped sum by ghost clipping on a fixed batch; memory is the "
        "compiled step's temporaries + arguments from XLA's memory analysis.)",
        "",
        f"{'✓' if v['below_zero_shot'] else '✗'} at ε = {v['epsilon']:g} DP-LoRA's held-out "
        f"perplexity ({v['lora']:.2f}) is below zero-shot ({v['zero_shot']:.2f}); "
        f"{'✓' if v['below_scratch'] else '✗'} and below from-scratch DP ({v['scratch']:.2f}).",
    ]
    return "\n".join(lines) + "\n"


def skipped(reason: str) -> dict:
    message = f"SKIPPED: the SmolLM2 model file or the Shakespeare texts are missing. {reason}"
    print(f"[finetune_lm] {message}", file=sys.stderr, flush=True)
    title = "## Private fine-tuning of a pretrained LM (SmolLM2-135M) on Shakespeare"
    md = f"{title}\n\n**{message}**\n"
    return dict(report_md=md, verdict="SKIPPED (model/text missing: run `make data`)")


def run(out_dir: pathlib.Path, *, full: bool = False, seed: int = 0, size: str | None = None):
    """Run at the quick (default) or full scale; write ``finetune_lm.json``; report section.
    Missing model or text files: the section and verdict say SKIPPED with the ``make data``
    hint (a corrupted file is an error)."""
    from experiments.data import DataMissingError
    from experiments.report import write_json

    size = "full" if full else (size or "quick")
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    start, cpu = time.perf_counter(), time.process_time()
    try:
        result = evaluate(size, seed)
    except DataMissingError as error:
        return skipped(str(error))
    except ModuleNotFoundError as error:  # gguf / transformers not installed
        hint = (
            "needs gguf, transformers and torch (transformers' GGUF tokenizer reader imports "
            "torch; `make data` installs its CPU wheel)"
        )
        return dict(report_md=f"## finetune_lm\n\n**SKIPPED: {error} ({hint})**\n",
                    verdict=f"SKIPPED ({hint})")  # fmt: skip
    result["seconds"] = time.perf_counter() - start
    result["cpu_seconds"] = time.process_time() - cpu  # every thread of this process
    write_json(out_dir / "finetune_lm.json", dict(seed=seed, **result))
    v = verdict(result)
    return dict(report_md=markdown(result), rows=result["rows"],
                verdict=f"{size}: ε={v['epsilon']:g} LoRA ppl {v['lora']:.2f} vs zero-shot "
                f"{v['zero_shot']:.2f}, scratch {v['scratch']:.2f}")  # fmt: skip
