"""``python -m benchmarks --startup``: time to first result, each in a fresh process.

Measures what a new user waits for before anything is computed:

* ``import dpjax`` (and ``import jax`` alone, the floor), plus the heavy modules that the import
  left loaded (none of dp-accounting, SciPy's statistics, scikit-learn or flax is expected);
* ``from dpjax import make_private`` (the DP-SGD room and its accounting, loaded on first use);
* ``--help`` of every console script, run as its installed launcher runs it;
* the README's ``make_private`` block (50 steps of a 5-parameter logistic regression), as a
  script in an empty folder (skipped when the README is not beside the programs, e.g. a wheel).

Each row is the minimum (and median) over ``--repeats`` runs of the process's wall-clock time
and its CPU time (user + system of the child), so a loaded machine shows up as wall ≫ CPU.
Targets: import and ``--help`` ≤ 1.5 s, the README block ≤ 10 s (wall, minimum over runs).
Writes ``startup.json`` and ``startup.md`` under ``--out``.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import pathlib
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]  # holds dpjax/ (editable) and README.md
HEAVY = ("dp_accounting", "scipy.stats", "scipy.signal", "sklearn", "flax", "optax", "pandas")
# The imports timed: `import jax` is the floor of any JAX program, and `from dpjax import
# make_private` loads the DP-SGD room with its accounting; both are shown for reference only,
# without a target (the target is `import dpjax`'s).
IMPORTS = ("import jax", "import dpjax", "from dpjax import make_private")
JUDGED = ("import dpjax",)
TARGETS_S = {"import": 1.5, "help": 1.5, "readme": 10.0}  # wall seconds, minimum over runs
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _child(code: str, args: tuple[str, ...] = (), cwd: pathlib.Path | None = None):
    """Run ``python -c code args`` with this checkout's dpjax first on the path; wall and CPU
    seconds of the child, and the finished process."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc


def _timed(what: str, kind: str, code: str, repeats: int, args: tuple[str, ...] = ()) -> dict:
    """One row: minimum and median wall / CPU seconds of ``repeats`` fresh processes."""
    walls, cpus, failure = [], [], None
    with tempfile.TemporaryDirectory() as empty:
        for _ in range(repeats):
            wall, cpu, proc = _child(code, args, cwd=pathlib.Path(empty))
            if proc.returncode != 0:
                failure = proc.stderr[-2000:]
                break
            walls.append(wall)
            cpus.append(cpu)
    row = {"what": what, "kind": kind, "runs": len(walls)}
    if failure is not None:
        return row | {"status": "FAILED", "error": failure}
    row |= {
        "wall_min_s": round(min(walls), 3),
        "wall_median_s": round(statistics.median(walls), 3),
        "cpu_min_s": round(min(cpus), 3),
        "cpu_median_s": round(statistics.median(cpus), 3),
    }
    if kind == "import" and what not in JUDGED:
        return row | {"status": "reference"}
    row["target_s"] = TARGETS_S[kind]
    return row | {"status": "holds" if row["wall_min_s"] <= row["target_s"] else "MISSED"}


def heavy_modules_after_import() -> list[str]:
    """The modules of :data:`HEAVY` that ``import dpjax`` leaves loaded (fresh process)."""
    code = f"import json, sys, dpjax; print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    _, _, proc = _child(code)
    return json.loads(proc.stdout) if proc.returncode == 0 else ["(import failed)"]


def console_scripts() -> dict[str, str]:
    """dpjax's console scripts: name -> ``module:function`` (``[project.scripts]`` of the
    checkout's pyproject.toml, else the installed distribution's entry points)."""
    pyproject = ROOT / "pyproject.toml"
    if pyproject.is_file():
        return tomllib.loads(pyproject.read_text())["project"]["scripts"]
    found = importlib.metadata.entry_points(group="console_scripts")
    return {ep.name: ep.value for ep in found if ep.value.startswith("dpjax.")}


def _launcher(script: str, target: str) -> str:
    """The code pip's launcher runs for ``script`` (import the function, exit with its code)."""
    module, func = target.split(":")
    return f"import sys; sys.argv[0] = {script!r}; from {module} import {func}; sys.exit({func}())"


def readme_block() -> str | None:
    """The README's Python block that calls ``make_private``, or None without a README."""
    readme = ROOT / "README.md"
    if not readme.is_file():
        return None
    blocks = [body for lang, body in FENCE.findall(readme.read_text()) if lang == "python"]
    return next((b for b in blocks if "make_private(" in b), None)


def measure(repeats: int, readme_repeats: int) -> list[dict]:
    """Every row of the startup table (see the module docstring)."""
    rows = [_timed(code, "import", code, repeats) for code in IMPORTS]
    for script, target in sorted(console_scripts().items()):
        code = _launcher(script, target)
        rows.append(_timed(f"{script} --help", "help", code, repeats, ("--help",)))
    block = readme_block()
    if block is None:
        rows.append({"what": "README make_private block", "kind": "readme", "status": "SKIPPED"})
    else:
        rows.append(_timed("README make_private block", "readme", block, readme_repeats))
    return rows


def _cell(row: dict, key: str) -> str:
    return "—" if key not in row else f"{row[key]:.2f}"


def section(rows: list[dict], heavy: list[str], meta: dict) -> list[str]:
    """The Markdown of ``startup.md``."""
    md = [
        "# Time to first result (fresh process per run)",
        "",
        f"`{json.dumps(meta)}`",
        "",
        "| what | wall min s | wall median s | CPU min s | target (wall) | status |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        target = f"≤ {r['target_s']:g} s" if "target_s" in r else "—"
        status = r["status"]
        md.append(
            f"| {r['what']} | {_cell(r, 'wall_min_s')} | {_cell(r, 'wall_median_s')} | "
            f"{_cell(r, 'cpu_min_s')} | {target} | {status} |"
        )
    md += ["", f"Heavy modules loaded by `import dpjax`: {', '.join(heavy) or 'none'}."]
    failed = [r for r in rows if r["status"] == "FAILED"]
    md += [f"\n{r['what']} failed:\n```\n{r['error']}\n```" for r in failed]
    return md


def run(out: pathlib.Path, repeats: int = 5, readme_repeats: int = 1) -> int:
    """Measure, write ``startup.json`` and ``startup.md`` under ``out``, print the table."""
    out.mkdir(parents=True, exist_ok=True)
    rows = measure(repeats, readme_repeats)
    heavy = heavy_modules_after_import()
    meta = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "repeats": repeats,
        "readme_repeats": readme_repeats,
    }
    payload = {"meta": meta, "heavy_modules_after_import": heavy, "rows": rows}
    (out / "startup.json").write_text(json.dumps(payload, indent=2))
    md = section(rows, heavy, meta)
    (out / "startup.md").write_text("\n".join(md) + "\n")
    print("\n".join(md), flush=True)
    return 0 if all(r["status"] != "FAILED" for r in rows) else 1
