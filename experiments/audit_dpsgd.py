"""Audit of whole DP-SGD runs of ``dpjax.make_private``: white box, black box, one run.

The run: logistic regression on 62 points (features 1–3; feature 0 is reserved for the input
canary), one gradient-canary row (index 0, the index padding slots hold) and one input-canary
row: n = 64, expected batch 32 (q = 0.5), T = 10 steps, C = 1, SGD. σ is one of
:data:`SIGMAS`, calibrated with the PLD accountant for claimed ε ∈ {2, 4, 8} (δ = 1e-5); the
claimed ε of each row is what ``make_private`` reports for that σ at run time.

* **white box** (Nasr et al. 2023): the adversary sees every update; D has the gradient canary
  zeroed out, D′ has it; score = the likelihood ratio summed over steps
  (:func:`dpjax.auditing.dp_sgd_audit.gradient_canary_llr`); R runs per side through
  ``make_private``'s own ``step`` vmapped over keys.
* **black box**: only θ_T; D′ has the input canary x = 10·e₀, y = +1 instead; score = minus its
  loss at θ_T. Same PrivateTraining, same D runs.
* **one run** (Steinke, Nasr, Jagielski 2023): :func:`dpjax.auditing.audit_run` with 1000
  gradient canaries and 1000 input canaries (own input features), each in with probability ½.

Mutants (built from public pieces, never in the library): σ halved; noise on the mean
(noise of the mean's scale σC/(q·n) added to the sum); the sampler's mask forgotten; q accounted at
half the real rate (σ calibrated for q/2, run at q).
"""

from __future__ import annotations

import pathlib
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import dpjax
from dpjax import auditing
from dpjax.accounting.dp_sgd import dp_sgd_epsilon
from dpjax.auditing import dp_sgd_audit as dsa
from dpjax.dp_sgd.private import SLACK_FRACTION
from dpjax.dp_sgd.transforms import normalize_by

DELTA = 1e-5
N_ROWS, BATCH, STEPS, CLIP, LR, FEATURES = 64, 32, 10, 1.0, 0.5, 4
INPUT_CANARY_SCALE = 10.0
#: σ for claimed ε ∈ {2, 4, 8} at q = 0.5, T = 10, δ·(1 − 10⁻³): calibrate_noise_multiplier
#: (PLD, rtol 1e-3), computed once offline to keep the quick scale fast; the claimed ε of
#: every row is recomputed by make_private's accountant at run time.
SIGMAS = {2.0: 3.4361783150097938, 4.0: 1.9860243323878843, 8.0: 1.2008737374289853}
#: σ calibrated the same way at q = 0.25 (the "q accounted at half the real rate" mutant)
SIGMAS_HALF_Q = {2.0: 2.0145371166245645, 4.0: 1.2743595125768579, 8.0: 0.8446959716243747}
MUTANTS = ("sigma_halved", "noise_on_mean", "mask_forgotten", "q_half_accounted")
ONE_RUN_CANARIES = 1000
SCALES = {  # runs per side (R), which claims get mutants
    "quick": dict(runs=5_000, mutant_claims=(2.0,), one_run_claims=(8.0,)),
    "full": dict(runs=100_000, mutant_claims=(2.0, 4.0, 8.0), one_run_claims=(2.0, 4.0, 8.0)),
}


def base_data(seed: int = 0, rows: int = N_ROWS - 2, features: int = FEATURES) -> dict:
    """62 points, labels from a linear rule; feature 0 (and beyond 3) left at 0."""
    x = jax.random.normal(jax.random.key(seed), (rows, 3))
    y = jnp.where(x @ jnp.array([1.0, -1.0, 0.5]) >= 0, 1.0, -1.0)
    x = jnp.zeros((rows, features)).at[:, 1:4].set(x)
    return {"x": x, "y": y}


def logistic_loss(w: jax.Array, ex: dict) -> jax.Array:
    return jnp.logaddexp(0.0, -ex["y"] * (ex["x"] @ w))


