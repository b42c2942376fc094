"""Argument validation shared by every public function of dpjax.

Every check raises ``ValueError`` with one message shape::

    <name> must be <range>; got <value!r>

so that a bad privacy parameter fails loudly and the same way everywhere, instead of
silently producing a wrong guarantee. Checks are skipped for traced JAX values (inside
``jax.jit`` a value is not known); privacy parameters should be static Python numbers.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import jax

__all__ = [
    "is_concrete",
    "positive",
    "non_negative",
    "in_range",
    "epsilon",
    "delta",
    "probability",
    "positive_int",
    "one_of",
    "fail",
]


def is_concrete(value: Any) -> bool:
    """Whether ``value`` is a concrete number (not a JAX tracer)."""
    return not isinstance(value, jax.core.Tracer)


def fail(name: str, value: Any, valid: str) -> None:
    """Raise the standard ``ValueError`` for argument ``name``."""
    raise ValueError(f"{name} must be {valid}; got {value!r}")


def _as_float(name: str, value: Any, valid: str) -> float:
    try:
        result = float(value)
    except (TypeError, ValueError):
        fail(name, value, valid)
    if math.isnan(result):
        fail(name, value, valid)
    return result


def positive(name: str, value: Any, *, allow_inf: bool = False) -> Any:
    """Check ``0 < value`` (and finite unless ``allow_inf``); returns ``value``."""
    valid = "in (0, inf]" if allow_inf else "in (0, inf)"
    if not is_concrete(value):
        return value
    x = _as_float(name, value, valid)
    if not x > 0 or (math.isinf(x) and not allow_inf):
        fail(name, value, valid)
    return value


def non_negative(name: str, value: Any) -> Any:
    """Check ``0 <= value < inf``; returns ``value``."""
    if not is_concrete(value):
        return value
    x = _as_float(name, value, "in [0, inf)")
    if not 0 <= x < math.inf:
        fail(name, value, "in [0, inf)")
    return value


def in_range(
    name: str,
    value: Any,
    low: float,
    high: float,
    *,
    low_inclusive: bool = True,
    high_inclusive: bool = False,
) -> Any:
    """Check that ``value`` lies in the interval ``[low, high)`` (brackets configurable)."""
    lb = "[" if low_inclusive else "("
    rb = "]" if high_inclusive else ")"
    valid = f"in {lb}{low}, {high}{rb}"
    if not is_concrete(value):
        return value
    x = _as_float(name, value, valid)
    ok_low = x >= low if low_inclusive else x > low
    ok_high = x <= high if high_inclusive else x < high
    if not (ok_low and ok_high):
        fail(name, value, valid)
    return value


def epsilon(value: Any, name: str = "epsilon") -> Any:
    """Privacy parameter ε: must lie in (0, inf)."""
    return positive(name, value)


def delta(value: Any, name: str = "delta") -> Any:
    """Privacy parameter δ: must lie in [0, 1)."""
    return in_range(name, value, 0.0, 1.0)


def probability(value: Any, name: str, *, allow_zero: bool = False) -> Any:
    """A probability / sampling rate in (0, 1] (or [0, 1] with ``allow_zero``)."""
    return in_range(name, value, 0.0, 1.0, low_inclusive=allow_zero, high_inclusive=True)


def positive_int(name: str, value: Any) -> int:
    """A positive integer (bools are refused); returns it as ``int``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Integral | float)
        or (isinstance(value, float) and not value.is_integer())
        or value < 1
    ):
        fail(name, value, "a positive integer")
    return int(value)


def one_of(name: str, value: Any, choices: tuple[Any, ...]) -> Any:
    """Check that ``value`` is one of ``choices``."""
    if value not in choices:
        fail(name, value, f"one of {choices!r}")
    return value
