"""The correlated-noise experiment: its tree noise, its calibration, a tiny run (slow)."""

from __future__ import annotations

import numpy as np
import pytest

from dpjax.accounting import PrivacyAccountant
from experiments import correlated, registry


def test_tree_noise_prefix_sums_have_popcount_variance():
    """s_t = Σ_{u≤t} x_u sums one N(0, 1) node per dyadic block of [1, t]: Var = popcount(t).
    d = 20 000 coordinates: the sample variance is within 5·√(2/d) relative (and a wrong
    scale, e.g. Var = t or depth, is rejected)."""
    d, n = 20_000, 13
    x = correlated._tree_prefix_noise(np.random.default_rng(0), n, d)
    var = np.var(np.cumsum(x, axis=0), axis=1)
    pops = np.array([bin(t).count("1") for t in range(1, n + 1)])
    np.testing.assert_allclose(var, pops, rtol=5 * np.sqrt(2 / d))
    assert not np.allclose(var, np.arange(1, n + 1), rtol=0.1)


@pytest.mark.parametrize(
    "method",
    [
        pytest.param("dpsgd", marks=pytest.mark.slow),
        pytest.param("band4", marks=pytest.mark.slow),
        "tree",
    ],
)
def test_calibrated_sigma_reaches_the_target_epsilon(method):
    kw = dict(n=1437, steps=44, epochs=2, per_epoch=22, bands=4 if method == "band4" else 1)
    sigma, events = correlated._calibrate(method, 4.0, **kw)
    assert PrivacyAccountant(events).epsilon(1e-5) == pytest.approx(4.0, rel=0.01)
    assert sigma > 0.3


def test_registered():
    assert registry.EXPERIMENTS["correlated"] == "experiments.correlated"


@pytest.mark.slow
def test_tiny_run_writes_its_report(tmp_path):
    out = correlated.run(tmp_path, size="tiny")
    assert (
        (tmp_path / "correlated.json").exists()
        and "✓" in out["report_md"]
        or "✗" in (out["report_md"])
    )
    for rows in out["accuracy"].values():
        assert all(0.0 <= mean <= 1.0 for mean, _ in rows)
