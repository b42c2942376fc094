"""Command line: ``python -m experiments {all,<name>} [--full] [--seed N] [--out DIR]``.

``--size tiny|quick|full`` picks a scale for experiments whose ``run`` accepts ``size`` (the
rates: ``quick`` is the default of ``make reproduce``, ``--full`` equals ``--size full``).
"""

from __future__ import annotations

import argparse
import inspect
import pathlib
import sys
import time

from experiments import registry


def build_parser() -> argparse.ArgumentParser:
    lines = [f"  {name}: {registry.load(name).DESCRIPTION}" for name in registry.EXPERIMENTS]
    parser = argparse.ArgumentParser(
        prog="python -m experiments",
        description="Reproduce the lectures' results with dpjax.",
        epilog="experiments:\n" + ("\n".join(lines) or "  (none yet)"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("name", help="'all' or one experiment name")
    parser.add_argument("--full", action="store_true", help="run the full grid (slow)")
    parser.add_argument("--seed", type=int, default=0, help="root seed (reproducible runs)")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("results"))
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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    names = list(registry.ORDER) if args.name == "all" else [args.name]
    args.out.mkdir(parents=True, exist_ok=True)
    sections = []
    for name in names:
        start = time.perf_counter()
        print(f"[experiments] running {name} ...", flush=True)
        summary = _run_one(name, args)
        print(f"[experiments] {name} done in {time.perf_counter() - start:.1f}s", flush=True)
        sections.append(summary.get("report_md", ""))
    if args.name == "all":
        report = args.out / "REPORT.md"
        body = "\n\n".join(s for s in sections if s) or "No experiments are registered yet.\n"
        report.write_text("# dpjax reproduction report\n\n" + body + "\n")
        print(f"[experiments] report: {report.resolve()}")
        print(f"[experiments] plots and JSON: {args.out.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
