"""The plot helpers draw the numbers they claim: their lines' data, checked against closed forms.

Pixels are not compared: each figure's ``Line2D`` arrays are. ε against steps at q = 1 is the
Gaussian mechanism with μ = √T/σ (Balle & Wang 2018, Theorem 8), solved here by bisection on
its closed-form δ(ε); the trade-off curve of one Gaussian release is G_μ(α) = Φ(Φ⁻¹(1 − α) − μ)
(Dong, Roth, Su 2022).
"""

import json
import math

import numpy as np
import pytest
from scipy import optimize, stats

pytest.importorskip("matplotlib")
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from dpjax import events, plots  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def gaussian_epsilon(mu: float, delta: float) -> float:
    """ε of a μ-GDP mechanism at δ: the root of Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) = δ."""

    def excess(eps):
        return (
            stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)
        ) - delta

    return optimize.brentq(excess, 0.0, 200.0, xtol=1e-12)


def test_epsilon_against_steps_draws_the_gaussian_epsilon_at_each_step():
    fig = plots.epsilon_against_steps(
        noise_multipliers=[2.0, 4.0], sampling_rate=1.0, steps=50, delta=1e-5, points=4,
        target_epsilon=3.0,
    )  # fmt: skip
    ax = fig.axes[0]
    lines = ax.get_lines()
    assert [line.get_label() for line in lines[:2]] == ["σ = 2", "σ = 4"]
    steps = lines[0].get_xdata()
    assert steps[0] == 1 and steps[-1] == 50 and np.all(np.diff(steps) > 0)
    for line, sigma in zip(lines[:2], (2.0, 4.0), strict=True):
        t, eps = line.get_xdata(), line.get_ydata()
        expected = [gaussian_epsilon(math.sqrt(k) / sigma, 1e-5) for k in t]
        np.testing.assert_allclose(eps, expected, rtol=2e-3)
    assert list(lines[2].get_ydata()) == [3.0, 3.0]  # the budget line
    assert ax.get_xscale() == "log"


def test_epsilon_against_steps_takes_explicit_steps_and_refuses_bad_ones():
    fig = plots.epsilon_against_steps(
        noise_multipliers=1.0, sampling_rate=0.01, steps=[100, 10, 100], delta=1e-5,
        accounting="rdp",
    )  # fmt: skip
    (line,) = fig.axes[0].get_lines()
    assert list(line.get_xdata()) == [10, 100]
    assert line.get_ydata()[0] < line.get_ydata()[1]
    with pytest.raises(ValueError, match="steps"):
        plots.epsilon_against_steps(
            noise_multipliers=1.0, sampling_rate=0.01, steps=[0, 10], delta=1e-5
        )
    with pytest.raises(ValueError, match="sampling_rate"):
        plots.epsilon_against_steps(noise_multipliers=1.0, sampling_rate=2.0, steps=3, delta=1e-5)


def test_tradeoff_plot_draws_the_gaussian_tradeoff_curve():
    alphas = np.linspace(0.0, 1.0, 11)
    curves = {
        "σ = 1": events.GaussianEvent(noise_multiplier=1.0),
        "σ = 2": events.GaussianEvent(noise_multiplier=2.0),
    }
    fig = plots.tradeoff_plot(curves, alphas=alphas)
    lines = fig.axes[0].get_lines()
    assert [line.get_label() for line in lines] == ["σ = 1", "σ = 2", "perfect privacy: 1 − α"]
    for line, mu in zip(lines[:2], (1.0, 0.5), strict=True):
        exact = stats.norm.cdf(stats.norm.ppf(1 - alphas) - mu)
        np.testing.assert_allclose(line.get_xdata(), alphas)
        beta = line.get_ydata()
        assert np.all(beta <= exact + 1e-9)  # a lower bound on the true curve
        np.testing.assert_allclose(beta, exact, atol=5e-3)  # and close to it
    np.testing.assert_allclose(lines[2].get_xydata(), [[0, 1], [1, 0]])


def test_accuracy_against_epsilon_groups_sorts_and_reads_files(tmp_path):
    rows = [
        dict(mode="lora", epochs=2, epsilon=8.0, accuracy_mean=0.9, ci_low=0.85, ci_high=0.95),
        dict(mode="lora", epochs=2, epsilon=1.0, accuracy_mean=0.7, ci_low=0.6, ci_high=0.8),
        dict(mode="scratch", epochs=2, epsilon=1.0, accuracy_mean=0.5, ci_low=0.4, ci_high=0.6),
        dict(mode="scratch", epochs=2, epsilon=math.inf, accuracy_mean=0.99, ci_low=0.9,
             ci_high=1.0),
    ]  # fmt: skip
    path = tmp_path / "finetune.json"
    path.write_text(json.dumps({"size": "quick", "rows": rows}))
    fig = plots.accuracy_against_epsilon(path, group_by="mode")
    ax = fig.axes[0]
    lines = ax.get_lines()
    assert [line.get_label() for line in lines] == ["mode=lora", "mode=scratch"]
    np.testing.assert_allclose(lines[0].get_xydata(), [[1.0, 0.7], [8.0, 0.9]])
    np.testing.assert_allclose(lines[1].get_xydata(), [[1.0, 0.5]])  # ε = inf dropped
    bars = [seg for coll in ax.collections for seg in coll.get_segments()]
    np.testing.assert_allclose(bars[0], [[1.0, 0.6], [1.0, 0.8]])  # the first CI bar
    runs = [dict(seed=0, test_accuracy=0.95, epsilon=3.0), dict(seed=1, test_accuracy=0.96,
                                                                epsilon=2.0)]  # fmt: skip
    fig = plots.accuracy_against_epsilon({"runs": runs}, log_epsilon=False)
    (line,) = fig.axes[0].get_lines()
    np.testing.assert_allclose(line.get_xydata(), [[2.0, 0.96], [3.0, 0.95]])


def test_accuracy_against_epsilon_names_what_is_missing():
    with pytest.raises(ValueError, match="results"):
        plots.accuracy_against_epsilon({"size": "quick"})
    with pytest.raises(ValueError, match="results"):
        plots.accuracy_against_epsilon([])
    with pytest.raises(ValueError, match="group_by"):
        plots.accuracy_against_epsilon([dict(epsilon=1.0, accuracy=0.5)], group_by="mode")
    with pytest.raises(ValueError, match="accuracy_key"):
        plots.accuracy_against_epsilon([dict(epsilon=1.0, loss=0.5)])
