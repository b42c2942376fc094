"""One step-memory process: ``python -m benchmarks.memory_worker MODEL BATCH METHOD``.

Builds the parameters and the batch (for a JAX method also compiles the step and records XLA's
plan), reads the resident set, resets the high-water mark (``/proc/self/clear_refs``), runs
the step twice, reads the high-water mark, and prints one ``MEMORY {...}`` JSON line:
``rss_before_mb``, ``peak_rss_mb``, ``step_mb`` (their difference) and, for JAX,
``xla_plan_mb`` (temporaries + outputs) and ``xla_args_mb``. Linux only (``/proc``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

CALLS = 2


def vm_kb(field: str) -> float:
    """``VmRSS`` / ``VmHWM`` of this process in kB (NaN when /proc has no such field)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return float(line.split()[1])
    return float("nan")


def _reset_high_water_mark() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _jax_step(model_name: str, batch: int, method: str) -> tuple[Callable[[], object], dict]:
    import jax

    from benchmarks.models import make_model
    from benchmarks.steps import make_step

    model = make_model(model_name)
    params = model.init(jax.random.key(0))
    xs, ys = model.data(jax.random.key(1), batch)
    key = jax.random.key(2)
    compiled = make_step(model, method).lower(params, key, xs, ys).compile()
    mem = compiled.memory_analysis()
    plan = {
        "xla_plan_mb": (mem.temp_size_in_bytes + mem.output_size_in_bytes) / 2**20,
        "xla_args_mb": mem.argument_size_in_bytes / 2**20,
    }
    jax.block_until_ready((params, xs, ys))
    return lambda: jax.block_until_ready(compiled(params, key, xs, ys)), plan


def _torch_step(model_name: str, batch: int, method: str) -> tuple[Callable[[], object], dict]:
    import torch

    from benchmarks import torch_side

    torch.manual_seed(0)
    if method == "torch_nonprivate":
        return torch_side._nonprivate(model_name, batch, "cpu"), {}
    mode = method.removeprefix("opacus_")
    if mode not in torch_side.OPACUS_MODES:
        raise ValueError(f"method must be torch_nonprivate or opacus_<mode>; got {method!r}")
    return torch_side._opacus(model_name, batch, mode, "cpu"), {}


def measure(model_name: str, batch: int, method: str) -> dict:
    """Step memory of ``method`` on ``model_name`` at ``batch`` in THIS process (call once)."""
    if method.startswith(("torch_", "opacus_")):
        step, extra = _torch_step(model_name, batch, method)
    else:
        step, extra = _jax_step(model_name, batch, method)
    before = vm_kb("VmRSS")
    _reset_high_water_mark()
    for _ in range(CALLS):
        step()
    peak = vm_kb("VmHWM")
    return {
        "rss_before_mb": before / 1024,
        "peak_rss_mb": peak / 1024,
        "step_mb": (peak - before) / 1024,
        **extra,
    }


def main() -> None:
    model, batch, method = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    print("MEMORY " + json.dumps(measure(model, batch, method)), flush=True)


if __name__ == "__main__":
    main()
