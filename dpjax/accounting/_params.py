"""Privacy parameters at the accounting boundary: public constants, coerced to Python numbers.

A privacy parameter (σ/C, q, δ, ε, T) is a public constant of the analysis. A NumPy float32 or
a 0-d array must not carry float32 arithmetic into dp-accounting (ε comes out slightly too low)
or reach a cache as an unhashable array, and a JAX tracer has no value to account for. So the
accounting entry points coerce every such argument here, before any arithmetic, and refuse
bool, str and tracers by name.
"""

from __future__ import annotations

import numbers
from typing import Any

import jax
import numpy as np

__all__ = ["public_float", "public_int"]

_TRACED = "privacy parameters are public constants: pass a Python number, not a traced value"


def _scalar(name: str, value: Any, kind: str) -> Any:
    """``value`` as a Python scalar; TypeError for tracers, ValueError for bool/str/arrays."""
    if isinstance(value, jax.core.Tracer):
        raise TypeError(f"{name} must be {kind} ({_TRACED}); got {value!r}")
    if isinstance(value, np.ndarray | jax.Array):
        if value.ndim != 0:
            raise ValueError(f"{name} must be {kind}; got an array of shape {value.shape}")
        value = value.item()
    elif isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool | str | bytes) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be {kind}; got {value!r}")
    return value


def public_float(name: str, value: Any) -> float:
    """``value`` as a Python float (NumPy scalars and concrete 0-d arrays accepted).

    Raises:
        TypeError: for a JAX tracer (inside ``jit``/``grad``), naming ``name``.
        ValueError: for bool, str, non-real numbers and arrays of rank > 0, naming ``name``.
    """
    return float(_scalar(name, value, "a real number"))


def public_int(name: str, value: Any) -> int:
    """``value`` as a Python int; integral floats (``100.0``) are accepted, others refused.

    Raises:
        TypeError: for a JAX tracer, naming ``name``.
        ValueError: for bool, str, non-integral values and arrays of rank > 0, naming ``name``.
    """
    x = _scalar(name, value, "an integer")
    if isinstance(x, numbers.Integral):
        return int(x)
    if isinstance(x, float) and x.is_integer():
        return int(x)
    raise ValueError(f"{name} must be an integer; got {value!r}")