def input_canary(features: int = FEATURES, coordinate: int = 0) -> dict:
    x = jnp.zeros((1, features)).at[0, coordinate].set(INPUT_CANARY_SCALE)
    return {"x": x, "y": jnp.ones(1)}


def neighbours() -> dict[str, tuple[Any, Any]]:
    """(loss, params, data) layouts: "out" (both canaries out), "white" and "black" (one in)."""
    data = base_data()
    out = {}
    for name, grad_in, input_in in [("out", 0, 0), ("white", 1, 0), ("black", 0, 1)]:
        out[name] = dsa.add_gradient_canaries(
            logistic_loss, jnp.zeros(FEATURES), data, [bool(grad_in)], l2_clip_norm=CLIP,
            input_examples=input_canary(), input_included=[bool(input_in)],
        )  # fmt: skip
    return out


def _private(loss, sigma: float, key: jax.Array):
    return dpjax.make_private(
        loss, optimizer=dsa.canary_optimizer(optax.sgd(LR)), l2_clip_norm=CLIP,
        dataset_size=N_ROWS, batch_size=BATCH, steps=STEPS, noise_multiplier=sigma,
        delta=DELTA, key=key, clipping="vmap",
    )  # fmt: skip


def _black_box_score(final_params: dict) -> np.ndarray:
    """Minus the input canary's loss at θ_T (large = trained on it)."""
    ex = jax.tree.map(lambda a: a[0], input_canary())
    loss = jax.vmap(logistic_loss, in_axes=(0, None))(jnp.asarray(final_params["model"]), ex)
    return -np.asarray(loss, np.float64)


# ---------------------------------------------------------------------------- the mutants


def _pieces_runner(loss, params, *, sampler, sigma, use_mask, noise_on_mean_scale):
    """A DP-SGD run wired from public pieces (sampler, clipped_grad, noise, normalize_by)."""
    grad_fn = dpjax.clipped_grad(loss, l2_clip_norm=CLIP, backend="vmap")
    normalizer = sampler.expected_batch_size
    # the bug: the noise of the MEAN (σC/(q·n), its sensitivity C/(q·n)) added to the SUM
    stddev = sigma * CLIP / normalizer if noise_on_mean_scale else sigma * CLIP
    noise = dpjax.add_gaussian_noise(stddev, key=jax.random.key(0))
    tx = optax.chain(noise, normalize_by(normalizer), dsa.canary_optimizer(optax.sgd(LR)))
    opt0 = tx.init(params)
    scale = sampler.expected_batch_size / CLIP

    def one_run(key, data):
        k_noise, k_sample = jax.random.split(key)
        opt = dsa.with_noise_key(opt0, jax.random.key_data(k_noise))

        def body(carry, k):
            p, s = carry
            batch = sampler.sample(k)
            ex = jax.tree.map(lambda x: jnp.take(x, batch.indices, axis=0), data)
            g, _ = grad_fn(p, ex, mask=batch.mask if use_mask else None)
            u, s = tx.update(g, s, p)
            p_next = optax.apply_updates(p, u)
            return (p_next, s), -(p_next["canary"] - p["canary"]) * scale

        _, xs = jax.lax.scan(body, (params, opt), jax.random.split(k_sample, STEPS))
        return xs

    run = jax.jit(jax.vmap(one_run, in_axes=(0, None)))
    return lambda keys, data: np.asarray(run(keys, data), np.float64)


