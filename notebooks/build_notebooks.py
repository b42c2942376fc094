"""Write the tutorial notebooks from their Python sources, with outputs cleared.

Each notebook is kept as a reviewable "percent" script in ``notebooks/src/NN_name.py``:
``# %%`` starts a code cell, ``# %% [markdown]`` starts a markdown cell whose lines are comments
(``# `` is stripped). In code cells a commented IPython magic (``# %matplotlib inline``) is
uncommented, so the sources stay plain Python. A code cell whose first line is ``# parameters``
gets the papermill ``parameters`` tag. This script turns each source into
``notebooks/NN_name.ipynb`` with nbformat, with deterministic cell ids and no outputs, so a diff
of a notebook is a diff of its source.

Usage:
    python notebooks/build_notebooks.py          # (re)write every notebook
    python notebooks/build_notebooks.py --check  # exit 1 if a notebook is out of date
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent
SOURCES = HERE / "src"
CELL_MARK = "# %%"
MARKDOWN_MARK = "# %% [markdown]"

KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


def _split_cells(text: str) -> list[tuple[str, list[str]]]:
    """Split a percent script into (kind, lines) pairs; kind is "code" or "markdown"."""
    cells: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith(MARKDOWN_MARK):
            cells.append(("markdown", []))
        elif line.startswith(CELL_MARK):
            cells.append(("code", []))
        elif cells:
            cells[-1][1].append(line)
    return cells


def _strip_comment(line: str) -> str:
    if line.startswith("# "):
        return line[2:]
    return "" if line.strip() == "#" else line


def _uncomment_magic(line: str) -> str:
    return line[2:] if line.startswith("# %") else line


def _trim(lines: list[str]) -> str:
    return "\n".join(lines).strip("\n")


def notebook_from_source(path: Path) -> nbformat.NotebookNode:
    """Build the (output-free) notebook for one percent-format source file."""
    cells = []
    for index, (kind, lines) in enumerate(_split_cells(path.read_text(encoding="utf-8"))):
        cell_id = f"{path.stem[:2]}-{index:02d}"
        if kind == "markdown":
            cell = new_markdown_cell(_trim([_strip_comment(line) for line in lines]), id=cell_id)
        else:
            source = _trim([_uncomment_magic(line) for line in lines])
            cell = new_code_cell(source, id=cell_id)
            if source.startswith("# parameters"):
                cell.metadata["tags"] = ["parameters"]
        cells.append(cell)
    metadata = {"kernelspec": KERNELSPEC, "language_info": {"name": "python"}}
    return new_notebook(cells=cells, metadata=metadata)


def target_for(source: Path) -> Path:
    return HERE / f"{source.stem}.ipynb"


def render(source: Path) -> str:
    """The exact text written for ``source`` (nbformat JSON, 1-space indent, final newline)."""
    notebook = notebook_from_source(source)
    nbformat.validate(notebook)
    return nbformat.writes(notebook) + "\n"


def sources() -> list[Path]:
    return sorted(SOURCES.glob("[0-9][0-9]_*.py"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check, write nothing")
    args = parser.parse_args(argv)
    stale = []
    for source in sources():
        target, text = target_for(source), render(source)
        if target.exists() and target.read_text(encoding="utf-8") == text:
            continue
        stale.append(target.name)
        if not args.check:
            target.write_text(text, encoding="utf-8")
    verb = "out of date" if args.check else "written"
    print(f"{len(stale)} notebook(s) {verb}: {', '.join(stale) or '-'}")
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
