"""The "Published results" table: the field's DP numbers beside dpjax's on the same data.

Rows measured by a full-scale run are kept in a committed results file
(:data:`RESULTS_FILE`, small JSON: accuracies per seed, ε as dpjax accounts it, wall time, date
and machine), written by ``python -m experiments.published record <out>/scatternet.json [...]``
after ``python -m experiments <experiment> --full``. This experiment only READS that file
(it trains nothing, so ``make reproduce`` stays quick) and renders it with the rows that were not
run here, each with the command that runs it, and the time-to-accuracy rows of
:mod:`experiments.opacus_mnist` (dpjax beside Opacus; ``record DIR/opacus_mnist.json``).

Sources of the published numbers:

* Tramèr & Boneh 2021, *Differentially Private Learning Needs Better Features (or Much More
  Data)*, ICLR 2021, https://arxiv.org/abs/2011.11660 (README table of
  github.com/ftramer/Handcrafted-DP), (ε, δ) = (3, 1e-5);
* Bu et al. 2023, *Automatic clipping: differentially private deep learning made easier and
  stronger*, NeurIPS 2023, https://arxiv.org/abs/2206.07136: AUTO-S matches or beats flat
  clipping at the same ε; they report no ScatterNet number, so the automatic-clipping row is
  compared with Tramèr & Boneh's flat-clipping 98.7 (the "holds" column) AND with the
  flat-clipping row measured here (the line under the table);
* Opacus's MNIST example (``examples/mnist_README.md`` of github.com/pytorch/opacus): mean of 10
  runs, δ = 1e-5, the ε printed by its accountant (6.86 / 2.91 / 1.16 in the current README;
  an older version printed 7.10 / 3.01 / 1.19 for the same commands);
* Chaudhuri, Monteleoni, Sarwate 2011, JMLR 12:1069–1109 (Adult): their figure's values are
  not transcribed (see :mod:`experiments.erm_adult`), so that row compares claims, not a number.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import platform
import sys

import numpy as np

DESCRIPTION = "published: the published-results table (reads the committed full-run results)"

RESULTS_FILE = pathlib.Path(__file__).with_name("published_results.json")
TITLE = "## Published results: the papers' numbers beside dpjax's"

TB = "Tramèr & Boneh 2021"
OPACUS = "Opacus MNIST example"
AUTO_S = "Tramèr & Boneh 2021 (flat C); AUTO-S: Bu et al. 2023"
AUTO_CMD = "python -m experiments.scatternet --full --clip-rule automatic --dataset mnist"
# One seed S of a setting of experiments.opacus_mnist (SETTINGS: the rows of Opacus's example and
# Tramèr & Boneh's tanh CNN), dpjax's side.
OPACUS_EXAMPLE_CMD = (  # also the command of the recorded rows (S: each seed)
    "python -m experiments.opacus_mnist --full --framework dpjax --seed S --setting"
)
# Every row of the table, in order: (paper, data set, model, ε, published accuracy %, key of
# the measured row in the results file, what to run when it was not run here).
ROWS: tuple[dict, ...] = (
    dict(paper=TB, dataset="MNIST", model="ScatterNet + linear", epsilon=3.0, published=98.7,
         key="scatternet/mnist", command="python -m experiments scatternet --full"),
    dict(paper=TB, dataset="Fashion-MNIST", model="ScatterNet + linear", epsilon=3.0,
         published=89.7, key="scatternet/fashion-mnist",
         command="python -m experiments scatternet --full"),
    dict(paper=AUTO_S, dataset="MNIST", model="ScatterNet + linear, automatic clipping (AUTO-S)",
         epsilon=3.0, published=98.7, key="scatternet-automatic/mnist", command=AUTO_CMD,
         baseline="scatternet/mnist"),
    dict(paper=AUTO_S, dataset="Fashion-MNIST",
         model="ScatterNet + linear, automatic clipping (AUTO-S)", epsilon=3.0, published=89.7,
         key="scatternet-automatic/fashion-mnist",
         command=AUTO_CMD.replace("mnist", "fashion-mnist"), baseline="scatternet/fashion-mnist",
         why="CPU, about 3 min of CPU per seed"),
    dict(paper=TB, dataset="MNIST", model="end-to-end tanh CNN", epsilon=3.0, published=98.1,
         key="opacus_mnist/tb_cnn", command=f"{OPACUS_EXAMPLE_CMD} tb_cnn",
         why="40 epochs × 3 seeds ≈ 33 min of CPU (4 688 DP-SGD steps of a CNN at batch 512 a "
         "seed, 11 min of CPU each here)", time_key="time/tb_cnn"),
    dict(paper=TB, dataset="Fashion-MNIST", model="end-to-end tanh CNN", epsilon=3.0,
         published=86.0, key="opacus_mnist/tb_cnn_fmnist",
         command=f"{OPACUS_EXAMPLE_CMD} tb_cnn_fmnist",
         why="40 epochs × 3 seeds (1 172 DP-SGD steps of a CNN at batch 2 048 a seed, 20.5 min "
         "of CPU each here before the shifted-maximum pooling)"),
    dict(paper=TB, dataset="MNIST", model="ScatterNet + CNN", epsilon=3.0, published=98.7,
         key="scatternet-cnn/mnist",
         command="python -m experiments.scatternet --full --head cnn --dataset mnist",
         why="3 seeds × about 5 min of CPU"),
    dict(paper=TB, dataset="Fashion-MNIST", model="ScatterNet + CNN", epsilon=3.0,
         published=89.0, key="scatternet-cnn/fashion-mnist",
         command="python -m experiments.scatternet --full --head cnn --dataset fashion-mnist",
         why="3 seeds × about 9 min of CPU"),
    dict(paper=OPACUS, dataset="MNIST", model="SampleConvNet, non-private", epsilon=None,
         published=98.94, key="opacus_mnist/opacus_example_nonprivate",
         command=f"{OPACUS_EXAMPLE_CMD} opacus_example_nonprivate",
         why="20 epochs × 3 seeds not run here", time_key="time/opacus_example_nonprivate"),
    dict(paper=OPACUS, dataset="MNIST", model="SampleConvNet", epsilon=6.86, published=97.09,
         key="opacus_mnist/opacus_example_sigma0.7",
         command=f"{OPACUS_EXAMPLE_CMD} opacus_example_sigma0.7",
         why="45 epochs × 3 seeds ≈ 50 min of CPU at the 22 s of CPU an epoch measured for "
         "σ = 1.3 here"),
    dict(paper=OPACUS, dataset="MNIST", model="SampleConvNet", epsilon=2.91, published=96.78,
         key="opacus_mnist/opacus_example_sigma1.1",
         command=f"{OPACUS_EXAMPLE_CMD} opacus_example_sigma1.1",
         why="60 epochs × 3 seeds ≈ 66 min of CPU at the 22 s of CPU an epoch measured for "
         "σ = 1.3 here"),
    dict(paper=OPACUS, dataset="MNIST", model="SampleConvNet", epsilon=1.16, published=94.63,
         key="opacus_mnist/opacus_example", command=f"{OPACUS_EXAMPLE_CMD} opacus_example",
         why="15 epochs not run here", time_key="time/opacus_example"),
)  # fmt: skip


def machine() -> str:
    """A short description of this machine: CPU model, cores, OS (and the GPU when there is one)."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            names = [ln.split(":", 1)[1].strip() for ln in handle if ln.startswith("model name")]
        model = names[0] if names else model
    except OSError:
        pass
    try:
        import jax

        devices = {d.device_kind for d in jax.devices()}
    except Exception:  # noqa: BLE001 - a description, never a failure
        devices = set()
    return f"{model}, {os.cpu_count()} cores, {platform.system()}; jax devices: {sorted(devices)}"


