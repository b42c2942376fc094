r"""Batch samplers, each paired with the privacy event its sampling justifies.

A DP-SGD accountant is only valid for the sampling it assumes (anchors §3, opacus#80): the
Poisson-subsampled Gaussian accountant needs Poisson sampling, fixed-size shuffled batches need
an analysis of sampling without replacement. So each sampler here builds its own event:

* :class:`PoissonSampler` — every example joins a batch independently with probability q
  (decided on 64 random bits with integer arithmetic, so the realised rate is exact);
  batches are padded to a fixed shape (indices + mask) so one compiled step serves all sizes;
  ``event(...)`` is a :class:`~dpjax.events.PoissonSampledGaussianEvent`
  (add/remove-one). Normalise by the PUBLIC ``expected_batch_size`` = q·n.
* :class:`ShuffledBatchSampler` — a fresh permutation per epoch cut into fixed-size batches;
  ``event(...)`` is a :class:`~dpjax.events.FixedBatchGaussianEvent`
  (replace-one, ``sampling="shuffle"``: no amplification, epochs counted). Normalise by
  ``batch_size``.
* :class:`UniformBatchSampler` — a fresh uniformly random b-subset at every step;
  ``FixedBatchGaussianEvent(sampling="independent")`` (sampling without replacement).

Randomness comes only from the explicit ``key`` (JAX PRNG), so sampling is reproducible.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import NamedTuple

import jax
import jax.numpy as jnp
from scipy import stats

from dpjax import _validate
from dpjax.accounting.padded_slack import TRUNCATION_DELTA_SHARES
from dpjax.dp_sgd._frozen import ReadOnlyAfterInit
from dpjax.events import (
    FixedBatchGaussianEvent,
    PoissonSampledGaussianEvent,
    WithReplacementGaussianEvent,
)
from dpjax.relation import ADD_OR_REMOVE_ONE, REPLACE_ONE, NeighbouringRelation, as_relation

__all__ = [
    "PaddedBatch",
    "PoissonSampler",
    "ShuffledBatchSampler",
    "UniformBatchSampler",
    "WithReplacementSampler",
    "inclusion_threshold",
    "realised_sampling_rate",
    "words_below_threshold",
]

DEFAULT_OVERFLOW_PROBABILITY = 1e-9

#: ε up to which a cap sized from ``steps`` and ``delta`` keeps the truncation slack within the
#: first share of δ (:data:`dpjax.accounting.padded_slack.TRUNCATION_DELTA_SHARES`); larger
#: ε use the larger shares (up to ε ≈ 16 within δ/2).
SIZING_EPSILON = 10.0


_MAX_INDEX = 2**31 - 1  # jax.random draws int32 indices


def _event_noise_multiplier(noise_multiplier: float) -> float:
    """σ for a sampler's privacy event: σ > 0 (σ = 0 is the clip-only baseline, ε = inf)."""
    if _validate.non_negative("noise_multiplier", noise_multiplier) == 0.0:
        _validate.fail(
            "noise_multiplier",
            noise_multiplier,
            "> 0 for a privacy event (σ = 0 is the clip-only baseline: NOT private, ε = inf)",
        )
    return float(noise_multiplier)


