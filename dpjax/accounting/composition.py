"""Closed-form composition theorems: basic, parallel, advanced, group privacy, and the
conversion of a guarantee between neighbouring relations.

All functions are host-side Python on plain floats. Every result holds under whichever
neighbouring relation the inputs' (ε, δ) were stated under: composition, parallel composition
and group privacy do not change the relation (group privacy counts k steps of that relation).
:func:`convert_relation` is the one explicit way to change it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

from dpjax import _validate
from dpjax.relation import ADD_OR_REMOVE_ONE, REPLACE_ONE, NeighbouringRelation, as_relation

__all__ = [
    "basic_composition",
    "parallel_composition",
    "advanced_composition",
    "advanced_composition_heterogeneous",
    "advanced_composition_step_epsilon",
    "group_privacy",
    "convert_relation",
]


def _epsilons_deltas(
    epsilons: Sequence[float], deltas: Sequence[float] | None
) -> tuple[list[float], list[float]]:
    eps = [_validate.epsilon("epsilons[i]", e) for e in epsilons]
    if not eps:
        _validate.fail("epsilons", epsilons, "a non-empty sequence")
    if deltas is None:
        return eps, [0.0] * len(eps)
    dels = [_validate.delta("deltas[i]", d) for d in deltas]
    if len(dels) != len(eps):
        _validate.fail("deltas", deltas, f"a sequence of the same length as epsilons ({len(eps)})")
    return eps, dels


def basic_composition(
    epsilons: Sequence[float], deltas: Sequence[float] | None = None
) -> tuple[float, float]:
    """Basic (sequential, adaptive) composition: (Σ εᵢ, Σ δᵢ).

    Formal guarantees:
        Basic adaptive composition (Dwork & Roth 2014, Theorem 3.16; sequential
        composition, pure DP): running
        (εᵢ, δᵢ)-DP mechanisms on the same data, possibly chosen adaptively, is
        (Σεᵢ, Σδᵢ)-DP under the relation of the inputs.

    Args:
        epsilons: per-mechanism ε, each in (0, inf).
        deltas: per-mechanism δ in [0, 1); ``None`` means pure DP (all zero).

    Returns:
        ``(epsilon, delta)`` of the composition (δ may reach or exceed 1: then vacuous).

    Example:
        >>> basic_composition([0.5, 0.25], [1e-6, 1e-6])
        (0.75, 2e-06)
    """
    eps, dels = _epsilons_deltas(epsilons, deltas)
    return math.fsum(eps), math.fsum(dels)


def parallel_composition(
    epsilons: Sequence[float], deltas: Sequence[float] | None = None
) -> tuple[float, float]:
    """Parallel composition over disjoint parts of the data: (max εᵢ, max δᵢ).

    Formal guarantees:
        Parallel composition (McSherry 2009, "Privacy integrated queries"): if Q⁽ⁱ⁾ is εᵢ-DP and
        runs on the i-th block of a partition of the data into disjoint blocks, the joint release is
        maxᵢ εᵢ-DP. The (ε, δ) version (max δᵢ) follows the same way, since one record lies in
        exactly one block. The partition must not depend on the data (a fixed split by index,
        or by a public attribute of each record).

    Args:
        epsilons: per-block ε, each in (0, inf).
        deltas: per-block δ in [0, 1); ``None`` means pure DP.

    Returns:
        ``(epsilon, delta)`` of the joint release.

    Example:
        >>> parallel_composition([0.5, 1.0, 0.25])
        (1.0, 0.0)
    """
    eps, dels = _epsilons_deltas(epsilons, deltas)
    return max(eps), max(dels)


def _drift(epsilon: float) -> float:
    """Per-step drift bound ε(e^ε − 1)/(e^ε + 1) = ε·tanh(ε/2) (Dwork & Roth 2014,
    "Bounding the drift")."""
    return epsilon * math.tanh(epsilon / 2.0)


def advanced_composition(
    *, epsilon: float, delta: float, steps: int, delta_prime: float
) -> tuple[float, float]:
    """Advanced composition of T adaptively chosen (ε, δ)-DP mechanisms.

    .. math::
        ε' = ε\\sqrt{2T\\ln(1/δ')} + Tε\\frac{e^ε - 1}{e^ε + 1}, \\qquad δ_{total} = Tδ + δ'.

    Formal guarantees:
        Advanced Composition in Dwork & Roth 2014, with the drift term
        ε(e^ε − 1)/(e^ε + 1) that its proof ("Bounding the drift", Hoeffding + Chernoff) gives;
        a first statement often shows the looser drift Tε(e^ε − 1). Holds under the
        relation of the (ε, δ) inputs (Dwork, Rothblum and Vadhan 2010). For large ε or small T
        it can exceed basic composition's Tε; both bounds hold at once, so take the smaller
        (``min(ε', T·ε)``) if you only need a valid number.

    Args:
        epsilon: per-step ε in (0, inf).
        delta: per-step δ in [0, 1).
        steps: number T of mechanisms, a positive integer.
        delta_prime: the slack δ' in (0, 1).

    Returns:
        ``(epsilon_total, delta_total)``.

    Example:
        >>> eps, dlt = advanced_composition(epsilon=0.1, delta=0.0, steps=100, delta_prime=1e-5)
        >>> round(eps, 4), dlt
        (5.2981, 1e-05)
    """
    epsilon = _validate.real("epsilon", epsilon)
    _validate.epsilon("epsilon", epsilon)
    delta = _validate.real("delta", delta)
    _validate.delta("delta", delta)
    steps = _validate.positive_int("steps", steps)
    delta_prime = _validate.real("delta_prime", delta_prime)
    _validate.in_range("delta_prime", delta_prime, 0.0, 1.0, low_inclusive=False)
    return advanced_composition_heterogeneous(
        [float(epsilon)], [float(delta)], counts=[steps], delta_prime=delta_prime
    )


def advanced_composition_heterogeneous(
    epsilons: Sequence[float],
    deltas: Sequence[float] | None = None,
    *,
    delta_prime: float,
    counts: Sequence[int] | None = None,
) -> tuple[float, float]:
    """Advanced composition of mechanisms with different (εᵢ, δᵢ).

    .. math::
        ε' = \\sqrt{2\\ln(1/δ')\\sum_i ε_i^2} + \\sum_i ε_i\\frac{e^{ε_i} - 1}{e^{ε_i} + 1},
        \\qquad δ_{total} = \\sum_i δ_i + δ'.

    Formal guarantees:
        The proof of Advanced Composition in Dwork & Roth 2014 carries over step
        by step: the drift lemma bounds each step's conditional mean by εᵢ(e^εᵢ − 1)/(e^εᵢ + 1), and
        Hoeffding's lemma with interval width 2εᵢ gives P(Σ(Lᵢ − μᵢ) > γ) ≤ exp(−γ²/(2Σεᵢ²)).
        With all εᵢ equal this is exactly :func:`advanced_composition`.

    Args:
        epsilons: per-mechanism ε, each in (0, inf).
        deltas: per-mechanism δ in [0, 1); ``None`` means pure DP.
        delta_prime: the slack δ' in (0, 1).
        counts: how many times each (εᵢ, δᵢ) is repeated (positive integers); default 1 each.

    Returns:
        ``(epsilon_total, delta_total)``.
    """
    eps, dels = _epsilons_deltas(epsilons, deltas)
    delta_prime = _validate.real("delta_prime", delta_prime)
    _validate.in_range("delta_prime", delta_prime, 0.0, 1.0, low_inclusive=False)
    if counts is None:
        counts = [1] * len(eps)
    counts = [_validate.positive_int("counts[i]", c) for c in counts]
    if len(counts) != len(eps):
        _validate.fail("counts", counts, f"a sequence of the same length as epsilons ({len(eps)})")
    sum_sq = math.fsum(c * e * e for c, e in zip(counts, eps, strict=True))
    drift = math.fsum(c * _drift(e) for c, e in zip(counts, eps, strict=True))
    fluctuation = math.sqrt(2.0 * sum_sq * math.log(1.0 / delta_prime))
    delta_total = math.fsum(c * d for c, d in zip(counts, dels, strict=True)) + delta_prime
    return fluctuation + drift, delta_total


def advanced_composition_step_epsilon(
    *, target_epsilon: float, steps: int, delta_prime: float
) -> float:
    """Per-step ε that the corollary of advanced composition allows: ε'/√(8T ln(1/δ')).

    Formal guarantees:
        Corollary after Advanced Composition in Dwork & Roth 2014: T (ε, δ)-DP
        steps with ε ≤ ε'/√(8T ln(1/δ')) compose to (ε', Tδ + δ')-DP, valid for 0 < ε' < 1 only.

    Args:
        target_epsilon: the total ε' in (0, 1).
        steps: number T of steps, a positive integer.
        delta_prime: the slack δ' in (0, 1).

    Returns:
        The per-step ε.

    Raises:
        ValueError: if ``target_epsilon`` is outside (0, 1), where the corollary does not hold.

    Example:
        >>> round(advanced_composition_step_epsilon(target_epsilon=0.5, steps=100,
        ...                                         delta_prime=1e-5), 6)
        0.00521
    """
    target_epsilon = _validate.real("target_epsilon", target_epsilon)
    _validate.in_range("target_epsilon", target_epsilon, 0.0, 1.0, low_inclusive=False)
    steps = _validate.positive_int("steps", steps)
    delta_prime = _validate.real("delta_prime", delta_prime)
    _validate.in_range("delta_prime", delta_prime, 0.0, 1.0, low_inclusive=False)
    return target_epsilon / math.sqrt(8.0 * steps * math.log(1.0 / delta_prime))


def group_privacy(*, epsilon: float, delta: float, group_size: int) -> tuple[float, float]:
    """Group privacy: protection of a group of k records, (kε, δ(e^{kε} − 1)/(e^ε − 1)).

    Formal guarantees:
        Group Privacy in Dwork & Roth 2014: an (ε, δ)-DP mechanism satisfies, for data
        sets differing in k entries (k steps of the mechanism's relation),
        P(M(D) ∈ Ω) ≤ e^{kε} P(M(D') ∈ Ω) + δ(e^{kε} − 1)/(e^ε − 1).

    Args:
        epsilon: the mechanism's ε in (0, inf).
        delta: the mechanism's δ in [0, 1).
        group_size: k, a positive integer (k = 1 returns (ε, δ)).

    Returns:
        ``(k·epsilon, delta_group)``, each rounded up (a few ulps at most) so the returned
        pair is never below the exact one (δ_group may exceed 1: then vacuous).

    Example:
        >>> eps, dlt = group_privacy(epsilon=1.0, delta=1e-6, group_size=2)
        >>> eps, round(dlt / 1e-6, 4)  # δ(e² − 1)/(e − 1) = δ(e + 1), in units of 1e-6
        (2.0, 3.7183)
    """
    epsilon = _validate.real("epsilon", epsilon)
    _validate.epsilon("epsilon", epsilon)
    delta = _validate.real("delta", delta)
    _validate.delta("delta", delta)
    k = _validate.positive_int("group_size", group_size)
    if k == 1:
        return float(epsilon), float(delta)
    # (e^{kε} − 1)/(e^ε − 1) = Σ_{j<k} e^{jε}, computed with expm1 for small ε.
    ratio = math.expm1(k * epsilon) / math.expm1(epsilon)
    return _round_up(k * float(epsilon), exact=Fraction(k) * Fraction(epsilon)), _above(
        float(delta) * ratio, delta
    )


#: ulps added to a computed group δ: two expm1 (≤ 1 ulp each), a division and a product
#: (½ ulp each) leave it ≤ 3 ulps below the exact value; 8 ulps is above it.
_GROUP_DELTA_ULPS = 8


def _above(value: float, delta: float) -> float:
    """``value`` raised by a few ulps so the rounded δ is never below the exact one (0 stays 0)."""
    if delta == 0.0 or not math.isfinite(value):
        return value
    return value + _GROUP_DELTA_ULPS * math.ulp(value)


def _round_up(value: float, *, exact: Fraction) -> float:
    """``value`` (= the rounded ``exact``) or the next double up if rounding went down."""
    if math.isfinite(value) and Fraction(value) < exact:
        return math.nextafter(value, math.inf)
    return value


#: Why a replace-one guarantee is not converted to add/remove-one.
REPLACE_TO_ADD_REMOVE_REFUSAL = (
    "a replace-one (ε, δ) guarantee says nothing about data sets of different sizes: a "
    "mechanism may use n (divide by it, release it, size its batches from it) and be "
    "replace-one private while adding or removing one record is revealed with certainty. No "
    "conversion is sound in general; restate the mechanism's sensitivity under add/remove-one "
    "(with a public normaliser) and account it under that relation instead"
)


def convert_relation(
    *,
    epsilon: float,
    delta: float,
    from_: NeighbouringRelation | str,
    to: NeighbouringRelation | str,
) -> tuple[float, float]:
    """An (ε, δ) guarantee under relation ``from_`` restated under relation ``to``.

    * same relation: unchanged;
    * add/remove-one → replace-one: (2ε, (1 + e^ε)δ);
    * replace-one → add/remove-one: refused (``ValueError``), see below.

    Formal guarantees:
        Group privacy (Dwork & Roth 2014, Theorem 2.2, group
        privacy): an (ε, δ)-DP mechanism is (kε, k e^{(k−1)ε} δ)-DP for data sets at distance
        k, and more tightly (kε, δ(e^{kε} − 1)/(e^ε − 1))-DP (:func:`group_privacy`). Replacing
        one record is removing it and then adding another (D → D − x → D − x + y), two steps of
        add/remove-one through a data set of size n − 1, so an add/remove-one (ε, δ) guarantee
        gives replace-one (2ε, δ(e^{2ε} − 1)/(e^ε − 1)) = (2ε, (1 + e^ε)δ) (k = 2; also
        Kasiviswanathan et al. 2011 on the relation between the two notions of neighbours).
        The converse is not true in general: a replace-one guarantee is silent about data sets
        of different sizes (a mechanism that releases n is replace-one 0-DP and not
        add/remove-one private at all), so that direction is refused.

    Args:
        epsilon: ε in [0, inf) of the guarantee under ``from_``.
        delta: δ in [0, 1) of the guarantee under ``from_``.
        from_: the relation the guarantee holds under.
        to: the relation to restate it under.

    Returns:
        ``(epsilon, delta)`` under ``to`` (δ may reach or exceed 1: then the guarantee is
        vacuous).

    Raises:
        ValueError: invalid ε, δ or relation names, or ``from_='replace_one'``,
            ``to='add_or_remove_one'``.

    Example:
        >>> eps, dlt = convert_relation(epsilon=1.0, delta=1e-6, from_="add_or_remove_one",
        ...                             to="replace_one")
        >>> eps, round(dlt / 1e-6, 6)  # (2ε, (1 + e)δ)
        (2.0, 3.718282)
    """
    epsilon = _validate.real("epsilon", epsilon)
    _validate.non_negative("epsilon", epsilon)
    delta = _validate.real("delta", delta)
    _validate.delta("delta", delta)
    source, target = as_relation(from_, "from_"), as_relation(to, "to")
    if source is target:
        return float(epsilon), float(delta)
    if source is REPLACE_ONE and target is ADD_OR_REMOVE_ONE:
        raise ValueError(
            "from_='replace_one' cannot be converted to to='add_or_remove_one': "
            + REPLACE_TO_ADD_REMOVE_REFUSAL
        )
    if epsilon == 0.0:
        return 0.0, 2.0 * float(delta)  # (e^{2ε} − 1)/(e^ε − 1) → 2 as ε → 0
    return group_privacy(epsilon=epsilon, delta=delta, group_size=2)
