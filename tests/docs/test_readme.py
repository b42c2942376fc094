"""Every Python block of README.md and of the guides runs as written, from an empty directory.

Each block is extracted and run in a fresh interpreter (a subprocess) whose working directory is
an empty temporary folder and whose ``sys.path`` holds this checkout's dpjax (as an installed
dpjax would be), so a block cannot lean on names defined elsewhere, on files of the repository
or on another block. A block whose first line is a ``# not run`` comment is only shown (it needs
several processes or a cluster; the command that launches it is fenced as shell next to it).
Identical blocks (the README's examples repeated in a guide) run once. The README's blocks run
in ``make test`` (about 25 s of CPU); the guides' blocks (about 30 s more) are marked ``slow``
and run in ``make test-slow``.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
GUIDES = sorted((ROOT / "docs" / "guides").glob("*.md"))
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
NOT_RUN = "# not run"


def fenced_blocks(path: pathlib.Path, language: str) -> list[str]:
    """The bodies of the ```language blocks of a Markdown file, in order."""
    return [body for lang, body in FENCE.findall(path.read_text()) if lang == language]


def _runnable_blocks() -> list:
    seen, blocks = set(), []
    for path in [README, *GUIDES]:
        marks = [] if path == README else [pytest.mark.slow]
        for i, code in enumerate(fenced_blocks(path, "python")):
            if code.lstrip().startswith(NOT_RUN) or code in seen:
                continue
            seen.add(code)
            where = f"{path.relative_to(ROOT)}[{i}]"
            blocks.append(pytest.param(where, code, id=where, marks=marks))
    return blocks


BLOCKS = _runnable_blocks()


def test_readme_keeps_the_two_commands_and_three_examples():
    shell = "\n".join(fenced_blocks(README, "sh"))
    assert re.search(r"^make reproduce\s", shell, re.MULTILINE)
    assert re.search(r"^make test\s", shell, re.MULTILINE)
    assert len(fenced_blocks(README, "python")) == 3
    assert len(README.read_text().splitlines()) < 250  # a front page: a few screens


def test_readme_links_resolve():
    """Relative links of the README point at files of the repository."""
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text())
    local = [t for t in targets if "://" not in t]
    assert local, "the README links to its guides"
    missing = [t for t in local if not (ROOT / t).exists()]
    assert missing == []


@pytest.mark.parametrize("where,code", BLOCKS)
def test_python_block_runs_as_written(where, code, tmp_path):
    script = tmp_path / "block.py"
    script.write_text(code)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "XLA_FLAGS")}
    env |= {"PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    run = subprocess.run(
        [sys.executable, script.name],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, f"{where} failed:\n{code}\n--- stderr ---\n{run.stderr[-4000:]}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["block.py"]  # writes no files


def test_shell_blocks_name_real_commands():
    """Every ``dpjax-*`` command in a shell block is a console script of pyproject.toml, and every
    ``python -m`` module it runs exists in the checkout."""
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    shell = "\n".join(b for path in [README, *GUIDES] for b in fenced_blocks(path, "sh"))
    commands = set(re.findall(r"\b(dpjax-[a-z-]+)", shell))
    assert commands and commands <= set(scripts), commands - set(scripts)
    for module in re.findall(r"python -m ([\w.]+)", shell):
        path = ROOT.joinpath(*module.split("."))
        assert path.with_suffix(".py").is_file() or (path / "__main__.py").is_file(), module
