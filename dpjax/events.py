"""Privacy events: the record of what a release spent, shared by samplers, solvers and accountants.

A solver or sampler returns an event; an accountant composes events and answers ε(δ). Each
event names the neighbouring relation its parameters were computed under, so an accountant can
refuse to mix relations.

Conventions (read these before building an event):

* ``noise_multiplier`` of a Gaussian event is σ/Δ₂, with Δ₂ the ℓ2 sensitivity of the released
  quantity **under the event's relation**.
* For the subsampled events (DP-SGD), ``noise_multiplier`` is σ/C, where C bounds one example's
  contribution to the noised sum (its add/remove-one sensitivity). Under ``REPLACE_ONE`` the
  accountant accounts for the sensitivity 2C itself; do not pre-double.
* ``count`` is the number of noisy releases (noise draws), never a number of micro-batches.
* Numeric fields are stored as Python floats/ints (NumPy scalars and 0-d arrays are coerced;
  bool, str and JAX tracers are refused by name): privacy parameters are public constants.
* Events are frozen dataclasses: :func:`merge` joins two events that differ only in ``count``
  (what :class:`dpjax.accounting.PrivacyAccountant` does to consecutive identical records), and
  :func:`event_to_dict` / :func:`event_from_dict` turn an event into JSON-able values and back.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from scipy import stats

from dpjax import _validate
from dpjax.relation import ADD_OR_REMOVE_ONE, REPLACE_ONE, NeighbouringRelation, as_relation

#: The default privacy unit of an event: one record (example-level DP).
EXAMPLE_UNIT = "example"

__all__ = [
    "PrivacyEvent",
    "GaussianEvent",
    "LaplaceEvent",
    "EpsilonDeltaEvent",
    "PoissonSampledGaussianEvent",
    "FixedBatchGaussianEvent",
    "BallsInBinsGaussianEvent",
    "LaplaceDPSGDEvent",
    "RepeatAndSelectEvent",
    "WithReplacementGaussianEvent",
    "DiscreteGaussianEvent",
    "EVENT_TYPES",
    "count_is_additive",
    "merge",
    "event_to_dict",
    "event_from_dict",
]


@dataclasses.dataclass(frozen=True)
class PrivacyEvent:
    """Base class of all events."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "relation", as_relation(self.relation))  # type: ignore[attr-defined]
        self._coerce_int("count")
        _validate.positive_int("count", self.count)  # type: ignore[attr-defined]

    def _coerce_float(self, *names: str) -> None:
        for name in names:
            object.__setattr__(self, name, _validate.real(name, getattr(self, name)))

    def _coerce_int(self, *names: str) -> None:
        for name in names:
            object.__setattr__(self, name, _validate.integer(name, getattr(self, name)))

    def _check_padded_cap(self) -> None:
        """A padded sampler's ``dataset_size`` n and cap m: both None, or 1 ≤ m ≤ n."""
        size, cap = self.dataset_size, self.max_batch_size  # type: ignore[attr-defined]
        if (size is None) != (cap is None):
            _validate.fail(
                "max_batch_size",
                cap,
                "given together with dataset_size (a padded sampler) or both None",
            )
        if size is not None:
            self._coerce_int("dataset_size", "max_batch_size")
            size = _validate.positive_int("dataset_size", self.dataset_size)  # type: ignore[attr-defined]
            cap = _validate.positive_int("max_batch_size", self.max_batch_size)  # type: ignore[attr-defined]
            if cap > size:
                _validate.fail("max_batch_size", cap, f"at most dataset_size={size}")


@dataclasses.dataclass(frozen=True)
class GaussianEvent(PrivacyEvent):
    """``count`` releases of a Gaussian mechanism with σ/Δ₂ = ``noise_multiplier``."""

    noise_multiplier: float
    count: int = 1
    relation: NeighbouringRelation = REPLACE_ONE

    def __post_init__(self) -> None:
        super().__post_init__()
        self._coerce_float("noise_multiplier")
        _validate.positive("noise_multiplier", self.noise_multiplier)


@dataclasses.dataclass(frozen=True)
class LaplaceEvent(PrivacyEvent):
    """``count`` releases of a Laplace mechanism with b/Δ₁ = ``noise_multiplier`` (ε = 1/it)."""

    noise_multiplier: float
    count: int = 1
    relation: NeighbouringRelation = REPLACE_ONE

    def __post_init__(self) -> None:
        super().__post_init__()
        self._coerce_float("noise_multiplier")
        _validate.positive("noise_multiplier", self.noise_multiplier)


