r"""Batch samplers, each paired with the privacy event its sampling justifies.

A DP-SGD accountant is only valid for the sampling it assumes (anchors §3, opacus#80): the
Poisson-subsampled Gaussian accountant needs Poisson sampling, fixed-size shuffled batches need
an analysis of sampling without replacement. So each sampler here builds its own event:

* :class:`PoissonSampler` — every example joins a batch independently with probability q;
  batches are padded to a fixed shape (indices + mask) so one compiled step serves all sizes;
  ``event(...)`` is a :class:`~dpjax.accounting.events.PoissonSampledGaussianEvent`
  (add/remove-one). Normalise by the PUBLIC ``expected_batch_size`` = q·n.
* :class:`ShuffledBatchSampler` — a fresh permutation per epoch cut into fixed-size batches;
  ``event(...)`` is a :class:`~dpjax.accounting.events.FixedBatchGaussianEvent`
  (replace-one, ``sampling="shuffle"``: no amplification, epochs counted). Normalise by
  ``batch_size``.
* :class:`UniformBatchSampler` — a fresh uniformly random b-subset at every step;
  ``FixedBatchGaussianEvent(sampling="independent")`` (sampling without replacement).

Randomness comes only from the explicit ``key`` (JAX PRNG), so sampling is reproducible.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from scipy import stats

from dpjax import _validate
from dpjax.accounting.events import FixedBatchGaussianEvent, PoissonSampledGaussianEvent
from dpjax.relation import ADD_OR_REMOVE_ONE, REPLACE_ONE, NeighbouringRelation, as_relation

__all__ = ["PaddedBatch", "PoissonSampler", "ShuffledBatchSampler", "UniformBatchSampler"]

DEFAULT_OVERFLOW_PROBABILITY = 1e-9


class PaddedBatch(NamedTuple):
    """Indices of one batch padded to a fixed length.

    Attributes:
        indices: int32 (max_batch_size,) dataset indices; padding slots hold index 0.
        mask: bool (max_batch_size,), True for real examples (pass it to ``grad_fn(mask=...)``).
    """

    indices: jax.Array
    mask: jax.Array


def _binomial_cap(n: int, q: float, tail: float) -> int:
    """Smallest m with P[Binomial(n, q) > m] ≤ tail."""
    m = int(stats.binom.isf(tail, n, q))
    while m < n and stats.binom.sf(m, n, q) > tail:  # guard isf's floating-point edge
        m += 1
    while m > 0 and stats.binom.sf(m - 1, n, q) <= tail:
        m -= 1
    return max(1, min(n, m))


class PoissonSampler:
    r"""Poisson sampling at rate q, padded to a deterministic ``max_batch_size``.

    Each of the n examples is selected independently with probability q. The selected indices
    are returned in a random order, padded with masked slots to ``max_batch_size``.

    Above the cap: if more than ``max_batch_size`` examples are selected (probability
    ``overflow_probability`` per step), a uniformly random subset of ``max_batch_size`` of them
    is kept and the rest are dropped. The default cap makes this ≤ 1e-9 per step.

    Formal guarantees:
        Without overflow this is exactly the Poisson subsampling assumed by the subsampled
        Gaussian accountant (Abadi et al. 2016; 003_eb46ba05ef56608d.txt, amplification by
        subsampling), under add/remove-one. The truncated sampler differs from it by at most
        ``overflow_probability`` in total variation per step, so a run of T steps that the
        event shows (ε, δ)-DP is (ε, δ + T·overflow_probability)-DP; report
        :meth:`delta_slack` with ε.

    Args:
        dataset_size: n ≥ 1.
        sampling_rate: q ∈ (0, 1].
        max_batch_size: the padded length; default: smallest m with
            P[Binomial(n, q) > m] ≤ 1e-9.

    Example:
        >>> import jax
        >>> sampler = PoissonSampler(dataset_size=1000, sampling_rate=0.05)
        >>> batch = sampler.sample(jax.random.key(0))
        >>> batch.indices.shape == (sampler.max_batch_size,), sampler.expected_batch_size
        (True, 50.0)
        >>> sampler.event(noise_multiplier=1.0, steps=100).sampling_rate
        0.05
    """

    def __init__(
        self, *, dataset_size: int, sampling_rate: float, max_batch_size: int | None = None
    ):
        self.dataset_size = _validate.positive_int("dataset_size", dataset_size)
        self.sampling_rate = float(_validate.probability(sampling_rate, "sampling_rate"))
        if max_batch_size is None:
            max_batch_size = _binomial_cap(
                self.dataset_size, self.sampling_rate, DEFAULT_OVERFLOW_PROBABILITY
            )
        self.max_batch_size = _validate.positive_int("max_batch_size", max_batch_size)
        if self.max_batch_size > self.dataset_size:
            _validate.fail("max_batch_size", max_batch_size, f"at most dataset_size={dataset_size}")

    @property
    def expected_batch_size(self) -> float:
        """q·n: the PUBLIC normaliser for :func:`dpjax.normalize_by`."""
        return self.sampling_rate * self.dataset_size

    @property
    def overflow_probability(self) -> float:
        """P[Binomial(n, q) > max_batch_size]: chance per step that examples are dropped."""
        return float(stats.binom.sf(self.max_batch_size, self.dataset_size, self.sampling_rate))

    def delta_slack(self, steps: int) -> float:
        """T · overflow_probability: add it to the δ of :meth:`event` (truncation)."""
        return _validate.positive_int("steps", steps) * self.overflow_probability

    def sample(self, key: jax.Array) -> PaddedBatch:
        """Draw one Poisson batch (jit-able; ``key`` used once).

        Args:
            key: a JAX PRNG key.

        Returns:
            :class:`PaddedBatch` of length ``max_batch_size``.
        """
        u = jax.random.uniform(key, (self.dataset_size,))
        selected = u < self.sampling_rate
        # Among selected examples u is uniform on [0, q): the smallest max_batch_size of them
        # form a uniformly random subset (the truncation rule above the cap), in random order.
        priority = jnp.where(selected, u, jnp.inf)
        neg_top, indices = jax.lax.top_k(-priority, self.max_batch_size)
        mask = jnp.isfinite(neg_top)
        return PaddedBatch(jnp.where(mask, indices, 0).astype(jnp.int32), mask)

    def event(
        self,
        *,
        noise_multiplier: float,
        steps: int,
        relation: NeighbouringRelation | str = ADD_OR_REMOVE_ONE,
    ) -> PoissonSampledGaussianEvent:
        """The event of ``steps`` DP-SGD steps with this sampler and noise σ·C on the sum."""
        return PoissonSampledGaussianEvent(
            noise_multiplier=noise_multiplier,
            sampling_rate=self.sampling_rate,
            count=steps,
            relation=as_relation(relation),
        )

    def __repr__(self) -> str:
        return (
            f"PoissonSampler(dataset_size={self.dataset_size}, sampling_rate={self.sampling_rate}, "
            f"max_batch_size={self.max_batch_size})"
        )


class _FixedSizeBatches:
    """Shared parts of the fixed-size samplers: validation, normaliser, event, repr."""

    _SAMPLING = ""  # FixedBatchGaussianEvent.sampling of the subclass

    def __init__(self, *, dataset_size: int, batch_size: int):
        self.dataset_size = _validate.positive_int("dataset_size", dataset_size)
        self.batch_size = _validate.positive_int("batch_size", batch_size)
        if self.batch_size > self.dataset_size:
            _validate.fail("batch_size", batch_size, f"at most dataset_size={dataset_size}")

    @property
    def expected_batch_size(self) -> float:
        """b (deterministic here): the normaliser for :func:`dpjax.normalize_by`."""
        return float(self.batch_size)

    def event(
        self,
        *,
        noise_multiplier: float,
        steps: int,
        relation: NeighbouringRelation | str = REPLACE_ONE,
    ) -> FixedBatchGaussianEvent:
        """The event of ``steps`` DP-SGD steps on these batches with noise σ·C on the sum."""
        return FixedBatchGaussianEvent(
            noise_multiplier=noise_multiplier,
            batch_size=self.batch_size,
            dataset_size=self.dataset_size,
            count=steps,
            relation=as_relation(relation),
            sampling=self._SAMPLING,
        )

    def __repr__(self) -> str:
        name = type(self).__name__
        return f"{name}(dataset_size={self.dataset_size}, batch_size={self.batch_size})"


class ShuffledBatchSampler(_FixedSizeBatches):
    r"""Fixed-size batches from a fresh random permutation per epoch (sampling w/o replacement).

    Each epoch is a permutation of the n indices cut into ⌊n/b⌋ batches of exactly b (the last
    n mod b examples of the permutation are skipped that epoch).

    Formal guarantees:
        Each batch is a uniformly random b-subset marginally, but batches within an epoch are
        disjoint, so the per-step subsampling analyses (Poisson, or independent sampling
        without replacement) do NOT apply (opacus#80). The event is a
        :class:`~dpjax.accounting.events.FixedBatchGaussianEvent` with ``sampling="shuffle"``
        under replace-one: the accountant charges each record for the ⌈T/⌊n/b⌋⌉ batches it can
        appear in, each a Gaussian release of sensitivity 2C, with no amplification.

    Args:
        dataset_size: n ≥ 1.
        batch_size: b in [1, n].

    Example:
        >>> import jax
        >>> sampler = ShuffledBatchSampler(dataset_size=10, batch_size=4)
        >>> sampler.epoch(jax.random.key(0)).shape
        (2, 4)
    """

    _SAMPLING = "shuffle"

    @property
    def batches_per_epoch(self) -> int:
        """⌊n / b⌋."""
        return self.dataset_size // self.batch_size

    def epoch(self, key: jax.Array) -> jax.Array:
        """One epoch of batches: int32 (batches_per_epoch, batch_size) indices (jit-able)."""
        perm = jax.random.permutation(key, self.dataset_size)
        used = self.batches_per_epoch * self.batch_size
        return perm[:used].reshape(self.batches_per_epoch, self.batch_size).astype(jnp.int32)


class UniformBatchSampler(_FixedSizeBatches):
    r"""A fresh uniformly random subset of exactly b examples at every step.

    Formal guarantees:
        Each step samples b of n without replacement, independently of the other steps: the
        event is ``FixedBatchGaussianEvent(sampling="independent")`` under replace-one, for the
        sampling-without-replacement analysis (Wang, Balle, Kasiviswanathan 2019) — not the
        Poisson accountant.

    Args:
        dataset_size: n ≥ 1.
        batch_size: b in [1, n].

    Example:
        >>> import jax
        >>> UniformBatchSampler(dataset_size=10, batch_size=4).sample(jax.random.key(0)).shape
        (4,)
    """

    _SAMPLING = "independent"

    def sample(self, key: jax.Array) -> jax.Array:
        """int32 (batch_size,) distinct indices, uniformly random (jit-able)."""
        idx = jax.random.choice(key, self.dataset_size, (self.batch_size,), replace=False)
        return idx.astype(jnp.int32)
