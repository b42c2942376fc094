"""Peak memory of one DP step, dpjax against Opacus, and the largest batch under a budget.

Each (model, batch, method) runs in a fresh process (:func:`step_memory`, ``python -m
benchmarks.memory_worker``): it builds the parameters and the batch (and, for JAX, compiles
the step), reads its resident memory, resets the kernel's high-water mark, runs the step twice
and reads the high-water mark again. **Step memory** = peak RSS − RSS before the step: the
working memory of the step over what is already resident (parameters, batch, program), the
same measure for both libraries. The processes run with ``MALLOC_MMAP_THRESHOLD_=131072`` so
that glibc returns every freed block over 128 KiB to the system at once (the resident set
follows the live buffers of either library instead of what malloc kept) and with
``OMP_WAIT_POLICY=PASSIVE``. For JAX the compiled program's own plan
(``compile().memory_analysis()``: temporaries + outputs, the buffers XLA allocates for one
call) is reported beside it.

Methods: ``nonprivate`` (``jax.grad`` of the mean), ``dpjax`` (ghost clipping, the default
``backend="auto"``), ``dpjax_vmap`` (per-example gradients by ``jax.vmap``), and on the PyTorch
twin ``torch_nonprivate``, ``opacus_ghost`` (fast gradient clipping) and ``opacus_hooks``
(per-sample gradients by hooks, Opacus's default; ``functorch`` and ``ew`` also materialise
every per-sample gradient). Opacus's best mode for memory is the smaller of the two.

The largest batch under a budget comes from the two batches measured: step memory is affine
in the batch (a fixed part + a per-example part), so ``largest = ⌊(budget − fixed) /
per_example⌋``, budget :data:`BUDGET_MB` of step memory.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

__all__ = [
    "BUDGET_MB",
    "MEMORY_ROWS",
    "MEMORY_METHODS",
    "step_memory",
    "largest_batch",
    "run",
    "section",
]

BUDGET_MB = 1024.0
# model -> the two batches whose step memory is measured (the fit's two points)
MEMORY_ROWS = {
    "mlp": (256, 1024),
    "cnn": (256, 1024),
    "llama_block": (8, 32),
    "transformer": (8, 32),
}
JAX_METHODS = ("nonprivate", "dpjax", "dpjax_vmap")
TORCH_METHODS = ("torch_nonprivate", "opacus_ghost", "opacus_hooks")
MEMORY_METHODS = JAX_METHODS + TORCH_METHODS
ENV = {"MALLOC_MMAP_THRESHOLD_": "131072", "OMP_WAIT_POLICY": "PASSIVE"}


def step_memory(model: str, batch: int, method: str, timeout: int = 900) -> dict:
    """One method's step memory, measured in a fresh process (``{"error": ...}`` if it fails)."""
    cmd = [sys.executable, "-m", "benchmarks.memory_worker", model, str(batch), method]
    rec = {"model": model, "batch": batch, "method": method}
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=os.environ | ENV
        )
    except subprocess.TimeoutExpired:
        return rec | {"error": f"timeout after {timeout} s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("MEMORY ")]
    if proc.returncode != 0 or not lines:
        return rec | {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr else "?"}
    return rec | json.loads(lines[-1][len("MEMORY ") :])


def largest_batch(points: list[tuple[int, float]], budget_mb: float = BUDGET_MB) -> int | None:
    """⌊(budget − fixed) / per_example⌋ of the line through two (batch, MB) points.

    None when the fit is not usable (fewer than two batches, or memory not growing with the
    batch); 0 when even the fixed part is over the budget.
    """
    if len(points) < 2:
        return None
    (b1, m1), (b2, m2) = sorted(points)[:1] + sorted(points)[-1:]
    if b2 == b1 or not (m2 > m1) or any(math.isnan(m) for m in (m1, m2)):
        return None
    per_example = (m2 - m1) / (b2 - b1)
    fixed = m1 - per_example * b1
    return max(0, int((budget_mb - fixed) // per_example))


def run(rows: dict[str, tuple[int, ...]] | None = None, opacus: bool = True) -> dict:
    """Every method of every row in fresh processes; the records and each method's fit."""
    rows = MEMORY_ROWS if rows is None else rows
    methods = MEMORY_METHODS if opacus else JAX_METHODS
    records = []
    for model, batches in rows.items():
        for batch in batches:
            for method in methods:
                print(f"[memory] {model} batch {batch}: {method}", flush=True)
                records.append(step_memory(model, batch, method))
                print("RECORD " + json.dumps(records[-1]), flush=True)
    return {"budget_mb": BUDGET_MB, "env": ENV, "records": records, "fits": _fits(records)}


def _fits(records: list[dict]) -> list[dict]:
    fits = []
    keys = sorted({(r["model"], r["method"]) for r in records}, key=str)
    for model, method in keys:
        mine = [r for r in records if (r["model"], r["method"]) == (model, method)]
        rss = [(r["batch"], r["step_mb"]) for r in mine if "step_mb" in r]
        plan = [(r["batch"], r["xla_plan_mb"]) for r in mine if "xla_plan_mb" in r]
        fits.append(
            {
                "model": model,
                "method": method,
                "largest_batch_rss": largest_batch(rss),
                "largest_batch_xla": largest_batch(plan) if plan else None,
            }
        )
    return fits


def _fmt(x: float | None, spec: str = ".0f") -> str:
    return "—" if x is None else format(x, spec)


def _best_opacus(by_method: dict[str, dict]) -> tuple[str, dict]:
    ok = {m: r for m, r in by_method.items() if m.startswith("opacus_") and "step_mb" in r}
    if not ok:
        return "—", {}
    best = min(ok, key=lambda m: ok[m]["step_mb"])
    return best.removeprefix("opacus_"), ok[best]


def section(result: dict, machine: str = "") -> list[str]:
    """Markdown: step memory per (model, batch, method) and the largest batch under the budget."""
    budget = result["budget_mb"]
    lines = [
        "",
        f"## Peak memory of one step{f' ({machine})' if machine else ''}",
        "",
        "Step memory (MB) = peak RSS − RSS before the step, each in a fresh process "
        "(`MALLOC_MMAP_THRESHOLD_=131072`); in brackets, XLA's plan for one call "
        "(temporaries + outputs, `compile().memory_analysis()`). Opacus: its smaller mode "
        "(ghost or hooks).",
        "",
        "| model | batch | non-private (XLA) | dpjax ghost (XLA) | dpjax vmap (XLA) "
        "| torch non-private | Opacus best (mode) | Opacus ghost | Opacus hooks |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    records = result["records"]
    for model, batch in dict.fromkeys((r["model"], r["batch"]) for r in records):
        by = {r["method"]: r for r in records if (r["model"], r["batch"]) == (model, batch)}

        def cell(method: str, xla: bool = False, by=by) -> str:
            rec = by.get(method, {})
            if "step_mb" not in rec:
                return "failed" if "error" in rec else "—"
            plan = f" ({_fmt(rec.get('xla_plan_mb'))})" if xla else ""
            return _fmt(rec["step_mb"]) + plan

        mode, best = _best_opacus(by)
        lines.append(
            f"| {model} | {batch} | {cell('nonprivate', True)} | {cell('dpjax', True)} | "
            f"{cell('dpjax_vmap', True)} | {cell('torch_nonprivate')} | "
            f"{_fmt(best.get('step_mb'))} ({mode}) | {cell('opacus_ghost')} | "
            f"{cell('opacus_hooks')} |"
        )
    lines += [
        "",
        f"Largest batch whose step memory fits {budget:.0f} MB (line through the two batches; "
        "XLA plan in brackets):",
        "",
        "| model | non-private | dpjax ghost | dpjax vmap | torch non-private | Opacus ghost "
        "| Opacus hooks |",
        "|---|---|---|---|---|---|---|",
    ]
    fits = {(f["model"], f["method"]): f for f in result["fits"]}
    for model in dict.fromkeys(r["model"] for r in records):
        cells = []
        for method in MEMORY_METHODS:
            fit = fits.get((model, method), {})
            cell = _fmt(fit.get("largest_batch_rss"), "d")
            if method in JAX_METHODS:
                cell += f" ({_fmt(fit.get('largest_batch_xla'), 'd')})"
            cells.append(cell)
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.memory [OUT [MODEL ...]]``: the memory section alone
    (OUT/memory.{json,md}; default OUT ``results``, every model of :data:`MEMORY_ROWS`)."""
    import pathlib
    import platform

    argv = sys.argv[1:] if argv is None else argv
    out = pathlib.Path(argv[0] if argv else "results")
    out.mkdir(parents=True, exist_ok=True)
    models = argv[1:] or list(MEMORY_ROWS)
    result = run({m: MEMORY_ROWS[m] for m in models})
    machine = f"{platform.machine()} CPU, {os.cpu_count()} cores"
    result["machine"] = machine
    (out / "memory.json").write_text(json.dumps(result, indent=2))
    md = ["# dpjax step memory"] + section(result, machine)
    (out / "memory.md").write_text("\n".join(md) + "\n")
    print("\n".join(md), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
