"""One benchmark process: ``python -m benchmarks.worker MODE MODEL BATCH METHODS... --repeats R``.

MODE ``time``: compile every method's step (compile time, XLA buffer plan) and two bare noise
draws of the model's size, optionally build Opacus's fastest mode (``--opacus``), then time
everything round-robin in this process and print one JSON line per method plus a ``summary``
line whose ratios are medians of per-round ratios.
MODE ``rss``: one method only; reset the RSS high-water mark after compiling and warming up,
run the step, print the peak resident memory (Linux ``/proc/self/status`` VmHWM).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections.abc import Callable

import jax

from benchmarks.models import make_model
from benchmarks.steps import bare_draw, make_step, num_params


def _block(x):
    return jax.block_until_ready(x)


def _vm_kb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return float(line.split()[1])
    return float("nan")


def _reset_hwm() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _setup(model_name: str, batch: int):
    model = make_model(model_name)
    params = model.init(jax.random.key(0))
    xs, ys = model.data(jax.random.key(1), batch)
    return model, params, xs, ys


def _compile(model, method, params, key, xs, ys):
    start = time.perf_counter()
    compiled = make_step(model, method).lower(params, key, xs, ys).compile()
    seconds = time.perf_counter() - start
    try:
        mem = compiled.memory_analysis()
        plan_mb = (
            mem.temp_size_in_bytes + mem.argument_size_in_bytes + mem.output_size_in_bytes
        ) / 2**20
    except Exception:  # noqa: BLE001 - not every backend reports it
        plan_mb = float("nan")
    return compiled, seconds, plan_mb


def _timed_call(fn: Callable[[], object]) -> tuple[float, float]:
    """One warm call (absorbs whatever the previous, maybe huge, step left), then one timed:
    (wall ms, this process's CPU ms over all its threads; steadier on a shared machine)."""
    _block(fn())
    start, cpu = time.perf_counter(), time.process_time()
    _block(fn())
    return 1e3 * (time.perf_counter() - start), 1e3 * (time.process_time() - cpu)


def _thunks(model_name: str, batch: int, methods: list[str], keys) -> tuple[dict, dict]:
    """{name: zero-argument call} for every JAX method and the two bare draws, and their
    compile records (lower + compile seconds, XLA buffer plan)."""
    model, params, xs, ys = _setup(model_name, batch)
    size = num_params(params)
    thunks, records = {}, {}
    for method in methods:
        cpu = time.process_time()
        fn, seconds, plan_mb = _compile(model, method, params, keys[0], xs, ys)
        thunks[method] = functools.partial(fn, params, keys[1], xs, ys)
        records[method] = {"compile_s": seconds, "compile_cpu_s": time.process_time() - cpu}
        records[method]["xla_buffer_mb"] = plan_mb
    for name, sampler in (("draw", "sound"), ("draw_jax", "jax")):
        start, cpu = time.perf_counter(), time.process_time()
        fn = bare_draw(size, sampler).lower(keys[0]).compile()
        records[name] = {"compile_s": time.perf_counter() - start, "num_normals": size}
        records[name]["compile_cpu_s"] = time.process_time() - cpu
        thunks[name] = functools.partial(fn, keys[1])
    return thunks, records


def _opacus_thunks(model_name: str, batch: int, probe: int) -> tuple[dict, dict, dict]:
    """torch non-private + Opacus's FASTEST mode for this model (each mode timed ``probe``
    times first), its per-mode medians and the modes that failed; empty without the extra."""
    try:
        import torch

        from benchmarks.torch_side import torch_steps
    except ImportError as err:
        return {}, {}, {"all": f"bench-torch extra not installed ({err.name})"}
    device = "cpu"
    if jax.default_backend() != "cpu":
        if not torch.cuda.is_available():
            return {}, {}, {"all": "JAX runs on an accelerator, torch has no CUDA: not comparable"}
        device = "cuda"
    steps, failed = torch_steps(model_name, batch, device=device)
    modes = {m: s for m, s in steps.items() if m.startswith("opacus_")}
    per_mode = {
        mode: statistics.median(_timed_call(step)[0] for _ in range(probe))
        for mode, step in modes.items()
    }
    thunks = {m: s for m, s in steps.items() if m == "torch_nonprivate"}
    if per_mode:
        best = min(per_mode, key=per_mode.get)
        thunks["opacus"] = steps[best]
        per_mode = {"best": best, **per_mode}
    return thunks, per_mode, failed


def time_methods(
    model_name: str, batch: int, methods: list[str], repeats: int, opacus: bool
) -> list[dict]:
    """Compile everything, then time every method once per round, round-robin.

    Round r times the methods in an order rotated by r (each call warm first); every ratio is
    computed within a round (same moment of a noisy machine) and summarised by its median.
    """
    keys = jax.random.split(jax.random.key(2), 2)
    thunks, records = _thunks(model_name, batch, methods, keys)
    for fn in thunks.values():
        _block(fn())  # warm-up
    extra = {}
    if opacus:
        torch_thunks, per_mode, failed = _opacus_thunks(model_name, batch, 1 + (repeats > 5))
        thunks |= torch_thunks
        extra = {"opacus_modes_ms": per_mode, "opacus_failed": failed}
    names = list(thunks)
    rounds: list[dict[str, float]] = []
    cpu_rounds: list[dict[str, float]] = []
    for r in range(repeats):
        shift = r % len(names)
        timed = {name: _timed_call(thunks[name]) for name in names[shift:] + names[:shift]}
        rounds.append({name: t[0] for name, t in timed.items()})
        cpu_rounds.append({name: t[1] for name, t in timed.items()})
    out = []
    for name in names:
        rec = records.get(name, {}) | _summary([rnd[name] for rnd in rounds])
        rec["cpu_median_ms"] = statistics.median(rnd[name] for rnd in cpu_rounds)
        out.append({"model": model_name, "batch": batch, "method": name, **rec})
    summary = {
        "model": model_name,
        "batch": batch,
        "method": "summary",
        "device": _device(),
        "ratios": _median_ratios(rounds) | _compile_ratios(records, "compile_s"),
        "cpu_ratios": _median_ratios(cpu_rounds) | _compile_ratios(records, "compile_cpu_s"),
    }
    out.append(summary | {"rounds": rounds, "cpu_rounds": cpu_rounds} | extra)
    return out


def _device() -> dict:
    dev = jax.devices()[0]
    return {
        "platform": dev.platform,
        "device_kind": dev.device_kind,
        "num_devices": jax.device_count(),
        "jax": jax.__version__,
    }


def _median_ratios(rounds: list[dict[str, float]]) -> dict[str, float]:
    """Median over rounds of each ratio of :data:`_RATIOS` (those whose methods were timed)."""
    ratios = {key: statistics.median(_round_ratios(rounds, key)) for key in _RATIOS}
    return {k: v for k, v in ratios.items() if v == v}  # drop NaN


_RATIOS = (
    "dp_over_nonprivate",
    "noise_over_draw",
    "nobarrier_noise_over_draw",
    "dp_over_floor",
    "draw_over_draw_jax",
    "dpjax_over_opacus",
    "opacus_over_torch",
)


def _ratio(rnd: dict[str, float], key: str) -> float:
    """One round's ``key`` (see :data:`_RATIOS`), NaN when a method of it was not timed."""
    nan = float("nan")
    try:
        if key == "dp_over_nonprivate":
            return rnd["dpjax"] / rnd["nonprivate"]
        if key == "noise_over_draw":  # the noise's cost inside the jitted DP step
            return (rnd["dpjax"] - rnd["dpjax_clip_only"]) / rnd["draw"]
        if key == "nobarrier_noise_over_draw":
            return (rnd["dpjax_nobarrier"] - rnd["dpjax_clip_only"]) / rnd["draw"]
        if key == "dp_over_floor":  # floor: non-private step + one bare draw
            return rnd["dpjax"] / (rnd["nonprivate"] + rnd["draw"])
        if key == "draw_over_draw_jax":
            return rnd["draw"] / rnd["draw_jax"]
        if key == "dpjax_over_opacus":
            return rnd["dpjax"] / rnd["opacus"]
        if key == "opacus_over_torch":
            return rnd["opacus"] / rnd["torch_nonprivate"]
    except KeyError:
        return nan
    raise ValueError(f"key must be one of {_RATIOS}; got {key!r}")


def _round_ratios(rounds: list[dict[str, float]], key: str) -> list[float]:
    return [_ratio(rnd, key) for rnd in rounds]


def _compile_ratios(records: dict, field: str) -> dict:
    base = records.get("nonprivate", {}).get(field)
    if not base:
        return {}
    return {
        f"compile_{name}_over_nonprivate": rec[field] / base
        for name, rec in records.items()
        if name != "nonprivate" and field in rec
    }


def _summary(times: list[float]) -> dict:
    return {"median_ms": statistics.median(times), "min_ms": min(times)}


def rss_method(model_name: str, batch: int, method: str, repeats: int) -> dict:
    model, params, xs, ys = _setup(model_name, batch)
    key = jax.random.key(2)
    _block((params, xs, ys))
    fn, _, _ = _compile(model, method, params, key, xs, ys)
    _block(fn(params, key, xs, ys))
    before = _vm_kb("VmRSS")
    _reset_hwm()
    for _ in range(repeats):
        _block(fn(params, key, xs, ys))
    peak = _vm_kb("VmHWM")
    return {
        "model": model_name,
        "batch": batch,
        "method": method,
        "peak_rss_mb": peak / 1024,
        "step_rss_mb": (peak - before) / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("time", "rss"))
    parser.add_argument("model")
    parser.add_argument("batch", type=int)
    parser.add_argument("methods", nargs="*")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--opacus", action="store_true", help="time Opacus in the same rounds")
    args = parser.parse_args()
    if args.mode == "time":
        records = time_methods(args.model, args.batch, args.methods, args.repeats, args.opacus)
    else:
        records = [rss_method(args.model, args.batch, args.methods[0], args.repeats)]
    for rec in records:
        print("BENCH " + json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
