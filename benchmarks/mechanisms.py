"""``python -m benchmarks --mechanisms``: scalar releases per second, vmapped and batched.

In one process, float32 (x64 off), for the Gaussian (ε = 1, δ = 1e-5) and the Laplace
mechanism (ε = 1), each over ``ROWS`` scalar values:

* ``vmapped``: ``jax.jit(jax.vmap(mechanism))`` over ``ROWS`` distinct keys
  (``jax.random.split``), one release per row: the per-row key guard runs (its check that
  the keys are distinct is part of the time);
* ``vmapped_unguarded``: the same without the guard (``unguarded(mechanism)``), to state what
  the guard costs; never a way to release (it does not refuse a shared key);
* ``batched``: one ``jax.jit(mechanism)`` call on the ``ROWS``-vector with one key.

Each round times every case once (order rotated between rounds; fresh keys per call are not
needed: the program is the same), and the reported time is the median over rounds; the
machine may be shared. Target: ≥ 10⁶ releases per second for both ``vmapped`` rows.
"""

from __future__ import annotations

import json
import os
import pathlib
import platform
import statistics
import time

ROWS = 100_000
TARGET = 1e6  # releases per second, jit(vmap(mechanism)) over distinct keys
GAUSS = {"sensitivity": 1.0, "epsilon": 1.0, "delta": 1e-5}
LAPLACE = {"sensitivity": 1.0, "epsilon": 1.0}


def _cases(rows: int) -> dict:
    import jax
    import jax.numpy as jnp

    from dpjax.mechanisms import gaussian, laplace
    from dpjax.mechanisms._vmap_guard import unguarded

    keys = jax.random.split(jax.random.key(0), rows)
    values = jnp.linspace(-1.0, 1.0, rows, dtype=jnp.float32)
    cases = {}
    for name, mechanism, kwargs in (("gaussian", gaussian, GAUSS), ("laplace", laplace, LAPLACE)):

        def release(k, v, m=mechanism, kw=kwargs):
            return m(k, v, **kw)

        def bare(k, v, m=mechanism, kw=kwargs):
            return unguarded(m)(k, v, **kw)

        cases[(name, "vmapped")] = (jax.jit(jax.vmap(release)), keys, values)
        cases[(name, "vmapped_unguarded")] = (jax.jit(jax.vmap(bare)), keys, values)
        cases[(name, "batched")] = (jax.jit(release), keys[0], values)
    return cases


def measure(rows: int = ROWS, rounds: int = 7) -> dict:
    """Median seconds per call of every case over ``rounds`` interleaved rounds."""
    import jax

    with jax.enable_x64(False):
        cases = _cases(rows)
        for fn, *args in cases.values():
            jax.block_until_ready(fn(*args))  # compile
        seconds: dict = {case: [] for case in cases}
        order = list(cases)
        for r in range(rounds):
            for case in order[r % len(order) :] + order[: r % len(order)]:
                fn, *args = cases[case]
                start = time.perf_counter()
                jax.block_until_ready(fn(*args))
                seconds[case].append(time.perf_counter() - start)
    out = []
    for (mechanism, path), times in seconds.items():
        median = statistics.median(times)
        out.append(
            {
                "mechanism": mechanism,
                "path": path,
                "rows": rows,
                "median_ms": 1e3 * median,
                "releases_per_s": rows / median,
            }
        )
    return {"rows": out, "rounds": rounds}


def section(result: dict) -> list[str]:
    """The markdown table and the target lines of :func:`measure`'s result."""
    lines = [
        "## Scalar releases per second (float32, jit)",
        "",
        "| mechanism | path | rows | median ms | releases / s |",
        "|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['mechanism']} | {r['path']} | {r['rows']} | {r['median_ms']:.2f} | "
            f"{r['releases_per_s']:.3g} |"
        )
    lines.append("")
    for r in result["rows"]:
        if r["path"] == "vmapped":
            status = "holds" if r["releases_per_s"] >= TARGET else "MISSED"
            lines.append(
                f"- {r['mechanism']}, jit(vmap) over distinct keys: "
                f"{r['releases_per_s']:.3g} releases/s ≥ {TARGET:.0e}: {status}"
            )
    return lines


def run(out: pathlib.Path, repeats: int = 7, rows: int = ROWS) -> dict:
    """Measure, write mechanisms.{json,md} under ``out``, print the table."""
    result = measure(rows, rounds=repeats)
    result["meta"] = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
    }
    (out / "mechanisms.json").write_text(json.dumps(result, indent=2))
    lines = ["# dpjax mechanisms at scale", "", f"`{json.dumps(result['meta'])}`", ""]
    lines += section(result)
    (out / "mechanisms.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    return result
