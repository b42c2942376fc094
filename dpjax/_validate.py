"""Argument validation shared by every public function of dpjax.

Every check raises ``ValueError`` with one message shape::

    <name> must be <range>; got <value!r>

so that a bad privacy parameter fails loudly and the same way everywhere, instead of
silently producing a wrong guarantee.

Privacy parameters (ε, δ, σ, sensitivities, sampling rates, step counts, ...) are public
constants, and every helper here coerces them at the boundary: each returns the value as a
Python ``float`` (or ``int`` for :func:`positive_int`), so the caller's arithmetic never runs in
a NumPy float32 or on a string. Accepted: Python ints and floats, NumPy scalars and concrete
0-d arrays (NumPy or JAX) of an integer or floating dtype. Refused by name: bools, strings,
other objects, arrays with more than one element, and JAX tracers (inside ``jax.jit`` a
privacy parameter would not be known, so it could not be checked). A tracer raises
:class:`TracedParameterError`, a ``TypeError``; every other refusal is a ``ValueError``.

Data arrays that may legitimately be traced are not privacy parameters: test them with
:func:`is_concrete` and check them only when they are concrete.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "TracedParameterError",
    "PUBLIC_CONSTANTS",
    "is_concrete",
    "real",
    "positive",
    "non_negative",
    "in_range",
    "epsilon",
    "delta",
    "probability",
    "integer",
    "positive_int",
    "one_of",
    "fail",
]

PUBLIC_CONSTANTS = (
    "privacy parameters are public constants: pass a Python number, not a traced value"
)


class TracedParameterError(TypeError):
    """A privacy parameter was given as a JAX tracer (e.g. an argument of a jitted function)."""


def is_concrete(value: Any) -> bool:
    """Whether ``value`` is a concrete value (not a JAX tracer); for data, not parameters."""
    return not isinstance(value, jax.core.Tracer)


def fail(name: str, value: Any, valid: str) -> None:
    """Raise the standard ``ValueError`` for argument ``name``."""
    raise ValueError(f"{name} must be {valid}; got {value!r}")


def _refuse_tracer(name: str, value: Any, valid: str) -> None:
    if isinstance(value, jax.core.Tracer):
        raise TracedParameterError(
            f"{name} must be {valid}; got the traced value {value!r} ({PUBLIC_CONSTANTS}; "
            "close over it or mark it static instead of passing it through jax.jit)"
        )


def _number_like(value: Any) -> Any | None:
    """``value`` as a NumPy/Python scalar if it is a real number of a numeric type, else None."""
    if isinstance(value, bool | np.bool_ | str | bytes):
        return None
    if isinstance(value, np.ndarray | jax.Array):
        dtype = value.dtype
        numeric = jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.floating)
        if value.ndim != 0 or not numeric:
            return None
        return np.asarray(value)[()]
    if isinstance(value, numbers.Real):
        return value
    return None


def _as_float(name: str, value: Any, valid: str) -> float:
    _refuse_tracer(name, value, valid)
    number = _number_like(value)
    if number is None:
        fail(name, value, valid)
    try:
        result = float(number)
    except OverflowError:  # an int beyond float64: refused, not silently made inf
        fail(name, value, valid)
    if math.isnan(result):
        fail(name, value, valid)
    return result


def real(name: str, value: Any, valid: str = "a real number") -> float:
    """Coerce a public real number (±inf allowed, NaN refused) to a Python ``float``."""
    return _as_float(name, value, valid)


def positive(name: str, value: Any, *, allow_inf: bool = False) -> float:
    """Check ``0 < value`` (and finite unless ``allow_inf``); returns it as a ``float``."""
    valid = "in (0, inf]" if allow_inf else "in (0, inf)"
    x = _as_float(name, value, valid)
    if not x > 0 or (math.isinf(x) and not allow_inf):
        fail(name, value, valid)
    return x


def non_negative(name: str, value: Any) -> float:
    """Check ``0 <= value < inf``; returns it as a ``float``."""
    x = _as_float(name, value, "in [0, inf)")
    if not 0 <= x < math.inf:
        fail(name, value, "in [0, inf)")
    return x


def in_range(
    name: str,
    value: Any,
    low: float,
    high: float,
    *,
    low_inclusive: bool = True,
    high_inclusive: bool = False,
) -> float:
    """Check that ``value`` lies in ``[low, high)`` (brackets configurable); returns a float."""
    lb = "[" if low_inclusive else "("
    rb = "]" if high_inclusive else ")"
    valid = f"in {lb}{low}, {high}{rb}"
    x = _as_float(name, value, valid)
    ok_low = x >= low if low_inclusive else x > low
    ok_high = x <= high if high_inclusive else x < high
    if not (ok_low and ok_high):
        fail(name, value, valid)
    return x


def epsilon(name: str, value: Any) -> float:
    """Privacy parameter ε: must lie in (0, inf); returns it as a ``float``."""
    return positive(name, value)


def delta(name: str, value: Any) -> float:
    """Privacy parameter δ: must lie in [0, 1); returns it as a ``float``."""
    return in_range(name, value, 0.0, 1.0)


def probability(name: str, value: Any, *, allow_zero: bool = False) -> float:
    """A probability / sampling rate in (0, 1] (or [0, 1] with ``allow_zero``), as a float."""
    return in_range(name, value, 0.0, 1.0, low_inclusive=allow_zero, high_inclusive=True)


def integer(name: str, value: Any, valid: str = "an integer") -> int:
    """A public integer (bools and strings are refused); returns it as ``int``.

    Integer-valued floats (``3.0``) are accepted, as are NumPy integer scalars and 0-d arrays.
    """
    _refuse_tracer(name, value, valid)
    number = _number_like(value)
    if isinstance(number, numbers.Integral | np.integer):
        return int(number)
    if number is not None and math.isfinite(float(number)) and float(number).is_integer():
        return int(float(number))
    fail(name, value, valid)


def positive_int(name: str, value: Any) -> int:
    """A positive integer (see :func:`integer`); returns it as ``int``."""
    result = integer(name, value, "a positive integer")
    if result < 1:
        fail(name, value, "a positive integer")
    return result


def one_of(name: str, value: Any, choices: tuple[Any, ...]) -> Any:
    """Check that ``value`` is one of ``choices``; returns the matching element of ``choices``."""
    valid = f"one of {choices!r}"
    _refuse_tracer(name, value, valid)
    for choice in choices:
        if value is choice:
            return choice
        if isinstance(value, bool) != isinstance(choice, bool):  # True is not the choice 1
            continue
        try:
            if bool(value == choice):
                return choice
        except (TypeError, ValueError):  # e.g. an array compared elementwise
            continue
    fail(name, value, valid)
