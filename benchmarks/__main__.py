"""Benchmarks of dpjax: the DP-SGD step against the non-private step and Opacus.

Every (model, batch) row runs in a fresh process that compiles each method (compile time:
`lower().compile()` seconds), draws bare noise vectors of the model's size (dpjax's sound
sampler and `jax.random.normal`), builds Opacus's fastest mode on the same PyTorch model when
torch and opacus are installed (the `bench-torch` extra), then times everything round-robin.
Each ratio is taken within one round and summarised by its median over rounds, in wall-clock
and in CPU time. Writes bench.json and bench.md under --out, with these targets:

* noise inside the jitted DP step <= 1.15 x a bare draw of the same size;
* DP step <= 1.15 x (non-private step + bare draw);
* dpjax's DP step <= 0.5 x Opacus's best mode;
* compile time of the DP step <= 3 x the non-private step's.

The full run (no --quick) adds the vmap paths and a peak-memory process per method, and the
step-memory section (benchmarks.memory): the DP step's peak memory under dpjax ghost clipping,
dpjax vmap, Opacus (ghost and hooks) and the non-private steps for the MLP, CNN, Llama-block
and transformer rows, each in a fresh process, and the largest batch under a 1 GiB budget.
Both end with the throughput of the exact integer samplers and of the sound Gaussian sampler
against `jax.random.normal` (target <= 1.3 x).

Four other sections run instead of the table: --startup (time to first result: `import dpjax`,
each console script's --help, the README's make_private block; startup.{json,md}),
--construction (CPU time of building make_private; construction.{json,md}), --accounting
(CPU time of the accountant, 1000 recorded steps -> epsilon, and of make_private at a target
epsilon; accounting.{json,md}), and --mechanisms (scalar Gaussian and Laplace releases per
second, jit(vmap) over distinct keys and batched; mechanisms.{json,md}).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pathlib
import platform
import subprocess
import sys
import time

# The models, steps and samplers import JAX and flax: they are imported by `main` after the
# command line is parsed, so `--help` and argument errors are instant.

TARGETS = {  # ratio key -> (bound, what it compares)
    "noise_over_draw": (1.15, "noise in the jitted step / bare draw"),
    "dp_over_floor": (1.15, "DP step / (non-private step + bare draw)"),
    "dpjax_over_opacus": (0.5, "dpjax DP step / Opacus best mode"),
    "compile_dpjax_over_nonprivate": (3.0, "compile, DP step / non-private step"),
}


def _worker(args: list[str], timeout: int = 1800) -> list[dict]:
    cmd = [sys.executable, "-m", "benchmarks.worker", *args]
    # torch's OpenMP threads busy-wait by default: on a shared, loaded CPU that made its
    # steps ~20x slower (MLP 256: 528 ms vs 25 ms passive), which would flatter dpjax.
    env = {"OMP_WAIT_POLICY": "PASSIVE"} | dict(os.environ)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        print(f"[bench] timeout: {' '.join(args)}", flush=True)
        return []
    if proc.returncode != 0:
        print(f"[bench] failed: {' '.join(args)}\n{proc.stderr[-2000:]}", flush=True)
    return [json.loads(line[6:]) for line in proc.stdout.splitlines() if line.startswith("BENCH ")]


def _measure(
    model: str, batch: int, methods: tuple[str, ...], repeats: int, rss: bool, opacus: bool
) -> list[dict]:
    print(f"[bench] {model} batch {batch}: {', '.join(methods)}", flush=True)
    args = ["time", model, str(batch), *methods, "--repeats", str(repeats)]
    records = _worker(args + (["--opacus"] if opacus else []))
    if rss:
        for rec in records:
            if rec["method"] in ("nonprivate", "dpjax"):
                mem = _worker(["rss", model, str(batch), rec["method"], "--repeats", "2"])
                if mem:
                    rec["peak_memory_mb"] = mem[0]["peak_rss_mb"]
                    rec["step_memory_mb"] = mem[0]["step_rss_mb"]
    return records


def _fmt(x: float | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def _by_method(records: list[dict], model: str, batch: int) -> dict[str, dict]:
    return {r["method"]: r for r in records if r["model"] == model and r["batch"] == batch}


def _ms(by_method: dict[str, dict], name: str) -> str:
    return _fmt(by_method.get(name, {}).get("median_ms"), ".1f")


def _summary_table(records: list[dict], opacus: bool) -> list[str]:
    """One row per (model, batch): times (ms, wall median) and the key ratios."""
    head = (
        "| model | batch | non-private | dpjax DP step (×) | no noise | no barrier | "
        "bare draw (jax.random.normal) | noise / draw | DP / (non-private + draw) |"
    )
    rule = "|---|---|---|---|---|---|---|---|---|"
    if opacus:
        head += " torch non-private | Opacus best (mode) | dpjax / Opacus |"
        rule += "---|---|---|"
    lines = [head, rule]
    for s in (r for r in records if r["method"] == "summary"):
        ratios = s["ratios"]
        ms = functools.partial(_ms, _by_method(records, s["model"], s["batch"]))

        row = (
            f"| {s['model']} | {s['batch']} | {ms('nonprivate')} | {ms('dpjax')} "
            f"({_fmt(ratios.get('dp_over_nonprivate'), '.2f')}×) | {ms('dpjax_clip_only')} | "
            f"{ms('dpjax_nobarrier')} | {ms('draw')} ({ms('draw_jax')}) | "
            f"{_fmt(ratios.get('noise_over_draw'), '.2f')} | "
            f"{_fmt(ratios.get('dp_over_floor'), '.2f')} |"
        )
        if opacus:
            best = s.get("opacus_modes_ms", {}).get("best", "—").removeprefix("opacus_")
            row += (
                f" {ms('torch_nonprivate')} | {ms('opacus')} ({best}) | "
                f"{_fmt(ratios.get('dpjax_over_opacus'), '.2f')} |"
            )
        lines.append(row)
    return lines


def _method_table(records: list[dict]) -> list[str]:
    lines = [
        "| model | batch | method | median ms | CPU ms | peak RSS MB | compile s (CPU s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in records:
        if r["method"] == "summary":
            continue
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['method']} | {r['median_ms']:.1f} | "
            f"{r['cpu_median_ms']:.1f} | {_fmt(r.get('peak_memory_mb'), '.0f')} | "
            f"{_fmt(r.get('compile_s'), '.2f')} ({_fmt(r.get('compile_cpu_s'), '.2f')}) |"
        )
    return lines


# targets of one model only, by device platform ("cpu", "gpu", ...)
MODEL_TARGETS = {
    "transformer": {
        "dp_over_nonprivate": (
            {"cpu": 1.3, "gpu": 1.5},
            "DP step / non-private step (sequence 128)",
        ),
    },
}


def _row_targets(summary: dict) -> list[tuple[str, float, str]]:
    """(ratio key, bound, what) of every target that applies to one summary's row."""
    rows = [(key, bound, what) for key, (bound, what) in TARGETS.items()]
    platform = summary.get("device", {}).get("platform", "cpu")
    for key, (bounds, what) in MODEL_TARGETS.get(summary["model"], {}).items():
        if platform in bounds:
            rows.append((key, bounds[platform], f"{what}, {platform}"))
    return rows


