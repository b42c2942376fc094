"""Test accuracy of DP logistic regression on real data: dpjax's solvers against diffprivlib.

For every data set, method and ε ∈ {0.1, 0.3, 1, 3, 10}: S train/test splits (75/25,
stratified), one private fit per split with its own key, test accuracy; mean and 95% Student-t
CI over the S fits. The dpjax fits of one (data set, method, ε) are ONE compiled call
(``jax.jit(jax.vmap(...))`` over keys and splits of the same shape).

Public preprocessing (never computed from the training split): a per-feature affine map
x ↦ (x − lo)/(hi − lo) − 1/2 with public bounds [lo, hi] (digits: the pixel range [0, 16];
synthetic: [−1/2, 1/2]; breast cancer and wine: the per-feature ranges published with the data
set in its description, treated as public domain knowledge — as diffprivlib's ``bounds=``),
then rows clipped to norm 1 and the intercept as a constant feature s = 1/2 with the clipped
row scaled by √(1 − s²) (:func:`dpjax.erm.estimator.public_features`), so ‖x̃‖ ≤ 1. Every
method, diffprivlib and scikit-learn included, sees the same rows. μ is a public function of
(n, d, ε, δ) and the prior radius R = 10 (:func:`dpjax.erm.estimator.default_mu`), never tuned
on the data.
"""

from __future__ import annotations

import math
import pathlib
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np

DESCRIPTION = "utility: DP logistic regression accuracy on real data vs diffprivlib and sklearn"

EPSILONS = (0.1, 0.3, 1.0, 3.0, 10.0)
DELTA = 1e-5
RADIUS = 10.0
INTERCEPT = 0.5
TEST_FRACTION = 0.25
DP_GD_MAX_STEPS = 200
DP_SGD_BATCH = 64
DP_SGD_EPOCHS = 5

METHODS = (
    "objective_kst",
    "objective_cms",
    "output",
    "dp_gd",
    "dp_sgd",
    "diffprivlib",
    "sklearn",
)
DPJAX_METHODS = METHODS[:5]
LABELS = {
    "objective_kst": "objective pert. KST12 (ε, δ)",
    "objective_cms": "objective pert. CMS11 (pure ε)",
    "output": "output pert. Gaussian (ε, δ)",
    "dp_gd": "DP-GD (ε, δ)",
    "dp_sgd": "DP-SGD (ε, δ), add/remove",
    "diffprivlib": "diffprivlib LR (pure ε)",
    "sklearn": "scikit-learn, non-private",
}
PURE = {"objective_cms", "diffprivlib"}
SIZES = {
    "tiny": dict(
        datasets=("breast_cancer", "synthetic"),
        epsilons=(1.0,),
        seeds=3,
        synth_n=400,
        accountant="fast",
    ),
    "quick": dict(
        datasets=("breast_cancer", "digits", "wine", "synthetic"),
        epsilons=EPSILONS,
        seeds=50,
        synth_n=2000,
        accountant="fast",
    ),
    "full": dict(
        datasets=("breast_cancer", "digits", "wine", "synthetic"),
        epsilons=EPSILONS,
        seeds=200,
        synth_n=20000,
        accountant="pld",
    ),
}


# -- data ---------------------------------------------------------------------------------------


def _synthetic(n: int, seed: int = 1234, d: int = 20) -> tuple[np.ndarray, np.ndarray, tuple]:
    """Features uniform on [−1/2, 1/2]^d, labels from a logistic model with ‖w‖ = 8."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-0.5, 0.5, size=(n, d))
    w = rng.normal(size=d)
    w *= 8.0 / np.linalg.norm(w)
    y = (rng.uniform(size=n) < 1.0 / (1.0 + np.exp(-X @ w))).astype(int)
    return X, y, (np.full(d, -0.5), np.full(d, 0.5))


def load_dataset(name: str, *, synth_n: int = 4000) -> dict:
    """(X, y ∈ {0, 1}, public bounds (lo, hi), description) of a named data set."""
    from sklearn import datasets

    if name == "synthetic":
        X, y, bounds = _synthetic(synth_n)
        desc = f"synthetic logistic, d = 20, n = {synth_n}"
    elif name == "breast_cancer":
        X, y = datasets.load_breast_cancer(return_X_y=True)
        bounds, desc = (X.min(0), X.max(0)), "breast cancer (malignant vs benign)"
    elif name == "digits":
        X, t = datasets.load_digits(return_X_y=True)
        y = (t >= 5).astype(int)
        bounds, desc = (np.zeros(X.shape[1]), np.full(X.shape[1], 16.0)), "digits (0–4 vs 5–9)"
    elif name == "wine":
        X, t = datasets.load_wine(return_X_y=True)
        y = (t == 0).astype(int)
        bounds, desc = (X.min(0), X.max(0)), "wine (class 0 vs rest)"
    else:
        raise ValueError(
            f"dataset must be one of synthetic/breast_cancer/digits/wine; got {name!r}"
        )
    return dict(X=np.asarray(X, float), y=np.asarray(y), bounds=bounds, description=desc)


def public_rows(X: np.ndarray, bounds: tuple) -> np.ndarray:
    """Min–max to [−1/2, 1/2] with PUBLIC bounds, then the estimator's row map (norm ≤ 1)."""
    from dpjax.erm.estimator import public_features

    lo, hi = (np.asarray(b, float) for b in bounds)
    span = np.where(hi > lo, hi - lo, 1.0)
    Z = (X - lo) / span - 0.5
    return public_features(Z, fit_intercept=True, intercept_scaling=INTERCEPT)