def _scatternet_key(run: dict) -> str:
    """``scatternet/<data set>`` for flat clipping of the linear head (runs recorded before the
    options have no ``clip_rule`` or ``head``), ``scatternet-automatic/<data set>`` for automatic
    clipping, ``scatternet-cnn/<data set>`` for the CNN head."""
    rule, head = run.get("clip_rule", "flat"), run.get("head", "linear")
    if head != "linear":
        return f"scatternet-{head}/{run['dataset']}"
    return (
        f"scatternet/{run['dataset']}" if rule == "flat" else f"scatternet-{rule}/{run['dataset']}"
    )


def rows_from_scatternet(payload: dict, command: str) -> list[dict]:
    """Measured rows (one per data set and clip rule) from a ``scatternet.json`` of a run."""
    out = []
    for key in dict.fromkeys(_scatternet_key(r) for r in payload["runs"]):
        runs = [r for r in payload["runs"] if _scatternet_key(r) == key]
        flag = " --full" if payload["size"] == "full" else ""
        row_command = command  # the flat linear head's; the options name their own
        if runs[0].get("head", "linear") != "linear":
            row_command = (f"python -m experiments.scatternet{flag} --head {runs[0]['head']} "
                           f"--dataset {runs[0]['dataset']}")  # fmt: skip
        elif runs[0].get("clip_rule", "flat") != "flat":
            row_command = (f"python -m experiments.scatternet{flag} --clip-rule "
                           f"{runs[0]['clip_rule']} --dataset {runs[0]['dataset']}")  # fmt: skip
        out.append(
            dict(key=key, protocol=payload["size"],
                 accuracies=[100 * r["test_accuracy"] for r in runs],
                 seeds=[r["seed"] for r in runs], epsilon=runs[0]["epsilon"],
                 delta=runs[0]["delta"], steps=runs[0]["steps"],
                 wall_seconds=[r["seconds"] for r in runs],
                 cpu_seconds=[r.get("cpu_seconds") for r in runs], command=row_command,
                 **_clip_settings(runs[0]))
        )  # fmt: skip
    return out


