"""``python -m benchmarks --construction``: CPU time of building ``make_private``.

Each case runs in a fresh process (cold calibration and accounting caches, imports done
before the clock starts) and reports the process CPU time of ``make_private(...)`` and of the
first ``epsilon(state)`` at the planned T, for the README's settings (n = 60 000, batch 256,
3 epochs, δ = 1e-5) at ``target_epsilon=3``, at σ = 0.3, and at the non-private σ = 0.05 and
σ = 0 (which must construct, warn and report ε = inf). Target: construction ≤ 1 s of CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import subprocess
import sys

README_PLAN = {"dataset_size": 60_000, "batch_size": 256, "epochs": 3, "delta": 1e-5}
CASES = (
    {"target_epsilon": 3.0},
    {"noise_multiplier": 0.3},
    {"noise_multiplier": 1.0},
    {"noise_multiplier": 0.05},
    {"noise_multiplier": 0.0},
)
TARGET_CPU_SECONDS = 1.0


def _one(case: dict) -> dict:
    """Build make_private for ``case`` in this process; CPU seconds of the build and of ε(T)."""
    import time
    import warnings

    import jax
    import jax.numpy as jnp
    import optax

    import dpjax

    key = jax.random.key(0)
    jax.random.split(key)  # JAX's own start-up is not part of the construction

    def loss_fn(w, example):
        return jnp.sum(w * example)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = time.process_time()
        private = dpjax.make_private(
            loss_fn,
            optimizer=optax.sgd(0.1),
            l2_clip_norm=1.0,
            key=key,
            **README_PLAN,
            **case,
        )
        built = time.process_time()
        eps = private.epsilon(private.steps)
        done = time.process_time()
    return {
        "case": case,
        "construction_cpu_s": round(built - start, 3),
        "first_epsilon_cpu_s": round(done - built, 3),
        "noise_multiplier": private.noise_multiplier,
        "steps": private.steps,
        "max_batch_size": private.max_batch_size,
        "epsilon": eps,
        "warnings": sorted({type(w.message).__name__ for w in caught}),
    }


def run(out: pathlib.Path) -> int:
    """Every case in its own process; writes ``construction.json`` and ``construction.md``."""
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for case in CASES:
        cmd = [sys.executable, "-m", "benchmarks.construction", "--case", json.dumps(case)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("BENCH ")]
        if proc.returncode != 0 or not lines:
            print(f"[construction] failed: {case}\n{proc.stderr[-2000:]}", flush=True)
            continue
        rows.append(json.loads(lines[-1][6:]))
    meta = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "plan": README_PLAN,
    }
    (out / "construction.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    md = [
        "# make_private construction (CPU seconds, fresh process per row)",
        "",
        f"`{json.dumps(meta)}`",
        "",
        "| case | construction | first ε(T) | σ | ε(T) | cap | ≤ 1 s | warnings |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ok = "yes" if r["construction_cpu_s"] <= TARGET_CPU_SECONDS else "NO"
        md.append(
            f"| {json.dumps(r['case'])} | {r['construction_cpu_s']:.2f} | "
            f"{r['first_epsilon_cpu_s']:.2f} | {r['noise_multiplier']:.4g} | "
            f"{r['epsilon']:.4g} | {r['max_batch_size']} | {ok} | {', '.join(r['warnings'])} |"
        )
    (out / "construction.md").write_text("\n".join(md) + "\n")
    print("\n".join(md), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.construction", description=__doc__)
    parser.add_argument("--case", default=None, help="one case as JSON (internal: one process)")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("results"))
    args = parser.parse_args(argv)
    if args.case is None:
        return run(args.out)
    print("BENCH " + json.dumps(_one(json.loads(args.case))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
