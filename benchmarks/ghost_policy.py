"""A/B of ghost clipping's backend policies in one process.

``python -m benchmarks.ghost_policy [--model transformer] [--batch 32] [--repeats 11]`` compiles
the non-private step and the dpjax DP step twice, traced under the CPU policy (the plan that the
accelerators used before their own policy, still the CPU's) and under the accelerator policy
(:mod:`dpjax.dp_sgd._ghost_policy`, the default on GPU/TPU), then times the three round-robin
and prints one JSON line per method (``AB {...}``: median ms, × non-private, compile s) and
the device.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax

from benchmarks.models import load_plugins, make_model
from benchmarks.steps import make_step
from dpjax.dp_sgd import _ghost_policy

__all__ = ["measure", "main"]


def _compiled(model, method: str, policy, args: tuple):
    with _ghost_policy.use(policy):
        start = time.perf_counter()
        fn = make_step(model, method).lower(*args).compile()
        seconds = time.perf_counter() - start
    jax.block_until_ready(fn(*args))  # warm-up
    return fn, seconds


def measure(model_name: str, batch: int, repeats: int) -> list[dict]:
    """Median step times (ms) of nonprivate and dpjax under each policy, interleaved."""
    load_plugins()
    model = make_model(model_name)
    params = model.init(jax.random.key(0))
    xs, ys = model.data(jax.random.key(1), batch)
    keys = jax.random.split(jax.random.key(2), repeats + 1)
    variants = {
        "nonprivate": ("nonprivate", _ghost_policy.CPU),
        "dpjax[cpu policy]": ("dpjax", _ghost_policy.CPU),
        "dpjax[accelerator policy]": ("dpjax", _ghost_policy.ACCELERATOR),
    }
    args = (params, keys[0], xs, ys)
    fns, compile_s, times = {}, {}, {name: [] for name in variants}
    for name, (method, policy) in variants.items():
        fns[name], compile_s[name] = _compiled(model, method, policy, args)
    names = list(variants)
    for r in range(repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            jax.block_until_ready(fns[name](params, keys[r + 1], xs, ys))
            times[name].append(1e3 * (time.perf_counter() - start))
    base = statistics.median(times["nonprivate"])
    device = jax.devices()[0]
    return [
        {
            "model": model.name,
            "batch": batch,
            "method": name,
            "median_ms": statistics.median(times[name]),
            "ratio_to_nonprivate": statistics.median(times[name]) / base,
            "compile_s": compile_s[name],
            "times_ms": times[name],
            "device": f"{device.platform} {device.device_kind}",
            "jax": jax.__version__,
        }
        for name in names
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ghost_policy", description=__doc__)
    parser.add_argument("--model", default="transformer")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=11)
    args = parser.parse_args(argv)
    for rec in measure(args.model, args.batch, args.repeats):
        print("AB " + json.dumps(rec), flush=True)
        print(
            f"{rec['device']}: {rec['method']}: {rec['median_ms']:.2f} ms "
            f"({rec['ratio_to_nonprivate']:.2f}x), compile {rec['compile_s']:.1f} s",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