def splits(rows: np.ndarray, y: np.ndarray, seeds: int, seed: int) -> dict:
    """S stratified 75/25 splits stacked into arrays (S, n_train, d), ..."""
    from sklearn.model_selection import train_test_split

    parts = [
        train_test_split(
            rows, y, test_size=TEST_FRACTION, stratify=y, random_state=seed * 100_003 + s
        )
        for s in range(seeds)
    ]
    Xtr, Xte, ytr, yte = (np.stack([p[i] for p in parts]) for i in range(4))
    return dict(Xtr=Xtr, Xte=Xte, ytr=ytr, yte=yte)


# -- methods ------------------------------------------------------------------------------------


def method_config(method: str, *, n: int, d: int, epsilon: float, accountant: str = "rdp") -> dict:
    """Public hyperparameters of one method at (n, d, ε): μ, δ, steps, sampling rate."""
    from dpjax.erm.estimator import default_mu

    if method == "objective_kst":
        return dict(mu=default_mu("objective", n=n, d=d, epsilon=epsilon, delta=DELTA), delta=DELTA)
    if method == "objective_cms":
        return dict(mu=default_mu("objective", n=n, d=d, epsilon=epsilon, delta=0.0), delta=0.0)
    if method == "output":
        return dict(mu=default_mu("output", n=n, d=d, epsilon=epsilon, delta=DELTA), delta=DELTA)
    if method == "dp_gd":
        from dpjax.accounting import zcdp_rho_for_epsilon
        from dpjax.erm.iterative import default_steps

        rho = zcdp_rho_for_epsilon(epsilon=epsilon, delta=DELTA)
        steps = min(default_steps(n=n, d=d, rho=rho), DP_GD_MAX_STEPS)
        return dict(mu=0.0, delta=DELTA, steps=steps, radius=RADIUS)
    if method == "dp_sgd":
        q = min(1.0, DP_SGD_BATCH / n)
        steps = math.ceil(DP_SGD_EPOCHS / q)
        return dict(
            mu=0.0, delta=DELTA, steps=steps, sampling_rate=q, radius=RADIUS, accountant=accountant
        )
    if method == "diffprivlib":
        return dict(delta=0.0, data_norm=1.0)
    return dict(delta=0.0, C=100.0)


def _dpjax_fit(method: str, epsilon: float, cfg: dict, n: int):
    """(key, X, y±) -> w for one method, all hyperparameters closed over (public)."""
    from dpjax import erm
    from dpjax.erm import losses

    loss = losses.logistic
    if method == "objective_kst":
        return lambda k, X, y: (
            erm.objective_perturbation(
                k, X, y, loss=loss, mu=cfg["mu"], epsilon=epsilon, delta=DELTA, variant="kst"
            ).params
        )
    if method == "objective_cms":
        return lambda k, X, y: (
            erm.objective_perturbation(
                k, X, y, loss=loss, mu=cfg["mu"], epsilon=epsilon, variant="cms"
            ).params
        )
    if method == "output":
        return lambda k, X, y: (
            erm.output_perturbation(
                k, X, y, loss=loss, mu=cfg["mu"], epsilon=epsilon, delta=DELTA
            ).params
        )
    if method == "dp_gd":
        return lambda k, X, y: erm.dp_gd(
            k, X, y, loss=loss, epsilon=epsilon, delta=DELTA, radius=cfg["radius"],
            steps=cfg["steps"],
        ).params  # fmt: skip
    return lambda k, X, y: erm.dp_sgd(
        k, X, y, loss=loss, epsilon=epsilon, delta=DELTA, radius=cfg["radius"],
        sampling_rate=cfg["sampling_rate"], steps=cfg["steps"], dataset_size=n,
        accounting=cfg["accountant"],
    ).params  # fmt: skip


