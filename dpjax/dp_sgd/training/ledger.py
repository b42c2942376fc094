"""The plan of a DP-SGD run, recorded exactly inside its training state (the phase ledger).

A :class:`~dpjax.dp_sgd.PrivateState` carries ``plan``, a ``uint32[k, WORDS]`` array: one row
per phase of the run, each row the exact bits of the parameters that fix the privacy of a
step (σ, realised q, C, the normaliser, n, the padded cap, the relation; for adaptive
clipping C_0 and (γ, η, σ_b)) and the step count at which the phase started. Float64 values
are stored as their two 32-bit words, so the record is exact with or without x64 and
survives ``flax.serialization`` / orbax checkpoints (it is an array leaf, not static data).
The ledger holds no key and no randomness: it is public. A user-level plan
(:mod:`dpjax.dp_sgd.user_level`) also records its unit: the cap k of examples per user and a
64-bit fingerprint of the grouping (``n`` is then the number of users), so a state is never
continued under another grouping of the examples into users.

Why: a state resumed under another plan would otherwise be charged at the new plan only
(issue 20: 200 steps at σ = 0.8, q = 0.05 then 200 at σ = 4, q = 0.01 reported ε = 0.166
instead of the composition 7.705). With the ledger, ``step``/``fit`` refuse a state whose
current phase is another plan, and ``epsilon`` composes every recorded phase.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from dpjax import _validate
from dpjax.relation import NeighbouringRelation, as_relation

__all__ = [
    "Plan",
    "WORDS",
    "EXTENSION",
    "ledger_row",
    "current_plan",
    "read_ledger",
    "append_phase",
]

#: First word of every row ("DPJ1"): a row of zeros (or garbage) is not a plan.
MAGIC = 0x44504A31
_RELATIONS = tuple(NeighbouringRelation)
#: First word of the extension: adaptive clipping's γ, η, σ_b (3 float64; zeros for a fixed C).
EXTENSION = 1 + 4 * 2 + 2 * 2 + 1 + 2
#: Words per row: magic, 4 float64 (2 words each), 2 int64 (2 each), relation and phase
#: count, start (2), then the extension (adaptive clipping: 3 float64), then the privacy
#: unit: k examples per user (0: example level) and the grouping's fingerprint (2), then the
#: correlated noise: bands (2) and the strategy digest (2).
WORDS = EXTENSION + 3 * 2 + 1 + 2 + 2 * 2
#: Rows written before the extension existed (fixed C, example level): read with zeros.
_LEGACY_WORDS = 16
#: The first word of the privacy unit (compared like the plan words).
UNIT_WORD = EXTENSION + 3 * 2
#: The first word of the correlated noise (``make_private(noise=BandMF(b))``): b, digest.
NOISE_WORD = UNIT_WORD + 3
#: The word holding the relation (low 8 bits) and the number k of rows of the ledger (bits
#: 8 and up, rewritten in every row when a phase is appended): a ledger cut to fewer rows
#: (e.g. an orbax restore into a one-row template with ``strict=False``) is refused instead
#: of charging the dropped phases' steps at the kept plan.
RELATION_WORD = 13


@dataclasses.dataclass(frozen=True)
class Plan:
    """What fixes the privacy of one DP-SGD step of :func:`~dpjax.make_private`.

    Attributes:
        noise_multiplier: σ.
        sampling_rate: the REALISED Poisson rate q (what is accounted).
        l2_clip_norm: C.
        normalizer: the public divisor q·n.
        dataset_size: n.
        max_batch_size: the padded cap (fixes the truncation slack).
        relation: the neighbouring relation of the guarantee.
        examples_per_user: k, the cap of examples per user of a user-level plan (then
            ``dataset_size`` counts users and ``max_batch_size`` users); 0: example level.
        grouping: a 64-bit fingerprint of the user grouping (0 at example level).
        target_quantile: adaptive clipping's γ (0.0: a fixed C). With adaptive clipping
            (:class:`~dpjax.dp_sgd.AdaptiveClip`) ``l2_clip_norm`` is the INITIAL C_0 and
            the config (C_0, γ, η, σ_b) is what identifies the plan (C_t lives in the state).
        learning_rate: adaptive clipping's η (0.0: a fixed C).
        count_noise_multiplier: adaptive clipping's σ_b (0.0: a fixed C).
        bands: b of a banded matrix-factorization noise (``make_private(noise=BandMF(b))``;
            0: DP-SGD's independent noise). Accounted steps are then ⌈t/b⌉ rounds on parts of
            ⌈n/b⌉ records.
        strategy_digest: 64-bit fingerprint of (b, C) (0 for DP-SGD).
    """

    noise_multiplier: float
    sampling_rate: float
    l2_clip_norm: float
    normalizer: float
    dataset_size: int
    max_batch_size: int
    relation: NeighbouringRelation
    examples_per_user: int = 0
    grouping: int = 0
    target_quantile: float = 0.0
    learning_rate: float = 0.0
    count_noise_multiplier: float = 0.0
    bands: int = 0
    strategy_digest: int = 0

    def accounted_steps(self, steps: int) -> int:
        """The steps the accountant charges: t for DP-SGD, ⌈t/b⌉ rounds for banded MF."""
        return steps if self.bands == 0 else -(-steps // self.bands)

    def accounted_dataset_size(self) -> int:
        """The records one sampler draws from: n, or a part's ⌈n/b⌉ for banded MF."""
        return self.dataset_size if self.bands == 0 else -(-self.dataset_size // self.bands)

    def describe(self) -> str:
        unit = (
            f", user level (users={self.dataset_size}, k={self.examples_per_user}, "
            f"grouping={self.grouping:#018x})"
            if self.examples_per_user
            else ""
        )
        clip = f"C={self.l2_clip_norm:.6g}"
        if self.count_noise_multiplier > 0.0:
            clip = (
                f"adaptive C (C_0={self.l2_clip_norm:.6g}, γ={self.target_quantile:.6g}, "
                f"η={self.learning_rate:.6g}, σ_b={self.count_noise_multiplier:.6g})"
            )
        return (
            f"σ={self.noise_multiplier:.6g}, q={self.sampling_rate:.6g}, {clip}"
            f", normalizer={self.normalizer:.6g}, n={self.dataset_size}, "
            f"max_batch_size={self.max_batch_size}, relation={self.relation.value}{unit}"
            + (
                f", noise=BandMF(bands={self.bands}, strategy {self.strategy_digest:016x})"
                if self.bands
                else ""
            )
        )


def _float_words(x: float) -> list[int]:
    return [int(w) for w in np.array([x], "<f8").view("<u4")]


def _int_words(i: int) -> list[int]:
    return [(i >> 32) & 0xFFFFFFFF, i & 0xFFFFFFFF]


def ledger_row(plan: Plan, start: int, rows: int = 1) -> np.ndarray:
    """The ``uint32[WORDS]`` row recording ``plan`` from step ``start`` on (exact bits), in a
    ledger of ``rows`` rows."""
    words = [MAGIC]
    for x in (plan.noise_multiplier, plan.sampling_rate, plan.l2_clip_norm, plan.normalizer):
        words += _float_words(float(x))
    words += _int_words(plan.dataset_size) + _int_words(plan.max_batch_size)
    words.append(_RELATIONS.index(as_relation(plan.relation)) | (rows << 8))
    words += _int_words(start)
    for x in (plan.target_quantile, plan.learning_rate, plan.count_noise_multiplier):
        words += _float_words(float(x))
    words += [plan.examples_per_user & 0xFFFFFFFF] + _int_words(plan.grouping)
    words += _int_words(plan.bands) + _int_words(plan.strategy_digest)
    return np.asarray(words, np.uint32)


def _decode_row(row: np.ndarray) -> tuple[Plan, int]:
    w = [int(x) for x in row]
    floats = [float(np.array(w[i : i + 2], "<u4").view("<f8")[0]) for i in (1, 3, 5, 7)]
    ints = [(w[i] << 32) | w[i + 1] for i in (9, 11, 14)]
    if len(w) > _LEGACY_WORDS:
        adaptive = [
            float(np.array(w[i : i + 2], "<u4").view("<f8")[0])
            for i in range(EXTENSION, UNIT_WORD, 2)
        ]
        unit = (w[UNIT_WORD], (w[UNIT_WORD + 1] << 32) | w[UNIT_WORD + 2])
    else:
        adaptive, unit = [0.0, 0.0, 0.0], (0, 0)
    noise = (
        [(w[i] << 32) | w[i + 1] for i in (NOISE_WORD, NOISE_WORD + 2)]
        if len(w) > NOISE_WORD
        else [0, 0]
    )
    relation = _RELATIONS[w[RELATION_WORD] & 0xFF]
    plan = Plan(*floats, ints[0], ints[1], relation, *unit, *adaptive, *noise)
    return plan, ints[2]


_VALID = (
    f"a uint32[k, {WORDS}] plan ledger written by PrivateTraining (init/continue_from; a "
    "state_template must be restored from a checkpoint first)"
)


def _checked(ledger: Any) -> np.ndarray:
    arr = np.asarray(ledger)
    if (
        arr.dtype != np.uint32
        or arr.ndim != 2
        or arr.shape[0] < 1
        or arr.shape[1] not in (WORDS, _LEGACY_WORDS)
    ):
        _validate.fail("state.plan", f"an array of {arr.dtype}{arr.shape}", _VALID)
    if np.any(arr[:, 0] != MAGIC) or np.any(arr[:, RELATION_WORD] & 0xFF >= len(_RELATIONS)):
        _validate.fail("state.plan", "rows without the ledger's magic word", _VALID)
    recorded = arr[:, RELATION_WORD] >> 8
    if np.any(recorded != arr.shape[0]):
        _validate.fail(
            "state.plan",
            f"{arr.shape[0]} rows of a ledger written with {sorted(set(recorded.tolist()))}",
            _VALID + "; all of its rows (a checkpoint restored into a template with fewer "
            "rows, e.g. orbax with strict=False, drops phases that ε must count: restore "
            "with a template of as many rows, or without one)",
        )
    return arr


def current_plan(ledger: Any) -> Plan:
    """The plan of the last (current) phase of ``ledger`` (host-side; validates it)."""
    return _decode_row(_checked(ledger)[-1])[0]


def read_ledger(ledger: Any, step: int) -> list[tuple[Plan, int]]:
    """``[(plan_i, steps_i)]``: every phase of a state and the steps it ran (host-side).

    Args:
        ledger: the state's ``plan`` leaf, ``uint32[k, WORDS]``.
        step: the state's step count (the last phase ran from its start to ``step``).

    Raises:
        ValueError: not a ledger (wrong shape, dtype or magic word, starts not increasing
            from 0 up to ``step``): e.g. a template state, or a state from before the ledger.
    """
    arr = _checked(ledger)
    decoded = [_decode_row(r) for r in arr]
    starts = [s for _, s in decoded] + [step]
    if starts[0] != 0 or any(b < a for a, b in zip(starts[:-1], starts[1:], strict=True)):
        _validate.fail("state.plan", f"phase starts {starts[:-1]} at step {step}", _VALID)
    return [(plan, starts[i + 1] - starts[i]) for i, (plan, _) in enumerate(decoded)]


def append_phase(ledger: Any, plan: Plan, start: int) -> np.ndarray:
    """``ledger`` with a new phase ``plan`` from step ``start`` (the current phase closed)."""
    old = np.array(ledger, np.uint32)
    if old.shape[1] == _LEGACY_WORDS:  # example-level rows of an older checkpoint: unit 0
        old = np.pad(old, ((0, 0), (0, WORDS - _LEGACY_WORDS)))
    rows = old.shape[0] + 1
    old[:, RELATION_WORD] = (old[:, RELATION_WORD] & 0xFF) | (rows << 8)
    return np.concatenate([old, ledger_row(plan, start, rows)[None, :]], axis=0)
