"""Plots of a privacy plan and of its results, each returned as a matplotlib ``Figure``.

* :func:`epsilon_against_steps`: ε after t steps of DP-SGD for several noise multipliers σ
  (where a run stops for a budget ε, and what a larger σ buys);
* :func:`tradeoff_plot`: the f-DP trade-off curve β(α) of one or more compositions (the type-II
  error any membership test must make at type-I error α);
* :func:`accuracy_against_epsilon`: accuracy against ε from a results file or records, e.g.
  the ``rows`` of ``experiments``' ``finetune.json``.

matplotlib is imported when a plot is drawn (it is an optional dependency: ``pip install
matplotlib``, or ``pip install -e ".[experiments]"``), so ``import dpjax.plots`` costs nothing.
Every function draws on a new figure (or on ``ax=`` when given) and never calls ``show`` or
``savefig``: ``fig.savefig("eps.png")`` is yours.

Example:
    >>> fig = epsilon_against_steps(noise_multipliers=[1.0, 2.0], sampling_rate=1.0,
    ...                             steps=100, delta=1e-5, points=5)
    >>> [line.get_label() for line in fig.axes[0].get_lines()]
    ['σ = 1', 'σ = 2']
"""

from __future__ import annotations

import json
import math
import pathlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from dpjax import _validate

__all__ = ["epsilon_against_steps", "tradeoff_plot", "accuracy_against_epsilon"]

#: keys read as "accuracy" when ``accuracy_key`` is not given, in this order
ACCURACY_KEYS = ("accuracy_mean", "test_accuracy", "accuracy")
#: keys of a results file that hold its list of records, in this order
RECORD_LISTS = ("rows", "runs", "records")


def _pyplot():
    try:
        import matplotlib.pyplot as plt
    except ImportError as err:  # pragma: no cover - exercised only without matplotlib
        raise ImportError(
            "dpjax.plots needs matplotlib: pip install matplotlib (or the 'experiments' extra)"
        ) from err
    return plt


def _axes(ax):
    """(figure, axes): ``ax`` and its figure, or a new figure with one axes."""
    if ax is not None:
        return ax.figure, ax
    fig, new_ax = _pyplot().subplots(figsize=(6.0, 4.0))
    return fig, new_ax


def step_grid(steps: int | Sequence[int], points: int) -> np.ndarray:
    """The step counts at which ε is evaluated: ``steps`` itself when a sequence (sorted,
    deduplicated, each a positive integer), else ``points`` integers spread geometrically over
    [1, steps] (always including 1 and ``steps``)."""
    if isinstance(steps, Iterable) and not isinstance(steps, str):
        grid = [_validate.positive_int("steps", t) for t in steps]
        if not grid:
            _validate.fail("steps", steps, "a positive integer or a non-empty sequence of them")
        return np.unique(np.asarray(grid, dtype=np.int64))
    last = _validate.positive_int("steps", steps)
    points = _validate.positive_int("points", points)
    grid = np.geomspace(1, last, num=max(points, 2)).round().astype(np.int64)
    return np.unique(np.concatenate([[1], grid, [last]]))


