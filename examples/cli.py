"""The examples' command lines, built without importing the examples.

An example imports JAX, flax and dpjax when it is imported; its console script parses the
command line here first (``dpjax/_cli.py``), so ``--help`` and a wrong argument answer at once.
Each parser's description is its example's module docstring, read from the source file.
"""

from __future__ import annotations

import argparse
import ast
import pathlib

HERE = pathlib.Path(__file__).resolve().parent


def _docstring(example: str) -> str:
    """The module docstring of ``examples/<example>.py`` (for ``--help``), not imported."""
    tree = ast.parse((HERE / f"{example}.py").read_text(encoding="utf-8"))
    return (ast.get_docstring(tree) or "").replace("``", "`")


def digits_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """``dpjax-example-digits``: ``--help`` shows flax_digits.py's docstring."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=_docstring("flax_digits"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--target-epsilon", type=float, default=3.0, help="ε of the whole run (default 3)"
    )
    parser.add_argument(
        "--delta", type=float, default=1e-5, help="δ of the whole run, add/remove-one (1e-5)"
    )
    parser.add_argument(
        "--epochs", type=float, default=20.0, help="passes over the training set (default 20)"
    )
    parser.add_argument("--batch", type=int, default=64, help="expected batch size q·n (64)")
    parser.add_argument(
        "--clip", type=float, default=1.0, help="per-example L2 clip norm C (default 1)"
    )
    parser.add_argument("--lr", type=float, default=0.1, help="SGD learning rate (default 0.1)")
    parser.add_argument(
        "--dropout", type=float, default=0.1, help="dropout rate of the hidden layer (0.1)"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the split, the model and the noise (0)"
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return parser


def distributed_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """``dpjax-example-distributed``: ``--help`` shows distributed_dp_sgd.py's docstring."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=_docstring("distributed_dp_sgd"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--coordinator", help="host:port of process 0 (default: auto-detect)")
    parser.add_argument(
        "--num-processes", type=int, help="processes in the job (with --coordinator)"
    )
    parser.add_argument(
        "--process-id", type=int, help="this process's index, 0 .. num-processes - 1"
    )
    parser.add_argument("--cpu-devices", type=int, help="CPU devices per process (CPU only)")
    parser.add_argument(
        "--noise-multiplier", type=float, default=1.0, help="σ of the DP-SGD noise (default 1)"
    )
    parser.add_argument("--x64", action="store_true", help="float64 (to compare to a reference)")
    parser.add_argument(
        "--check-key-mismatch", action="store_true", help="also check a per-process key is refused"
    )
    parser.add_argument("--spawn", type=int, help="launch this many processes on this machine")
    return parser
