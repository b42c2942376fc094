r"""The ``noise=`` switch of :func:`dpjax.make_private`: banded matrix-factorization noise.

``make_private(..., noise=dpjax.dp_sgd.BandMF(bands=b))`` trains with the correlated noise of a
b-banded strategy C (default: the banded square root of the prefix-sum matrix, Kalinin &
Lampert 2024, normalised to max column norm 1) and the sampling its amplified accounting needs:

* **cyclic Poisson sampling** (:class:`CyclicPoissonSampler`): the n records are split into b
  parts by index (part p = {i : i mod b = p}), and step t Poisson-samples part t mod b at rate
  q = batch_size / ⌈n/b⌉ — so a record participates only in steps of its part, b apart;
* **accounting** (Choquette-Choo et al. 2023, "(Amplified) banded matrix factorization",
  Theorem 4): T steps are DP-SGD over ⌈T/b⌉ rounds at rate q and noise multiplier
  σ / max_j ‖C e_j‖ = σ (see
  :func:`~dpjax.dp_sgd.matrix_factorization.accounting.banded_amplified_event`).
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dpjax import _validate
from dpjax.dp_sgd._frozen import ReadOnlyAfterInit
from dpjax.dp_sgd.matrix_factorization.accounting import banded_rounds, max_column_norm
from dpjax.dp_sgd.matrix_factorization.streaming import band_table, correlated_noise
from dpjax.dp_sgd.samplers import PaddedBatch, PoissonSampler
from dpjax.relation import ADD_OR_REMOVE_ONE, NeighbouringRelation

__all__ = ["BandMF", "CyclicPoissonSampler", "banded_sqrt_matrix", "ResolvedBandMF"]


def banded_sqrt_matrix(n: int, bands: int) -> np.ndarray:
    """The square root of the prefix-sum matrix (c_k = binom(2k, k)/4^k) cut to ``bands``
    diagonals, as an n×n float64 matrix (uses ``strategies.banded_sqrt_strategy`` when the
    strategies module is present)."""
    try:
        from dpjax.dp_sgd.matrix_factorization.strategies import (  # noqa: PLC0415
            banded_sqrt_strategy,
        )

        return np.asarray(banded_sqrt_strategy(n, bands), np.float64)
    except ImportError:
        k = np.arange(min(bands, n))
        # binom(2k, k)/4^k = Π_{i=1}^{k} (2i − 1)/(2i), computed as a running product
        coefficients = np.concatenate([[1.0], np.cumprod((2 * k[1:] - 1) / (2 * k[1:]))])
        c = np.zeros((n, n))
        for j, v in enumerate(coefficients):
            c[np.arange(j, n), np.arange(n - j)] = v
        return c


@dataclasses.dataclass(frozen=True)
class BandMF:
    """Banded matrix-factorization noise for :func:`dpjax.make_private` (one argument).

    Attributes:
        bands: b ≥ 1, the number of non-zero diagonals of C and of parts of the cyclic split
            (b = 1 is DP-SGD's independent noise with the data split in one part).
        strategy: None (the banded square root), an n×n b-banded lower-triangular matrix for
            n = the run's steps, or a callable ``strategy(n, bands) -> C``. Normalised to max
            column norm 1 by :meth:`resolve`.

    Formal guarantees:
        With :func:`dpjax.make_private` (which resolves it and samples cyclically), the run is
        accounted as DP-SGD over ⌈T/b⌉ rounds at rate q on parts of ⌈n/b⌉ records
        (Choquette-Choo et al. 2023, "(Amplified) banded matrix factorization", Theorem 4;
        add/remove-one). Covered: the parameter trajectory and the public state of a run
        whose every step sees the data set of its first step in the same row order; NOT the
        noise buffers, keys and row-order record of the private state. The part of a record
        is its ROW INDEX mod b, so the row order is part of the plan: a record whose index
        changes mid-run can be sampled in steps less than b apart, and the ⌈T/b⌉-round
        accounting no longer holds. The state therefore records, from its first step, a
        digest of the rows in order, keyed by the run's key (an unkeyed digest of private
        data would fingerprint it) and kept in the SECRET state only, never in the public
        ledger (:mod:`~dpjax.dp_sgd.matrix_factorization.row_order`); ``step``/``fit``
        refuse other data or another order (``ValueError`` naming ``data``; under your own
        ``jax.jit``, NaN parameters), also after a checkpoint restore. Shuffle the data once,
        before the first step, never between steps.

    Example:
        >>> noise = BandMF(bands=4).resolve(dataset_size=1000, batch_size=50, steps=40)
        >>> noise.part_size, noise.sampling_rate, noise.rounds(40), noise.matrix.shape
        (250, 0.2, 10, (40, 40))
    """

    bands: int
    strategy: Any = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "bands", _validate.positive_int("bands", self.bands))

    def resolve(self, *, dataset_size: int, batch_size: int, steps: int) -> ResolvedBandMF:
        """The strategy for ``steps`` steps and the cyclic split of ``dataset_size`` records.

        Raises:
            ValueError: more bands than steps or records, a batch larger than a part, or a
                strategy that is not a b-banded lower-triangular n×n matrix.
        """
        b, n = self.bands, _validate.positive_int("steps", steps)
        records = _validate.positive_int("dataset_size", dataset_size)
        if b > n or b > records:
            _validate.fail("noise.bands", b, f"in [1, min(steps={n}, dataset_size={records})]")
        part = -(-records // b)
        if batch_size > part:
            _validate.fail(
                "batch_size",
                batch_size,
                f"≤ ⌈dataset_size/bands⌉ = {part} (each step samples "
                f"one of the {b} parts of the cyclic split at rate batch_size/{part} ≤ 1)",
            )
        if self.strategy is None:
            c = banded_sqrt_matrix(n, b)
        elif callable(self.strategy):
            c = np.asarray(self.strategy(n, b), np.float64)
        else:
            c = np.asarray(self.strategy, np.float64)
        if c.shape != (n, n):
            _validate.fail("noise.strategy", f"a matrix of shape {c.shape}", f"shape ({n}, {n})")
        band_table(c, b)  # validates: lower-triangular, invertible, ≤ b diagonals
        c = c / max_column_norm(c)
        return ResolvedBandMF(bands=b, matrix=c, part_size=part, sampling_rate=batch_size / part)


@dataclasses.dataclass(frozen=True, eq=False)
class ResolvedBandMF:
    """A :class:`BandMF` fixed for one run (what :class:`~dpjax.dp_sgd.PrivateTraining` uses).

    Attributes:
        bands: b. matrix: C (n×n, max column norm 1). part_size: ⌈dataset_size/b⌉.
        sampling_rate: the requested rate within a part, batch_size / part_size.
    """

    bands: int
    matrix: np.ndarray
    part_size: int
    sampling_rate: float

    @property
    def digest(self) -> int:
        """A 64-bit fingerprint of (b, C): the plan ledger records it, so a state is never
        continued under another strategy without a new phase."""
        h = hashlib.sha256(np.int64(self.bands).tobytes())
        h.update(np.ascontiguousarray(self.matrix, "<f8").tobytes())
        return int.from_bytes(h.digest()[:8], "little") or 1

    def rounds(self, steps: int) -> int:
        """⌈t/b⌉: the accounted rounds of t steps."""
        return banded_rounds(steps, self.bands) if steps > 0 else 0

    def transform(self, noise_multiplier: float, l2_clip_norm: float, *, key: jax.Array):
        """:func:`~dpjax.dp_sgd.matrix_factorization.streaming.correlated_noise` of C."""
        return correlated_noise(
            self.matrix,
            noise_multiplier=noise_multiplier,
            l2_clip_norm=l2_clip_norm,
            key=key,
            bands=self.bands,
        )

    def sampler(self, part_sampler: PoissonSampler, dataset_size: int) -> CyclicPoissonSampler:
        return CyclicPoissonSampler(part_sampler, parts=self.bands, dataset_size=dataset_size)


class CyclicPoissonSampler(ReadOnlyAfterInit):
    """Step t Poisson-samples part t mod b of the records (part p = {i : i mod b = p}).

    Wraps a :class:`~dpjax.dp_sgd.PoissonSampler` over ⌈n/b⌉ local slots: slot j of part p is
    record p + j·b (a slot past n, in the smaller parts, is never a record: masked out). Its
    rate, cap, truncation slack and event are the part sampler's, in ROUNDS (one round = b
    steps: a record is sampled at most once per round).

    Attributes:
        dataset_size: n (the rows of ``data``).
        parts: b.
        part_sampler: the Poisson sampler of one part.
        sampling_rate: the part sampler's realised rate.
        max_batch_size: the part sampler's cap.
    """

    _DERIVED = "the sampler was built with it"
    _REBUILD_HINT = "build a new sampler"

    def __init__(self, part_sampler: PoissonSampler, *, parts: int, dataset_size: int):
        self.part_sampler = part_sampler
        self.parts = _validate.positive_int("parts", parts)
        self.dataset_size = _validate.positive_int("dataset_size", dataset_size)
        if part_sampler.dataset_size != -(-self.dataset_size // self.parts):
            _validate.fail("part_sampler", part_sampler, "a sampler over ⌈n/parts⌉ slots")
        self.sampling_rate = part_sampler.sampling_rate
        self.max_batch_size = part_sampler.max_batch_size
        self._freeze()

    @property
    def expected_batch_size(self) -> float:
        """q·⌈n/b⌉: the PUBLIC normaliser (a full part's expected batch)."""
        return self.part_sampler.expected_batch_size

    def delta_slack(self, rounds: int, epsilon: float) -> float:
        """The part sampler's truncation slack over ``rounds`` rounds (a record's steps)."""
        return self.part_sampler.delta_slack(rounds, epsilon)

    def sample_at(self, key: jax.Array, step: jax.Array) -> PaddedBatch:
        """The batch of step ``step`` (jit-able): a Poisson batch of part step mod b."""
        local = self.part_sampler.sample(key)
        part = jnp.asarray(step, jnp.int32) % self.parts
        indices = part + local.indices * self.parts
        mask = local.mask & (indices < self.dataset_size)
        return PaddedBatch(jnp.where(mask, indices, 0).astype(jnp.int32), mask)

    def event(
        self,
        *,
        noise_multiplier: float,
        steps: int,
        relation: NeighbouringRelation | str = ADD_OR_REMOVE_ONE,
    ):
        """The event of ``steps`` ROUNDS (see the class): the part sampler's DP-SGD event.

        Valid for independent noise σ·C_clip per step, or for the correlated noise of a
        b-banded C (b ≤ ``parts``) with max column norm ≤ 1, as ``make_private`` builds it.
        With your own :func:`correlated_noise` strategy, pass σ / max_j‖C e_j‖ here, or use
        :func:`~dpjax.dp_sgd.matrix_factorization.accounting.banded_amplified_event`, which
        divides by it and checks the band width (an unnormalised C would be under-charged).
        """
        return self.part_sampler.event(
            noise_multiplier=noise_multiplier, steps=steps, relation=relation
        )

    def __repr__(self) -> str:
        return f"CyclicPoissonSampler(parts={self.parts}, part_sampler={self.part_sampler!r})"


def rounds_of(noise: ResolvedBandMF | None, steps: int) -> int:
    """The accounted steps of ``steps`` steps: ⌈t/b⌉ for banded MF, t for DP-SGD."""
    return steps if noise is None else noise.rounds(steps)
