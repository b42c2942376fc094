"""The sound Gaussian sampler against ``jax.random.normal`` (target: ≤ 1.3× on the CPU).

``python -m benchmarks.sampler [--quick] [--out results]`` times, in this process, one jitted
draw of d = 669 706 float32 coordinates (the MLP's size) of :func:`dpjax._random.normal` and
of ``jax.random.normal``, interleaved: each round times both (a fresh key per draw, the order
alternating between rounds), and the ratio is taken within the round; the reported ratio is
the median over rounds (the machine may be shared and noisy). ``make bench`` adds this
section to ``results/bench.md`` and its target to ``bench.json``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time

import jax
import jax.numpy as jnp

from dpjax import _random

SIZE = 669_706
TARGET = (1.3, "sampler / jax.random.normal, one float32 draw of the MLP's size")


def _time(fn, key: jax.Array, draws: int) -> float:
    """Seconds per draw: ``draws`` calls with keys folded from ``key``."""
    keys = [jax.random.fold_in(key, i) for i in range(draws)]
    jax.block_until_ready(keys)
    start = time.perf_counter()
    for k in keys:
        fn(k).block_until_ready()
    return (time.perf_counter() - start) / draws


def run(quick: bool = False, size: int = SIZE) -> dict:
    """Interleaved rounds of both draws; per-round ratio, median over rounds."""
    fns = {
        "dpjax": jax.jit(lambda k: _random.normal(k, (size,), jnp.float32)),
        "jax": jax.jit(lambda k: jax.random.normal(k, (size,), jnp.float32)),
    }
    for fn in fns.values():
        fn(jax.random.key(0)).block_until_ready()  # compile
    rounds, draws = (7, 5) if quick else (21, 10)
    seconds: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(rounds):
        order = list(fns) if r % 2 == 0 else list(fns)[::-1]
        for name in order:
            seconds[name].append(_time(fns[name], jax.random.key(r + 1), draws))
    ratios = [a / b for a, b in zip(seconds["dpjax"], seconds["jax"], strict=True)]
    ratio = statistics.median(ratios)
    return {
        "size": size,
        "rounds": rounds,
        "draws_per_round": draws,
        "dpjax_ms": 1e3 * statistics.median(seconds["dpjax"]),
        "jax_ms": 1e3 * statistics.median(seconds["jax"]),
        "ratio": ratio,
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "target": {
            "model": "sampler",
            "batch": size,
            "target": "sampler_over_jax_normal",
            "what": TARGET[1],
            "bound": TARGET[0],
            "ratio": ratio,
            "cpu_ratio": None,
            "status": "holds" if ratio <= TARGET[0] else "MISSED",
            "device": _device_name(),
        },
    }


def _device_name() -> str:
    """The device the draws ran on (the same field every bench.json target carries)."""
    device = jax.devices()[0]
    return str(getattr(device, "device_kind", device.platform))


def section(result: dict) -> list[str]:
    """Markdown lines for bench.md."""
    return [
        "",
        "## Sound sampler vs jax.random.normal",
        "",
        f"- d = {result['size']} float32, {result['rounds']} interleaved rounds of "
        f"{result['draws_per_round']} draws: dpjax {result['dpjax_ms']:.2f} ms, "
        f"jax.random.normal {result['jax_ms']:.2f} ms; ratio (median of per-round ratios) "
        f"{result['ratio']:.3f} [{result['ratio_min']:.3f}, {result['ratio_max']:.3f}] "
        f"≤ {TARGET[0]}: {result['target']['status']}",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sampler", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="7 rounds of 5 draws (else 21×10)")
    parser.add_argument("--out", type=pathlib.Path, default=None, help="write sampler.json")
    args = parser.parse_args(argv)
    result = run(args.quick)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "sampler.json").write_text(json.dumps(result, indent=2))
    print("\n".join(section(result)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