@dataclasses.dataclass(frozen=True)
class EpsilonDeltaEvent(PrivacyEvent):
    """``count`` releases of a generic (ε, δ)-DP mechanism (only composition theorems apply).

    ``privacy_unit`` is what one neighbour differs in, as for
    :class:`PoissonSampledGaussianEvent`: ``"example"`` (default) or ``"user:<fingerprint>"``;
    :meth:`dpjax.accounting.PrivacyAccountant.as_event` writes the unit of the run it
    summarises, so a user-level run converted to (ε, δ) still refuses to compose with
    example-level events.
    """

    epsilon: float
    delta: float = 0.0
    count: int = 1
    relation: NeighbouringRelation = REPLACE_ONE
    privacy_unit: str = EXAMPLE_UNIT

    def __post_init__(self) -> None:
        super().__post_init__()
        self._coerce_float("epsilon", "delta")
        _validate.epsilon("epsilon", self.epsilon)
        _validate.delta("delta", self.delta)
        _check_privacy_unit(self.privacy_unit)


@dataclasses.dataclass(frozen=True)
class PoissonSampledGaussianEvent(PrivacyEvent):
    """``count`` DP-SGD steps: Poisson sampling at rate q, clipped sum + N(0, (σ·C)²).

    ``sampling_rate = 1`` is full-batch DP-GD.

    ``dataset_size`` n and ``max_batch_size`` m (both or neither) record a PADDED sampler that
    keeps at most m of the selected records (a uniformly random subset of them; see
    :class:`dpjax.dp_sgd.PoissonSampler`). The accountants of :mod:`dpjax.accounting.tight`
    then charge its truncation: with p̄ = :attr:`overflow_probability` per step, the run is
    (ε, δ′ + (1 + e^ε)·count·p̄)-DP where (ε, δ′) is the guarantee of the untruncated
    sampling. Without them the event is exact Poisson sampling (no cap).

    ``privacy_unit`` names what one neighbour differs in: ``"example"`` (one record, the
    default) or ``"user:<grouping fingerprint>"`` (every record of one user, written by
    user-level DP-SGD, :mod:`dpjax.dp_sgd.user_level`). The accountant refuses to compose
    events of different units: their ε would hold for neither.
    """

    noise_multiplier: float
    sampling_rate: float
    count: int = 1
    relation: NeighbouringRelation = ADD_OR_REMOVE_ONE
    dataset_size: int | None = None
    max_batch_size: int | None = None
    privacy_unit: str = EXAMPLE_UNIT

    def __post_init__(self) -> None:
        super().__post_init__()
        self._coerce_float("noise_multiplier", "sampling_rate")
        _validate.positive("noise_multiplier", self.noise_multiplier)
        _validate.probability("sampling_rate", self.sampling_rate)
        self._check_padded_cap()
        _check_privacy_unit(self.privacy_unit)

    @property
    def truncated(self) -> bool:
        """Whether the event records a padded (capped) sampler."""
        return self.dataset_size is not None

    @property
    def overflow_probability(self) -> float:
        """p̄ = P[Binomial(n + 1, q) > m]: the chance per step that the padded sampler drops a
        record on the data set or any neighbour of it (n + 1 covers an add-one neighbour);
        0 without a cap."""
        if self.dataset_size is None:
            return 0.0
        return float(stats.binom.sf(self.max_batch_size, self.dataset_size + 1, self.sampling_rate))

    def untruncated(self, *, slack_paid_separately: bool = False) -> PoissonSampledGaussianEvent:
        """The same event without the cap (exact Poisson sampling): an ANALYSIS aid.

        The untruncated event is not the mechanism that ran: a padded sampler's guarantee is
        the untruncated one's plus the truncation slack (1 + e^ε)·count·p̄ on δ
        (:func:`dpjax.accounting.truncation_slack`). Record the padded event itself (every
        accountant pays the slack, also inside a
        :class:`RepeatAndSelectEvent`); dropping the cap is refused unless the caller states
        that it pays the slack itself.

        Args:
            slack_paid_separately: True to acknowledge that the slack
                ``truncation_slack(ε, count·overflow_probability)`` is added to δ elsewhere.

        Raises:
            ValueError: a padded event and ``slack_paid_separately`` not True.
        """
        if not self.truncated:
            return self
        if slack_paid_separately is not True:
            _validate.fail(
                "slack_paid_separately",
                slack_paid_separately,
                "True: the untruncated event drops the padded sampler's truncation slack "
                f"(1 + e^ε)·count·p̄ with count·p̄ = {self.count * self.overflow_probability:.3g}; "
                "record the padded event itself (the accountant pays the slack, also under "
                "RepeatAndSelectEvent), or pass True and add "
                "dpjax.accounting.truncation_slack(ε, count·overflow_probability) to δ yourself",
            )
        return dataclasses.replace(self, dataset_size=None, max_batch_size=None)


