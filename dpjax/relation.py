"""Neighbouring relations: which pairs of data sets a guarantee protects.

Every mechanism, sensitivity and accountant in dpjax names the relation it uses, and the two
must agree: a sensitivity computed under add/remove-one and a guarantee claimed under
replace-one is the most common factor-2 privacy bug .

* ``REPLACE_ONE`` — D and D' have the same size n and differ in one record (the textbook
  convention, e.g. the sensitivity 2L/(μn) of the regularised argmin in Chaudhuri, Monteleoni,
  Sarwate 2011).
* ``ADD_OR_REMOVE_ONE`` — D' is D with one record added or removed (the convention of
  dp-accounting and Opacus for DP-SGD; a sum of per-example terms bounded by C has
  sensitivity C, versus 2C under replace-one).

:func:`sensitivity_factor` is the one home of that "×2 under replace-one"; converting a whole
(ε, δ) guarantee between relations is :func:`dpjax.accounting.convert_relation`.
"""

from __future__ import annotations

import enum

__all__ = [
    "NeighbouringRelation",
    "REPLACE_ONE",
    "ADD_OR_REMOVE_ONE",
    "as_relation",
    "sensitivity_factor",
]


class NeighbouringRelation(enum.StrEnum):
    """The neighbouring relation a privacy guarantee is stated under."""

    REPLACE_ONE = "replace_one"
    ADD_OR_REMOVE_ONE = "add_or_remove_one"


REPLACE_ONE = NeighbouringRelation.REPLACE_ONE
ADD_OR_REMOVE_ONE = NeighbouringRelation.ADD_OR_REMOVE_ONE


def as_relation(value: NeighbouringRelation | str, name: str = "relation") -> NeighbouringRelation:
    """Parse a relation given as the enum or its string value.

    Raises:
        ValueError: if ``value`` names no relation.
    """
    try:
        return NeighbouringRelation(value)
    except ValueError:
        valid = tuple(r.value for r in NeighbouringRelation)
        raise ValueError(f"{name} must be one of {valid!r}; got {value!r}") from None


def sensitivity_factor(relation: NeighbouringRelation | str) -> float:
    """Sensitivity under ``relation`` of a quantity whose add/remove-one sensitivity is 1.

    2.0 under ``REPLACE_ONE``, 1.0 under ``ADD_OR_REMOVE_ONE``. Multiply a per-record bound C
    (the add/remove-one sensitivity of a clipped sum, of a normalised-by-public-n gradient
    average, of a regularised argmin with public normaliser n, ...) by it to get the
    sensitivity under ``relation``.

    Formal guarantees:
        Replacing one record is removing it and adding another; if f moves by at most C when
        one record is added or removed (f defined on data sets of every size, any normaliser
        public), then by the triangle inequality f moves by at most 2C when one record is
        replaced. The factor is tight for sums of per-record terms (x → −x).

    Args:
        relation: the relation the sensitivity is claimed under (enum or its string value).

    Returns:
        2.0 or 1.0.

    Raises:
        ValueError: if ``relation`` names no relation.

    Example:
        >>> sensitivity_factor("replace_one"), sensitivity_factor(ADD_OR_REMOVE_ONE)
        (2.0, 1.0)
    """
    return 2.0 if as_relation(relation) is REPLACE_ONE else 1.0