def targets(records: list[dict]) -> list[dict]:
    """Every target of :data:`TARGETS` (and :data:`MODEL_TARGETS`) per (model, batch).

    Each row: wall and CPU-time ratio, the bound, the status and the device it was measured on.
    """
    out = []
    for s in (r for r in records if r["method"] == "summary"):
        device = s.get("device", {})
        for key, bound, what in _row_targets(s):
            wall = s["ratios"].get(key)
            if wall is None:
                continue
            out.append(
                {
                    "model": s["model"],
                    "batch": s["batch"],
                    "target": key,
                    "what": what,
                    "bound": bound,
                    "ratio": wall,
                    "cpu_ratio": s["cpu_ratios"].get(key),
                    "status": "holds" if wall <= bound else "MISSED",
                    "device": device.get("device_kind", device.get("platform", "unknown")),
                }
            )
    return out


def _target_lines(rows: list[dict]) -> list[str]:
    lines = [
        "",
        "## Targets (ratio: median over rounds of wall-clock, CPU-time)",
        "",
    ]
    for t in rows:
        lines.append(
            f"- {t['model']} {t['batch']}, {t['what']}: {t['ratio']:.2f} "
            f"(CPU time {_fmt(t['cpu_ratio'], '.2f')}) ≤ {t['bound']}: {t['status']} "
            f"({t['device']})"
        )
    return lines


def _opacus_available() -> str | None:
    """None when torch and opacus import, else why not."""
    try:
        import opacus  # noqa: F401
        import torch  # noqa: F401
    except ImportError as err:
        return f"{err.name} not installed (pip install -e '.[bench-torch]')"
    return None


def _memory(only: set[str] | None, opacus: bool) -> dict:
    """The step-memory section (:mod:`benchmarks.memory`) for the selected models."""
    from benchmarks.memory import MEMORY_ROWS, run

    rows = {m: b for m, b in MEMORY_ROWS.items() if only is None or m in only}
    return run(rows, opacus=opacus)


def memory_section(result: dict, machine: str) -> list[str]:
    from benchmarks.memory import section

    return section(result, machine)


def _machine(device: dict) -> str:
    kind = device.get("device_kind", device.get("platform", "cpu"))
    return f"{kind}, {platform.machine()}, {os.cpu_count()} cores"


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1; got {value}")
    return value