@dataclasses.dataclass(frozen=True)
class FixedBatchGaussianEvent(PrivacyEvent):
    """``count`` steps on fixed-size batches of ``batch_size`` drawn without replacement
    from ``dataset_size`` records (shuffling), clipped sum + N(0, (σ·C)²).

    Only analyses for sampling without replacement apply (not the Poisson accountant).

    ``sampling`` (added for the accountant) says how batches are drawn:

    * ``"shuffle"`` (default): a fresh random permutation per epoch cut into ⌊n/b⌋ batches, so
      a record is in at most one batch per epoch. No amplification is claimed for it: the
      accountant counts ⌈count/⌊n/b⌋⌉ Gaussian releases of sensitivity 2C (replace-one).
    * ``"independent"``: a fresh uniform b-subset at every step; the without-replacement RDP
      analysis (Wang, Balle, Kasiviswanathan 2019) applies.
    """

    noise_multiplier: float
    batch_size: int
    dataset_size: int
    count: int = 1
    relation: NeighbouringRelation = REPLACE_ONE
    sampling: str = "shuffle"

    def __post_init__(self) -> None:
        super().__post_init__()
        _validate.one_of("sampling", self.sampling, ("shuffle", "independent"))
        self._coerce_float("noise_multiplier")
        self._coerce_int("batch_size", "dataset_size")
        _validate.positive("noise_multiplier", self.noise_multiplier)
        _validate.positive_int("batch_size", self.batch_size)
        _validate.positive_int("dataset_size", self.dataset_size)
        if self.batch_size > self.dataset_size:
            _validate.fail(
                "batch_size", self.batch_size, f"at most dataset_size={self.dataset_size}"
            )


