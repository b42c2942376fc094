"""Write the tutorial notebooks from their Python sources, with outputs cleared.

Each notebook is kept as a reviewable "percent" script in ``notebooks/src/NN_name.py``:
``# %%`` starts a code cell, ``# %% [markdown]`` starts a markdown cell whose lines are comments
(``# `` is stripped). In code cells a commented IPython magic (``# %matplotlib inline``) is
uncommented, so the sources stay plain Python. A code cell whose first line is ``# parameters``
gets the papermill ``parameters`` tag. This script turns each source into
``notebooks/NN_name.ipynb`` with nbformat, with deterministic cell ids and no outputs, so a diff
of a notebook is a diff of its source.

The stored notebooks stay output-free; ``--execute DIR`` (``make notebooks``) runs each one top to
bottom in a fresh kernel on this interpreter, from the repository root, and writes the executed
notebook (with its figures) and an HTML rendering (nbconvert) to ``DIR``, so a reader can see the
results without running anything.

Usage:
    python notebooks/build_notebooks.py          # (re)write every notebook
    python notebooks/build_notebooks.py --check  # exit 1 if a notebook is out of date
    python notebooks/build_notebooks.py --execute results/notebooks  # rendered copies
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
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


ROOT = HERE.parent
KERNEL_NAME = "dpjax-notebooks-python"


def kernel_spec_manager(kernel_dir: Path):
    """A kernel spec manager that knows one kernel: ipykernel on *this* interpreter.

    A user-level ``python3`` kernel spec pointing at another Python cannot hijack the run.
    """
    from jupyter_client.kernelspec import KernelSpecManager

    spec_dir = kernel_dir / KERNEL_NAME
    spec_dir.mkdir(parents=True, exist_ok=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "dpjax notebooks (this interpreter)",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec), encoding="utf-8")
    return KernelSpecManager(kernel_dirs=[str(kernel_dir)])


def execute(notebook: nbformat.NotebookNode, specs, timeout: int = 300) -> nbformat.NotebookNode:
    """Run ``notebook`` in place, top to bottom, in the repository root; raise on any error."""
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    manager = KernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=specs)
    client = NotebookClient(
        notebook,
        km=manager,
        timeout=timeout,
        allow_errors=False,
        resources={"metadata": {"path": str(ROOT)}},
    )
    client.execute()
    notebook.metadata["kernelspec"] = KERNELSPEC  # the stored name, not the temporary one
    return notebook


def to_html(notebook: nbformat.NotebookNode) -> str:
    """The executed notebook as a standalone HTML page (figures embedded), via nbconvert."""
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter().from_notebook_node(notebook)
    return body


def render_executed(out_dir: Path, names: list[str] | None = None) -> list[Path]:
    """Execute every notebook (or those whose stem is in ``names``) into ``out_dir``.

    Writes ``NN_name.ipynb`` (with outputs) and ``NN_name.html`` per notebook; the sources and
    the stored notebooks are not touched. Returns the written paths.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory() as kernels:
        specs = kernel_spec_manager(Path(kernels))
        for source in sources():
            if names and source.stem not in names:
                continue
            start = time.perf_counter()
            notebook = execute(notebook_from_source(source), specs)
            ipynb, html = out_dir / f"{source.stem}.ipynb", out_dir / f"{source.stem}.html"
            nbformat.write(notebook, ipynb)
            html.write_text(to_html(notebook), encoding="utf-8")
            written += [ipynb, html]
            print(f"executed {source.stem} in {time.perf_counter() - start:.1f}s -> {html}")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check, write nothing")
    parser.add_argument(
        "--execute",
        type=Path,
        metavar="DIR",
        help="also execute every notebook into DIR (.ipynb with outputs and .html)",
    )
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
    if args.check and stale:
        return 1
    if args.execute is not None:
        render_executed(args.execute)
        print(f"rendered notebooks: {args.execute.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