def dpjax_accuracies(method, epsilons, configs, data, key) -> np.ndarray:
    """Test accuracies (S, E) of S private fits per ε: ONE jit(vmap) call over the S splits.

    Each (split, ε) fit gets its own key: ``fold_in(split key, ε index)``.
    """
    n = data["Xtr"].shape[1]
    fits = [_dpjax_fit(method, e, c, n) for e, c in zip(epsilons, configs, strict=True)]

    def accuracies(split_key, Xtr, ytr, Xte, yte):
        out = []
        for i, fit in enumerate(fits):
            w = fit(jax.random.fold_in(split_key, i), Xtr, 2.0 * ytr - 1.0)
            out.append(jnp.mean(((Xte @ w) > 0) == (yte > 0)))
        return jnp.stack(out)

    keys = jax.random.split(key, data["Xtr"].shape[0])
    args = (data["Xtr"], data["ytr"].astype(float), data["Xte"], data["yte"].astype(float))
    return np.asarray(jax.jit(jax.vmap(accuracies))(keys, *(jnp.asarray(a) for a in args)))


def baseline_accuracies(method, epsilon, cfg, data, seed) -> np.ndarray:
    """diffprivlib's LogisticRegression (pure ε, data_norm = 1) or scikit-learn's, per split."""
    out = []
    for s in range(data["Xtr"].shape[0]):
        Xtr, ytr, Xte, yte = (data[k][s] for k in ("Xtr", "ytr", "Xte", "yte"))
        if method == "diffprivlib":
            from diffprivlib.models import LogisticRegression

            model = LogisticRegression(
                epsilon=epsilon,
                data_norm=cfg["data_norm"],
                fit_intercept=False,
                random_state=seed * 100_003 + s,
            )
        else:
            from sklearn.linear_model import LogisticRegression

            model = LogisticRegression(C=cfg["C"], fit_intercept=False, max_iter=2000)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.fit(Xtr, ytr)
        out.append(model.score(Xte, yte))
    return np.asarray(out)


def mean_ci(values: np.ndarray) -> tuple[float, float, float]:
    """Mean and 95% Student-t interval of i.i.d. accuracies."""
    from scipy import stats

    values = np.asarray(values, float)
    m = float(values.mean())
    if values.size < 2:
        return m, m, m
    half = float(stats.t.ppf(0.975, values.size - 1) * values.std(ddof=1) / math.sqrt(values.size))
    return m, m - half, m + half


# -- run ----------------------------------------------------------------------------------------


def _accountant(spec: dict, epsilon: float) -> str:
    """DP-SGD's accountant: PLD, or (quick/tiny) PLD for ε ≤ 1 and RDP above, where the PLD
    calibration is slow (seconds per ε) — RDP's σ is the larger (pessimistic) of the two."""
    if spec["accountant"] != "fast":
        return spec["accountant"]
    return "pld" if epsilon <= 1.0 else "rdp"


def _record(name, ds, method, eps, cfg, data, acc, seconds) -> dict:
    mean, lo, hi = mean_ci(acc)
    relation = {"sklearn": "non-private", "dp_sgd": "add_or_remove_one"}.get(method, "replace_one")
    return dict(
        dataset=name,
        description=ds["description"],
        method=method,
        label=LABELS[method],
        epsilon=eps,
        delta=cfg["delta"],
        pure_epsilon=method in PURE,
        relation=relation,
        mu=cfg.get("mu"),
        n_train=int(data["Xtr"].shape[1]),
        n_test=int(data["Xte"].shape[1]),
        d=int(data["Xtr"].shape[2]),
        accuracy_mean=mean,
        ci_low=lo,
        ci_high=hi,
        seeds=int(acc.size),
        majority=float(max(ds["y"].mean(), 1 - ds["y"].mean())),
        seconds=seconds,
        **{k: cfg[k] for k in ("steps", "sampling_rate", "accountant") if k in cfg},
    )


