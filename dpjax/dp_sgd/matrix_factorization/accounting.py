r"""Privacy events of the matrix-factorization (correlated-noise) mechanisms.

The mechanism of :mod:`~dpjax.dp_sgd.matrix_factorization.streaming` releases, in DP-SGD form,
g_t + σ·clip·(C⁻¹Z)_t; multiplying by C gives C·G + σ·clip·Z, a Gaussian mechanism on C·G.
Three analyses, all under add/remove-one (a record's clipped gradient, of norm ≤ clip, appears
in or vanishes from the steps where it participates):

* **no amplification** (single or multiple epochs, any participation pattern):
  one Gaussian release whose ℓ2 sensitivity is clip·sens(C) —
  :func:`matrix_mechanism_event`, a :class:`~dpjax.events.GaussianEvent` at noise multiplier
  σ / sens(C) (Denisov et al. 2022, Theorem 2.1; Choquette-Choo et al. 2023, "Multi-epoch
  matrix factorization mechanisms for private machine learning", Theorem 2);
* **b-banded C with cyclic Poisson sampling** (Choquette-Choo, Ganesh, McKenna, McMahan, Rush,
  Thakurta, Xu 2023, "(Amplified) banded matrix factorization: a unified approach to private
  training", Theorem 4): the records are split into b parts, step t Poisson-samples part
  t mod b at rate q. A record's participations are b steps apart, so the rows of C·G they
  touch (the b rows below each) are disjoint: the mechanism is the adaptive composition of
  ⌈n/b⌉ Poisson-subsampled Gaussians, each of sensitivity clip·max_j ‖C e_j‖ —
  :func:`banded_amplified_event`, a :class:`~dpjax.events.PoissonSampledGaussianEvent` of
  ⌈n/b⌉ rounds at noise multiplier σ / max_j ‖C e_j‖;
* **DP-FTRL tree aggregation**, one epoch (Kairouz et al. 2021, "Practical and private (deep)
  learning without sampling or shuffling", Appendix D): a record is in one leaf, hence in
  ⌈log₂(n + 1)⌉ nodes — :func:`tree_aggregation_event`, the Gaussian at σ/√⌈log₂(n + 1)⌉,
  which is exactly the RDP curve dp-accounting's ``SingleEpochTreeAggregationDpEvent`` charges
  (stated there for "replace with a special record", i.e. zero-out neighbours: how dpjax models
  add/remove-one with a public n, see :func:`dpjax.make_private`).

The events compose in :class:`dpjax.accounting.PrivacyAccountant` with every other event of the
same relation.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dpjax import _validate
from dpjax.dp_sgd.matrix_factorization.streaming import banded_width
from dpjax.events import GaussianEvent, PoissonSampledGaussianEvent
from dpjax.relation import ADD_OR_REMOVE_ONE

__all__ = [
    "max_column_norm",
    "matrix_mechanism_event",
    "strategy_event",
    "banded_rounds",
    "banded_amplified_event",
    "tree_depth",
    "tree_aggregation_event",
]


def _matrix(strategy: Any, steps: int | None = None) -> np.ndarray:
    """C as a float64 array (a BLT through its ``.matrix(n)``)."""
    if hasattr(strategy, "matrix") and callable(strategy.matrix):
        n = _validate.positive_int("steps", steps)
        return np.asarray(strategy.matrix(n), np.float64)
    c = np.asarray(strategy, np.float64)
    if c.ndim != 2 or c.shape[0] != c.shape[1] or not np.all(np.isfinite(c)):
        _validate.fail("strategy", f"an array of shape {c.shape}", "a finite square matrix C")
    return c


def max_column_norm(strategy: Any, steps: int | None = None) -> float:
    """max_j ‖C e_j‖₂: the sensitivity of C·G under single participation (clip = 1)."""
    return float(np.max(np.linalg.norm(_matrix(strategy, steps), axis=0)))


def matrix_mechanism_event(noise_multiplier: float, *, sensitivity: float) -> GaussianEvent:
    """The whole run as ONE Gaussian release: noise multiplier σ / sens(C).

    Args:
        noise_multiplier: σ > 0 of :func:`correlated_noise` (noise σ·clip·Z on C·G).
        sensitivity: sens(C), the ℓ2 sensitivity of C·G per unit clip under the sampler's
            participation pattern (``matrix_factorization.sensitivity.sensitivity``).

    Returns:
        ``GaussianEvent(σ / sens, count=1, relation=ADD_OR_REMOVE_ONE)``.

    Formal guarantees:
        The Gaussian mechanism on C·G with sensitivity clip·sens(C) (Dwork–Roth 2014,
        Theorem A.1; exact profile Balle–Wang 2018), released adaptively (Denisov et al.
        2022, Theorem 2.1). No amplification by sampling is claimed.
    """
    sigma = _validate.positive("noise_multiplier", noise_multiplier)
    sens = _validate.positive("sensitivity", sensitivity)
    return GaussianEvent(noise_multiplier=sigma / sens, count=1, relation=ADD_OR_REMOVE_ONE)


def strategy_event(
    strategy: Any,
    *,
    noise_multiplier: float,
    min_separation: int | None = None,
    max_participations: int = 1,
    steps: int | None = None,
) -> GaussianEvent:
    """:func:`matrix_mechanism_event` with sens(C) computed for the participation pattern.

    Args:
        strategy: C (n×n) or a BLT (then ``steps`` = n).
        noise_multiplier: σ > 0.
        min_separation: b, the minimum number of steps between two participations of a
            record (None: single participation).
        max_participations: k, the most participations of a record.
        steps: n for a BLT.

    Returns:
        The Gaussian event (see :func:`matrix_mechanism_event`).
    """
    from dpjax.dp_sgd.matrix_factorization.sensitivity import sensitivity  # noqa: PLC0415

    c = _matrix(strategy, steps)
    sens = sensitivity(c, min_separation=min_separation, max_participations=max_participations)
    return matrix_mechanism_event(noise_multiplier, sensitivity=sens)


def banded_rounds(steps: int, bands: int) -> int:
    """⌈n/b⌉: the most steps in which one record of a cyclic b-part split can participate."""
    n = _validate.positive_int("steps", steps)
    b = _validate.positive_int("bands", bands)
    return -(-n // b)


def banded_amplified_event(
    strategy: Any,
    *,
    noise_multiplier: float,
    sampling_rate: float,
    bands: int | None = None,
    steps: int | None = None,
    dataset_size: int | None = None,
    max_batch_size: int | None = None,
) -> PoissonSampledGaussianEvent:
    r"""A b-banded C with cyclic Poisson sampling, reduced to DP-SGD over ⌈n/b⌉ rounds.

    .. math::  \mathrm{event} = \mathrm{PSG}\big(\sigma / \max_j \|C e_j\|,\ q,\ \lceil n/b
       \rceil\big)

    Args:
        strategy: the n×n lower-triangular C (or a BLT with ``steps``; a BLT is banded only
            if ``bands`` covers it) with at most ``bands`` non-zero diagonals.
        noise_multiplier: σ > 0 of :func:`correlated_noise`.
        sampling_rate: q in (0, 1], the Poisson rate WITHIN a part (expected batch / part
            size).
        bands: b, the number of parts of the cyclic split (None: the width of C). It must
            be at least the width of C.
        steps: n (default: the size of C).
        dataset_size, max_batch_size: the PART size and the padded cap of a padded sampler
            (both or neither; see :class:`~dpjax.events.PoissonSampledGaussianEvent`).

    Returns:
        ``PoissonSampledGaussianEvent(σ / max_j‖C e_j‖, q, count=⌈n/b⌉)`` under add/remove-one.

    Raises:
        ValueError: C wider than ``bands`` (participations b apart would overlap in rows of
            C·G and the reduction does not hold), or a bad argument.

    Formal guarantees:
        Choquette-Choo et al. 2023, "(Amplified) banded matrix factorization", Theorem 4:
        with b-min-separated cyclic Poisson sampling and a b-banded C, the mechanism is
        (ε, δ)-DP whenever DP-SGD with rate q and noise multiplier σ / max_j‖C e_j‖ run for
        ⌈n/b⌉ steps is. Add/remove-one, adaptively chosen gradients.
    """
    c = _matrix(strategy, steps)
    n = c.shape[0] if steps is None else _validate.positive_int("steps", steps)
    if n != c.shape[0]:
        _validate.fail("steps", steps, f"None or the size of C ({c.shape[0]})")
    width = banded_width(c)
    b = width if bands is None else _validate.positive_int("bands", bands)
    if width > b:
        _validate.fail(
            "bands",
            b,
            f"≥ {width}, the number of non-zero diagonals of C (the "
            "amplification theorem needs a b-banded C for a b-part split)",
        )
    sigma = _validate.positive("noise_multiplier", noise_multiplier)
    return PoissonSampledGaussianEvent(
        noise_multiplier=sigma / max_column_norm(c),
        sampling_rate=sampling_rate,
        count=banded_rounds(n, b),
        relation=ADD_OR_REMOVE_ONE,
        dataset_size=dataset_size,
        max_batch_size=max_batch_size,
    )


def tree_depth(steps: int) -> int:
    """⌈log₂(n + 1)⌉: the tree nodes a leaf's record enters (dp-accounting's max depth)."""
    n = _validate.positive_int("steps", steps)
    return math.ceil(math.log2(n + 1))


def tree_aggregation_event(noise_multiplier: float, *, steps: int) -> GaussianEvent:
    """DP-FTRL tree aggregation, one epoch (each record in at most one of the n steps).

    Args:
        noise_multiplier: σ > 0, the noise of each tree node per unit clip.
        steps: n, the number of leaves (steps) of the tree.

    Returns:
        ``GaussianEvent(σ / √⌈log₂(n + 1)⌉, relation=ADD_OR_REMOVE_ONE)``.

    Formal guarantees:
        A record's clipped gradient enters ⌈log₂(n + 1)⌉ nodes, each with independent
        N(0, σ²clip²) noise: a Gaussian mechanism of sensitivity clip·√depth (Kairouz et al.
        2021, Appendix D; the RDP curve of dp-accounting's
        ``SingleEpochTreeAggregationDpEvent``).
    """
    sigma = _validate.positive("noise_multiplier", noise_multiplier)
    return GaussianEvent(
        noise_multiplier=sigma / math.sqrt(tree_depth(steps)), relation=ADD_OR_REMOVE_ONE
    )
