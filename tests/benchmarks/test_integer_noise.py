"""benchmarks/integer_noise.py: the throughput section of `make bench` (issue 26)."""

import pytest

from benchmarks import integer_noise


def test_section_has_one_row_per_record():
    records = [
        dict(sampler=name, n=10, compile_s=1.0, seconds=s, draws_per_s=10 / s, over_jax_normal=r)
        for name, s, r in (("jax.random.normal", 0.5, 1.0), ("discrete_gaussian σ=3", 5.0, 10.0))
    ]
    lines = integer_noise.section(records)
    rows = [line for line in lines if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == 2 and "| 10.0 |" in rows[1] and "draws per second" in "\n".join(lines)


@pytest.mark.slow  # compiles five samplers (~20 s)
def test_measure_times_every_sampler_against_jax_normal():
    records = integer_noise.measure(2000, repeats=1)
    assert [r["sampler"] for r in records][0] == "jax.random.normal"
    assert len(records) == 5 and records[0]["over_jax_normal"] == 1.0
    assert all(r["draws_per_s"] > 0 and r["compile_s"] > 0 for r in records)