def _observations(variant: str, claim: float, layouts: dict, keys: dict, claims: dict) -> tuple:
    """(claimed ε, σ/q the auditor assumes, {layout: CanaryRun-like}) for one variant."""
    loss, params, _ = layouts["out"]
    sigma = SIGMAS[claim]
    private = _private(loss, sigma / 2.0 if variant == "sigma_halved" else
                       SIGMAS_HALF_Q[claim] if variant == "q_half_accounted" else sigma,
                       keys["object"])  # fmt: skip
    q = private.sampling_rate
    if variant == "correct":
        claims[claim] = private.epsilon(STEPS)
    claimed = claims[claim]  # the mutants claim what the correct σ is accounted for
    assumed_sigma, assumed_q = sigma, q
    if variant == "q_half_accounted":
        assumed_sigma, assumed_q = SIGMAS_HALF_Q[claim], q / 2.0
        claimed = dp_sgd_epsilon(noise_multiplier=assumed_sigma, sampling_rate=assumed_q,
                                 steps=STEPS, delta=DELTA * (1.0 - SLACK_FRACTION))  # fmt: skip
    if variant in ("noise_on_mean", "mask_forgotten"):
        runner = _pieces_runner(loss, params, sampler=private.sampler, sigma=sigma,
                                use_mask=variant != "mask_forgotten",
                                noise_on_mean_scale=variant == "noise_on_mean")  # fmt: skip
        obs = {side: dsa.CanaryRun(runner(keys[side], layouts[side][2]), None)
               for side in ("out", "white")}  # fmt: skip
        return claimed, assumed_sigma, assumed_q, obs
    sides = ("out", "white", "black") if variant == "correct" else ("out", "white")
    runs = dsa.canary_updates_many(private, params, [layouts[side][2] for side in sides],
                                   [keys[side] for side in sides])  # fmt: skip
    return claimed, assumed_sigma, assumed_q, dict(zip(sides, runs, strict=True))


# ---------------------------------------------------------------------------- the records


def _record(threat, variant, claim, claimed, bound, runs, seconds) -> dict:
    ci_low, ci_high = _rates_ci(bound)
    return dict(
        threat_model=threat, variant=variant, claimed_epsilon=claim,
        accounted_epsilon=round(float(claimed), 4), epsilon_lb=float(bound.epsilon),
        ci_low=ci_low, ci_high=ci_high, runs=runs, estimator=bound.method,
        confidence=bound.confidence, ratio=float(bound.epsilon) / float(claimed),
        conditional_on=bound.conditional_on, exceeds_claim=bool(bound.epsilon > claimed),
        seconds=round(seconds, 2),
    )  # fmt: skip


def _rates_ci(bound) -> tuple[float, float | None]:
    """(ε_LB, ε at the LOWER Clopper–Pearson bounds of both error rates): a two-sided interval
    for the ε the test reaches (None above for the one-run bound)."""
    if bound.fpr is None or bound.n_eval is None:
        return float(bound.epsilon), None
    n = bound.n_eval
    alpha = (1.0 - bound.confidence) / 2.0
    fpr_lo = float(auditing.clopper_pearson_lower(round(bound.fpr * n), n, alpha))
    fnr_lo = float(auditing.clopper_pearson_lower(round(bound.fnr * n), n, alpha))
    fpr_lo, fnr_lo = max(fpr_lo, 1e-300), max(fnr_lo, 1e-300)
    if bound.method == "gdp":
        mu = float(auditing.gdp_mu_from_rates(fpr_lo, fnr_lo))
        if not np.isfinite(mu):
            return float(bound.epsilon), float("inf")
        return float(bound.epsilon), float(auditing.gdp_epsilon(mu, DELTA))
    return float(bound.epsilon), float(auditing.epsilon_from_rates(fpr_lo, fnr_lo, DELTA))


def _bounds(scores_out, scores_in, confidence):
    direct = auditing.direct_epsilon_lower_bound(scores_out, scores_in, delta=DELTA,
                                                 confidence=confidence)  # fmt: skip
    gdp = auditing.gdp_epsilon_lower_bound(
        scores_out, scores_in, delta=DELTA, confidence=confidence, assume_gaussian_tradeoff=True
    )
    return direct, gdp  # fmt: skip


