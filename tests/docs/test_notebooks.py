"""Execute every tutorial notebook top to bottom and fail on any error (`make test` executes the
lightest one, `make test-slow` the other four).

The notebooks run in a fresh ipykernel started with *this* interpreter (the .venv's), through a
kernel spec written to a temporary directory, so a user-level ``python3`` kernel spec pointing at
another Python cannot hijack the run. The kernel inherits the test environment (XLA_FLAGS from
conftest); each notebook configures JAX itself (x64 where it measures excess risk). The kernel
runs in the repository root, so ``import dpjax`` finds the checkout even where an editable
install is stale.
"""

import importlib.util
import re
import time
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
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
    return _load_builder().kernel_spec_manager(tmp_path_factory.mktemp("kernels"))


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


SEED_FILE = re.compile(r"\b\d{3}_[0-9a-f]{16}(\.txt)?|\(00[0-4][,)]|\b00[0-4] (bound|predicts)")
LECTURE_TOPIC = re.compile(r"lecture on \w")


@pytest.mark.parametrize("name", EXPECTED)
def test_notebook_cites_the_lectures_by_topic_and_starts_with_parameters(name):
    """Readers do not have the lecture files: cite lectures by topic, never by file name/code."""
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    markdown = "\n".join(c.source for c in notebook.cells if c.cell_type == "markdown")
    everything = "\n".join(c.source for c in notebook.cells)
    assert not SEED_FILE.search(everything), SEED_FILE.search(everything).group(0)
    assert LECTURE_TOPIC.search(markdown), f"{name} cites no lecture by topic"
    code = [c for c in notebook.cells if c.cell_type == "code"]
    assert code[0].metadata.get("tags") == ["parameters"], f"{name}: first code cell"
    assert "assert " in "\n".join(c.source for c in code), f"{name} checks nothing"


# `make test` executes the lightest notebook (the kernel, the execution and the HTML export);
# the four heavier ones (up to 4x its time each) run in the slow suite, which CI runs too.
FAST_NOTEBOOK = "02_accounting.ipynb"
RENDERED = [n if n == FAST_NOTEBOOK else pytest.param(n, marks=pytest.mark.slow) for n in EXPECTED]


@pytest.mark.parametrize("name", RENDERED)
def test_notebook_runs_clean_and_renders_to_html(name, kernel_spec_manager):
    """The path of `make notebooks`: execute with the builder's kernel, export HTML."""
    builder = _load_builder()
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    start = time.perf_counter()
    builder.execute(notebook, kernel_spec_manager, timeout=CELL_TIMEOUT_S)
    elapsed = time.perf_counter() - start
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert images, f"{name} shows no plot"
    html = builder.to_html(notebook)
    assert html.count("data:image/png;base64,") >= len(images)
    print(f"{name}: {elapsed:.1f} s")
