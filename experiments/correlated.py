"""Correlated noise: DP-SGD vs DP-FTRL (tree) vs banded MF vs BLT at equal (ε, δ), multi-epoch.

Task: multinomial logistic regression on the digits data (sklearn, 8×8 images, 10 classes;
1437 train / 360 test), plain SGD (the model is a prefix sum of the noisy gradients: the
workload the factorizations are built for), per-example clip C = 1, expected batch B = 64,
several epochs. Every method is calibrated to the same (ε, δ = 1e-5) by its own accounting:

* DP-SGD — Poisson sampling at q = B/n, T steps: PoissonSampledGaussian(σ, q, T);
* banded MF (b bands) — banded square root of the prefix-sum matrix (column norm 1) with
  cyclic Poisson sampling (part t mod b at q = B/⌈n/b⌉): PoissonSampledGaussian(σ, q, ⌈T/b⌉)
  (Choquette-Choo et al. 2023, amplified banded MF);
* DP-FTRL tree — fixed cyclic batches (record i in batch pos(i) // B every epoch), one tree
  per epoch (restarted), each record in one leaf per tree: Gaussian(σ/√⌈log₂(k+1)⌉) per epoch,
  k steps per epoch (Kairouz et al. 2021);
* BLT — a 4-buffer buffered linear Toeplitz C (``blt_strategy`` for the run's participation;
  a least-squares fit if that fit is invalid), same fixed cyclic batches, no amplification:
  Gaussian(σ / sens), sens = ``sensitivity(C, min_separation=steps per epoch,
  max_participations=epochs)`` (certified).

Noise for DP-SGD / banded / BLT comes from :func:`dpjax.dp_sgd.correlated_noise` (C = I is
DP-SGD's noise); the tree's noise is the dyadic decomposition of each prefix sum. The sampling
masks here use ``jax.random.bernoulli`` (an experiment, not a release: dpjax's
:class:`~dpjax.dp_sgd.PoissonSampler` is what releases use).

Second part: the prefix-sum error of each strategy (root-mean-squared and max over steps, per
unit σ at sensitivity 1, single participation) against n, in a plot.
"""

from __future__ import annotations

import json
import math
import pathlib
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

from dpjax.accounting import PrivacyAccountant, calibrate_noise_multiplier
from dpjax.dp_sgd.matrix_factorization import accounting as mfacc
from dpjax.dp_sgd.matrix_factorization.config import banded_sqrt_matrix
from dpjax.dp_sgd.matrix_factorization.streaming import correlated_noise
from dpjax.events import GaussianEvent, PoissonSampledGaussianEvent
from dpjax.mechanisms import analytic_gaussian_sigma

DESCRIPTION = "correlated: DP-SGD vs DP-FTRL tree vs banded MF vs BLT at equal (ε, δ)"

DELTA = 1e-5
CLIP = 1.0
BATCH = 64
SCALES = {
    "tiny": dict(epsilons=(4.0,), epochs=2, seeds=2, bands=(4,), lr=1.0, error_n=3),
    "quick": dict(epsilons=(2.0, 8.0), epochs=4, seeds=4, bands=(4,), lr=1.0, error_n=6),
    "full": dict(
        epsilons=(1.0, 2.0, 4.0, 8.0, 16.0), epochs=8, seeds=10, bands=(4, 8), lr=1.0, error_n=9
    ),
}


# ----------------------------------------------------------------------------- data and model


def _digits() -> tuple[np.ndarray, ...]:
    from sklearn.datasets import load_digits  # noqa: PLC0415

    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    x, y = (x[order] / 16.0).astype(np.float32), y[order].astype(np.int32)
    split = 1437
    return x[:split], y[:split], x[split:], y[split:]


def _loss(params: dict, x: jax.Array, y: jax.Array) -> jax.Array:
    logits = x @ params["w"] + params["b"]
    return -jax.nn.log_softmax(logits)[y]


def _clipped_sum(params: dict, x: jax.Array, y: jax.Array, mask: jax.Array) -> dict:
    grads = jax.vmap(jax.grad(_loss), in_axes=(None, 0, 0))(params, x, y)
    sq = sum(jnp.sum(g.reshape(g.shape[0], -1) ** 2, axis=1) for g in jax.tree.leaves(grads))
    factor = jnp.where(mask, jnp.minimum(1.0, CLIP / jnp.sqrt(sq + 1e-30)), 0.0)
    return jax.tree.map(lambda g: jnp.tensordot(factor, g, axes=(0, 0)), grads)


