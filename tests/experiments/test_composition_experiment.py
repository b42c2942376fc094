"""The composition experiment: orderings and √T-versus-T scaling that the lecture on properties
of DP motivates."""

import json

import numpy as np
import pytest

from dpjax.mechanisms import analytic_gaussian_sigma
from experiments import composition, registry


def _setup():
    delta_step = composition.DELTA / (2 * composition.T_MAX)
    sigma = analytic_gaussian_sigma(
        sensitivity=1.0, epsilon=composition.EPSILON_STEP, delta=delta_step
    )
    return sigma, delta_step


def test_orderings_at_large_T():
    sigma, delta_step = _setup()
    eps = composition._epsilons(1000, sigma, delta_step)
    # PLD tightest; RDP ≈ zCDP for a Gaussian (RDP is exactly ρα); KOV ≤ advanced ≤ basic.
    assert eps["pld"] <= eps["rdp"] <= eps["zcdp"] * (1 + 1e-3)
    assert eps["rdp"] / eps["pld"] < 1.2
    assert eps["optimal"] <= eps["advanced"] <= eps["basic"]
    assert eps["basic"] == pytest.approx(1000 * composition.EPSILON_STEP)


def test_basic_linear_and_tight_methods_sqrt_T():
    sigma, delta_step = _setup()
    grid = [100, 1000, 10_000]
    curves = {m: [] for m in composition.METHODS}
    for t in grid:
        for m, v in composition._epsilons(t, sigma, delta_step).items():
            curves[m].append(v)
    assert composition._slope(grid, curves["basic"]) == pytest.approx(1.0, abs=1e-9)
    for m in ("pld", "rdp", "zcdp"):
        assert 0.5 <= composition._slope(grid, curves[m]) < 0.6
    for m in ("advanced", "optimal"):
        assert 0.5 <= composition._slope(grid, curves[m]) < 0.75


def test_registered_after_rates():
    assert registry.EXPERIMENTS["composition"] == "experiments.composition"
    assert registry.ORDER.index("composition") > registry.ORDER.index("rates")


@pytest.mark.slow
def test_run_writes_plot_table_and_json(tmp_path):
    summary = composition.run(tmp_path, full=False, seed=0)
    assert (tmp_path / "composition.png").stat().st_size > 0
    assert "| T |" in (tmp_path / "composition.md").read_text()
    payload = json.loads((tmp_path / "composition.json").read_text())
    assert payload["grid"][0] == 1 and payload["grid"][-1] == composition.T_MAX
    assert np.all(np.diff(payload["epsilons"]["pld"]) > 0)
    assert summary["report_md"].startswith("## Composition")
    for row in summary["recipes"]:
        assert row["pld"] <= row["rdp"] <= row["zcdp_cks"] * 1.01 < row["zcdp_bun_steinke"]
        assert row["zcdp_bun_steinke"] < row["advanced_classic"]