@dataclasses.dataclass(frozen=True)
class BallsInBinsGaussianEvent(PrivacyEvent):
    """``count`` DP-SGD steps with balls-in-bins batches (random 1-out-of-t allocation):
    every epoch of t = ``steps_per_epoch`` steps assigns each record to one uniformly random
    step, independently of the other records; clipped sum + N(0, (σ·C)²).

    Accounted WITHOUT amplification (:class:`dpjax.dp_sgd.BallsInBinsSampler`, "Formal
    guarantees"): each epoch, a partial one included, is charged as one Gaussian release of
    sensitivity C (add/remove-one) or 2C (replace-one), so the event composes
    :attr:`epochs` = ⌈count/t⌉ of them. ``dataset_size`` n and ``max_batch_size`` m (both or
    neither) record a padded sampler that keeps at most m records of a step; the accountants
    charge its truncation slack (1 + e^ε)·count·p̄ on δ with p̄ = P[Binomial(n + 1, 1/t) > m],
    as for a padded :class:`PoissonSampledGaussianEvent`.
    """

    noise_multiplier: float
    steps_per_epoch: int
    count: int = 1
    relation: NeighbouringRelation = ADD_OR_REMOVE_ONE
    dataset_size: int | None = None
    max_batch_size: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self._coerce_float("noise_multiplier")
        self._coerce_int("steps_per_epoch")
        _validate.positive("noise_multiplier", self.noise_multiplier)
        _validate.positive_int("steps_per_epoch", self.steps_per_epoch)
        self._check_padded_cap()

    @property
    def epochs(self) -> int:
        """⌈count / steps_per_epoch⌉: the epochs the run touches (a partial one counts)."""
        return -(-self.count // self.steps_per_epoch)

    @property
    def truncated(self) -> bool:
        """Whether the event records a padded (capped) sampler."""
        return self.dataset_size is not None

    @property
    def overflow_probability(self) -> float:
        """p̄ = P[Binomial(n + 1, 1/t) > m]: the chance per step that the padded sampler drops
        a record on the data set or any neighbour of it; 0 without a cap."""
        if self.dataset_size is None:
            return 0.0
        rate = 1.0 / self.steps_per_epoch
        return float(stats.binom.sf(self.max_batch_size, self.dataset_size + 1, rate))

    def untruncated(self, *, slack_paid_separately: bool = False) -> BallsInBinsGaussianEvent:
        """The same event without the cap: an ANALYSIS aid (the caller pays the truncation
        slack (1 + e^ε)·count·p̄ itself, and says so with ``slack_paid_separately=True``).

        Raises:
            ValueError: a padded event and ``slack_paid_separately`` not True.
        """
        if not self.truncated:
            return self
        if slack_paid_separately is not True:
            _validate.fail(
                "slack_paid_separately",
                slack_paid_separately,
                "True: the untruncated event drops the padded sampler's truncation slack "
                f"(1 + e^ε)·count·p̄ with count·p̄ = {self.count * self.overflow_probability:.3g}",
            )
        return dataclasses.replace(self, dataset_size=None, max_batch_size=None)


@dataclasses.dataclass(frozen=True)
class LaplaceDPSGDEvent(PrivacyEvent):
    """The Laplace-noise batch-1 DP-SGD (no published source located): per-step
    pure-DP budgets ε_h.

    ``epsilons`` holds the per-release ε_h; the run is (Σ ε_h, 0)-DP by basic composition.
    """

    epsilons: tuple[float, ...]
    count: int = 1
    relation: NeighbouringRelation = REPLACE_ONE

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(
            self, "epsilons", tuple(_validate.real("epsilons[i]", e) for e in self.epsilons)
        )
        if not self.epsilons:
            _validate.fail("epsilons", self.epsilons, "a non-empty sequence")
        for e in self.epsilons:
            _validate.epsilon("epsilons[i]", e)


@dataclasses.dataclass(frozen=True)
class RepeatAndSelectEvent(PrivacyEvent):
    """``count`` private selections: run ``base_event`` a random number K of times and release
    only the best run (Papernot & Steinke 2022; :func:`dpjax.tuning.private_selection`).

    K is drawn independently of the data with mean ``mean`` and is NOT released. ``shape``
    names its distribution, as in dp-accounting's ``RepeatAndSelectDpEvent``: ``inf``
    Poisson, ``1`` geometric (Liu & Talwar 2019), ``0`` logarithmic, ``0 < shape < inf``
    truncated negative binomial. The relation is the base event's. Accounted by RDP only.

    ``max_trials`` K_max (a public integer) records a selection that always runs K_max trials
    and selects among the first min(K, K_max) (so its running time does not show K): the
    accountant charges P[K > K_max] (:func:`dpjax.accounting.num_trials.num_trials_tail`)
    through the coupling slack (1 + e^ε)·m̄ on δ, as for a padded sampler. None: K was not
    capped (records written before the field existed). Padded Poisson-sampler events are
    allowed in ``base_event``: each trial adds its overflow mass, E[K]·Σ count·p̄ in all.
    """

    base_event: PrivacyEvent | tuple[PrivacyEvent, ...]
    mean: float
    shape: float
    count: int = 1
    relation: NeighbouringRelation | None = None
    max_trials: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.base_event, list | tuple):
            object.__setattr__(self, "base_event", tuple(self.base_event))
        parts = self.base_parts
        if not parts or not all(
            isinstance(p, PrivacyEvent) and not isinstance(p, RepeatAndSelectEvent) for p in parts
        ):
            _validate.fail(
                "base_event",
                self.base_event,
                "a dpjax privacy event, or a non-empty tuple of them (their composition; no "
                "nested selection)",
            )
        if len({p.relation for p in parts}) > 1:
            _validate.fail("base_event", self.base_event, "events under one relation")
        if self.relation is None:
            object.__setattr__(self, "relation", parts[0].relation)
        super().__post_init__()
        if self.relation is not parts[0].relation:
            _validate.fail("relation", self.relation, "the base event's relation")
        self._coerce_float("mean", "shape")
        _validate.in_range("mean", self.mean, 1.0, float("inf"), high_inclusive=False)
        _validate.in_range("shape", self.shape, 0.0, float("inf"), high_inclusive=True)
        if self.max_trials is not None:
            self._coerce_int("max_trials")
            _validate.positive_int("max_trials", self.max_trials)

    @property
    def base_parts(self) -> tuple[PrivacyEvent, ...]:
        """The events one trial is the composition of."""
        b = self.base_event
        return b if isinstance(b, tuple) else (b,)


