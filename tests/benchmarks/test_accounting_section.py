"""benchmarks/accounting.py: the accounting section (`python -m benchmarks --accounting`).

The section reports CPU seconds; nothing here asserts a time (the machine is shared)."""

import math

from benchmarks import accounting
from benchmarks.__main__ import build_parser
from dpjax.accounting import dp_sgd_epsilon


def test_section_has_one_row_per_case_with_its_target_and_status():
    rows = [
        dict(
            case=case,
            what=what,
            cpu_s=0.25,
            cpu_s_runs=[0.25, 0.31],
            target_cpu_s=target,
            status="holds",
            result={"epsilon": 1.5},
        )
        for case, (what, target) in accounting.CASES.items()
    ]
    lines = accounting.section({"meta": {"repeats": 2}, "rows": rows})
    table = [line for line in lines if line.startswith("| ") and "---" not in line][1:]
    assert len(table) == len(accounting.CASES) == 4
    assert "| 0.250 | 0.25, 0.31 | ≤ 0.3 | holds | epsilon = 1.5 |" in table[0]
    assert "≤ 1.0" in table[-1]


def test_the_accountant_case_times_what_dp_sgd_epsilon_reports():
    result = accounting._one("accountant_1000_records_pld")
    expected = dp_sgd_epsilon(
        noise_multiplier=accounting.SIGMA,
        sampling_rate=accounting.RATE,
        steps=accounting.RECORDS,
        delta=accounting.DELTA,
    )
    assert result["epsilon"] == expected and math.isfinite(expected)
    assert result["cpu_s"] > 0.0


def test_the_command_line_has_the_accounting_switch():
    assert build_parser().parse_args(["--accounting"]).accounting
