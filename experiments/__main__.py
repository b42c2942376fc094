"""Command line: ``python -m experiments {all,<name>} [--size S] [--full] [--seed N] [--out DIR]``.

The same program is the console script ``dpjax-experiments`` (from any directory once dpjax is
installed; see ``dpjax/_cli.py``).

``--size tiny|quick|full`` picks a scale for experiments whose ``run`` accepts ``size`` (the
rates: ``quick`` is the default of ``make reproduce``, ``--full`` equals ``--size full``).

Every run writes ``DIR/REPORT.md``, one section per experiment, each between the markers
``<!-- experiment: NAME -->`` and ``<!-- end: NAME -->``. ``all`` rewrites the whole file with
every registered experiment's section (in ``registry.ORDER``); a single experiment replaces its
own section in an existing ``REPORT.md`` and keeps the others (or starts the file), so
``rates`` then ``audit`` into one folder gives the same report as ``all``. Any registered module
whose ``run`` returns ``{"report_md": ...}`` gets a section; nothing here names an experiment.
After each experiment the command prints the files it wrote and, where the summary has one, its
``verdict`` line (the rates: ``N/M rows ✓``, counting rows whose 95% CI contains the theory's
slope and whose bound held). ``--jobs J`` runs ``all``'s experiments in J spawned processes
(each experiment is seeded on its own, so the results do not depend on J).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import inspect
import multiprocessing
import pathlib
import re
import sys
import time

from experiments import registry

REPORT_NAME = "REPORT.md"
REPORT_TITLE = "# dpjax reproduction report"


PROG = "python -m experiments"  # the console script `dpjax-experiments` passes its own name


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1; got {value}")
    return value


def _experiment_lines() -> list[str]:
    """``  name: what it measures`` per experiment (read without importing the experiments)."""
    lines = []
    for name in registry.EXPERIMENTS:
        text = registry.description(name).removeprefix(f"{name}: ")
        by_name = " (run by name only; not part of 'all')" if name in registry.BY_NAME_ONLY else ""
        lines.append(f"  {name}: {text.removesuffix(' (run by name)')}{by_name}")
    return lines


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The command line (imports no experiment: ``--help`` and argument errors are instant)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=(
            "Reproduce dpjax's experiments: excess-risk rates of private convex ERM, privacy\n"
            "audits, composition, utility against other libraries, private tuning,\n"
            "fine-tuning and correlated noise. Writes JSON, PNG plots and a section of\n"
            f"{REPORT_NAME} per experiment under --out, and prints where they are.\n\n"
            f"`{prog} all` rewrites {REPORT_NAME}; one experiment replaces only its own\n"
            "section and keeps the others, so running them one by one into the same --out\n"
            "gives the same report."
        ),
        epilog="experiments:\n" + ("\n".join(_experiment_lines()) or "  (none yet)"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "name",
        metavar="NAME",
        choices=("all", *registry.EXPERIMENTS),
        help=(
            f"'all' (every experiment; rewrites {REPORT_NAME}) or one experiment name, listed "
            f"below (updates its own section of {REPORT_NAME}, keeps the others)"
        ),
    )
    parser.add_argument("--full", action="store_true", help="run the full grid (slow)")
    parser.add_argument("--seed", type=int, default=0, help="root seed (reproducible runs)")
    parser.add_argument(
        "--out",
        type=pathlib.Path,
        default=pathlib.Path("results"),
        help=f"output folder for JSON, PNG and {REPORT_NAME} (created; default: results)",
    )
    parser.add_argument(
        "--jobs",
        type=_positive_int,
        default=1,
        help=(
            "experiments run at once, each in its own process (default 1; `make reproduce` "
            "uses 2: the experiments are independent and single-threaded)"
        ),
    )
    parser.add_argument(
        "--size",
        choices=("tiny", "quick", "full"),
        default=None,
        help="scale of the experiments that support it (default quick; --full means full)",
    )
    return parser


def _run_one(name: str, args: argparse.Namespace) -> dict:
    module = registry.load(name)
    kwargs = {"full": args.full, "seed": args.seed}
    if args.size is not None and "size" in inspect.signature(module.run).parameters:
        kwargs["size"] = args.size
    return module.run(args.out, **kwargs)


def _longest_first(names: list[str]) -> list[str]:
    """Submission order for the worker pool: the long experiments first (fewer idle cores)."""
    first = [n for n in registry.LONGEST_FIRST if n in names]
    return first + [n for n in names if n not in first]


def _run_parallel(names: list[str], args: argparse.Namespace, report: pathlib.Path) -> list[str]:
    """Run ``names`` in ``args.jobs`` spawned processes; write each section as it finishes."""
    verdicts: dict[str, str] = {}
    fresh = True
    context = multiprocessing.get_context("spawn")  # JAX is not fork-safe
    with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=context) as pool:
        futures = {}
        for name in _longest_first(names):
            print(f"[experiments] running {name} ...", flush=True)
            child = (registry.EXPERIMENTS[name], args.out, args.full, args.seed, args.size)
            futures[pool.submit(registry.run_module, *child)] = name
        for future in concurrent.futures.as_completed(futures):
            name = futures[future]
            summary = future.result()
            print(f"[experiments] {name} done in {summary['seconds']:.1f}s", flush=True)
            if summary.get("report_md"):
                update_report(report, {name: summary["report_md"]}, replace_all=fresh)
                fresh = False
            if summary.get("verdict"):
                verdicts[name] = f"[experiments] {name}: {summary['verdict']}"
                print(verdicts[name], flush=True)
    return [verdicts[n] for n in names if n in verdicts]


def _begin(name: str) -> str:
    return f"<!-- experiment: {name} -->"


def _end(name: str) -> str:
    return f"<!-- end: {name} -->"


def read_sections(text: str) -> dict[str, str]:
    """The sections of a ``REPORT.md`` written by this command: name -> Markdown body."""
    pattern = re.compile(r"<!-- experiment: (\S+) -->\n(.*?)\n<!-- end: \1 -->", re.DOTALL)
    return {m.group(1): m.group(2) for m in pattern.finditer(text)}


def render_report(sections: dict[str, str]) -> str:
    """The whole ``REPORT.md``: title, then the sections in ``registry.ORDER`` (others last)."""
    order = [n for n in registry.ORDER if n in sections]
    order += [n for n in sections if n not in order]
    body = "\n\n".join(f"{_begin(n)}\n{sections[n].strip()}\n{_end(n)}" for n in order)
    return f"{REPORT_TITLE}\n\n" + (body or "No experiment has written a section yet.") + "\n"


def update_report(path: pathlib.Path, new: dict[str, str], *, replace_all: bool) -> pathlib.Path:
    """Write ``new`` sections into ``path``: alone (``replace_all``) or over the existing ones."""
    old = {} if replace_all or not path.exists() else read_sections(path.read_text())
    path.write_text(render_report(old | new))
    return path


def _snapshot(out: pathlib.Path) -> dict[pathlib.Path, int]:
    return {p: p.stat().st_mtime_ns for p in out.iterdir() if p.is_file()}


def _written(before: dict[pathlib.Path, int], out: pathlib.Path) -> list[str]:
    after = _snapshot(out)
    return sorted(p.name for p, t in after.items() if before.get(p) != t)


def _listing(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", … ({len(names)} files)" if len(names) > limit else "")


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    args = build_parser(prog).parse_args(argv)
    names = list(registry.ORDER) if args.name == "all" else [args.name]
    for name in names:
        registry.load(name)  # an unknown name fails before anything runs
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out.resolve()
    report = args.out / REPORT_NAME
    verdicts = []
    fresh = args.name == "all"  # `all` starts REPORT.md afresh; one experiment updates it
    if args.jobs > 1 and len(names) > 1:
        verdicts = _run_parallel(names, args, report)
        names = []
    for name in names:
        start = time.perf_counter()
        print(f"[experiments] running {name} ...", flush=True)
        before = _snapshot(args.out)
        summary = _run_one(name, args)
        print(f"[experiments] {name} done in {time.perf_counter() - start:.1f}s", flush=True)
        print(f"[experiments] {name} wrote in {out}: {_listing(_written(before, args.out))}")
        section = summary.get("report_md", "")
        if section:  # after each experiment, so an interrupted `all` keeps what finished
            update_report(report, {name: section}, replace_all=fresh)
            fresh = False
        if summary.get("verdict"):
            verdicts.append(f"[experiments] {name}: {summary['verdict']}")
            print(verdicts[-1], flush=True)
    print(f"[experiments] report: {report.resolve()}")
    print(f"[experiments] plots and JSON: {out}")
    for line in verdicts:  # the last line(s): what a reader checks first
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