PROG = "python -m benchmarks"  # the console script `dpjax-bench` passes its own name


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The command line; ``--help`` keeps the module docstring's paragraphs and lists."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="the `make bench` scale: 5 rounds, the quick (model, batch) rows, no vmap paths "
        "and no peak-memory processes",
    )
    parser.add_argument(
        "--out",
        type=pathlib.Path,
        default=pathlib.Path("results"),
        help="output folder for bench.json and bench.md (created; default: results)",
    )
    parser.add_argument(
        "--only",
        default=None,
        metavar="MODELS",
        help="comma-separated models to run, e.g. mlp,cnn (mlp, cnn, cnn_tanh, cnn_im2col, "
        "logreg, lora_mlp, transformer, llama_block; default: all)",
    )
    parser.add_argument(
        "--repeats",
        type=_positive_int,
        default=None,
        help="timing rounds per (model, batch) (default: 5 with --quick, else 11); with "
        "--startup, fresh processes per row (default 5)",
    )
    parser.add_argument(
        "--no-opacus",
        action="store_true",
        help="skip the Opacus columns even if torch and opacus are installed",
    )
    parser.add_argument(
        "--no-samplers",
        action="store_true",
        help="skip the closing throughput sections (exact integer samplers, the bare sound "
        "sampler against jax.random.normal): the model rows only",
    )
    parser.add_argument(
        "--no-memory",
        action="store_true",
        help="skip the full run's step-memory section (fresh processes per model, batch and "
        "method)",
    )
    parser.add_argument(
        "--construction",
        action="store_true",
        help="only time make_private's construction (calibration, sampler cap) in fresh "
        "processes: construction.json and construction.md",
    )
    parser.add_argument(
        "--startup",
        action="store_true",
        help="only time the start: `import dpjax`, each console script's --help and the "
        "README's make_private block, in fresh processes: startup.json and startup.md",
    )
    parser.add_argument(
        "--mechanisms",
        action="store_true",
        help="only time scalar releases per second of the Gaussian and Laplace mechanisms "
        "(jit(vmap) over distinct keys, with and without the key guard, and one batched call; "
        "100 000 rows, median of --repeats rounds, default 7): mechanisms.json and "
        "mechanisms.md",
    )
    parser.add_argument(
        "--accounting",
        action="store_true",
        help="only time the accountant (1000 recorded DP-SGD steps -> epsilon) and make_private "
        "at a target epsilon, each in fresh processes (min of --repeats, default 3): "
        "accounting.json and accounting.md",
    )
    return parser


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    args = build_parser(prog).parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.construction:
        from benchmarks.construction import run

        return run(args.out)
    if args.startup:
        from benchmarks.startup import run

        return run(args.out, repeats=args.repeats or 5)
    if args.mechanisms:
        from benchmarks import mechanisms

        mechanisms.run(args.out, args.repeats or 7)
        return 0
    if args.accounting:
        from benchmarks import accounting

        accounting.run(args.out, args.repeats or 3)
        return 0
    from benchmarks import integer_noise, sampler
    from benchmarks.models import CONFIGS, load_plugins
    from benchmarks.steps import available_methods

    repeats = args.repeats or (5 if args.quick else 11)
    plugins = load_plugins()
    only = None if args.only is None else set(args.only.split(","))
    methods = available_methods(slow=not args.quick)
    no_opacus = "--no-opacus given" if args.no_opacus else _opacus_available()
    start = time.perf_counter()

    records: list[dict] = []
    for model, batch, in_quick in CONFIGS:
        if (only is None or model in only) and (in_quick or not args.quick):
            rss = not args.quick
            records += _measure(model, batch, methods, repeats, rss, opacus=no_opacus is None)
    summaries = [r for r in records if r["method"] == "summary"]
    device = summaries[0]["device"] if summaries else {}
    meta = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "device": device,
        "quick": args.quick,
        "repeats": repeats,
        "plugins": plugins,
        "opacus": "timed in the same rounds" if no_opacus is None else f"omitted: {no_opacus}",
        "seconds": round(time.perf_counter() - start, 1),
    }
    rows = targets(records)
    over_opacus = {
        f"{s['model']}/{s['batch']}": s["ratios"]["dpjax_over_opacus"]
        for s in summaries
        if "dpjax_over_opacus" in s["ratios"]
    }
    payload = {
        "meta": meta,
        "dpjax_over_opacus": over_opacus,
        "targets": rows,
        "records": records,
    }
    if not args.no_samplers:
        payload["integer_noise"] = integer_noise.run(args.quick)
        payload["sampler"] = sampler.run(args.quick)  # sound sampler / jax.random.normal
        rows.append(payload["sampler"]["target"])
    if not args.quick and not args.no_memory:
        payload["memory"] = _memory(only, opacus=no_opacus is None)
    (args.out / "bench.json").write_text(json.dumps(payload, indent=2))
    md = ["# dpjax benchmarks", "", f"`{json.dumps(meta)}`", ""]
    md += _summary_table(records, opacus=no_opacus is None)
    if no_opacus is not None:
        md += ["", f"Opacus columns omitted: {no_opacus}."]
    md += _target_lines(rows)
    md += ["", "## Every method", ""] + _method_table(records)
    if not args.no_samplers:
        md += integer_noise.section(payload["integer_noise"])
        md += sampler.section(payload["sampler"])
    if "memory" in payload:
        md += memory_section(payload["memory"], _machine(device))
    (args.out / "bench.md").write_text("\n".join(md) + "\n")
    print("\n".join(md), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