def _clip_settings(run: dict) -> dict:
    """The clip rule and its settings of an automatic-clipping run (nothing for flat runs)."""
    if run.get("clip_rule", "flat") == "flat":
        return {}
    names = ("clip_rule", "l2_clip_norm", "gamma", "learning_rate")
    return {name: run[name] for name in names}


def rows_from_opacus_mnist(payload: dict, command: str) -> list[dict]:
    """Rows from ``opacus_mnist.json`` files (their rows pooled): per setting, a time-to-accuracy
    row (``time/<setting>``: both frameworks, the first seed both ran) and, at the full scale,
    dpjax's accuracy row over its seeds (``opacus_mnist/<setting>``, as the ScatterNet rows)."""
    out = []
    for setting in dict.fromkeys(r["setting"] for r in payload["rows"]):
        mine = [r for r in payload["rows"] if r["setting"] == setting]
        out += _time_row(setting, mine, payload["size"], command)
        dpjax = [r for r in mine if r["framework"] == "dpjax"]
        if payload["size"] == "full" and dpjax:
            out.append(_accuracy_row(setting, dpjax))
    return out


def _time_row(setting: str, rows: list[dict], size: str, command: str) -> list[dict]:
    """The time-to-accuracy row of ``setting``: both frameworks at the first seed both ran
    (none when only one framework ran)."""
    both = [s for s in dict.fromkeys(r["seed"] for r in rows)
            if {r["framework"] for r in rows if r["seed"] == s} >= {"dpjax", "opacus"}]  # fmt: skip
    if not both:
        return []
    runs = {r["framework"]: r for r in rows if r["seed"] == both[0]}
    frameworks = {
        name: dict(accuracy=100 * r["test_accuracy"], epsilon=r["epsilon"],
                   accountant=r["accountant"], wall_seconds=r["seconds"],
                   cpu_seconds=r["cpu_seconds"], threads=r.get("threads"))
        | ({"init": _init(setting, [r])} if name == "dpjax" else {})
        for name, r in runs.items()
    }  # fmt: skip
    first = runs["dpjax"]
    if size == "full":  # one setting and seed, both frameworks
        command = f"python -m experiments.opacus_mnist --full --setting {setting} --seed {both[0]}"
    return [dict(key=f"time/{setting}", protocol=size, steps=first["steps"],
                 epochs=first["epochs"], seed=both[0], frameworks=frameworks,
                 command=command)]  # fmt: skip


def _init(setting: str, runs: list[dict]) -> str:
    """The initialiser dpjax's ``runs`` used: one for all of them (a run written before
    ``opacus_mnist`` recorded it used flax's default, the only one then)."""
    inits = sorted({r.get("init", "flax") for r in runs})
    if len(inits) != 1:
        raise ValueError(f"sources must hold runs of one init for {setting}; got {inits}")
    return inits[0]


def _opacus_command(setting: str, init: str) -> str:
    """The command of one seed of ``setting`` (``--init`` when not the setting's default)."""
    from experiments.opacus_mnist import SETTINGS

    default = SETTINGS.get(setting, {}).get("init")
    return f"{OPACUS_EXAMPLE_CMD} {setting}" + ("" if init == default else f" --init {init}")


def _accuracy_row(setting: str, runs: list[dict]) -> dict:
    """dpjax's full-protocol accuracies of ``setting`` over its seeds (one run per seed), with
    the initialiser they ran (and the per-epoch test curves when the runs recorded them)."""
    seeds = [r["seed"] for r in runs]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"sources must hold one dpjax run per seed of {setting}; got {seeds}")
    init = _init(setting, runs)
    curves = {"curves": [r["curve"] for r in runs]} if all("curve" in r for r in runs) else {}
    return dict(key=f"opacus_mnist/{setting}", protocol="full",
                accuracies=[100 * r["test_accuracy"] for r in runs], seeds=seeds,
                epsilon=runs[0]["epsilon"], delta=runs[0].get("delta", 1e-5) if
                runs[0]["epsilon"] is not None else None, steps=runs[0]["steps"],
                wall_seconds=[r["seconds"] for r in runs],
                cpu_seconds=[r["cpu_seconds"] for r in runs], init=init, **curves,
                command=_opacus_command(setting, init))  # fmt: skip


