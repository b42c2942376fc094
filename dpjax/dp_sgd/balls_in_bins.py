r"""Balls-in-bins batches (random 1-out-of-t allocation) with a fixed padded shape.

Every epoch of t steps, each of the n records is thrown into one uniformly random step (its
"bin"), independently of the other records: a record is used exactly once per epoch (unlike
Poisson sampling) and batch sizes vary, Binomial(n, 1/t) each (unlike shuffling). Chua et al.
2024 ("Balls-and-bins sampling for DP-SGD") call this balls-and-bins sampling; Feldman &
Shenfeld 2025 call it random allocation (k = 1 out of t).

What is fixed-size and what is not:

* fixed: the shape of every batch (``max_batch_size`` slots: indices + mask), the number of
  steps per epoch t, and the public normaliser n/t (:attr:`expected_batch_size`);
* not fixed: the number of real (unmasked) records of a step, Binomial(n, 1/t); above the cap
  a uniformly random ``max_batch_size`` of the bin are kept and the rest dropped (probability
  :attr:`overflow_probability` per step, charged on δ like :class:`PoissonSampler`'s cap).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from scipy import stats

from dpjax import _validate
from dpjax.accounting.padded_slack import TRUNCATION_DELTA_SHARES
from dpjax.dp_sgd._frozen import ReadOnlyAfterInit
from dpjax.dp_sgd.samplers import (
    DEFAULT_OVERFLOW_PROBABILITY,
    SIZING_EPSILON,
    PaddedBatch,
    _binomial_cap,
    _event_noise_multiplier,
    _run_plan,
)
from dpjax.events import BallsInBinsGaussianEvent
from dpjax.relation import ADD_OR_REMOVE_ONE, NeighbouringRelation, as_relation

__all__ = ["BallsInBinsSampler"]

_MAX_INDEX = 2**31 - 1  # int32 indices


class BallsInBinsSampler(ReadOnlyAfterInit):
    r"""Balls-in-bins sampling: each record joins one uniformly random step of each epoch.

    :meth:`epoch` draws the t padded batches of one epoch from one key (bins by
    ``jax.random.randint``; the order inside a bin, and so the records kept above the cap, by
    an independent random permutation). Use a fresh key per epoch (``jax.random.split``);
    the same key gives the same epoch. Normalise the noisy sum by the PUBLIC
    :attr:`expected_batch_size` n/t.

    Formal guarantees:
        Privacy accounting (what :meth:`event` records): NO amplification is claimed. Each
        epoch is charged as one Gaussian release of sensitivity C under add/remove-one (2C
        under replace-one) at noise σ·C, and epochs compose: E epochs are
        (√E/σ)-GDP under add/remove-one (2√E/σ under replace-one). Proof: the bin b of the
        differing record is drawn independently of the data and of the other records' bins,
        with the same law on D and on its neighbour D′. Conditioned on b (and on the other
        bins, coupled to be equal), the epoch's t adaptive steps on D and D′ differ only in
        step b, by one clipped gradient, so the conditional epoch is 1/σ-GDP (Gaussian
        mechanism; Dong, Roth & Su 2022, "Gaussian differential privacy", Theorem 2.7 with
        adaptive composition Corollary 3.3, https://arxiv.org/abs/1905.02383). The
        unconditional epoch is a mixture over b of such pairs, and the hockey-stick divergence
        is jointly convex (an f-divergence; the mixing weights are the same on D and D′), so
        δ_epoch(ε) ≤ δ_Gauss(1/σ)(ε) for every ε, i.e. the epoch is 1/σ-GDP (same paper,
        Corollary 2.13); composing E epochs adaptively gives √E/σ (Corollary 3.3). This holds
        for any data-independent bin distribution, so the small bias of ``randint`` does not
        enter.
        It is conservative: balls-in-bins amplifies privacy (Chua et al. 2024,
        https://arxiv.org/abs/2412.16802; Feldman & Shenfeld 2025, "Privacy amplification by
        random allocation", https://arxiv.org/abs/2502.08202, bound it by Poisson subsampling
        at rate (1 + o(1))/t), but those amplified bounds are not implemented here;
        :func:`dpjax.accounting.monte_carlo_epsilon` ESTIMATES the amplified ε with a
        confidence interval, which is not a guarantee.

        Truncation: couple the capped run with the uncapped one on the same randomness; they
        differ only if a step overflows, probability ≤ T·p̄ over T steps on D or D′,
        p̄ = P[Binomial(n + 1, 1/t) > m], so the run is (ε, δ + (1 + e^ε)·T·p̄)-DP
        (:meth:`delta_slack`; the accountants add it themselves for :meth:`event`).

    Args:
        dataset_size: n in [1, 2³¹ − 1].
        steps_per_epoch: t ≥ 1 (t = 1 is full-batch DP-GD).
        max_batch_size: the padded length m in [1, n]; default: sized from ``steps`` and
            ``delta`` when given (the slack (1 + e^ε)·T·p̄ within 10⁻³·δ for every
            ε ≤ 10, as :class:`PoissonSampler`), else P[Binomial(n, 1/t) > m] ≤ 1e-9.
        steps: T, the run's planned number of steps (with ``delta``), or None.
        delta: the δ the run will be reported at (with ``steps``), in (0, 1), or None.

    Raises:
        ValueError: invalid arguments (named); ``steps`` without ``delta`` or the reverse; a
            ``max_batch_size`` whose slack 2·T·p̄ (its value at ε = 0) exceeds ``delta``/4;
            no cap of at most n rows meeting the sizing claim.

    Example:
        >>> import jax
        >>> sampler = BallsInBinsSampler(dataset_size=100, steps_per_epoch=4)
        >>> batches = sampler.epoch(jax.random.key(0))
        >>> batches.indices.shape == (4, sampler.max_batch_size), int(batches.mask.sum())
        (True, 100)
        >>> sampler.event(noise_multiplier=1.0, steps=8).epochs
        2
    """

    _DERIVED = "epoch and event must agree"
    _REBUILD_HINT = "build a new BallsInBinsSampler(...)"

    def __init__(
        self,
        *,
        dataset_size: int,
        steps_per_epoch: int,
        max_batch_size: int | None = None,
        steps: int | None = None,
        delta: float | None = None,
    ):
        self.dataset_size = _validate.positive_int("dataset_size", dataset_size)
        if self.dataset_size > _MAX_INDEX:
            _validate.fail("dataset_size", dataset_size, f"in [1, {_MAX_INDEX}] (int32 indices)")
        self.steps_per_epoch = _validate.positive_int("steps_per_epoch", steps_per_epoch)
        plan = _run_plan(steps, delta)
        rate = 1.0 / self.steps_per_epoch
        if max_batch_size is None and plan is None:
            max_batch_size = _binomial_cap(self.dataset_size, rate, DEFAULT_OVERFLOW_PROBABILITY)
        elif max_batch_size is None:
            t, d = plan
            tail = TRUNCATION_DELTA_SHARES[0] * d / (t * (1.0 + math.exp(SIZING_EPSILON)))
            max_batch_size = min(
                self.dataset_size, _binomial_cap(self.dataset_size + 1, rate, tail)
            )
        self.max_batch_size = _validate.positive_int("max_batch_size", max_batch_size)
        if self.max_batch_size > self.dataset_size:
            _validate.fail("max_batch_size", max_batch_size, f"at most dataset_size={dataset_size}")
        if plan is not None and 2.0 * plan[0] * self.neighbour_overflow_probability > (
            TRUNCATION_DELTA_SHARES[-1] * plan[1]
        ):
            _validate.fail(
                "max_batch_size",
                max_batch_size,
                f"a cap whose truncation slack (1 + e^ε)·T·p̄ can fit in delta={plan[1]:g} over "
                f"steps={plan[0]} (here T·p̄ = {plan[0] * self.neighbour_overflow_probability:.3g}"
                "): a larger max_batch_size, or None to size it from steps and delta",
            )
        self._freeze()

    @property
    def expected_batch_size(self) -> float:
        """n/t: the PUBLIC normaliser for :func:`dpjax.normalize_by`."""
        return self.dataset_size / self.steps_per_epoch

    @property
    def overflow_probability(self) -> float:
        """P[Binomial(n, 1/t) > max_batch_size]: chance per step that records are dropped."""
        n, m, t = self.dataset_size, self.max_batch_size, self.steps_per_epoch
        return float(stats.binom.sf(m, n, 1.0 / t))

    @property
    def neighbour_overflow_probability(self) -> float:
        """p̄ = P[Binomial(n + 1, 1/t) > max_batch_size]: the overflow chance per step on the
        data set or any neighbour of it."""
        n, m, t = self.dataset_size, self.max_batch_size, self.steps_per_epoch
        return float(stats.binom.sf(m, n + 1, 1.0 / t))

    def delta_slack(self, steps: int, epsilon: float) -> float:
        """(1 + e^ε)·T·p̄, the δ the cap costs over ``steps`` T at ``epsilon`` (≥ 0)."""
        steps = _validate.positive_int("steps", steps)
        epsilon = _validate.non_negative("epsilon", _validate.real("epsilon", epsilon))
        p = self.neighbour_overflow_probability
        if p == 0.0:
            return 0.0
        return (1.0 + math.exp(epsilon) if epsilon < 709.0 else math.inf) * steps * p

    def epoch(self, key: jax.Array) -> PaddedBatch:
        """The t padded batches of one epoch (jit-able; ``key`` used once).

        Args:
            key: a JAX PRNG key (a fresh one per epoch).

        Returns:
            :class:`PaddedBatch` with int32 ``indices`` and bool ``mask`` of shape
            (steps_per_epoch, max_batch_size); row s is step s's batch, padding slots hold
            index 0 and mask False. Without overflow every record is in exactly one row.
        """
        n, t, m = self.dataset_size, self.steps_per_epoch, self.max_batch_size
        bin_key, order_key = jax.random.split(key)
        bins = jax.random.randint(bin_key, (n,), 0, t, dtype=jnp.int32)
        perm = jax.random.permutation(order_key, n).astype(jnp.int32)
        order = jnp.argsort(bins[perm], stable=True)  # by bin; random order inside a bin
        by_bin = perm[order].astype(jnp.int32)
        counts = jnp.bincount(bins, length=t).astype(jnp.int32)
        starts = jnp.cumsum(counts, dtype=jnp.int32) - counts
        slot = jnp.arange(m, dtype=jnp.int32)
        mask = slot[None, :] < counts[:, None]  # the first m of a bin in random order are kept
        position = jnp.minimum(starts[:, None] + slot[None, :], jnp.int32(n - 1))
        indices = jnp.where(mask, by_bin[position], 0).astype(jnp.int32)
        return PaddedBatch(indices, mask)

    def event(
        self,
        *,
        noise_multiplier: float,
        steps: int,
        relation: NeighbouringRelation | str = ADD_OR_REMOVE_ONE,
    ) -> BallsInBinsGaussianEvent:
        """The event of ``steps`` DP-SGD steps on these batches with noise σ·C on the sum,
        its cap included (the accountants add the truncation slack to δ).

        It charges ⌈steps/t⌉ epochs: the steps must run epoch by epoch from the start of an
        epoch. A run that abandons an epoch part-way (a resume that draws a fresh epoch) touches
        more epochs than that: record one event per stretch of steps run on one epoch draw
        (the accountant does not merge them).

        Raises:
            ValueError: ``noise_multiplier`` ≤ 0 (σ = 0 is not private), bad ``steps``.
        """
        _event_noise_multiplier(noise_multiplier)
        return BallsInBinsGaussianEvent(
            noise_multiplier=noise_multiplier,
            steps_per_epoch=self.steps_per_epoch,
            count=steps,
            relation=as_relation(relation),
            dataset_size=self.dataset_size,
            max_batch_size=self.max_batch_size,
        )

    def __repr__(self) -> str:
        return (
            f"BallsInBinsSampler(dataset_size={self.dataset_size}, steps_per_epoch="
            f"{self.steps_per_epoch}, max_batch_size={self.max_batch_size})"
        )
