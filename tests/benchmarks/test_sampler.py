"""benchmarks/sampler.py: the sampler / jax.random.normal row of `make bench` (issue 24)."""

from benchmarks import sampler


def test_run_reports_a_median_ratio_with_its_target():
    result = sampler.run(quick=True, size=4096)
    assert result["ratio_min"] <= result["ratio"] <= result["ratio_max"]
    assert result["dpjax_ms"] > 0 and result["jax_ms"] > 0
    row = result["target"]
    assert row["target"] == "sampler_over_jax_normal" and row["bound"] == 1.3
    assert row["status"] == ("holds" if result["ratio"] <= 1.3 else "MISSED")
    assert "jax.random.normal" in "\n".join(sampler.section(result))
