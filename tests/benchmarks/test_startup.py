"""``python -m benchmarks --startup``: the rows it times, their statuses and its table.

The timings themselves are the benchmark's output, never asserted here; these tests check that
the rows measure what they say (the README's make_private block, every console script) and that
a failure or a missed target is reported as such.
"""

from __future__ import annotations

import tomllib

from benchmarks import startup


def test_the_readme_row_runs_the_make_private_block():
    block = startup.readme_block()
    assert block is not None and "dpjax.make_private(" in block and ".fit(" in block


def test_every_console_script_gets_a_help_row():
    pyproject = tomllib.loads((startup.ROOT / "pyproject.toml").read_text())
    assert startup.console_scripts() == pyproject["project"]["scripts"]
    code = startup._launcher("dpjax-bench", "dpjax._cli:bench")
    assert "sys.argv[0] = 'dpjax-bench'" in code and "from dpjax._cli import bench" in code


def test_a_row_reports_min_and_median_and_its_status():
    row = startup._timed("import dpjax", "import", "pass", repeats=2)
    assert row["runs"] == 2 and row["target_s"] == startup.TARGETS_S["import"]
    assert 0 < row["wall_min_s"] <= row["wall_median_s"] and row["cpu_min_s"] >= 0
    assert row["status"] == ("holds" if row["wall_min_s"] <= row["target_s"] else "MISSED")


def test_reference_rows_have_no_target_and_failures_are_reported():
    reference = startup._timed("import jax", "import", "pass", repeats=1)
    assert reference["status"] == "reference" and "target_s" not in reference
    failed = startup._timed("dpjax-bench --help", "help", "raise SystemExit('boom')", repeats=3)
    assert failed["status"] == "FAILED" and failed["runs"] == 0 and "boom" in failed["error"]
    md = "\n".join(startup.section([reference, failed], [], {}))
    assert "| import jax |" in md and "| reference |" in md and "| FAILED |" in md
    assert "dpjax-bench --help failed" in md and "loaded by `import dpjax`: none" in md