@dataclasses.dataclass(frozen=True)
class WithReplacementGaussianEvent(PrivacyEvent):
    """``count`` DP-SGD steps on batches of ``batch_size`` independent uniform draws WITH
    replacement from ``dataset_size`` records; every draw is clipped to C on its own (a record
    drawn k times contributes up to k·C), clipped sum + N(0, (σ·C)²).

    Replace-one only (n and b are public); accounted by PLD
    (:mod:`dpjax.accounting.with_replacement`).
    """

    noise_multiplier: float
    batch_size: int
    dataset_size: int
    count: int = 1
    relation: NeighbouringRelation = REPLACE_ONE

    def __post_init__(self) -> None:
        super().__post_init__()
        self._coerce_float("noise_multiplier")
        self._coerce_int("batch_size", "dataset_size")
        _validate.positive("noise_multiplier", self.noise_multiplier)
        _validate.positive_int("batch_size", self.batch_size)
        _validate.positive_int("dataset_size", self.dataset_size)
        if self.relation is not REPLACE_ONE:
            _validate.fail(
                "relation",
                self.relation.value,
                "'replace_one' (sampling with replacement from a public n; no add/remove-one "
                "analysis is claimed)",
            )


@dataclasses.dataclass(frozen=True)
class DiscreteGaussianEvent(PrivacyEvent):
    """``count`` releases of the discrete Gaussian mechanism N_ℤ(0, σ²) (integer queries).

    ``sensitivity`` is Δ₂ ≥ ‖f(D) − f(D′)‖₂ for integer-valued f under ``relation`` (1 for a
    histogram under add/remove-one, √2 under replace-one). Each release is ρ-zCDP with
    ρ = Δ₂²/(2σ²) (Canonne, Kamath, Steinke 2020, Theorem 14), which is how the accountant
    composes it (``accounting="zcdp"``); dp-accounting has no discrete Gaussian DpEvent.
    """

    sigma: float
    sensitivity: float = 1.0
    count: int = 1
    relation: NeighbouringRelation = ADD_OR_REMOVE_ONE

    def __post_init__(self) -> None:
        super().__post_init__()
        self._coerce_float("sigma", "sensitivity")
        _validate.positive("sigma", self.sigma)
        _validate.positive("sensitivity", self.sensitivity)


#: The event classes by name (what :func:`event_to_dict` writes under ``"type"``).
EVENT_TYPES: dict[str, type[PrivacyEvent]] = {
    cls.__name__: cls
    for cls in (
        GaussianEvent,
        LaplaceEvent,
        EpsilonDeltaEvent,
        PoissonSampledGaussianEvent,
        FixedBatchGaussianEvent,
        BallsInBinsGaussianEvent,
        LaplaceDPSGDEvent,
        RepeatAndSelectEvent,
        WithReplacementGaussianEvent,
        DiscreteGaussianEvent,
    )
}


def count_is_additive(event: PrivacyEvent) -> bool:
    """Whether ``count`` releases of ``event`` are accounted as ``count`` independent copies.

    True for every event except shuffled fixed-size batches (``FixedBatchGaussianEvent`` with
    ``sampling="shuffle"``) and balls-in-bins batches (``BallsInBinsGaussianEvent``): their
    accounting charges ⌈count/⌊n/b⌋⌉ (or ⌈count/t⌉) uses per *permutation* (or epoch), so
    two separately recorded shuffled runs (two permutations) are not one run of the summed
    length, and merging them would under-state ε.
    """
    if isinstance(event, BallsInBinsGaussianEvent):  # ⌈count/t⌉ epochs: a partial one is whole
        return False
    return not (isinstance(event, FixedBatchGaussianEvent) and event.sampling == "shuffle")


def _check_privacy_unit(unit: Any) -> None:
    if not isinstance(unit, str) or not (unit == EXAMPLE_UNIT or unit.startswith("user:")):
        _validate.fail("privacy_unit", unit, "'example' or 'user:<fingerprint>'")


def privacy_units(event: PrivacyEvent) -> frozenset[str]:
    """The privacy units of an event and of the events nested in it (``base_event``):
    ``{"example"}`` unless a user-level DP-SGD event says ``"user:<fingerprint>"``."""
    if hasattr(event, "privacy_unit"):
        return frozenset({event.privacy_unit})
    base = getattr(event, "base_event", None)
    inner = base if isinstance(base, tuple) else (() if base is None else (base,))
    # a wrapper has the units of the events it wraps (several: a mix the accountant refuses)
    return frozenset().union(*(privacy_units(e) for e in inner)) or frozenset({EXAMPLE_UNIT})