def epsilon_against_steps(
    *,
    noise_multipliers: float | Sequence[float],
    sampling_rate: float,
    steps: int | Sequence[int],
    delta: float,
    accounting: str = "pld",
    relation: Any = None,
    points: int = 12,
    target_epsilon: float | None = None,
    ax=None,
):
    """ε after t steps of DP-SGD (Poisson sampling at rate q), one line per noise multiplier σ.

    Each point is :func:`dpjax.accounting.dp_sgd_epsilon` at (σ, q, t, δ): the same accountant
    as :func:`dpjax.make_private`, so a line crosses ``target_epsilon`` where a run with that σ
    must stop. An infinite ε (σ = 0) is not drawn.

    Args:
        noise_multipliers: σ/C, one or several, each ≥ 0.
        sampling_rate: q in (0, 1] (``batch_size / dataset_size``).
        steps: the last step T (then ``points`` step counts spread geometrically over [1, T])
            or the step counts themselves.
        delta: δ in [0, 1).
        accounting: ``"pld"`` (default, tight) or ``"rdp"`` (faster, never tighter).
        relation: the neighbouring relation (default add/remove-one, as ``dp_sgd_epsilon``).
        points: how many step counts when ``steps`` is one integer (≥ 1).
        target_epsilon: if given, a horizontal line at this ε.
        ax: a matplotlib ``Axes`` to draw on (default: a new figure).

    Returns:
        The ``Figure``; ``fig.axes[0].get_lines()[i].get_xydata()`` are σᵢ's (t, ε) points.

    Raises:
        ValueError: an argument outside its range (named), as ``dp_sgd_epsilon`` raises.
    """
    from dpjax.accounting import dp_sgd_epsilon
    from dpjax.relation import ADD_OR_REMOVE_ONE

    sigmas = np.atleast_1d(np.asarray(noise_multipliers, dtype=np.float64))
    if sigmas.ndim != 1 or sigmas.size == 0:
        _validate.fail("noise_multipliers", noise_multipliers, "one σ ≥ 0 or a list of them")
    grid = step_grid(steps, points)
    fig, ax = _axes(ax)
    for sigma in sigmas:
        eps = np.array(
            [
                dp_sgd_epsilon(
                    noise_multiplier=float(sigma),
                    sampling_rate=sampling_rate,
                    steps=int(t),
                    delta=delta,
                    accounting=accounting,
                    relation=relation if relation is not None else ADD_OR_REMOVE_ONE,
                )
                for t in grid
            ]
        )
        finite = np.isfinite(eps)
        ax.plot(grid[finite], eps[finite], marker="o", ms=3, label=f"σ = {sigma:g}")
    if target_epsilon is not None:
        target = _validate.positive("target_epsilon", target_epsilon)
        ax.axhline(target, color="0.4", linestyle="--", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("steps t")
    ax.set_ylabel(f"ε (δ = {delta:g}, {accounting.upper()})")
    ax.set_title(f"DP-SGD, Poisson sampling at q = {sampling_rate:g}", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def tradeoff_plot(events: Any, *, alphas: Sequence[float] | None = None, ax=None):
    """The trade-off curve β(α) of one composition, or one curve per label.

    β(α) is :func:`dpjax.accounting.tradeoff_curve`: a lower bound on the type-II error of any
    test between neighbouring data sets at type-I error α (Dong, Roth, Su 2022, "Gaussian
    differential privacy", https://arxiv.org/abs/1905.02383). The dotted diagonal β = 1 − α is
    perfect privacy; the further a curve lies below it, the more an adversary can learn.

    Args:
        events: events under one relation, one event or a ``PrivacyAccountant`` (one curve),
            or a mapping label → such events (one curve each).
        alphas: type-I errors in [0, 1] (default: 201 points on [0, 1]).
        ax: a matplotlib ``Axes`` to draw on (default: a new figure).

    Returns:
        The ``Figure``; the curves are ``fig.axes[0].get_lines()[:-1]`` (the diagonal is last).

    Raises:
        ValueError: as :func:`dpjax.accounting.tradeoff_curve` (events it cannot account,
            mixed relations, α outside [0, 1]).
    """
    from dpjax.accounting import tradeoff_curve

    alpha = np.linspace(0.0, 1.0, 201) if alphas is None else np.asarray(alphas, np.float64)
    curves = events if isinstance(events, Mapping) else {None: events}
    fig, ax = _axes(ax)
    for label, composed in curves.items():
        beta = tradeoff_curve(composed, alpha)
        ax.plot(alpha, beta, label=label if label is not None else "β(α)")
    ax.plot([0.0, 1.0], [1.0, 0.0], ":", color="0.5", label="perfect privacy: 1 − α")
    ax.set_xlim(0.0, 1.0)
    ax.set_ylim(0.0, 1.0)
    ax.set_aspect("equal")
    ax.set_xlabel("type-I error α")
    ax.set_ylabel("type-II error β")
    ax.set_title("trade-off curve (f-DP)", fontsize=10)
    ax.legend(fontsize=8)
    return fig


def load_records(results: Any) -> list[dict]:
    """The records of a results file: a JSON path, a dict holding one of
    :data:`RECORD_LISTS` (``rows``, ``runs``, ``records``), or a list of dicts."""
    if isinstance(results, str | pathlib.Path):
        results = json.loads(pathlib.Path(results).read_text())
    if isinstance(results, Mapping):
        found = next((results[k] for k in RECORD_LISTS if k in results), None)
        if found is None:
            _validate.fail("results", sorted(results), f"a dict with one of {RECORD_LISTS}")
        results = found
    records = list(results)
    if not records or not all(isinstance(r, Mapping) for r in records):
        _validate.fail("results", type(results).__name__, "a non-empty list of dict records")
    return records


def _accuracy_key(records: list[dict], accuracy_key: str | None) -> str:
    if accuracy_key is not None:
        if accuracy_key not in records[0]:
            keys = sorted(records[0])
            _validate.fail("accuracy_key", accuracy_key, f"a key of the records {keys}")
        return accuracy_key
    found = next((k for k in ACCURACY_KEYS if k in records[0]), None)
    if found is None:
        _validate.fail("accuracy_key", None, f"given: the records have none of {ACCURACY_KEYS}")
    return found


def _group_label(record: Mapping, group_by: Sequence[str]) -> str:
    return ", ".join(f"{k}={record[k]}" for k in group_by) if group_by else "accuracy"


def accuracy_against_epsilon(
    results: Any,
    *,
    group_by: str | Sequence[str] | None = None,
    epsilon_key: str = "epsilon",
    accuracy_key: str | None = None,
    log_epsilon: bool = True,
    ax=None,
):
    """Accuracy against ε, one line per group of records, with 95% CI bars where recorded.

    A record is a dict with an ε (``epsilon_key``) and an accuracy (``accuracy_key``; default
    the first of :data:`ACCURACY_KEYS` present); ``ci_low``/``ci_high``, when present, are drawn
    as error bars. Records of a group are sorted by ε; non-finite ε (no privacy) is dropped.

    Args:
        results: a JSON results file (e.g. ``results/finetune.json``), its dict, or records.
        group_by: record key(s) whose values split the lines (e.g. ``("mode", "epochs")``).
        epsilon_key: the key of ε (``"epsilon"``: the ε accounted; ``"target_epsilon"``).
        accuracy_key: the key of the accuracy (default: found among :data:`ACCURACY_KEYS`).
        log_epsilon: a logarithmic ε axis.
        ax: a matplotlib ``Axes`` to draw on (default: a new figure).

    Returns:
        The ``Figure``; ``fig.axes[0].get_lines()`` hold each group's (ε, accuracy) points, in
        the order the groups first appear in the records.

    Raises:
        ValueError: no records, or a key the records lack (named).
    """
    records = load_records(results)
    keys = (group_by,) if isinstance(group_by, str) else tuple(group_by or ())
    missing = [k for k in (epsilon_key, *keys) if k not in records[0]]
    if missing:
        _validate.fail("epsilon_key/group_by", missing, f"keys of the records {sorted(records[0])}")
    acc_key = _accuracy_key(records, accuracy_key)
    groups: dict[str, list[Mapping]] = {}
    for record in records:
        groups.setdefault(_group_label(record, keys), []).append(record)
    fig, ax = _axes(ax)
    for label, rows in groups.items():
        rows = sorted(
            (r for r in rows if r[epsilon_key] is not None and math.isfinite(r[epsilon_key])),
            key=lambda r: r[epsilon_key],
        )
        x = np.array([r[epsilon_key] for r in rows], dtype=np.float64)
        y = np.array([r[acc_key] for r in rows], dtype=np.float64)
        (line,) = ax.plot(x, y, marker="o", label=label)
        if rows and all("ci_low" in r and "ci_high" in r for r in rows):
            err = np.array([[r[acc_key] - r["ci_low"], r["ci_high"] - r[acc_key]] for r in rows])
            # bars only (a LineCollection): get_lines() keeps one Line2D per group
            ax.errorbar(x, y, yerr=err.T, fmt="none", ecolor=line.get_color(), capsize=0)
    if log_epsilon:
        ax.set_xscale("log")
    ax.set_xlabel(f"ε ({epsilon_key})")
    ax.set_ylabel(acc_key.replace("_", " "))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return fig