# What ``record`` reads: file name -> (rows maker, experiment name).
SOURCES = {
    "scatternet.json": (rows_from_scatternet, "scatternet"),
    "opacus_mnist.json": (rows_from_opacus_mnist, "opacus_mnist"),
}


def record(*sources: pathlib.Path, results_file: pathlib.Path | None = None,
           commit: str | None = None, machine_note: str | None = None,
           notes: dict[str, str] | None = None) -> list[dict]:  # fmt: skip
    """Merge the rows measured in ``sources`` into ``results_file`` (default
    :data:`RESULTS_FILE`), each stamped with today's date, this machine (with ``machine_note``,
    e.g. "CPU, 2 cores, shared") and the commit(s) of the code that ran (the sources'
    ``commit``, all of them when seeds ran at different commits, else ``commit``); a row with
    the same key is replaced. Sources are ``scatternet.json`` files of runs of one scale (e.g.
    one per seed: their runs are pooled) and/or ``opacus_mnist.json`` files (time to accuracy;
    dpjax's accuracy over seeds at the full scale). ``notes`` maps a row's key to a sentence
    stored with it (e.g. why it has fewer seeds than a row needs)."""
    by_name: dict[str, list[dict]] = {}
    for source in sources:
        name = pathlib.Path(source).name
        if name not in SOURCES:
            raise ValueError(
                f"sources must be {' or '.join(SOURCES)} files written by a run; got {source}"
            )
        by_name.setdefault(name, []).append(json.loads(pathlib.Path(source).read_text()))
    if not by_name:
        raise ValueError("sources must name at least one results file")
    commits = sorted({p.get("commit") for ps in by_name.values() for p in ps} - {None})
    new = []
    for name, payloads in by_name.items():
        if len({p["size"] for p in payloads}) != 1:
            raise ValueError("sources must be one or more runs of the same scale (quick or full)")
        items = "runs" if name == "scatternet.json" else "rows"
        pooled = {"size": payloads[0]["size"], items: [r for p in payloads for r in p[items]]}
        make_rows, experiment = SOURCES[name]
        flag = " --full" if pooled["size"] == "full" else ""
        new += make_rows(pooled, f"python -m experiments {experiment}{flag}")
    here = machine() + (f" ({machine_note})" if machine_note else "")
    stamp = dict(date=datetime.date.today().isoformat(), machine=here)
    code = ", ".join(commits) if commits else commit  # seeds run at several commits: all
    new = [row | stamp | ({"commit": code} if code else {}) for row in new]
    notes = notes or {}
    unknown = set(notes) - {row["key"] for row in new}
    if unknown:
        raise ValueError(f"notes must name recorded rows; got {sorted(unknown)}")
    new = [row | ({"note": notes[row["key"]]} if row["key"] in notes else {}) for row in new]
    old = load_results(results_file)
    keys = {row["key"] for row in new}
    merged = [row for row in old if row["key"] not in keys] + new
    target = pathlib.Path(RESULTS_FILE if results_file is None else results_file)
    target.write_text(json.dumps(dict(rows=merged), indent=1) + "\n")
    return new


def load_results(results_file: pathlib.Path | None = None) -> list[dict]:
    """The measured rows of ``results_file`` (default :data:`RESULTS_FILE`; none when absent)."""
    path = pathlib.Path(RESULTS_FILE if results_file is None else results_file)
    return json.loads(path.read_text())["rows"] if path.is_file() else []


def _mean_sd(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f} (1 seed)"
    return f"{np.mean(values):.2f} ± {np.std(values, ddof=1):.2f} ({len(values)} seeds)"


def verdict(published: float, values: list[float]) -> str:
    """Whether the row holds: the paper's number inside dpjax's 95% Student-t CI of the mean,
    or below it (dpjax higher); else by how many points dpjax's CI lies below it."""
    from experiments.erm_adult import mean_ci

    if len(values) < 2:
        return "— (1 seed: no CI)"
    _, low, high = mean_ci(values)
    ci = f"95% CI [{low:.2f}, {high:.2f}]"
    if published <= high:
        return f"✓ {ci} ∋ paper" if published >= low else f"✓ {ci}, above the paper"
    return f"✗ {ci}, {published - high:.2f} pt below the paper"