def repeated_records(key: jax.Array, *, scale: str, confidence: float) -> list[dict]:
    """White-box rows (correct + mutants) and black-box rows (correct) for every claim."""
    cfg, layouts, records, claims = SCALES[scale], neighbours(), [], {}
    for i, claim in enumerate(SIGMAS):
        variants = ("correct",) + (MUTANTS if claim in cfg["mutant_claims"] else ())
        for j, variant in enumerate(variants):
            start = time.perf_counter()
            k = jax.random.fold_in(key, 100 * i + j)
            keys = {name: jax.random.split(jax.random.fold_in(k, s), cfg["runs"])
                    for s, name in enumerate(("out", "white", "black"))}  # fmt: skip
            keys["object"] = jax.random.fold_in(k, 99)
            claimed, sigma, q, obs = _observations(variant, claim, layouts, keys, claims)

            def llr(run, sigma=sigma, q=q):
                return dsa.gradient_canary_llr(
                    run.observations[..., 0], noise_multiplier=sigma, sampling_rate=q
                )

            rows = [("white_box", b) for b in _bounds(llr(obs["out"]), llr(obs["white"]),
                                                       confidence)]  # fmt: skip
            if "black" in obs:
                rows += [("black_box", b) for b in _bounds(
                    _black_box_score(obs["out"].final_params),
                    _black_box_score(obs["black"].final_params), confidence)]  # fmt: skip
            seconds = time.perf_counter() - start
            records += [_record(t, variant, claim, claimed, b, cfg["runs"], seconds)
                        for t, b in rows]  # fmt: skip
    return records


def one_run_records(key: jax.Array, *, confidence: float, claims=tuple(SIGMAS)) -> list[dict]:
    """audit_run on one make_private run per claim, m = 1000 gradient + 1000 input canaries."""
    m = ONE_RUN_CANARIES
    features = FEATURES + m
    data = base_data(rows=62, features=features)
    inputs = {"x": INPUT_CANARY_SCALE * jnp.eye(m, features, k=FEATURES), "y": jnp.ones(m)}
    n_rows = 62 + 2 * m
    records = []
    for i, claim in enumerate(claims):
        start = time.perf_counter()
        result = auditing.audit_run(
            logistic_loss, jnp.zeros(features), data, key=jax.random.fold_in(key, i),
            optimizer=optax.sgd(LR), l2_clip_norm=CLIP, batch_size=n_rows // 2, delta=DELTA,
            num_canaries=m, input_canaries=inputs,
            input_score=lambda w, ex: -logistic_loss(w, ex), confidence=confidence,
            steps=STEPS, noise_multiplier=SIGMAS[claim], clipping="vmap",
        )  # fmt: skip
        seconds = time.perf_counter() - start
        for threat, bound in (
            ("one_run", result.white_box),
            ("one_run_black_box", result.black_box),
        ):
            records.append(_record(threat, "correct", claim, result.claimed_epsilon, bound,
                                   1, seconds))  # fmt: skip
    return records


# ---------------------------------------------------------------------------- the report


