"""The vmap guard of every mechanism: one key per batched row, or a ``ValueError``.

``jax.vmap(lambda q: gaussian(key, q, ...))(queries)`` (the key closed over, or passed with
``in_axes=None``) drew ONE noise sample that every row received: releasing the rows gave their
differences noise-free. :func:`guarded_release` wraps a mechanism ``name(key, values, ...)``
with the shared guard of :mod:`dpjax._vmap_guard` on the key and the mechanism's VALUES (the
data-dependent input its noise protects: ``value``, ``scores``, ``counts``, ``data``, ...):

* a vmap that batches the values but not the key: ``ValueError`` naming ``key``;
* a vmap that batches both with a repeated key (keys broadcast from one key): ``ValueError``
  eagerly; under ``jit`` every leaf of the release is voided (NaN; integer releases the
  dtype's minimum, or maximum if unsigned — a value no mechanism releases; bool False);
* a vmap over independent runs (distinct keys, batched values or not) and a vmap over keys
  with unbatched values (many runs on one data set, the auditing harness) pass unchanged.

The ERM releases of :mod:`dpjax.erm` use the same decorator on their data set ``(X, y)``.

The key's data passes through a ``custom_vmap`` identity (free outside vmap); ``grad``/``jvp``
with respect to the values are unchanged (the guard reads zero-size slices behind
``stop_gradient``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

import jax

from dpjax import _validate
from dpjax._vmap_guard import Guard, Refusal, key_guard, void_release

__all__ = ["guarded_release", "guard_prng_key", "unguarded"]

F = TypeVar("F", bound=Callable[..., Any])

_PASSED = True


@functools.cache
def _mechanism_guard(values: str) -> Guard:
    """The guard whose messages name ``key`` and the mechanism's values argument ``values``."""
    unmatched = Refusal(
        "key",
        f"one key shared by the rows of a jax.vmap that batches {values}",
        f"batched by every jax.vmap that batches {values}, one distinct key per row: a key "
        f"closed over (or passed with in_axes=None) gives every row of {values} the SAME noise "
        "draw, so the rows' differences would be released noise-free. Pass "
        "jax.random.split(key, n) with in_axes=0 next to the n rows (each row is then its own "
        f"release: account for all of them), or release the whole batch of {values} in one "
        "call with the sensitivity of the batch",
    )
    repeated = Refusal(
        "key",
        f"a batch of keys with repeated entries, vmapped together with {values}",
        "a batch of DISTINCT keys (one per row, e.g. jax.random.split(key, n)): rows that "
        "share a key get the same noise draw and their differences are released noise-free",
    )
    return key_guard(unmatched=unmatched, repeated=repeated)


def _is_typed_key(key: Any) -> bool:
    return jax.dtypes.issubdtype(getattr(key, "dtype", None), jax.dtypes.prng_key)


def guard_prng_key(key: Any, values: Any, *, name: str = "value") -> tuple[Any, jax.Array]:
    """``(key, ok)``: ``key`` unchanged (typed or raw uint32), checked against ``values``' vmaps.

    Raises:
        ValueError: naming ``key`` (see the module docstring).
    """
    if _validate.is_concrete(key) and all(map(_validate.is_concrete, jax.tree.leaves(values))):
        return key, _PASSED  # no tracer: no vmap batches them (and no eager dispatch cost)
    guard = _mechanism_guard(name)
    if _is_typed_key(key):
        data, ok = guard(values, jax.random.key_data(key))
        return jax.random.wrap_key_data(data, impl=jax.random.key_impl(key)), ok
    return guard(values, key)


def guarded_release(*values: str) -> Callable[[F], F]:
    """Decorate a mechanism ``fn(key, ..., values, ...)`` with the vmap guard.

    Args:
        *values: the names of ``fn``'s parameters that hold the data-dependent input (one for
            every mechanism here; e.g. ``"X", "y"`` for a release computed from a data set).

    Returns:
        A decorator; the wrapped function keeps ``fn``'s signature and docstring, and
        ``unguarded(wrapped)`` is ``fn`` (for mechanisms that call each other with a key the
        outer guard has already checked).
    """
    if not values:
        raise TypeError("guarded_release needs the name of at least one values parameter")
    label = " and ".join(values)

    def decorate(fn: F) -> F:
        signature = inspect.signature(fn)
        missing = [p for p in ("key", *values) if p not in signature.parameters]
        if missing:
            raise TypeError(f"{fn.__name__} has no parameter(s) {missing}")

        @functools.wraps(fn)
        def release(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            data = tuple(bound.arguments.get(p) for p in values)
            key, ok = guard_prng_key(bound.arguments["key"], data, name=label)
            bound.arguments["key"] = key
            return void_release(ok, fn(*bound.args, **bound.kwargs))

        release.__dpjax_guarded_values__ = values  # type: ignore[attr-defined]
        return release  # type: ignore[return-value]

    return decorate


def unguarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The undecorated mechanism of a :func:`guarded_release` (``fn`` itself otherwise)."""
    return getattr(fn, "__wrapped__", fn)