def evaluate(size: str = "quick", seed: int = 0, methods=METHODS) -> list[dict]:
    """One record per (dataset, method, ε); every key derives from ``jax.random.key(seed)``."""
    spec = SIZES[size]
    epsilons = spec["epsilons"]
    records = []
    root = jax.random.key(seed)
    with jax.enable_x64(True):
        for ds_index, name in enumerate(spec["datasets"]):
            ds = load_dataset(name, synth_n=spec["synth_n"])
            data = splits(public_rows(ds["X"], ds["bounds"]), ds["y"], spec["seeds"], seed)
            n, d = data["Xtr"].shape[1:]
            for m_index, method in enumerate(methods):
                start, cpu = time.perf_counter(), time.process_time()
                configs = [
                    method_config(method, n=n, d=d, epsilon=e, accountant=_accountant(spec, e))
                    for e in epsilons
                ]
                if method in DPJAX_METHODS:
                    key = jax.random.fold_in(root, ds_index * 31 + m_index)
                    acc = dpjax_accuracies(method, epsilons, configs, data, key)
                elif method == "sklearn":  # non-private: one fit per split, the same at every ε
                    once = baseline_accuracies(method, None, configs[0], data, seed)
                    acc = np.repeat(once[:, None], len(epsilons), axis=1)
                else:
                    acc = np.stack(
                        [baseline_accuracies(method, e, c, data, seed)
                         for e, c in zip(epsilons, configs, strict=True)], axis=1,
                    )  # fmt: skip
                seconds = (time.perf_counter() - start) / len(epsilons)
                print(
                    f"[utility] {name} {method}: {len(epsilons) * seconds:.1f}s "
                    f"(cpu {time.process_time() - cpu:.1f}s)",
                    flush=True,
                )
                for j, (eps, cfg) in enumerate(zip(epsilons, configs, strict=True)):
                    records.append(_record(name, ds, method, eps, cfg, data, acc[:, j], seconds))
    return records


def best_vs_diffprivlib(records: list[dict]) -> list[dict]:
    """Per (dataset, ε): dpjax's best method against diffprivlib, and whether CIs separate."""
    rows = []
    keys = sorted({(r["dataset"], r["epsilon"]) for r in records})
    for ds, eps in keys:
        cell = {r["method"]: r for r in records if r["dataset"] == ds and r["epsilon"] == eps}
        ours = [cell[m] for m in DPJAX_METHODS if m in cell]
        if not ours or "diffprivlib" not in cell:
            continue
        best = max(ours, key=lambda r: r["accuracy_mean"])
        pure = [cell[m] for m in DPJAX_METHODS if m in cell and m in PURE]
        best_pure = max(pure, key=lambda r: r["accuracy_mean"]) if pure else None
        dpl = cell["diffprivlib"]
        rows.append(
            dict(
                dataset=ds,
                epsilon=eps,
                best=best["method"],
                best_mean=best["accuracy_mean"],
                best_pure=best_pure["method"] if best_pure else None,
                best_pure_mean=best_pure["accuracy_mean"] if best_pure else None,
                diffprivlib_mean=dpl["accuracy_mean"],
                at_least_as_accurate=best["accuracy_mean"] >= dpl["accuracy_mean"],
                worse_beyond_ci=best["ci_high"] < dpl["ci_low"],
                pure_worse_beyond_ci=bool(best_pure and best_pure["ci_high"] < dpl["ci_low"]),
            )
        )
    return rows


