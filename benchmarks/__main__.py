"""``python -m benchmarks [--quick] --out results``: issue 9's table for dpjax.

Every (model, batch) runs in one fresh process that compiles all methods, then times each
method pair by pair against the non-private step (alternating order, a warm call before each
timed one), so each ratio comes from the same process at the same time (the absolute numbers on
a shared CPU are noisy; the ratios much less so). Peak memory is
the resident-set high-water mark of a separate process per method, reset after compilation,
so it measures the step, not the compiler. Writes ``bench.json`` (one record per (model,
batch, method)) and ``bench.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import subprocess
import sys
import time

from benchmarks.steps import available_methods

CONFIGS = (("mlp", 256), ("mlp", 1024), ("cnn", 256), ("logreg", 1024))
EXTRA = (("cnn_im2col", 256, ("nonprivate", "dpjax")),)  # the CNN written as patches @ kernel
CNN_FLAGS = ("--xla_cpu_use_onednn=true", "--xla_cpu_use_xnnpack=false")
TARGET_RATIO, TARGET_MEMORY, TARGET_COMPILE = 1.3, 2.0, 2.0


def _worker(
    args: list[str], env_flags: str = "", timeout: int = 1800, extra_env: dict | None = None
) -> list[dict]:
    env = dict(os.environ) | (extra_env or {})
    if env_flags:
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + env_flags).strip()
    cmd = [sys.executable, "-m", "benchmarks.worker", *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"[bench] timeout: {' '.join(args)}", flush=True)
        return []
    if proc.returncode != 0:
        print(f"[bench] failed: {' '.join(args)}\n{proc.stderr[-2000:]}", flush=True)
    return [json.loads(line[6:]) for line in proc.stdout.splitlines() if line.startswith("BENCH ")]


def _ratios(records: list[dict]) -> None:
    base = next((r for r in records if r["method"] == "nonprivate"), None)
    for r in records:
        if base is None:
            continue
        paired = r.get("paired_nonprivate_ms", base["median_ms"])
        r["ratio_to_nonprivate"] = r["median_ms"] / paired
        r["min_ratio_to_nonprivate"] = r["min_ms"] / r.get(
            "paired_nonprivate_min_ms", base["min_ms"]
        )
        r["compile_ratio"] = r["compile_s"] / base["compile_s"]
        for key in ("peak_memory_mb", "step_memory_mb"):
            if key in r and key in base and base[key] > 0:
                r[key.replace("_mb", "_ratio")] = r[key] / base[key]


def _measure(
    model: str, batch: int, methods: tuple[str, ...], repeats: int, rss: bool
) -> list[dict]:
    print(f"[bench] {model} batch {batch}: {', '.join(methods)}", flush=True)
    records = _worker(["time", model, str(batch), *methods, "--repeats", str(repeats)])
    if rss:
        for rec in records:
            mem = _worker(["rss", model, str(batch), rec["method"], "--repeats", "2"])
            if mem:
                rec["peak_memory_mb"] = mem[0]["peak_rss_mb"]
                rec["step_memory_mb"] = mem[0]["step_rss_mb"]
    _ratios(records)
    return records


def _fmt(x: float | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def _table(records: list[dict]) -> list[str]:
    lines = [
        "| model | batch | method | median ms | × non-private | min ms (×) | peak RSS MB (×) | "
        "step RSS MB (×) | XLA buffers MB | compile s (×) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['method']} | {r['median_ms']:.1f} | "
            f"{_fmt(r.get('ratio_to_nonprivate'), '.2f')} | "
            f"{r['min_ms']:.1f} ({_fmt(r.get('min_ratio_to_nonprivate'), '.2f')}) | "
            f"{_fmt(r.get('peak_memory_mb'), '.0f')} ({_fmt(r.get('peak_memory_ratio'), '.2f')}) | "
            f"{_fmt(r.get('step_memory_mb'), '.0f')} ({_fmt(r.get('step_memory_ratio'), '.2f')}) | "
            f"{r['xla_buffer_mb']:.0f} | "
            f"{r['compile_s']:.2f} ({_fmt(r.get('compile_ratio'), '.2f')}) |"
        )
    return lines


def _targets(records: list[dict]) -> list[str]:
    lines = ["", "## Targets (dpjax default path)", ""]
    for r in records:
        if r["method"] != "dpjax" or r["model"] == "cnn_im2col" or "flags" in r:
            continue
        name = f"{r['model']} {r['batch']}"
        ratio = r.get("ratio_to_nonprivate")
        if ratio is not None:
            ok = "holds" if ratio <= TARGET_RATIO else "MISSED"
            lines.append(
                f"- step {name}: {ratio:.2f}× (min-time ratio "
                f"{r['min_ratio_to_nonprivate']:.2f}×) ≤ {TARGET_RATIO}: {ok}"
            )
        compile_ratio = r.get("compile_ratio")
        if compile_ratio is not None:
            ok = "holds" if compile_ratio <= TARGET_COMPILE else "MISSED"
            lines.append(f"- compile {name}: {compile_ratio:.2f}× ≤ {TARGET_COMPILE}: {ok}")
        if r["model"] == "mlp" and r["batch"] == 1024 and "peak_memory_ratio" in r:
            ok = "holds" if r["peak_memory_ratio"] <= TARGET_MEMORY else "MISSED"
            lines.append(
                f"- peak memory {name}: {r['peak_memory_ratio']:.2f}× (step-only "
                f"{r.get('step_memory_ratio', float('nan')):.2f}×) ≤ {TARGET_MEMORY}: {ok}"
            )
    return lines


def _noise_lines(noise: list[dict]) -> list[str]:
    lines = ["", "## Noise generation (Gaussian for every parameter, jitted)", ""]
    lines += [
        "| model | PRNG | partitionable | draw | normals | median ms | compile s |",
        "|---|---|---|---|---|---|---|",
    ]
    for n in noise:
        lines.append(
            f"| {n['model']} | {n['prng']} | {n.get('partitionable')} | {n['draw']} | "
            f"{n['num_normals']} | {n['median_ms']:.2f} | {n['compile_s']:.2f} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="3 repeats, no memory processes")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("results"))
    parser.add_argument("--only", default=None, help="comma-separated model names")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    repeats, rss = (3, False) if args.quick else (10, True)
    only = None if args.only is None else set(args.only.split(","))
    methods = available_methods()
    start = time.perf_counter()

    records: list[dict] = []
    for model, batch in CONFIGS:
        if only is None or model in only:
            records += _measure(model, batch, methods, repeats, rss)
    for model, batch, extra_methods in EXTRA:
        if only is None or model in only:
            records += _measure(model, batch, extra_methods, repeats, rss=False)
    flag_records: list[dict] = []
    if only is None or "cnn" in only:
        for flags in CNN_FLAGS:
            print(f"[bench] cnn 256 with XLA_FLAGS={flags}", flush=True)
            args_ = ["time", "cnn", "256", "nonprivate", "dpjax", "--repeats", str(repeats)]
            recs = _worker(args_, flags)
            for r in recs:
                r["flags"] = flags
            _ratios(recs)
            flag_records += recs
    noise = _worker(["noise", "mlp", "0", "--repeats", str(max(repeats, 5))])
    legacy = {"JAX_THREEFRY_PARTITIONABLE": "0"}  # same threefry, pre-0.5 counter layout
    noise += _worker(["noise", "mlp", "0", "--repeats", str(max(repeats, 5))], extra_env=legacy)

    opacus = _opacus_available()
    meta = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "quick": args.quick,
        "opacus": "installed (not benchmarked yet)" if opacus else "not installed",
        "seconds": round(time.perf_counter() - start, 1),
    }
    payload = {"meta": meta, "records": records, "cnn_flags": flag_records, "noise": noise}
    (args.out / "bench.json").write_text(json.dumps(payload, indent=2))
    md = ["# dpjax benchmarks", "", f"`{json.dumps(meta)}`", ""] + _table(records)
    md += _targets(records)
    if flag_records:
        md += ["", "## CNN with XLA CPU flags", ""]
        md += _flag_table(flag_records)
    md += _noise_lines(noise)
    (args.out / "bench.md").write_text("\n".join(md) + "\n")
    print("\n".join(md), flush=True)
    return 0


def _flag_table(records: list[dict]) -> list[str]:
    lines = ["| model | flags | method | median ms | × non-private |", "|---|---|---|---|---|"]
    for r in records:
        lines.append(
            f"| {r['model']} | `{r['flags']}` | {r['method']} | {r['median_ms']:.1f} | "
            f"{_fmt(r.get('ratio_to_nonprivate'), '.2f')} |"
        )
    return lines


def _opacus_available() -> bool:
    try:
        import opacus  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