def table(measured: list[dict]) -> str:
    """The Markdown table: every row of :data:`ROWS`, measured or "not run here"."""
    by_key = {row["key"]: row for row in measured}
    lines = [
        "| paper | data set | model | ε (paper) | published % | dpjax % (mean ± sd) "
        "| holds | ε (dpjax) | protocol | wall time | run on |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in ROWS:
        eps = "∞ (non-private)" if row["epsilon"] is None else f"{row['epsilon']:g}"
        head = f"| {row['paper']} | {row['dataset']} | {row['model']} | {eps} | {row['published']}"
        got = by_key.get(row["key"])
        timed = by_key.get(row.get("time_key"))
        if got is None and timed is not None:
            lines.append(f"{head} | {_reduced_cells(timed)} |")
            continue
        if got is None:
            why = row.get("why", "needs GPU")
            run = f"`{row['command']}`" if row["command"] else "no command yet"
            lines.append(f"{head} | not run here: {why} ({run}) | | | | | |")
            continue
        cpu = got.get("cpu_seconds") or [None] * len(got["wall_seconds"])
        wall = ", ".join(
            f"{w / 60:.1f} min" + (f" (CPU {c / 60:.1f} min)" if c is not None else "")
            for w, c in zip(got["wall_seconds"], cpu, strict=True)
        )
        eps_dpjax = "∞" if got["epsilon"] is None else f"{got['epsilon']:.3f}"
        lines.append(
            f"{head} | {_mean_sd(got['accuracies'])}{_opacus_beside(timed)} "
            f"| {_holds(row['published'], got['accuracies'])}{_remarks(got)} | {eps_dpjax} "
            f"| {got['protocol']} (`{got['command']}`) | {wall} | {_run_on(got)} |"
        )
    return "\n".join(lines) + "\n"


def _holds(published: float, values: list[float]) -> str:
    """The "holds" cell: :func:`verdict` with three seeds or more; with fewer, no pass or fail
    (a partial row), its CI shown for information."""
    said = verdict(published, values)
    if len(values) >= SEEDS_FOR_A_ROW or not said.startswith(("✓", "✗")):
        return said
    return f"— (no verdict with {len(values)} seeds: {said[2:]})"


def _remarks(got: dict) -> str:
    """The "PARTIAL: k of 3 seeds" mark of a row with fewer seeds than a row needs, then its
    recorded note (why it is partial, or a measured reason it lies below the paper)."""
    parts = []
    if len(got["accuracies"]) < SEEDS_FOR_A_ROW:
        parts.append(f"PARTIAL: {len(got['accuracies'])} of {SEEDS_FOR_A_ROW} seeds")
    if got.get("note"):
        parts.append(got["note"])
    return "".join(f"; {part}" for part in parts)


def _opacus_beside(timed: dict | None) -> str:
    """Opacus's accuracy for the same full-protocol run, when it was run here."""
    if timed is None or timed["protocol"] != "full" or "opacus" not in timed["frameworks"]:
        return ""
    return f"; Opacus {timed['frameworks']['opacus']['accuracy']:.2f} (seed {timed['seed']})"


def _run_on(got: dict) -> str:
    commits = ", ".join(c.strip()[:12] for c in got.get("commit", "").split(",") if c.strip())
    commit = f", code {commits}" if commits else ""
    return f"{got['date']}, {got['machine']}{commit}"


def baseline_comparisons(measured: list[dict]) -> list[str]:
    """One line per row of :data:`ROWS` with a ``baseline`` (a variant of a measured row, e.g.
    automatic clipping of the flat-clipping run, same σ, batch, steps and ε): the difference of
    the mean accuracies and its 95% Welch interval, when both were measured."""
    from scipy import stats

    by_key = {row["key"]: row for row in measured}
    lines = []
    for row in ROWS:
        got, base = by_key.get(row["key"]), by_key.get(row.get("baseline"))
        if got is None or base is None:
            continue
        a, b = np.asarray(got["accuracies"], float), np.asarray(base["accuracies"], float)
        diff = float(a.mean() - b.mean())
        interval = ""
        if len(a) > 1 and len(b) > 1:
            va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
            se = float(np.sqrt(va + vb))
            dof = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
            half = float(stats.t.ppf(0.975, dof)) * se
            interval = f", 95% Welch CI [{diff - half:+.2f}, {diff + half:+.2f}]"
        settings = (
            f" (R = {got['l2_clip_norm']:g}, γ = {got['gamma']:g}, lr = {got['learning_rate']:g})"
            if "l2_clip_norm" in got
            else ""
        )
        lines.append(
            f"- {row['dataset']}, {row['model']}{settings} against the measured `{base['key']}` "
            f"row (same σ, batch, steps, δ; ε {got['epsilon']:.3f} vs {base['epsilon']:.3f}): "
            f"{a.mean():.2f} vs {b.mean():.2f}, difference {diff:+.2f} pt{interval}."
        )
    return lines


def _minutes(row: dict) -> str:
    return f"{row['wall_seconds'] / 60:.1f} min (CPU {row['cpu_seconds'] / 60:.1f} min)"


def _reduced_cells(timed: dict) -> str:
    """The main table's cells for a row measured only at a reduced scale beside Opacus."""
    mine, theirs = timed["frameworks"]["dpjax"], timed["frameworks"].get("opacus")
    opacus = f"; Opacus {theirs['accuracy']:.2f}" if theirs else ""
    times = f"dpjax {_minutes(mine)}" + (f"; Opacus {_minutes(theirs)}" if theirs else "")
    return (
        f"{mine['accuracy']:.2f}{opacus} (1 seed, {timed['epochs']:.2f} epoch: reduced) "
        f"| — (reduced scale: NOT the paper's protocol) | {mine['epsilon']:.3f} "
        f"| {timed['steps']} steps, reduced (`{timed['command']}`) | {times} "
        f"| {timed['date']}, {timed['machine']}"
    )


def time_table(measured: list[dict]) -> str:
    """Time to accuracy, dpjax beside Opacus: one line per setting and framework."""
    timed = [row for row in measured if row["key"].startswith("time/")]
    if not timed:
        return ""
    lines = [
        "| setting | scale | framework | test accuracy % | ε at δ = 1e-5 (accountant) "
        "| steps (epochs) | wall time | CPU time | run on |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in timed:
        label = row["key"].removeprefix("time/")
        scale = "full" if row["protocol"] == "full" else "quick: NOT the paper's protocol"
        for name, got in row["frameworks"].items():
            lines.append(
                f"| {label} | {scale} | {name} | {got['accuracy']:.2f} "
                f"| {'∞' if got['epsilon'] is None else format(got['epsilon'], '.3f')} "
                f"({got['accountant']}) "
                f"| {row['steps']} ({row['epochs']:.2f}) | {got['wall_seconds']:.0f} s "
                f"| {got['cpu_seconds']:.0f} s | {row['date']}, {row['machine']} |"
            )
    return "\n".join(lines) + "\n"


def markdown(measured: list[dict]) -> str:
    return "\n".join(
        [
            TITLE,
            "",
            "Published accuracies at (ε, δ = 1e-5) next to dpjax's on the same data, read from "
            f"the committed results file `experiments/{RESULTS_FILE.name}` (full runs, with the "
            "date and machine they ran on). dpjax's ε is its own accounting (PLD, add/remove-"
            "one, Poisson sampling) for the paper's noise multiplier; the papers used RDP. "
            "Rows not run here give the command to run them. Wall times were measured on a "
            "machine shared with other jobs (at first load 8–16 on 2 cores; later one run "
            "pinned to each core): the CPU time beside them is the better measure of cost. "
            "The ScatterNet rows report the model after the protocol's last step, with no "
            "choice of epoch on the test set.",
            "",
            table(measured),
            *_baseline_section(measured),
            *_time_section(measured),
        ]
    )


def _baseline_section(measured: list[dict]) -> list[str]:
    lines = baseline_comparisons(measured)
    if not lines:
        return []
    return [
        "Automatic clipping (AUTO-S, Bu et al. 2023: each example's gradient scaled to "
        "R·g/(‖g‖ + γ)) with R = 1, γ = 0.01 and lr = lr_flat·C_flat/R, fixed before any test "
        "accuracy was seen (no tuning); everything else as the flat-clipping run. Its "
        '"holds" column compares with Tramèr & Boneh\'s flat-clipping number; here it is '
        "compared with the flat-clipping row measured on the same machine:",
        "",
        *lines,
        "",
    ]


def _time_section(measured: list[dict]) -> list[str]:
    body = time_table(measured)
    if not body:
        return []
    return [
        "### Time to accuracy: dpjax beside Opacus (same model, σ, C, q, steps)",
        "",
        "Each setting trained by `dpjax.make_private` and by Opacus (`PrivacyEngine`, Poisson "
        "sampling, per-sample hooks) one after the other on the same machine "
        "(`python -m experiments opacus_mnist`; `experiments/opacus_mnist.py` states the "
        "models and hyperparameters). Wall and process CPU time of the training loop "
        "(dpjax's JIT compilation included; data loading and evaluation excluded), test "
        "accuracy of the final model. ε is each framework's own accountant for the same σ "
        "and steps (Opacus samples at q = 1/⌈n/b⌉, 0.7 % below b/n for batch 512). The "
        "non-private baseline is plain SGD on both sides (optax; torch without the "
        "`PrivacyEngine`): no clipping, no noise, ε = ∞.",
        "",
        body,
        *time_ratios(measured),
        *projections(measured),
    ]


def time_ratios(measured: list[dict]) -> list[str]:
    """One line per time-to-accuracy row that has both frameworks: dpjax's time over Opacus's
    (CPU and wall; the two ran in the same session on the same machine), with the row's note."""
    lines = []
    for row in measured:
        frameworks = row.get("frameworks", {})
        if not row["key"].startswith("time/") or not {"dpjax", "opacus"} <= set(frameworks):
            continue
        mine, theirs = frameworks["dpjax"], frameworks["opacus"]
        cpu = mine["cpu_seconds"] / theirs["cpu_seconds"]
        wall = mine["wall_seconds"] / theirs["wall_seconds"]
        note = f"; {row['note']}" if row.get("note") else ""
        lines.append(
            f"- {row['key'].removeprefix('time/')} ({row['protocol']}, seed {row['seed']}): "
            f"dpjax / Opacus = {cpu:.2f} in CPU time, {wall:.2f} in wall time{note}."
        )
    return ["", *lines, ""] if lines else []


SEEDS_FOR_A_ROW = 3


def paper_epochs(setting: str) -> int:
    """The paper's epochs for a setting of :mod:`experiments.opacus_mnist`."""
    from experiments.opacus_mnist import SETTINGS

    return SETTINGS[setting]["epochs"]


def projections(measured: list[dict]) -> list[str]:
    """Why a reduced run stands in for the paper's protocol: the measured time of one epoch,
    scaled to the paper's epochs and three seeds (dpjax's; JIT compilation counted once per
    epoch, so an upper bound)."""
    lines = []
    full = {row["key"] for row in measured}
    for row in measured:
        setting = row["key"].removeprefix("time/")
        if not row["key"].startswith("time/") or row["protocol"] == "full":
            continue
        if f"opacus_mnist/{setting}" in full:  # the paper's protocol was run: no projection
            continue
        mine = row["frameworks"]["dpjax"]
        epochs = paper_epochs(setting)
        scale = epochs * SEEDS_FOR_A_ROW / row["epochs"]
        lines.append(
            f"- {setting}: the paper's {epochs} epochs × {SEEDS_FOR_A_ROW} "
            f"seeds would take dpjax ≈ {mine['cpu_seconds'] * scale / 3600:.1f} h of CPU, "
            f"≈ {mine['wall_seconds'] * scale / 3600:.1f} h wall at this run's share of the "
            "shared machine (measured above, scaled by the number of epochs): not run here."
        )
    return ["", *lines, ""] if lines else []


PLOT_FILE = "published.png"


def plot_points(measured: list[dict]) -> list[dict]:
    """The points of the accuracy-against-ε plot: every paper's (ε, accuracy) with a finite ε,
    and dpjax's measured rows at dpjax's ε (full protocol: mean and 95% CI, or the one seed
    marked as such; reduced scale: the one run, marked reduced)."""
    from experiments.erm_adult import mean_ci

    by_key = {row["key"]: row for row in measured}
    points = []
    for row in ROWS:
        if row["epsilon"] is None:
            continue
        name = f"{row['model']} ({row['paper']})"
        points.append(dict(dataset=row["dataset"], source="paper", label=name,
                           epsilon=row["epsilon"], accuracy=row["published"]))  # fmt: skip
        got = by_key.get(row["key"])
        if got is not None and len(got["accuracies"]) < 2:  # no CI from one seed
            points.append(dict(dataset=row["dataset"], source="dpjax, 1 seed", label=name,
                               epsilon=got["epsilon"], accuracy=got["accuracies"][0]))  # fmt: skip
        elif got is not None:
            mean, low, high = mean_ci(got["accuracies"])
            points.append(dict(dataset=row["dataset"], source="dpjax", label=name,
                               epsilon=got["epsilon"], accuracy=mean, low=low,
                               high=high))  # fmt: skip
        timed = by_key.get(row.get("time_key"))
        if got is None and timed is not None:
            mine = timed["frameworks"]["dpjax"]
            points.append(dict(dataset=row["dataset"], source="dpjax, reduced", label=name,
                               epsilon=mine["epsilon"], accuracy=mine["accuracy"]))  # fmt: skip
    return points


def plot(path: pathlib.Path, measured: list[dict]) -> str | None:
    """Accuracy against ε, one panel per data set: the papers' points (open) and dpjax's
    (filled, 95% CI bars; diamonds for one seed; crosses for reduced-scale runs), legends below
    the panels. None without matplotlib."""
    from experiments.report import _plt

    plt = _plt()
    if plt is None:
        return None
    points = plot_points(measured)
    datasets = list(dict.fromkeys(p["dataset"] for p in points))
    labels = list(dict.fromkeys(p["label"] for p in points))
    fig, axes = plt.subplots(1, len(datasets), figsize=(6 * len(datasets), 4), squeeze=False)
    from matplotlib.ticker import FuncFormatter, NullFormatter

    for ax, dataset in zip(axes[0], datasets, strict=True):
        seen: set[str] = set()
        for p in (p for p in points if p["dataset"] == dataset):
            color = f"C{labels.index(p['label'])}"
            key = (p["label"], p["source"])
            p = p | dict(label=p["label"] if key not in seen else None)  # one legend entry
            seen.add(key)
            if p["source"] == "paper":
                ax.plot(p["epsilon"], p["accuracy"], "o", mfc="none", color=color, ms=8,
                        label=p["label"] and f"{p['label']}: paper")  # fmt: skip
            elif p["source"] == "dpjax":
                ax.errorbar(p["epsilon"], p["accuracy"], capsize=3, fmt="o", color=color,
                            yerr=[[p["accuracy"] - p["low"]], [p["high"] - p["accuracy"]]],
                            label=p["label"] and f"{p['label']}: dpjax (95% CI)")  # fmt: skip
            elif p["source"] == "dpjax, 1 seed":
                ax.plot(p["epsilon"], p["accuracy"], "D", color=color, ms=6,
                        label=p["label"] and f"{p['label']}: dpjax, 1 seed (partial)")  # fmt: skip
            else:
                ax.plot(p["epsilon"], p["accuracy"], "x", color=color, ms=8,
                        label=p["label"] and f"{p['label']}: dpjax, reduced")  # fmt: skip
        ax.set_xscale("log")
        ax.set_xticks([0.2, 0.5, 1, 2, 3, 5, 7])
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.margins(y=0.15)
        ax.set_xlabel("ε at δ = 1e-5 (paper: its accountant; dpjax: PLD)")
        ax.set_title(dataset)
        ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.28))  # below
    axes[0][0].set_ylabel("test accuracy %")
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return pathlib.Path(path).name


