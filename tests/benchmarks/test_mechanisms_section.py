"""benchmarks/mechanisms.py: scalar releases per second (`python -m benchmarks --mechanisms`)."""

from __future__ import annotations

import pytest

from benchmarks import mechanisms
from benchmarks.__main__ import build_parser

PATHS = ("vmapped", "vmapped_unguarded", "batched")


def test_the_command_line_has_the_mechanisms_switch():
    assert build_parser().parse_args(["--mechanisms"]).mechanisms


def test_the_section_states_the_target_for_each_vmapped_row():
    rows = [
        {"mechanism": m, "path": p, "rows": 10, "median_ms": ms, "releases_per_s": 1e4 / ms}
        for m, ms in (("gaussian", 0.005), ("laplace", 0.02))
        for p in PATHS
    ]
    lines = mechanisms.section({"rows": rows, "rounds": 1})
    targets = [line for line in lines if "jit(vmap) over distinct keys" in line]
    assert targets == [
        "- gaussian, jit(vmap) over distinct keys: 2e+06 releases/s ≥ 1e+06: holds",
        "- laplace, jit(vmap) over distinct keys: 5e+05 releases/s ≥ 1e+06: MISSED",
    ]
    assert sum(line.startswith("| gaussian") for line in lines) == len(PATHS)


@pytest.mark.slow
def test_one_small_round_times_every_case():
    result = mechanisms.measure(rows=64, rounds=1)
    cases = {(r["mechanism"], r["path"]) for r in result["rows"]}
    assert cases == {(m, p) for m in ("gaussian", "laplace") for p in PATHS}
    for r in result["rows"]:
        assert r["releases_per_s"] == pytest.approx(r["rows"] / (r["median_ms"] / 1e3))
