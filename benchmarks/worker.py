"""One benchmark process: ``python -m benchmarks.worker MODE MODEL BATCH METHODS... --repeats R``.

MODE ``time``: compile every method's step (compile time, XLA buffer plan), then time them
round-robin (pair by pair, same process) and print one JSON line per method.
MODE ``rss``: one method only; reset the RSS high-water mark after compiling and warming up,
run the step, print the peak resident memory (Linux ``/proc/self/status`` VmHWM).
MODE ``noise``: time drawing Gaussian noise for the model's parameters per PRNG implementation.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time

import jax
import jax.numpy as jnp

from benchmarks.models import make_model
from benchmarks.steps import make_step, noise_only


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


def _timed(fn, params, key, xs, ys) -> float:
    """One warm call (absorbs whatever the previous, maybe huge, step left), then one timed."""
    _block(fn(params, key, xs, ys))
    start = time.perf_counter()
    _block(fn(params, key, xs, ys))
    return 1e3 * (time.perf_counter() - start)


def time_methods(model_name: str, batch: int, methods: list[str], repeats: int) -> list[dict]:
    """Compile every method, then time each against the non-private step pair by pair.

    For each method, ``repeats`` rounds alternate (non-private, method) / (method, non-private);
    its ratio uses the non-private times of its own pairs (``paired_nonprivate_ms``).
    """
    model, params, xs, ys = _setup(model_name, batch)
    keys = jax.random.split(jax.random.key(2), repeats + 2)
    compiled, records = {}, {}
    for method in methods:
        fn, seconds, plan_mb = _compile(model, method, params, keys[0], xs, ys)
        _block(fn(params, keys[0], xs, ys))  # warm-up
        compiled[method] = fn
        records[method] = {"compile_s": seconds, "xla_buffer_mb": plan_mb}
    base_times: list[float] = []
    for method in methods:
        if method == "nonprivate":
            continue
        times, paired = [], []
        for r in range(repeats):
            pair = ("nonprivate", method) if r % 2 == 0 else (method, "nonprivate")
            for m in pair:
                t = _timed(compiled[m], params, keys[r + 1], xs, ys)
                (paired if m == "nonprivate" else times).append(t)
        records[method] |= _summary(times) | {"paired_nonprivate_ms": statistics.median(paired)}
        records[method]["paired_nonprivate_min_ms"] = min(paired)
        base_times += paired
    if "nonprivate" in records:
        if not base_times:
            base_times = [_timed(compiled["nonprivate"], params, k, xs, ys) for k in keys[1:]]
        records["nonprivate"] |= _summary(base_times)
    return [{"model": model_name, "batch": batch, "method": m, **records[m]} for m in methods]


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


def _flat_normal(tree):
    """All leaves' noise from ONE draw, split into leaves (one threefry kernel to compile)."""
    leaves, treedef = jax.tree.flatten(tree)
    sizes = [x.size for x in leaves]

    def draw(key):
        flat = jax.random.normal(key, (sum(sizes),), leaves[0].dtype)
        parts = jnp.split(flat, list(itertools.accumulate(sizes))[:-1])
        noise = [p.reshape(x.shape) for p, x in zip(parts, leaves, strict=True)]
        return jax.tree.unflatten(treedef, noise)

    return jax.jit(draw)


def time_noise(model_name: str, repeats: int) -> list[dict]:
    model = make_model(model_name)
    params = model.init(jax.random.key(0))
    size = sum(x.size for x in jax.tree.leaves(params))
    out = []
    variants = [("threefry2x32", "per-leaf (dpjax)"), ("threefry2x32", "one flat draw")]
    variants += [("rbg", "per-leaf (dpjax)"), ("unsafe_rbg", "per-leaf (dpjax)")]
    for impl, how in variants:
        draw = noise_only(params) if how.startswith("per-leaf") else _flat_normal(params)
        keys = jax.random.split(jax.random.key(3, impl=impl), repeats + 1)
        start = time.perf_counter()
        draw = draw.lower(keys[0]).compile()
        compile_s = time.perf_counter() - start
        _block(draw(keys[0]))
        times = []
        for r in range(repeats):
            start = time.perf_counter()
            _block(draw(keys[r + 1]))
            times.append(1e3 * (time.perf_counter() - start))
        out.append(
            {
                "model": model_name,
                "prng": impl,
                "draw": how,
                "partitionable": bool(jax.config.jax_threefry_partitionable),
                "num_normals": size,
                "median_ms": statistics.median(times),
                "compile_s": compile_s,
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("time", "rss", "noise"))
    parser.add_argument("model")
    parser.add_argument("batch", type=int)
    parser.add_argument("methods", nargs="*")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    if args.mode == "time":
        records = time_methods(args.model, args.batch, args.methods, args.repeats)
    elif args.mode == "rss":
        records = [rss_method(args.model, args.batch, args.methods[0], args.repeats)]
    else:
        records = time_noise(args.model, args.repeats)
    for rec in records:
        print("BENCH " + json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
