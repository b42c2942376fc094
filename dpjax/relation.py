"""Neighbouring relations: which pairs of data sets a guarantee protects.

Every mechanism, sensitivity and accountant in dpjax names the relation it uses, and the two
must agree: a sensitivity computed under add/remove-one and a guarantee claimed under
replace-one is the most common factor-2 privacy bug (literature §2.9, pitfall 8).

* ``REPLACE_ONE`` — D and D' have the same size n and differ in one record (the lectures'
  convention, 000/002/003: sensitivities such as 2L/(μn) for the regularised argmin).
* ``ADD_OR_REMOVE_ONE`` — D' is D with one record added or removed (the convention of
  dp-accounting and Opacus for DP-SGD; a sum of per-example terms bounded by C has
  sensitivity C, versus 2C under replace-one).
"""

from __future__ import annotations

import enum

__all__ = ["NeighbouringRelation", "REPLACE_ONE", "ADD_OR_REMOVE_ONE", "as_relation"]


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