def markdown(records: list[dict], comparison: list[dict], plot: str | None, spec: dict) -> str:
    eps_list = sorted({r["epsilon"] for r in records})
    datasets = list(dict.fromkeys(r["dataset"] for r in records))
    lines = [
        "## Utility on real data: DP logistic regression vs diffprivlib",
        "",
        f"Test accuracy, mean [95% CI] over {records[0]['seeds']} stratified 75/25 splits "
        "(one key per split). δ = 1e-5 for the (ε, δ) methods; **pure ε** methods: "
        "CMS11 objective perturbation and diffprivlib (so diffprivlib is like-for-like with "
        "`objective_cms`; the (ε, δ) methods get a weaker guarantee). DP-SGD is "
        "add/remove-one, the others replace-one.",
        "",
        "Preprocessing (public, the same rows for every method): per-feature min–max to "
        "[−½, ½] with public bounds (digits [0, 16]; breast cancer and wine the published "
        "per-feature ranges, taken as public domain knowledge), rows clipped to norm 1, the "
        "intercept a constant feature ½ with the row scaled by √¾ (norm ≤ 1). "
        f"μ = `dpjax.erm.estimator.default_mu(n, d, ε, δ, R = {RADIUS:g})` (objective: "
        "E‖b‖/(nR); output: √(4σ₁√d/n)/R), never tuned on data; DP-GD: μ = 0, radius R, "
        f"T = min(⌈n²ρ/2d⌉, {DP_GD_MAX_STEPS}); DP-SGD: μ = 0, radius R, Poisson q = "
        f"{DP_SGD_BATCH}/n, {DP_SGD_EPOCHS} epochs, σ calibrated by the "
        f"{records_accountant(records)} accountant; diffprivlib "
        "`LogisticRegression(epsilon, data_norm=1, fit_intercept=False)`; scikit-learn "
        "`LogisticRegression(C=100, fit_intercept=False)`.",
        "",
    ]
    for ds in datasets:
        recs = [r for r in records if r["dataset"] == ds]
        first = recs[0]
        lines += [
            f"**{first['description']}** (n_train = {first['n_train']}, d = {first['d']} "
            f"with the intercept, majority class {first['majority']:.3f})",
            "",
            "| method | " + " | ".join(f"ε = {e:g}" for e in eps_list) + " |",
            "|---|" + "---|" * len(eps_list),
        ]
        for m in METHODS:
            cells = {r["epsilon"]: r for r in recs if r["method"] == m}
            if not cells:
                continue
            row = [
                f"{cells[e]['accuracy_mean']:.3f} [{cells[e]['ci_low']:.3f}, "
                f"{cells[e]['ci_high']:.3f}]"
                if e in cells
                else "–"
                for e in eps_list
            ]
            lines.append(f"| {LABELS[m]} | " + " | ".join(row) + " |")
        lines.append("")
    misses = [c for c in comparison if not c["at_least_as_accurate"]]
    lines.append(
        "dpjax's best method is at least as accurate as diffprivlib in "
        f"{len(comparison) - len(misses)}/{len(comparison)} (data set, ε) cells"
        + (
            "; below it in: "
            + ", ".join(
                f"{c['dataset']} ε = {c['epsilon']:g} ({c['best_mean']:.3f} vs "
                f"{c['diffprivlib_mean']:.3f}, "
                + ("CIs separate" if c["worse_beyond_ci"] else "within the CIs")
                + ")"
                for c in misses
            )
            if misses
            else "."
        )
    )
    lines.append(
        '("Best" is picked after the fact over five methods on test accuracy — a comparison '
        "of the library, not a private model-selection procedure; the per-method rows are the "
        "like-for-like numbers.)"
    )
    pure_worse = [c for c in comparison if c["pure_worse_beyond_ci"]]
    lines.append(
        f"Like-for-like (pure ε: CMS11 vs diffprivlib): dpjax is below diffprivlib beyond the "
        f"CIs in {len(pure_worse)}/{len(comparison)} cells."
    )
    if plot:
        lines += ["", f"![utility]({plot})"]
    return "\n".join(lines) + "\n"


def records_accountant(records: list[dict]) -> str:
    names = sorted({r["accountant"].upper() for r in records if "accountant" in r})
    return " / ".join(names) + (" (PLD at ε ≤ 1, RDP above)" if len(names) > 1 else "")


def plot(path: pathlib.Path, records: list[dict]) -> str | None:
    """Accuracy vs ε with CI bands, one panel per data set; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    datasets = list(dict.fromkeys(r["dataset"] for r in records))
    fig, axes = plt.subplots(1, len(datasets), figsize=(4.2 * len(datasets), 3.6), squeeze=False)
    for ax, ds in zip(axes[0], datasets, strict=True):
        for i, m in enumerate(METHODS):
            recs = sorted(
                (r for r in records if r["dataset"] == ds and r["method"] == m),
                key=lambda r: r["epsilon"],
            )
            if not recs:
                continue
            x = [r["epsilon"] for r in recs]
            style = "--" if m in ("sklearn", "diffprivlib") else "-"
            ax.plot(x, [r["accuracy_mean"] for r in recs], style, color=f"C{i}", label=LABELS[m])
            ax.fill_between(
                x, [r["ci_low"] for r in recs], [r["ci_high"] for r in recs], color=f"C{i}",
                alpha=0.2,
            )  # fmt: skip
        ax.set_xscale("log")
        ax.set_xlabel("ε")
        ax.set_title(ds)
        ax.axhline(recs[0]["majority"], color="grey", lw=0.8, ls=":")
    axes[0][0].set_ylabel("test accuracy")
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def run(out_dir: pathlib.Path, *, full: bool = False, seed: int = 0, size: str | None = None):
    """Run the utility comparison, write ``utility.json`` and ``utility.png``; report section."""
    from experiments.report import write_json

    size = "full" if full else (size or "quick")
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    records = evaluate(size, seed)
    comparison = best_vs_diffprivlib(records)
    plot_name = plot(out_dir / "utility.png", records)
    write_json(
        out_dir / "utility.json",
        dict(size=size, seed=seed, records=records, best_vs_diffprivlib=comparison),
    )
    report = markdown(records, comparison, plot_name, SIZES[size])
    return dict(
        report_md=report,
        records=records,
        comparison=comparison,
        seconds=time.perf_counter() - start,
    )