class PaddedBatch(NamedTuple):
    """Indices of one batch padded to a fixed length.

    Attributes:
        indices: int32 (max_batch_size,) dataset indices; padding slots hold index 0.
        mask: bool (max_batch_size,), True for real examples (pass it to ``grad_fn(mask=...)``).
    """

    indices: jax.Array
    mask: jax.Array

    def micro_batches(self, physical_batch_size: int) -> PaddedBatch:
        """Split this batch into k = ⌈max_batch_size / m⌉ micro-batches of m rows.

        Slot j of the batch goes to row j // m, column j % m; the last row is padded with
        masked slots (index 0). So every selected record lies in exactly one micro-batch and
        the union of the micro-batches is this batch: accumulating their clipped sums and
        adding noise once is the DP-SGD step on the one Poisson batch (its inclusion
        probabilities unchanged). Drawing k independent Poisson batches instead lets a record
        appear several times, and is NOT Poisson sampling at rate k·q.

        Args:
            physical_batch_size: m ≥ 1, rows per micro-batch (the memory limit).

        Returns:
            A :class:`PaddedBatch` with ``indices`` and ``mask`` of shape (k, m); iterate over
            the leading axis (``jax.lax.scan`` or indexing).

        Example:
            >>> import jax.numpy as jnp
            >>> b = PaddedBatch(jnp.array([4, 2, 7, 0], jnp.int32), jnp.array([1, 1, 1, 0], bool))
            >>> micro = b.micro_batches(3)
            >>> micro.indices.tolist(), micro.mask.tolist()
            ([[4, 2, 7], [0, 0, 0]], [[True, True, True], [False, False, False]])
        """
        m = _validate.positive_int("physical_batch_size", physical_batch_size)
        if jnp.ndim(self.indices) != 1 or jnp.shape(self.mask) != jnp.shape(self.indices):
            _validate.fail(
                "batch",
                f"indices of shape {jnp.shape(self.indices)}",
                "one padded batch: indices and mask of the same shape (B,)",
            )
        size = jnp.shape(self.indices)[0]
        k = max(1, -(-size // m))
        pad = k * m - size
        indices = jnp.concatenate([self.indices, jnp.zeros((pad,), self.indices.dtype)])
        mask = jnp.concatenate([self.mask, jnp.zeros((pad,), jnp.bool_)])
        return PaddedBatch(indices.reshape(k, m), mask.reshape(k, m))


def _binomial_cap(n: int, q: float, tail: float) -> int:
    """Smallest m in [1, n] with P[Binomial(n, q) > m] ≤ tail.

    Bisection on m (the tail decreases in m; P[Bin > n] = 0): ⌈log₂ n⌉ evaluations. (Walking
    from ``binom.isf``, inexact at tails ~1e-26, took 6·10⁴ evaluations — seconds — at
    n = 60 000, ε = 34.)
    """
    lo, hi = 0, n  # invariant: sf(hi) ≤ tail; sf(lo) > tail once lo > 0 is set
    if stats.binom.sf(0, n, q) <= tail:
        return 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if stats.binom.sf(mid, n, q) <= tail:
            hi = mid
        else:
            lo = mid
    return max(1, min(n, hi))


def _run_plan(steps: int | None, delta: float | None) -> tuple[int, float] | None:
    """(T, δ) of the planned run, validated, or None if neither is given."""
    if steps is None and delta is None:
        return None
    if steps is None or delta is None:
        _validate.fail(
            "steps" if steps is None else "delta",
            None,
            "given together with " + ("delta" if steps is None else "steps") + " (or neither)",
        )
    t = _validate.positive_int("steps", steps)
    d = _validate.in_range("delta", delta, 0.0, 1.0, low_inclusive=False, high_inclusive=False)
    return t, d


def _refuse_unsizable_rate(sampling_rate: float, n: int, steps: int, delta: float) -> None:
    """A cap sized from (T, δ) would need more than n rows: refuse, naming the rate."""
    _validate.fail(
        "sampling_rate",
        sampling_rate,
        f"small enough that a cap of at most dataset_size={n} rows keeps the truncation slack "
        f"(1 + e^ε)·T·p̄ within {TRUNCATION_DELTA_SHARES[0]:g}·delta for every ε ≤ "
        f"{SIZING_EPSILON:g} over steps={steps} at delta={delta:g} (an add-one neighbour of "
        "n + 1 records overflows even the full cap n with probability q^(n+1) per step); use "
        "a smaller sampling_rate, full-batch DP-GD (dpjax.erm), or pass max_batch_size="
        "dataset_size explicitly to accept a slack that is checked at ε = 0 only (the "
        "accountant then refuses the ε whose slack does not fit in δ)",
    )


#: Resolution of the inclusion decision: two 32-bit words, i.e. a 64-bit uniform integer.
THRESHOLD_BITS = 64
_WORD = 1 << 32


def inclusion_threshold(sampling_rate: float) -> int:
    """t = ⌊q·2⁶⁴⌋, computed exactly (``Fraction``); an example is included iff its 64-bit
    random word W (two uint32 words, high first) satisfies W < t, so P[included] = t/2⁶⁴.

    For q ≥ 2⁻¹² the product q·2⁶⁴ is an integer (a double has 53 significant bits) and t/2⁶⁴
    = q exactly; below, t/2⁶⁴ ≤ q with t < 2⁵², so t/2⁶⁴ is still exactly a double.
    ``sampling_rate = 1`` gives 2⁶⁴ (every example; handled without bits).

    Example:
        >>> inclusion_threshold(0.5) == 2**63
        True
    """
    q = Fraction(float(sampling_rate))
    if not 0 < q <= 1:
        _validate.fail("sampling_rate", sampling_rate, "in (0, 1]")
    return math.floor(q * (1 << THRESHOLD_BITS))


def realised_sampling_rate(sampling_rate: float) -> float:
    """t/2⁶⁴ with t = :func:`inclusion_threshold`: the inclusion probability the sampler
    realises, exactly (it is a double), and ≤ ``sampling_rate``."""
    t = inclusion_threshold(sampling_rate)
    rate = t / (1 << THRESHOLD_BITS)  # correctly rounded int/int division; exact here
    if Fraction(rate) != Fraction(t, 1 << THRESHOLD_BITS):  # pragma: no cover (see docstring)
        raise AssertionError("t/2**64 is not a double")
    return rate


def words_below_threshold(high: jax.Array, low: jax.Array, threshold: int) -> jax.Array:
    """Whether the 64-bit words (``high``·2³² + ``low``, uint32 arrays) are < ``threshold``.

    Integer arithmetic only (lexicographic comparison of the uint32 pairs), so the decision is
    exact with or without x64. ``threshold`` must lie in [1, 2⁶⁴).
    """
    if not 1 <= threshold < (1 << THRESHOLD_BITS):
        _validate.fail("threshold", threshold, "in [1, 2**64)")
    t_high = jnp.uint32(threshold // _WORD)
    t_low = jnp.uint32(threshold % _WORD)
    return (high < t_high) | ((high == t_high) & (low < t_low))


class PoissonSampler(ReadOnlyAfterInit):
    r"""Poisson sampling at rate q, padded to a deterministic ``max_batch_size``.

    Each of the n examples is selected independently: its two uint32 random words, read as a
    64-bit integer W, must satisfy W < ⌊q·2⁶⁴⌋ (integer arithmetic, exact with or without
    x64; a float32 uniform compared with q would realise ⌈q·2²³⌉/2²³ instead). So the realised
    rate is ``sampling_rate`` = ⌊q·2⁶⁴⌋/2⁶⁴ — q itself for q ≥ 2⁻¹², at most 2⁻⁶⁴ below q
    otherwise — and that is the rate the event records. The selected indices are returned in a
    random order (by independent random priorities), padded with masked slots to
    ``max_batch_size``.

    Above the cap: if more than ``max_batch_size`` examples are selected (probability
    ``overflow_probability`` per step), the ``max_batch_size`` of highest priority are kept — a
    uniformly random subset (priorities are drawn independently of the selection) — and the
    rest dropped. Give the run's ``steps`` T and target ``delta`` δ when you know them: the
    default cap is then the smallest m whose slack (1 + e^ε)·T·p̄ fits in the first share
    (10⁻³) of δ for every ε ≤ :data:`SIZING_EPSILON`, and an explicit ``max_batch_size`` whose
    slack cannot fit in δ at any ε is refused here, before training, instead of by the
    accountant after it. Without them the default cap makes the overflow ≤ 1e-9 per step,
    which holds δ = 10⁻⁵ only for a few hundred steps. (Order and truncation rule do not
    enter the privacy analysis; truncation is paid for by :meth:`delta_slack`, which the
    accountants add to δ for the events of :meth:`event`.)

    Formal guarantees:
        Without overflow this is exactly the Poisson subsampling at rate ``sampling_rate``
        assumed by the subsampled Gaussian accountant (Abadi et al. 2016,
        amplification by subsampling), under add/remove-one, given uniform random bits.
        With truncation: couple the truncated run M with the untruncated run M* on the same
        randomness. They differ only if some step overflows, which has probability ≤ T·p̄ on
        D and on its neighbour D′, with p̄ = P[Binomial(n + 1, q) > m] (n = ``dataset_size``,
        m = ``max_batch_size``; n + 1 covers an add-one neighbour). If M* is (ε, δ)-DP, then
        for every set S of outputs
        P[M(D) ∈ S] ≤ P[M*(D) ∈ S] + Tp̄ ≤ e^ε P[M*(D′) ∈ S] + δ + Tp̄
        ≤ e^ε (P[M(D′) ∈ S] + Tp̄) + δ + Tp̄, so M is (ε, δ + (1 + e^ε)·T·p̄)-DP: report
        :meth:`delta_slack` ``(steps, epsilon)`` with the event's ε (the slack depends on ε).

    Args:
        dataset_size: n ≥ 1.
        sampling_rate: q ∈ [2⁻⁶⁴, 1] (the realised rate ⌊q·2⁶⁴⌋/2⁶⁴ is stored).
        max_batch_size: the padded length; default: sized from ``steps`` and ``delta`` when
            given (above), else the smallest m with P[Binomial(n, q) > m] ≤ 1e-9.
        steps: T, the number of steps the run will take (with ``delta``), or None.
        delta: the δ the run will be reported at (with ``steps``), in (0, 1), or None.

    Raises:
        ValueError: invalid arguments; ``steps`` without ``delta`` or the reverse; a
            ``max_batch_size`` whose truncation slack 2·T·p̄ (its value at ε = 0) exceeds
            half of ``delta``, so that no ε can be reported at that δ; ``sampling_rate``
            when ``steps`` and ``delta`` are given without ``max_batch_size`` and no cap of at
            most ``dataset_size`` rows meets the sizing claim above (q near 1 on a small data
            set: an add-one neighbour overflows the full cap with probability q^(n+1)).

    Example:
        >>> import jax
        >>> sampler = PoissonSampler(dataset_size=1000, sampling_rate=0.05)
        >>> batch = sampler.sample(jax.random.key(0))
        >>> batch.indices.shape == (sampler.max_batch_size,), sampler.expected_batch_size
        (True, 50.0)
        >>> sampler.event(noise_multiplier=1.0, steps=100).sampling_rate
        0.05
        >>> PoissonSampler(dataset_size=10, sampling_rate=1e-6).sampling_rate == 1e-6
        False
    """

    _DERIVED = "sample and event must agree"
    _REBUILD_HINT = "build a new PoissonSampler(...)"

    def __init__(
        self,
        *,
        dataset_size: int,
        sampling_rate: float,
        max_batch_size: int | None = None,
        steps: int | None = None,
        delta: float | None = None,
    ):
        self.dataset_size = _validate.positive_int("dataset_size", dataset_size)
        requested = _validate.real("sampling_rate", sampling_rate)
        _validate.in_range(
            "sampling_rate", requested, 2.0**-THRESHOLD_BITS, 1.0, high_inclusive=True
        )
        #: The rate asked for; ``sampling_rate`` is the (≤) rate the sampler realises.
        self.requested_sampling_rate = requested
        self.sampling_rate = realised_sampling_rate(requested)
        self.threshold = inclusion_threshold(requested)
        plan = _run_plan(steps, delta)
        if max_batch_size is None and plan is None:
            max_batch_size = _binomial_cap(
                self.dataset_size, self.sampling_rate, DEFAULT_OVERFLOW_PROBABILITY
            )
        elif max_batch_size is None:
            t, d = plan
            tail = TRUNCATION_DELTA_SHARES[0] * d / (t * (1.0 + math.exp(SIZING_EPSILON)))
            cap = _binomial_cap(self.dataset_size + 1, self.sampling_rate, tail)
            if cap > self.dataset_size:  # no cap of at most n rows meets the sizing claim
                _refuse_unsizable_rate(requested, self.dataset_size, t, d)
            max_batch_size = cap
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
                " > δ/4 even at ε = 0): a larger max_batch_size, or None to size it from steps "
                "and delta",
            )
        self._freeze()

    @property
    def expected_batch_size(self) -> float:
        """q·n (realised q): the PUBLIC normaliser for :func:`dpjax.normalize_by`."""
        return self.sampling_rate * self.dataset_size

    @property
    def overflow_probability(self) -> float:
        """P[Binomial(n, q) > max_batch_size]: chance per step that examples are dropped."""
        return float(stats.binom.sf(self.max_batch_size, self.dataset_size, self.sampling_rate))

    @property
    def neighbour_overflow_probability(self) -> float:
        """p̄ = P[Binomial(n + 1, q) > max_batch_size] ≥ ``overflow_probability``: the overflow
        chance per step on the data set or any add/remove/replace-one neighbour of it."""
        n, m, q = self.dataset_size, self.max_batch_size, self.sampling_rate
        return float(stats.binom.sf(m, n + 1, q))

    def delta_slack(self, steps: int, epsilon: float) -> float:
        """(1 + e^ε)·T·p̄: add it to the δ at which the event's ε holds (p̄ =
        :attr:`neighbour_overflow_probability`).

        Args:
            steps: T, the number of sampled steps (a positive integer).
            epsilon: the ε the event is reported at, in [0, inf).

        Returns:
            The δ slack of truncation (see the class's "Formal guarantees"); ``inf`` if e^ε
            overflows.
        """
        steps = _validate.positive_int("steps", steps)
        epsilon = _validate.real("epsilon", epsilon)
        _validate.non_negative("epsilon", epsilon)
        p = self.neighbour_overflow_probability
        if p == 0.0:
            return 0.0
        factor = 1.0 + math.exp(epsilon) if epsilon < 709.0 else math.inf
        return factor * steps * p

    def sample(self, key: jax.Array) -> PaddedBatch:
        """Draw one Poisson batch (jit-able; ``key`` used once).

        Args:
            key: a JAX PRNG key.

        Returns:
            :class:`PaddedBatch` of length ``max_batch_size``.
        """
        n = self.dataset_size
        select_key, order_key = jax.random.split(key)
        if self.threshold >= 1 << THRESHOLD_BITS:  # q = 1
            selected = jnp.ones((n,), dtype=jnp.bool_)
        else:
            words = jax.random.bits(select_key, (2, n), dtype=jnp.uint32)
            selected = words_below_threshold(words[0], words[1], self.threshold)
        # Independent priorities (31 random bits, unrelated to the selection words): the
        # max_batch_size selected examples of highest priority are a uniformly random subset of
        # the selected (the truncation rule), in random order (ties, probability ≤ m²/2³²,
        # fall back to index order).
        priority = jax.lax.shift_right_logical(
            jax.random.bits(order_key, (n,), dtype=jnp.uint32), jnp.uint32(1)
        ).astype(jnp.int32)
        top, indices = jax.lax.top_k(jnp.where(selected, priority, -1), self.max_batch_size)
        mask = top >= 0
        indices = jnp.where(mask, indices, 0)
        return PaddedBatch(indices.astype(jnp.int32), mask)

    def event(
        self,
        *,
        noise_multiplier: float,
        steps: int,
        relation: NeighbouringRelation | str = ADD_OR_REMOVE_ONE,
    ) -> PoissonSampledGaussianEvent:
        """The event of ``steps`` DP-SGD steps with this sampler (at its realised rate) and
        noise σ·C on the sum, its cap included (``dataset_size``, ``max_batch_size``): the
        accountants of :mod:`dpjax.accounting` add the truncation slack
        (1 + e^ε)·T·p̄ to δ themselves, so ε(δ) of this event is what ``make_private``
        reports for the same run.

        Raises:
            ValueError: ``noise_multiplier = 0`` (the clip-only baseline is not private: it has
                no event; :func:`dpjax.accounting.dp_sgd_epsilon` reports ε = inf for it).
        """
        _event_noise_multiplier(noise_multiplier)
        return PoissonSampledGaussianEvent(
            noise_multiplier=noise_multiplier,
            sampling_rate=self.sampling_rate,
            count=steps,
            relation=as_relation(relation),
            dataset_size=self.dataset_size,
            max_batch_size=self.max_batch_size,
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
        :class:`~dpjax.events.FixedBatchGaussianEvent` with ``sampling="shuffle"``
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


class WithReplacementSampler:
    r"""b independent uniform draws WITH replacement from n records at every step.

    A record can appear k times in one batch (k ~ Binomial(b, 1/n)). Its contribution is
    bounded by *charging the multiplicity*: every draw is a row of the batch and is clipped to
    C on its own (pass the gathered rows to the clipped-sum function as they are; do not
    de-duplicate), so a record drawn k times moves the clipped sum by up to k·C, and the
    accounting pays for every k. Normalise by the public ``batch_size``.

    Formal guarantees:
        Replace-one (n and b public). One step is bounded by Balle, Barthe, Gaboardi 2018
        (sampling with replacement: advanced joint convexity with η = 1 − (1 − 1/n)^b and the
        k-fold group profile of the Gaussian, a shift of 2kC); the T-step ε composes a
        pessimistic PLD of that profile (:mod:`dpjax.accounting.with_replacement`). There is
        no add/remove-one analysis here, and Poisson or without-replacement accountants do
        NOT apply to these batches.

    Args:
        dataset_size: n ≥ 2.
        batch_size: b ≥ 1 (may exceed n).

    Example:
        >>> import jax
        >>> WithReplacementSampler(dataset_size=10, batch_size=4).sample(jax.random.key(0)).shape
        (4,)
    """

    def __init__(self, dataset_size: int, batch_size: int):
        self.dataset_size = _validate.positive_int("dataset_size", dataset_size)
        self.batch_size = _validate.positive_int("batch_size", batch_size)
        if not 2 <= self.dataset_size <= _MAX_INDEX:
            _validate.fail("dataset_size", dataset_size, f"in [2, {_MAX_INDEX}] (int32 indices)")

    @property
    def expected_batch_size(self) -> float:
        """b (deterministic): the normaliser for :func:`dpjax.normalize_by`."""
        return float(self.batch_size)

    def sample(self, key: jax.Array) -> jax.Array:
        """int32 (batch_size,) indices, independent and uniform on [0, n) (jit-able)."""
        return jax.random.randint(key, (self.batch_size,), 0, self.dataset_size, dtype=jnp.int32)

    def event(
        self,
        *,
        noise_multiplier: float,
        steps: int,
        relation: NeighbouringRelation | str = REPLACE_ONE,
    ) -> WithReplacementGaussianEvent:
        """The event of ``steps`` DP-SGD steps on these batches with noise σ·C on the sum
        (replace-one only; another relation raises ``ValueError``)."""
        return WithReplacementGaussianEvent(
            noise_multiplier=noise_multiplier,
            batch_size=self.batch_size,
            dataset_size=self.dataset_size,
            count=steps,
            relation=as_relation(relation),
        )

    def __repr__(self) -> str:
        n, b = self.dataset_size, self.batch_size
        return f"WithReplacementSampler(dataset_size={n}, batch_size={b})"
