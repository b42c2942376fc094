"""Console scripts: the experiments, benchmarks and examples, runnable from any directory.

The command-line programs live in three packages next to ``dpjax/`` in the source tree:
``experiments/`` (``make reproduce``), ``benchmarks/`` (``make bench``) and ``examples/``. Their
names are generic, so they are never installed as top-level packages (they would collide with
other projects' ``experiments`` or ``examples``). Instead ``pyproject.toml`` installs them
under one private folder, ``dpjax_workbench/``, and each console script of
``[project.scripts]`` lands here: it finds the folder that holds the three packages (the source
checkout for an editable install, ``site-packages/dpjax_workbench`` for a wheel), puts it first
on ``sys.path`` of this process only (and on ``PYTHONPATH`` for the worker processes the
benchmarks and the distributed example start), parses the command line with the program's
parser (built without importing JAX, so ``--help`` and argument errors are instant), and calls
the program's ``main``.

* ``dpjax-experiments``: ``python -m experiments`` (``make reproduce``);
* ``dpjax-bench``: ``python -m benchmarks`` (``make bench``);
* ``dpjax-example-digits``: ``python -m examples.flax_digits``;
* ``dpjax-example-distributed``: ``python -m examples.distributed_dp_sgd``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pathlib
import sys

WORKBENCH_PACKAGES = ("experiments", "benchmarks", "examples")
INSTALLED_FOLDER = "dpjax_workbench"  # site-packages/dpjax_workbench/{experiments,...}


def _holds_workbench(folder: pathlib.Path) -> bool:
    return all((folder / name / "__init__.py").is_file() for name in WORKBENCH_PACKAGES)


def _candidates() -> list[pathlib.Path]:
    import dpjax

    found = [pathlib.Path(dpjax.__file__).resolve().parents[1]]  # source checkout, editable
    try:
        spec = importlib.util.find_spec(INSTALLED_FOLDER)
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        found += [pathlib.Path(p).resolve() for p in spec.submodule_search_locations]
    return found


def workbench_root() -> pathlib.Path:
    """The folder holding ``experiments/``, ``benchmarks/`` and ``examples/``.

    Returns:
        The source checkout's root (editable install, or dpjax imported from a checkout), else
        the installed ``dpjax_workbench`` folder.

    Raises:
        SystemExit: when neither holds the three packages (say how to get them).
    """
    for folder in _candidates():
        if _holds_workbench(folder):
            return folder
    raise SystemExit(
        "dpjax: the experiments, benchmarks and examples were not found next to the installed "
        "dpjax nor in site-packages/dpjax_workbench; install dpjax from its source tree "
        "(`pip install -e .` in the checkout) to run this command."
    )


def _inside(module, root: pathlib.Path) -> bool:
    """Whether ``module`` was imported from ``root`` (as sys.path spells it, links unresolved)."""
    path = pathlib.Path(getattr(module, "__file__", None) or "/")
    return root in path.parents or root in path.resolve().parents


def _enter(root: pathlib.Path) -> None:
    """Make ``root``'s packages importable here and in child processes."""
    for name in WORKBENCH_PACKAGES:
        module = sys.modules.get(name)
        if module is not None and not _inside(module, root):
            raise SystemExit(f"dpjax: another package named {name!r} is already imported")
    sys.path.insert(0, str(root))
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(root)] + ([old] if old else []))


def _import(module_name: str, root: pathlib.Path):
    module = importlib.import_module(module_name)
    if not _inside(module, root):  # pragma: no cover
        raise SystemExit(f"dpjax: {module_name} was imported from {module.__file__}, not {root}")
    return module


def _run(program: str, parser: str, prog: str) -> int:
    """Parse the command line with ``parser`` (``module:function``, a module that imports
    neither JAX nor dpjax's rooms), then import ``program`` and call its ``main``.

    ``--help`` and a wrong argument (argparse's usage message, exit code 2) answer before the
    program's heavy imports; the program's ``main`` parses the same command line again.
    """
    root = workbench_root()
    _enter(root)
    module_name, function = parser.split(":")
    getattr(_import(module_name, root), function)(prog).parse_args()
    return _exit_code(_import(program, root).main(prog=prog))


def _exit_code(result: object) -> int:
    return result if isinstance(result, int) else 0


def experiments() -> int:
    """``dpjax-experiments``: reproduce dpjax's experiments (``make reproduce``)."""
    prog = "dpjax-experiments"
    return _run("experiments.__main__", "experiments.__main__:build_parser", prog)


def bench() -> int:
    """``dpjax-bench``: time dpjax's DP-SGD step against the non-private step and Opacus."""
    return _run("benchmarks.__main__", "benchmarks.__main__:build_parser", "dpjax-bench")


def example_digits() -> int:
    """``dpjax-example-digits``: DP-SGD on scikit-learn's digits with a flax nnx MLP."""
    prog = "dpjax-example-digits"
    return _run("examples.flax_digits", "examples.cli:digits_parser", prog)


def example_distributed() -> int:
    """``dpjax-example-distributed``: DP-SGD over several processes (``jax.distributed``)."""
    prog = "dpjax-example-distributed"
    return _run("examples.distributed_dp_sgd", "examples.cli:distributed_parser", prog)