def run(out_dir: pathlib.Path, *, full: bool = False, seed: int = 0):
    """Render the table from :data:`RESULTS_FILE` (nothing is trained; ``full`` and ``seed`` are
    accepted for the common interface)."""
    del full, seed
    measured = load_results()
    pathlib.Path(out_dir).mkdir(parents=True, exist_ok=True)
    name = plot(pathlib.Path(out_dir) / PLOT_FILE, measured)
    figure = f"\n![accuracy against ε: the papers' points and dpjax's]({name})\n" if name else ""
    return dict(report_md=markdown(measured) + figure,
                verdict=f"{len(measured)} measured rows, {len(ROWS)} rows in all")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """``python -m experiments.published record [--commit C] [--machine-note TEXT]
    [--note KEY=TEXT ...] DIR/{scatternet,opacus_mnist}.json ...``."""
    import argparse

    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] != "record":
        print(
            "usage: python -m experiments.published record [--commit C] [--machine-note TEXT] "
            "[--note KEY=TEXT] DIR/{scatternet,opacus_mnist}.json ..."
        )
        return 2
    parser = argparse.ArgumentParser(prog="python -m experiments.published record")
    parser.add_argument("sources", type=pathlib.Path, nargs="+")
    parser.add_argument("--commit", help="the code's commit when the sources do not name it")
    parser.add_argument("--machine-note", help='e.g. "CPU, 2 cores, shared"')
    parser.add_argument("--note", action="append", default=[], help="KEY=TEXT")
    args = parser.parse_args(argv[1:])
    notes = dict(item.split("=", 1) for item in args.note)
    rows = record(*args.sources, commit=args.commit, machine_note=args.machine_note, notes=notes)
    for row in rows:
        print(f"[published] recorded {row['key']} ({row['protocol']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
