"""The console scripts run from any directory, and their ``--help`` is readable.

``[project.scripts]`` points at ``dpjax._cli``; the programs live in ``experiments/``,
``benchmarks/`` and ``examples/`` (installed as ``dpjax_workbench/...`` by a wheel). Each script
is run here as pip's launcher runs it (import the function, call it) in a fresh interpreter whose
working directory is an empty temporary folder and whose ``sys.path`` holds only an "installed"
dpjax, never the repository root: once as an editable install (a link to ``dpjax/``) and once as
a wheel install (a copy of ``dpjax/`` next to a ``dpjax_workbench`` folder).
"""

from __future__ import annotations

import argparse
import importlib
import os
import pathlib
import shutil
import subprocess
import sys
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SCRIPTS = PYPROJECT["project"]["scripts"]
WORKBENCH = ("experiments", "benchmarks", "examples")

# script -> the module whose build_parser(prog) makes its command line
PARSERS = {
    "dpjax-experiments": "experiments.__main__",
    "dpjax-bench": "benchmarks.__main__",
    "dpjax-example-digits": "examples.flax_digits",
    "dpjax-example-distributed": "examples.distributed_dp_sgd",
}


def _launch(site: pathlib.Path, cwd: pathlib.Path, script: str, *args: str):
    module, func = SCRIPTS[script].split(":")
    code = f"import sys; sys.argv[0] = {script!r}; from {module} import {func}; sys.exit({func}())"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {"PYTHONPATH": str(site), "JAX_PLATFORMS": "cpu"}
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def editable_site(tmp_path_factory) -> pathlib.Path:
    """A site folder holding only a link to this checkout's dpjax (like `pip install -e .`)."""
    site = tmp_path_factory.mktemp("editable_site")
    (site / "dpjax").symlink_to(ROOT / "dpjax", target_is_directory=True)
    return site


@pytest.fixture(scope="module")
def wheel_site(tmp_path_factory) -> pathlib.Path:
    """A site folder laid out as the wheel installs it: dpjax/ and dpjax_workbench/<program>/."""
    site = tmp_path_factory.mktemp("wheel_site")
    shutil.copytree(ROOT / "dpjax", site / "dpjax", ignore=shutil.ignore_patterns("__pycache__"))
    for name in WORKBENCH:
        (site / "dpjax_workbench").mkdir(exist_ok=True)
        (site / "dpjax_workbench" / name).symlink_to(ROOT / name, target_is_directory=True)
    return site


def test_every_program_has_a_console_script():
    assert set(SCRIPTS) == set(PARSERS)
    assert all(target.startswith("dpjax._cli:") for target in SCRIPTS.values())


@pytest.fixture(scope="module")
def helps(editable_site, tmp_path_factory) -> dict:
    """Every script's ``--help`` (editable layout), each from its own empty directory: one
    launch per script, read by the tests of what --help prints."""
    runs = {}
    for script in sorted(PARSERS):
        cwd = tmp_path_factory.mktemp(f"help_{script}")
        runs[script] = (_launch(editable_site, cwd, script, "--help"), cwd)
    return runs


@pytest.mark.parametrize("script", sorted(PARSERS))
def test_script_help_runs_from_an_empty_directory(script, helps):
    run, cwd = helps[script]
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith(f"usage: {script} "), run.stdout[:200]
    assert list(cwd.iterdir()) == []  # --help writes nothing


@pytest.mark.parametrize("script", sorted(PARSERS))
def test_script_help_is_answered_before_jax_is_imported(script, editable_site, tmp_path):
    """``--help`` parses before the program's heavy imports (JAX, flax, dp-accounting), so it
    answers at once; an exit hook reports what the process had loaded."""
    module, func = SCRIPTS[script].split(":")
    heavy = ("jax", "flax", "dp_accounting", "scipy", "sklearn")
    code = (
        "import atexit, sys\n"
        f"atexit.register(lambda: print('LOADED', [m for m in {heavy!r} if m in sys.modules]))\n"
        f"sys.argv[0] = {script!r}\nfrom {module} import {func}\nsys.exit({func}())"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {"PYTHONPATH": str(editable_site), "JAX_PLATFORMS": "cpu"}
    run = subprocess.run(
        [sys.executable, "-c", code, "--help"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.rstrip().splitlines()[-1] == "LOADED []"


@pytest.mark.parametrize(
    ("script", "args", "message"),
    [
        ("dpjax-experiments", ("bogus",), "argument NAME: invalid choice: 'bogus'"),
        ("dpjax-experiments", ("all", "--jobs", "0"), "argument --jobs: must be >= 1; got 0"),
        ("dpjax-bench", ("--repeats", "0"), "argument --repeats: must be >= 1; got 0"),
        ("dpjax-example-digits", ("--epochs", "x"), "argument --epochs: invalid float value"),
        ("dpjax-example-distributed", ("--bogus",), "unrecognized arguments: --bogus"),
    ],
)
def test_a_wrong_argument_is_a_usage_error_not_a_traceback(
    script, args, message, editable_site, tmp_path
):
    """argparse's answer (usage, the error, exit code 2) before anything runs or is written."""
    run = _launch(editable_site, tmp_path, script, *args)
    assert run.returncode == 2, run.stderr
    assert run.stderr.startswith(f"usage: {script} ") and message in run.stderr, run.stderr
    assert "Traceback" not in run.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("script", sorted(PARSERS))
def test_script_help_is_written_for_users(script, helps):
    """No internal notes in ``--help``: issue numbers, review rounds, lecture references."""
    text = helps[script][0].stdout
    for word in ("issue", "review", "lecture", "literature.md", ":data:", ":func:", "``"):
        assert word not in text.lower(), (script, word)


def test_scripts_run_from_a_wheel_layout(wheel_site, tmp_path):
    run = _launch(wheel_site, tmp_path, "dpjax-experiments", "--help")
    assert run.returncode == 0, run.stderr
    assert "usage: dpjax-experiments " in run.stdout


def test_scripts_say_what_is_missing_without_the_programs(tmp_path):
    """A dpjax with neither a checkout nor dpjax_workbench beside it: a clear exit, no traceback."""
    site = tmp_path / "site"
    shutil.copytree(ROOT / "dpjax", site / "dpjax", ignore=shutil.ignore_patterns("__pycache__"))
    run = _launch(site, tmp_path, "dpjax-experiments", "--help")
    assert run.returncode != 0
    assert "pip install -e ." in run.stderr and "Traceback" not in run.stderr


@pytest.mark.parametrize("script", sorted(PARSERS))
def test_every_option_has_help_and_paragraphs_are_kept(script):
    parser = importlib.import_module(PARSERS[script]).build_parser(script)
    assert parser.prog == script
    assert parser.formatter_class is argparse.RawDescriptionHelpFormatter
    assert "\n\n" in parser.description  # paragraphs, not one flattened block
    undocumented = [a.dest for a in parser._actions if not a.help]
    assert undocumented == [], f"{script}: options without help text: {undocumented}"


def test_package_list_covers_the_source_tree():
    """pyproject lists packages explicitly (for the dpjax_workbench mapping): none forgotten."""
    tool = PYPROJECT["tool"]["setuptools"]
    mapped = {v: k for k, v in tool["package-dir"].items()}
    on_disk = set()
    for folder in ("dpjax", *WORKBENCH):
        for init in (ROOT / folder).glob("**/__init__.py"):
            rel = init.parent.relative_to(ROOT)
            on_disk.add(".".join([mapped.get(folder, folder), *rel.parts[1:]]))
    assert set(tool["packages"]) == on_disk