def merge(first: PrivacyEvent, second: PrivacyEvent) -> PrivacyEvent | None:
    """One event equivalent to ``first`` then ``second``, or None if they cannot be merged.

    They merge when they have the same type, agree in every field but ``count``, and their
    count is additive (:func:`count_is_additive`); the result carries the summed count.

    Formal guarantees:
        k releases of a mechanism followed by m more releases of the same mechanism are its
        (k + m)-fold adaptive composition, which is what an event with ``count = k + m``
        denotes; every accountant in dpjax composes ``count`` as repeated releases, so the
        merged event has exactly the guarantee of the pair (PLD and RDP evaluate it at least
        as tightly, up to floating-point summation order).

    Example:
        >>> a = GaussianEvent(noise_multiplier=2.0, count=3)
        >>> merge(a, GaussianEvent(noise_multiplier=2.0)).count
        4
        >>> merge(a, GaussianEvent(noise_multiplier=3.0)) is None
        True
    """
    if type(first) is not type(second) or not count_is_additive(first):
        return None
    for field in dataclasses.fields(first):
        if field.name != "count" and getattr(first, field.name) != getattr(second, field.name):
            return None
    return dataclasses.replace(first, count=first.count + second.count)


def event_to_dict(event: PrivacyEvent) -> dict[str, Any]:
    """The event as a dict of JSON-able values (``"type"`` names the class).

    Example:
        >>> event_to_dict(GaussianEvent(noise_multiplier=2.0))
        {'type': 'GaussianEvent', 'noise_multiplier': 2.0, 'count': 1, 'relation': 'replace_one'}
    """
    if type(event).__name__ not in EVENT_TYPES:
        _validate.fail("event", event, f"an event of a type in {tuple(EVENT_TYPES)}")
    out: dict[str, Any] = {"type": type(event).__name__}
    for field in dataclasses.fields(event):
        value = getattr(event, field.name)
        if isinstance(value, NeighbouringRelation):
            value = value.value
        elif isinstance(value, PrivacyEvent):
            value = event_to_dict(value)
        elif isinstance(value, tuple) and value and isinstance(value[0], PrivacyEvent):
            value = [event_to_dict(v) for v in value]
        elif isinstance(value, tuple):
            value = list(value)
        out[field.name] = value
    return out


#: Fields that records written before they existed lack (read as None: no padded sampler).
_OPTIONAL_FIELDS = {
    "PoissonSampledGaussianEvent": {"dataset_size", "max_batch_size", "privacy_unit"},
    "EpsilonDeltaEvent": {"privacy_unit"},
    "RepeatAndSelectEvent": {"max_trials"},
    "BallsInBinsGaussianEvent": {"dataset_size", "max_batch_size"},
}


def event_from_dict(data: dict[str, Any]) -> PrivacyEvent:
    """Rebuild an event written by :func:`event_to_dict` (every field re-validated).

    Raises:
        ValueError: an unknown ``"type"``, unknown or missing fields, or invalid values.
    """
    if not isinstance(data, dict):
        _validate.fail("data", data, "a dict written by event_to_dict")
    if data.get("type") not in EVENT_TYPES:
        _validate.fail("data['type']", data.get("type"), f"one of {tuple(EVENT_TYPES)}")
    cls = EVENT_TYPES[data["type"]]
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: v for k, v in data.items() if k != "type"}
    unknown = set(kwargs) - fields
    if unknown:
        _validate.fail("data", sorted(unknown), f"fields of {cls.__name__}: {sorted(fields)}")
    missing = fields - set(kwargs) - _OPTIONAL_FIELDS.get(cls.__name__, set())
    if missing:  # no defaults here: a dropped "count" would read as 1 release, "relation" as
        # the class default (event_to_dict writes every field)
        _validate.fail(
            "data", f"a dict without {sorted(missing)}", f"every field of {cls.__name__}"
        )
    if "epsilons" in kwargs:
        kwargs["epsilons"] = tuple(kwargs["epsilons"])
    if "base_event" in kwargs:
        base = kwargs["base_event"]
        kwargs["base_event"] = (
            tuple(event_from_dict(b) for b in base)
            if isinstance(base, list)
            else event_from_dict(base)
        )
    try:
        return cls(**kwargs)
    except TypeError as err:  # a missing required field
        raise ValueError(f"data must hold the fields of {cls.__name__}; {err}") from None