def _init_params() -> dict:
    return {"w": jnp.zeros((64, 10), jnp.float32), "b": jnp.zeros(10, jnp.float32)}


# ----------------------------------------------------------------------------- strategies


def _fitted_blt(n: int):
    """4 buffers with fixed decays, ω by least squares on the square-root coefficients
    c_k = binom(2k, k)/4^k (cheap: used for the error-vs-n table)."""
    from dpjax.dp_sgd.matrix_factorization.blt import BLT  # noqa: PLC0415

    theta = np.array([0.995, 0.95, 0.75, 0.3])
    k = np.arange(1, n)
    target = np.cumprod((2 * k - 1) / (2 * k))
    basis = theta[None, :] ** (k[:, None] - 1)
    return BLT(theta, np.linalg.lstsq(basis, target, rcond=None)[0])


def _training_blt(n: int, per_epoch: int, epochs: int) -> tuple[Any, str]:
    """The BLT of the training runs: ``blt_strategy`` optimised for the run's participation
    (separation = steps per epoch, k = epochs); if its fit is not a valid BLT (a decay at 1),
    the least-squares fit. Returns (BLT, how it was built)."""
    from dpjax.dp_sgd.matrix_factorization.blt import blt_strategy  # noqa: PLC0415

    try:
        blt = blt_strategy(n, 4, min_separation=per_epoch, max_participations=epochs)
        blt.coefficients(n)  # validates θ ∈ (0, 1)
        return blt, "blt_strategy (optimised for the participation)"
    except ValueError:
        return _fitted_blt(
            n
        ), "least-squares fit to the sqrt coefficients (blt_strategy fit invalid)"


def _blt_matrix(blt: Any, n: int) -> np.ndarray:
    import scipy.linalg  # noqa: PLC0415

    k = np.arange(1, n)[:, None]
    tail = (np.asarray(blt.output_scale)[None] * np.asarray(blt.buf_decay)[None] ** (k - 1)).sum(1)
    return scipy.linalg.toeplitz(np.concatenate([[1.0], tail]), np.zeros(n))


def _blt_sensitivity(c: np.ndarray, per_epoch: int, epochs: int) -> float:
    """sens(C) for fixed cyclic batches: each record in one step per epoch, ``per_epoch``
    apart, ``epochs`` times (the certified value of ``sensitivity``; ≥ the periodic pattern's
    ‖C·Σ_j e_{s + j·per_epoch}‖, checked)."""
    from dpjax.dp_sgd.matrix_factorization.sensitivity import sensitivity  # noqa: PLC0415

    sens = sensitivity(c, min_separation=per_epoch, max_participations=epochs)
    periodic = max(float(np.linalg.norm(c[:, s::per_epoch].sum(axis=1))) for s in range(per_epoch))
    assert sens >= periodic * (1 - 1e-12)
    return sens


def _tree_prefix_noise(rng: np.random.Generator, steps: int, d: int) -> np.ndarray:
    """Per-step noise x_t = s_t − s_{t−1} of tree aggregation: s_t sums the noise of the
    dyadic blocks of [1, t] (one N(0, I) per node)."""
    nodes: dict[tuple[int, int], np.ndarray] = {}
    prefix = np.zeros((steps + 1, d))
    for t in range(1, steps + 1):
        total, start = np.zeros(d), 0
        for level in range(int(math.log2(t)), -1, -1):
            if t - start >= 1 << level:
                node = (level, start >> level)
                if node not in nodes:
                    nodes[node] = rng.standard_normal(d)
                total += nodes[node]
                start += 1 << level
        prefix[t] = total
    return np.diff(prefix, axis=0)


# ----------------------------------------------------------------------------- calibration


