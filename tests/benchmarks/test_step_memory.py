"""benchmarks.memory: the step-memory measure, the largest-batch fit and the table."""

import pytest

from benchmarks import memory, memory_worker


def test_largest_batch_is_the_budget_over_the_line_through_two_batches():
    # 100 MB fixed + 2 MB per example: (1024 - 100) / 2 = 462
    assert memory.largest_batch([(256, 612.0), (1024, 2148.0)], 1024.0) == 462
    assert memory.largest_batch([(8, 2000.0), (32, 2048.0)], 1024.0) == 0  # fixed part over
    assert memory.largest_batch([(8, 50.0), (32, 50.0)], 1024.0) is None  # flat: no fit
    assert memory.largest_batch([(8, 50.0)], 1024.0) is None


@pytest.mark.slow  # a compile in this process (~5 s); the default twin: the fit and the table
def test_measure_reports_the_steps_rss_and_xlas_plan():
    rec = memory_worker.measure("logreg", 8, "dpjax")
    assert rec["peak_rss_mb"] >= rec["rss_before_mb"] > 0
    assert rec["step_mb"] == pytest.approx(rec["peak_rss_mb"] - rec["rss_before_mb"])
    assert rec["xla_plan_mb"] > 0 and rec["xla_args_mb"] > 10_000 * 4 / 2**20


def test_section_shows_every_method_and_marks_failures():
    records = [
        {"model": "mlp", "batch": b, "method": m, "step_mb": mb * b, "xla_plan_mb": mb * b}
        for b in (256, 1024)
        for m, mb in (("nonprivate", 0.125), ("dpjax", 0.25), ("dpjax_vmap", 4.0))
    ]
    records += [
        {"model": "mlp", "batch": b, "method": m, "step_mb": mb * b}
        for b in (256, 1024)
        for m, mb in (("torch_nonprivate", 0.125), ("opacus_ghost", 0.5))
    ]
    records += [{"model": "mlp", "batch": 256, "method": "opacus_hooks", "error": "boom"}]
    result = {"budget_mb": 1024.0, "records": records, "fits": memory._fits(records)}
    text = "\n".join(memory.section(result, "test machine"))
    assert (
        "| mlp | 256 | 32 (32) | 64 (64) | 1024 (1024) | 32 | 128 (ghost) | 128 | failed |" in text
    )
    # largest batches: 1024 MB / (MB per example), no fixed part
    assert "| mlp | 8192 (8192) | 4096 (4096) | 256 (256) | 8192 | 2048 | — |" in text


@pytest.mark.torch  # needs the bench-torch extra: `make test-torch`
def test_opacus_step_memory_in_a_fresh_process():
    rec = memory.step_memory("logreg", 8, "opacus_ghost", timeout=300)
    assert "error" not in rec, rec
    assert rec["peak_rss_mb"] >= rec["rss_before_mb"] > 0
