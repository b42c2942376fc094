"""Every `codegen` test runs in one of `make test`'s two passes.

The first pass (fast compiles) skips the `codegen` tests; the second collects only the test files
whose text names the marker (the Makefile's CODEGEN_FILES: `grep -rlw codegen tests`). A test
marked from outside its file would run in neither, so the first pass refuses it
(`tests/conftest.py::_check_names_codegen`).
"""

from __future__ import annotations

import re
import types
from pathlib import Path

import pytest

from tests.conftest import _check_names_codegen

TESTS = Path(__file__).resolve().parents[1]


def _item(path: Path) -> types.SimpleNamespace:
    return types.SimpleNamespace(fspath=path, nodeid=f"{path.name}::test_x")


def test_a_codegen_test_whose_file_does_not_name_the_marker_is_refused(tmp_path):
    """A marker applied by a helper module: the file never says codegen, the grep misses it."""
    hidden = tmp_path / "test_hidden.py"
    hidden.write_text("from helpers import rounding_mark\n\n@rounding_mark\ndef test_x(): ...\n")
    with pytest.raises(pytest.UsageError, match="does not name it"):
        _check_names_codegen(_item(hidden))
    named = tmp_path / "test_named.py"
    named.write_text("import pytest\n\npytestmark = pytest.mark.codegen\n")
    _check_names_codegen(_item(named))  # no error


def test_every_file_that_marks_codegen_is_in_the_second_pass():
    """The files with `pytest.mark.codegen` are among those the Makefile's grep collects."""
    marking = {p for p in TESTS.rglob("test_*.py") if "pytest.mark.codegen" in p.read_text()}
    collected = {p for p in TESTS.rglob("test_*.py") if re.search(r"\bcodegen\b", p.read_text())}
    assert len(marking) >= 15 and marking <= collected
    makefile = (TESTS.parent / "Makefile").read_text()
    assert "grep -rlw --include='test_*.py' codegen tests" in makefile
    assert '-m "codegen and not slow and not torch" -q $(XDIST) $(CODEGEN_FILES)' in makefile
