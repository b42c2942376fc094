"""Throughput of the exact integer samplers against ``jax.random.normal``.

``python -m benchmarks.integer_noise [--quick] [--out results]`` times, in this process, one
jitted draw of n coordinates of: the discrete Gaussian (σ = 3 and σ = 1000), the discrete
Laplace release (ε = 1, Δ₁ = 1, g = 1: rate 1/2), dpjax's float Gaussian sampler and
``jax.random.normal``; each median over rounds with a fresh key per round, compile time
measured separately. ``make bench`` adds this section to ``results/bench.md``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp

from dpjax import _random, mechanisms


def _samplers(n: int) -> dict[str, Any]:
    zeros_i = jnp.zeros(n, jnp.int32)
    zeros_f = jnp.zeros(n, jnp.float32)
    return {
        "jax.random.normal": lambda k: jax.random.normal(k, (n,), jnp.float32),
        "dpjax._random.normal (float)": lambda k: _random.normal(k, (n,), jnp.float32),
        "discrete_gaussian σ=3": lambda k: mechanisms.discrete_gaussian(
            k, zeros_i, sensitivity=1, sigma=3
        ),
        "discrete_gaussian σ=1000": lambda k: mechanisms.discrete_gaussian(
            k, zeros_i, sensitivity=1, sigma=1000
        ),
        "discrete_laplace rate 1/2": lambda k: mechanisms.discrete_laplace(
            k, zeros_f, sensitivity=1.0, epsilon=float(n + 1) / 2, bound=2.0**20, granularity=1.0
        ),
    }


def measure(n: int, repeats: int) -> list[dict]:
    """One record per sampler: compile seconds, median seconds per draw of n, draws/s."""
    records = []
    for name, fn in _samplers(n).items():
        jitted = jax.jit(fn)
        start = time.perf_counter()
        compiled = jitted.lower(jax.random.key(0)).compile()
        compile_s = time.perf_counter() - start
        times = []
        for i in range(repeats):
            key = jax.random.key(i + 1)
            start = time.perf_counter()
            jax.block_until_ready(compiled(key))
            times.append(time.perf_counter() - start)
        median = statistics.median(times)
        records.append(
            dict(sampler=name, n=n, compile_s=compile_s, seconds=median, draws_per_s=n / median)
        )
    base = records[0]["seconds"]
    for r in records:
        r["over_jax_normal"] = r["seconds"] / base
    return records


def section(records: list[dict]) -> list[str]:
    """Markdown lines for bench.md."""
    lines = [
        "",
        "## Exact integer noise: draws per second",
        "",
        f"x64 = {jax.config.read('jax_enable_x64')}; median of rounds, one jitted draw of n.",
        "",
        "| sampler | n | draws/s | × jax.random.normal time | compile s |",
        "|---|---|---|---|---|",
    ]
    for r in records:
        lines.append(
            f"| {r['sampler']} | {r['n']} | {r['draws_per_s']:.3g} | "
            f"{r['over_jax_normal']:.1f} | {r['compile_s']:.1f} |"
        )
    return lines


def run(quick: bool) -> list[dict]:
    sizes = (100_000,) if quick else (100_000, 1_000_000)
    return [rec for n in sizes for rec in measure(n, repeats=3 if quick else 5)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.integer_noise", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="n = 10^5 only, 3 rounds")
    parser.add_argument("--out", type=pathlib.Path, default=None, help="write JSON + markdown")
    args = parser.parse_args(argv)
    records = run(args.quick)
    lines = section(records)
    print("\n".join(lines), flush=True)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "integer_noise.json").write_text(json.dumps(records, indent=2))
        (args.out / "integer_noise.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
