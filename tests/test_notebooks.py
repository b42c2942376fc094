"""Execute every tutorial notebook top to bottom and fail on any error.

The notebooks run in a fresh ipykernel started with *this* interpreter (the .venv's), through a
kernel spec written to a temporary directory, so a user-level ``python3`` kernel spec pointing at
another Python cannot hijack the run. The kernel inherits the test environment (XLA_FLAGS from
conftest); each notebook configures JAX itself (x64 where it measures excess risk). The kernel
runs in the repository root, so ``import dpjax`` finds the checkout even where an editable
install is stale.
"""

import importlib.util
import json
import re
import sys
import time
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
EXPECTED = [
    "01_mechanisms.ipynb",
    "02_accounting.ipynb",
    "03_output_vs_objective.ipynb",
    "04_dpsgd_flax.ipynb",
    "05_rates.ipynb",
]
KERNEL_NAME = "dpjax-test-python"
CELL_TIMEOUT_S = 300


def _load_builder():
    path = NOTEBOOKS / "build_notebooks.py"
    spec = importlib.util.spec_from_file_location("build_notebooks", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def kernel_spec_manager(tmp_path_factory):
    """A kernel spec manager that only knows one kernel: ipykernel on sys.executable."""
    kernels = tmp_path_factory.mktemp("kernels")
    spec_dir = kernels / KERNEL_NAME
    spec_dir.mkdir()
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "dpjax test kernel",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec), encoding="utf-8")
    return KernelSpecManager(kernel_dirs=[str(kernels)])


def test_all_five_notebooks_exist():
    names = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))
    assert names == EXPECTED


def test_notebooks_match_their_sources_and_have_no_outputs():
    builder = _load_builder()
    stale = [
        source.name
        for source in builder.sources()
        if builder.target_for(source).read_text(encoding="utf-8") != builder.render(source)
    ]
    assert not stale, f"run `python notebooks/build_notebooks.py`: stale {stale}"
    for name in EXPECTED:
        notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
        code = [c for c in notebook.cells if c.cell_type == "code"]
        assert all(not c.outputs and c.execution_count is None for c in code), name


SEED_FILE = re.compile(r"\d{3}_[0-9a-f]{16}\.txt")
LECTURE_NOTES = {
    "000_a9865af81d0677e1.txt",
    "001_22975d579ade9c52.txt",
    "002_2b8193132caeaf52.txt",
    "003_eb46ba05ef56608d.txt",
    "004_f02b245d52dd0fec.txt",
}


@pytest.mark.parametrize("name", EXPECTED)
def test_notebook_cites_the_lectures_and_starts_with_parameters(name):
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    markdown = "\n".join(c.source for c in notebook.cells if c.cell_type == "markdown")
    seeds = set(SEED_FILE.findall(markdown))
    assert seeds <= LECTURE_NOTES, seeds - LECTURE_NOTES
    assert seeds, f"{name} cites no lecture note"
    code = [c for c in notebook.cells if c.cell_type == "code"]
    assert code[0].metadata.get("tags") == ["parameters"], f"{name}: first code cell"
    assert "assert " in "\n".join(c.source for c in code), f"{name} checks nothing"


@pytest.mark.parametrize("name", EXPECTED)
def test_notebook_runs_clean(name, kernel_spec_manager):
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    manager = KernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=kernel_spec_manager)
    client = NotebookClient(
        notebook,
        km=manager,
        timeout=CELL_TIMEOUT_S,
        allow_errors=False,
        resources={"metadata": {"path": str(ROOT)}},
    )
    start = time.perf_counter()
    client.execute()
    elapsed = time.perf_counter() - start
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert images, f"{name} shows no plot"
    print(f"{name}: {elapsed:.1f} s")