def _calibrate(
    method: str,
    epsilon: float,
    *,
    n: int,
    steps: int,
    epochs: int,
    per_epoch: int,
    bands: int = 1,
    blt_sens: float = 1.0,
) -> tuple[float, Any]:
    """(σ, its event(s)) so that the method's run is (ε, δ)-DP by its own accounting."""
    if method == "dpsgd" or method.startswith("band"):
        part = -(-n // bands)
        q, rounds = BATCH / part, -(-steps // bands)
        sigma = calibrate_noise_multiplier(
            target_epsilon=epsilon, delta=DELTA, sampling_rate=q, steps=rounds
        )
        return sigma, [PoissonSampledGaussianEvent(sigma, q, count=rounds)]
    one = analytic_gaussian_sigma(sensitivity=1.0, epsilon=epsilon, delta=DELTA)
    if method == "tree":
        depth = mfacc.tree_depth(per_epoch)
        sigma = one * math.sqrt(epochs * depth)
        return sigma, [
            GaussianEvent(sigma / math.sqrt(depth), count=epochs, relation="add_or_remove_one")
        ]
    sigma = one * blt_sens  # blt: one Gaussian release of sensitivity sens(C)
    return sigma, [mfacc.matrix_mechanism_event(sigma, sensitivity=blt_sens)]


# ----------------------------------------------------------------------------- training


def _run_method(
    method: str,
    sigmas: list[float],
    data: tuple,
    cfg: dict,
    seed: int,
    bands: int = 1,
    blt: Any = None,
) -> np.ndarray:
    """Test accuracy [len(sigmas), seeds] of one method (σ traced: one compile)."""
    xtr, ytr, xte, yte = (jnp.asarray(a) for a in data)
    n = xtr.shape[0]
    per_epoch = n // BATCH
    steps = cfg["epochs"] * per_epoch
    params0 = _init_params()
    d = sum(p.size for p in jax.tree.leaves(params0))
    seeds = cfg["seeds"]
    if method == "dpsgd":
        tx = correlated_noise(
            np.eye(steps), noise_multiplier=1.0, l2_clip_norm=1.0, key=jax.random.key(0), bands=1
        )
    elif method.startswith("band"):
        tx = correlated_noise(
            _normalised(banded_sqrt_matrix(steps, bands)),
            noise_multiplier=1.0,
            l2_clip_norm=1.0,
            key=jax.random.key(0),
            bands=bands,
        )
    elif method == "blt":
        tx = correlated_noise(
            blt, noise_multiplier=1.0, l2_clip_norm=1.0, key=jax.random.key(0), steps=steps
        )
    else:
        tx = None
    rng = np.random.default_rng(seed)
    tree_noise = np.zeros((seeds, 1, 1), np.float32)
    if tx is None:
        tree_noise = np.stack(
            [
                np.concatenate(
                    [_tree_prefix_noise(rng, per_epoch, d) for _ in range(cfg["epochs"])]
                )
                for _ in range(seeds)
            ]
        ).astype(np.float32)
    positions = np.stack([rng.permutation(n) for _ in range(seeds)]).astype(np.int32)
    q_all = BATCH / n
    q_part = BATCH / -(-n // bands)
    index = jnp.arange(n, dtype=jnp.int32)

    def mask_at(key, t, pos):
        if method == "dpsgd":
            return jax.random.bernoulli(key, q_all, (n,))
        if method.startswith("band"):
            return (index % bands == t % bands) & jax.random.bernoulli(key, q_part, (n,))
        return (pos // BATCH) == (t % per_epoch)

    def train(sigma, key, pos, tree):
        def unit_noise(state, t, zeros):
            if tx is None:
                flat = tree[t]
                w = flat[:640].reshape(64, 10)
                return {"b": flat[640:], "w": w}, state
            return tx.update(zeros, state)

        def body(carry, t):
            params, state, key = carry
            key, sample_key = jax.random.split(key)
            mask = mask_at(sample_key, t, pos)
            g = _clipped_sum(params, xtr, ytr, mask)
            x, state = unit_noise(state, t, jax.tree.map(jnp.zeros_like, params))
            update = jax.tree.map(lambda a, z: (a + sigma * CLIP * z) / BATCH, g, x)
            params = jax.tree.map(lambda p, u: p - cfg["lr"] * u, params, update)
            return (params, state, key), None

        noise_key, train_key = jax.random.split(key)
        state = None
        if tx is not None:
            state = tx.init(params0)
            state = state._replace(key=jax.random.key_data(noise_key))
        (params, _, _), _ = jax.lax.scan(
            body, (params0, state, train_key), jnp.arange(steps, dtype=jnp.int32)
        )
        pred = jnp.argmax(xte @ params["w"] + params["b"], axis=1)
        return jnp.mean(pred.astype(yte.dtype) == yte)

    keys = jax.random.split(jax.random.key(seed), seeds)
    per_seed = jax.vmap(train, in_axes=(None, 0, 0, 0))
    run = jax.jit(jax.vmap(per_seed, in_axes=(0, None, None, None)))
    acc = run(jnp.asarray(sigmas, jnp.float32), keys, jnp.asarray(positions), tree_noise)
    return np.asarray(acc)


def _normalised(c: np.ndarray) -> np.ndarray:
    return c / mfacc.max_column_norm(c)


def _ci(values: np.ndarray) -> tuple[float, float]:
    """(mean, half-width of the 95% t-interval over seeds)."""
    m = float(np.mean(values))
    if len(values) < 2:
        return m, math.nan
    spread = np.std(values, ddof=1) / np.sqrt(len(values))
    half = float(stats.t.ppf(0.975, len(values) - 1) * spread)
    return m, half


# ----------------------------------------------------------------------------- errors vs n


def _strategy_errors(n: int) -> dict[str, tuple[float, float]]:
    """(RMSE, max error) of the prefix sums per unit σ at sensitivity 1 (single
    participation): sens(C)·‖A C⁻¹‖ rows."""
    a = np.tril(np.ones((n, n)))
    out = {}
    for name, c in (
        ("DP-SGD (C = I)", np.eye(n)),
        ("sqrt (full)", banded_sqrt_matrix(n, n)),
        ("banded sqrt, b = 8", banded_sqrt_matrix(n, min(8, n))),
        ("BLT (4 buffers, lsq fit)", _blt_matrix(_fitted_blt(n), n)),
    ):
        rows = np.linalg.norm(np.linalg.solve(c.T, a.T).T, axis=1) * mfacc.max_column_norm(c)
        out[name] = (float(np.sqrt(np.mean(rows**2))), float(np.max(rows)))
    depth = mfacc.tree_depth(n)
    pops = np.array([bin(t).count("1") for t in range(1, n + 1)]) * depth
    out["tree (DP-FTRL)"] = (float(np.sqrt(np.mean(pops))), float(np.sqrt(np.max(pops))))
    return out


def _plot_errors(path: pathlib.Path, ns: list[int], errors: dict) -> bool:
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for k, title in enumerate(("RMSE of prefix sums", "max error of prefix sums")):
        for name in errors[ns[0]]:
            axes[k].loglog(ns, [errors[n][name][k] for n in ns], marker="o", label=name)
        axes[k].set_xlabel("steps n")
        axes[k].set_title(title + " (σ = 1, sens = 1)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# ----------------------------------------------------------------------------- run


def run(
    out_dir: pathlib.Path, *, full: bool = False, seed: int = 0, size: str | None = None
) -> dict:
    """Train every method at every ε, compute the error curves, write
    ``correlated.{json,md,png}`` and return the summary (``report_md``)."""
    start = time.perf_counter()
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = SCALES["full" if full else (size or "quick")]
    data = _digits()
    n = len(data[1])
    per_epoch = n // BATCH
    steps = cfg["epochs"] * per_epoch
    blt, blt_how = _training_blt(steps, per_epoch, cfg["epochs"])
    blt_sens = _blt_sensitivity(_blt_matrix(blt, steps), per_epoch, cfg["epochs"])
    methods = ["dpsgd", *[f"band{b}" for b in cfg["bands"]], "tree", "blt"]
    sigmas: dict[str, list[float]] = {}
    checks: dict[str, list[float]] = {}
    for m in methods:
        bands = int(m[4:]) if m.startswith("band") else 1
        pairs = [
            _calibrate(
                m,
                e,
                n=n,
                steps=steps,
                epochs=cfg["epochs"],
                per_epoch=per_epoch,
                bands=bands,
                blt_sens=blt_sens,
            )
            for e in cfg["epsilons"]
        ]
        sigmas[m] = [s for s, _ in pairs]
        checks[m] = [PrivacyAccountant(ev).epsilon(DELTA) for _, ev in pairs]
    accuracy = {}
    for m in methods:
        bands = int(m[4:]) if m.startswith("band") else 1
        accuracy[m] = _run_method(m, sigmas[m], data, cfg, seed, bands=bands, blt=blt)
    ns = [2**k for k in range(3, 3 + cfg["error_n"])]
    errors = {k: _strategy_errors(k) for k in ns}
    plotted = _plot_errors(out_dir / "correlated.png", ns, errors)
    summary = {m: [_ci(accuracy[m][i]) for i in range(len(cfg["epsilons"]))] for m in methods}
    ordering = _ordering(summary, methods, cfg["epsilons"])
    report = _markdown(
        cfg,
        methods,
        sigmas,
        checks,
        summary,
        ordering,
        ns,
        errors,
        plotted,
        n=n,
        steps=steps,
        per_epoch=per_epoch,
        blt_sens=blt_sens,
        blt_how=blt_how,
    )
    seconds = time.perf_counter() - start
    (out_dir / "correlated.md").write_text(report)
    payload = {
        "description": DESCRIPTION,
        "delta": DELTA,
        "batch": BATCH,
        "clip": CLIP,
        "epochs": cfg["epochs"],
        "steps": steps,
        "epsilons": list(cfg["epsilons"]),
        "sigmas": sigmas,
        "accounted_epsilons": checks,
        "accuracy": {m: accuracy[m].tolist() for m in methods},
        "accuracy_mean_ci95": summary,
        "ordering_band_ge_dpsgd": ordering,
        "errors": {str(k): v for k, v in errors.items()},
        "seconds": seconds,
    }
    (out_dir / "correlated.json").write_text(json.dumps(payload, indent=1) + "\n")
    return {"report_md": report, "accuracy": summary, "ordering": ordering, "sigmas": sigmas}


def _ordering(summary: dict, methods: list[str], epsilons: tuple) -> list[bool]:
    """Per ε: whether the best banded MF's mean accuracy ≥ DP-SGD's (the published ordering)."""
    bands = [m for m in methods if m.startswith("band")]
    return [
        max(summary[m][i][0] for m in bands) >= summary["dpsgd"][i][0] for i in range(len(epsilons))
    ]


LABELS = {
    "dpsgd": "DP-SGD (Poisson)",
    "tree": "DP-FTRL tree (restart per epoch)",
    "blt": "BLT (4 buffers, no amplification)",
}


def _label(m: str) -> str:
    return LABELS.get(m, f"banded MF, b = {m[4:]} (cyclic Poisson)")


def _markdown(
    cfg,
    methods,
    sigmas,
    checks,
    summary,
    ordering,
    ns,
    errors,
    plotted,
    *,
    n,
    steps,
    per_epoch,
    blt_sens,
    blt_how,
) -> str:
    eps = cfg["epsilons"]
    lines = [
        "## Correlated noise: DP-SGD vs DP-FTRL vs banded MF vs BLT",
        "",
        f"Digits, multinomial logistic regression, plain SGD (lr {cfg['lr']}), n = {n}, "
        f"expected batch {BATCH}, {cfg['epochs']} epochs = {steps} steps ({per_epoch} per "
        f"epoch), clip {CLIP}, δ = {DELTA:g}; test accuracy, mean ± 95% CI over "
        f"{cfg['seeds']} seeds. Each method's σ is calibrated to ε by its own accounting "
        f"(BLT: {blt_how}, sensitivity {blt_sens:.3f} over {cfg['epochs']} participations).",
        "",
        "| method | " + " | ".join(f"ε = {e:g}" for e in eps) + " |",
        "|---|" + "---|" * len(eps),
    ]
    for m in methods:
        cells = [
            f"{100 * mu:.1f} ± {100 * h:.1f} (σ {s:.2f})"
            for (mu, h), s in zip(summary[m], sigmas[m], strict=True)
        ]
        lines.append(f"| {_label(m)} | " + " | ".join(cells) + " |")
    worst = max(abs(c / e - 1) for m in methods for c, e in zip(checks[m], eps, strict=True))
    lines += [
        "",
        f"Re-accounted ε of every calibrated σ is within {100 * worst:.2f}% of the target.",
        "",
        "Published ordering (Choquette-Choo et al. 2023: banded MF ≥ DP-SGD at every ε in the "
        "multi-epoch setting), best banded MF vs DP-SGD by mean accuracy: "
        + ", ".join(f"ε = {e:g} {'✓' if ok else '✗'}" for e, ok in zip(eps, ordering, strict=True))
        + (
            " (where ✗, the difference is within the seeds' CI at this scale or the band "
            "count is not tuned: the paper optimises b per ε)."
            if not all(ordering)
            else "."
        ),
        "",
        "Prefix-sum error per unit σ at sensitivity 1 (single participation), against n:",
        "",
        "| n | " + " | ".join(errors[ns[0]]) + " |",
        "|---|" + "---|" * len(errors[ns[0]]),
    ]
    for k in ns:
        lines.append(
            f"| {k} | " + " | ".join(f"{r:.2f} / {x:.2f}" for r, x in errors[k].values()) + " |"
        )
    lines += [
        "",
        "(cells: RMSE / max error)" + ("; plot: `correlated.png`." if plotted else "."),
        "",
    ]
    return "\n".join(lines)