def markdown(records: list[dict], *, runs: int, seconds: float) -> list[str]:
    lines = [
        "### Auditing whole DP-SGD runs of make_private (Nasr et al. 2023; Steinke et al. 2023)",
        "",
        f"Logistic regression, n = {N_ROWS}, q = {BATCH / N_ROWS:g}, T = {STEPS}, C = {CLIP:g}, "
        f"δ = {DELTA:g}; {runs} runs per side (white/black box) through make_private's step, "
        "vmapped over keys; one run with 1000 gradient + 1000 input canaries (one-run rows). "
        "ε_LB: 'direct' = Clopper–Pearson at a threshold chosen on a held-out half "
        "(assumption-free); 'gdp' = CONDITIONAL on a Gaussian trade-off (a heuristic for "
        "Poisson-subsampled DP-SGD, not a proof); 'one_run' = Steinke et al. Thm 3.1. "
        "CI = [ε_LB, ε at the lower Clopper–Pearson bounds of both rates]. "
        "Ratio = ε_LB / accounted ε. A mutant is caught "
        f"when ε_LB > its claim. Total {seconds:.0f} s.",
        "",
        "| threat model | variant | claimed ε (accounted) | estimator | ε_LB | CI high | ratio "
        "| > claim |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        point = "" if r["ci_high"] is None else f"{r['ci_high']:.2f}"
        lines.append(
            f"| {r['threat_model']} | {r['variant']} | {r['claimed_epsilon']:g} "
            f"({r['accounted_epsilon']:.3f}) | {r['estimator']} | {r['epsilon_lb']:.2f} | "
            f"{point} | {r['ratio']:.2f} | {'yes' if r['exceeds_claim'] else 'no'} |"
        )
    return lines + ["", *_summary_lines(records), ""]


def _summary_lines(records: list[dict]) -> list[str]:
    """Best white-box ratio per claim; which mutants each estimator catches."""
    out = []
    for claim in SIGMAS:
        mine = [r for r in records if r["threat_model"] == "white_box"
                and r["variant"] == "correct" and r["claimed_epsilon"] == claim]  # fmt: skip
        if mine:
            best = ", ".join(f"{r['estimator']} {r['ratio']:.2f}" for r in mine)
            out.append(f"- claimed ε = {claim:g}: white-box ε_LB / ε = {best}.")
    for est in ("direct", "gdp"):
        muts = [r for r in records if r["estimator"] == est and r["variant"] != "correct"]
        caught = sorted({f"{r['variant']}@{r['claimed_epsilon']:g}" for r in muts
                         if r["exceeds_claim"]})  # fmt: skip
        out.append(f"- mutants caught by '{est}': {len(caught)}/{len(muts)} "
                   f"({', '.join(caught) or '—'}).")  # fmt: skip
    out.append(
        "- Black box vs white box: here the input canary owns a feature and is clipped to C "
        "(a worst-case input canary) and q = 0.5, T = 10, so θ_T (the sum of the noisy "
        "updates) carries almost all of the white-box evidence: the black-box bound is "
        "close to the white-box one. Nasr et al. see the large gap with natural canaries, "
        "small q and long runs, where only the per-step view exposes the canary's steps."
    )
    return out


def plot(records: list[dict], path: pathlib.Path) -> pathlib.Path | None:
    """ε_LB against the claimed ε (correct runs), with the identity line."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(5.6, 4.4))
    lim = max(SIGMAS) * 1.1
    ax.plot([0, lim], [0, lim], "k--", lw=1, label="ε_LB = claimed ε")
    styles = {("white_box", "gdp"): "o-", ("white_box", "direct"): "s-",
              ("black_box", "gdp"): "o:", ("black_box", "direct"): "s:",
              ("one_run", "one_run"): "^-", ("one_run_black_box", "one_run"): "v:"}  # fmt: skip
    for (threat, est), style in styles.items():
        rows = [r for r in records if r["threat_model"] == threat and r["estimator"] == est
                and r["variant"] == "correct"]  # fmt: skip
        if rows:
            xs = [r["accounted_epsilon"] for r in rows]
            ax.plot(xs, [r["epsilon_lb"] for r in rows], style, label=f"{threat} ({est})")
    ax.set_xlabel("claimed ε (make_private's accountant)")
    ax.set_ylabel("empirical ε_LB")
    ax.set_xlim(0, lim)
    ax.set_ylim(0, lim)
    ax.legend(fontsize=7)
    ax.set_title("DP-SGD audit: ε_LB vs claim (δ = 1e-5)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def run(out_dir: pathlib.Path, *, full: bool, seed: int, confidence: float) -> dict:
    """All DP-SGD audit rows; writes ``audit_dpsgd.json`` and ``audit_dpsgd.png``."""
    from experiments.report import write_json

    start = time.perf_counter()
    scale = "full" if full else "quick"
    root = jax.random.key(seed + 22)
    records = repeated_records(jax.random.fold_in(root, 0), scale=scale, confidence=confidence)
    records += one_run_records(
        jax.random.fold_in(root, 1), confidence=confidence, claims=SCALES[scale]["one_run_claims"]
    )
    seconds = time.perf_counter() - start
    write_json(out_dir / "audit_dpsgd.json", {"scale": scale, "records": records})
    png = plot(records, out_dir / "audit_dpsgd.png")
    md = markdown(records, runs=SCALES[scale]["runs"], seconds=seconds)
    if png is not None:
        md += [f"![ε_LB vs claimed ε]({png.name})", ""]
    return {"records": records, "markdown": md, "seconds": seconds}
