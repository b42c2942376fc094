"""The private algorithms of the rate experiments: public ``dpjax.erm`` only, vmapped over keys."""

from __future__ import annotations

import functools
import importlib
import types
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["SolverUnavailable", "erm_function", "erm_loss", "private_release"]


class SolverUnavailable(RuntimeError):
    """The ``dpjax.erm`` function a row needs is not importable (the row is reported as skipped)."""


def erm_function(name: str) -> Callable:
    """The public ``dpjax.erm.<name>`` (a solver, a bound or a hyperparameter formula)."""
    try:
        erm = importlib.import_module("dpjax.erm")
    except ImportError as err:  # pragma: no cover - dpjax.erm is part of the package
        raise SolverUnavailable(f"dpjax.erm is not importable: {err}") from err
    found = getattr(erm, name, None)
    for module_name in (f"dpjax.erm.{name}", "dpjax.erm.bounds"):
        if callable(found) and not isinstance(found, types.ModuleType):
            break
        try:
            found = getattr(importlib.import_module(module_name), name, None)
        except ImportError:
            found = None
    if not callable(found):
        raise SolverUnavailable(f"dpjax.erm.{name} is not available")
    return found


def erm_loss(name: str):
    """A loss object of ``dpjax.erm.losses``."""
    try:
        return getattr(importlib.import_module("dpjax.erm.losses"), name)
    except (ImportError, AttributeError) as err:
        raise SolverUnavailable(f"dpjax.erm.losses.{name} is not available") from err


@functools.cache
def _compiled(name: str, kwargs: tuple) -> tuple[Callable, Callable]:
    solver = erm_function(name)
    options = dict(kwargs)

    def one(key, X, y):
        return solver(key, X, y, **options)

    return jax.jit(jax.vmap(one, in_axes=(0, None, None))), one


def private_release(name: str, keys: jax.Array, X: np.ndarray, y: np.ndarray, **kwargs):
    """Run ``dpjax.erm.<name>(key, X, y, **kwargs)`` for every key in ONE compiled vmapped call.

    Returns:
        ``(params, info, certificate)``: the private weights, shape (S, d); the solver's static
        result fields (``excess_risk_bound``, ``noise_scale``, ...) from ``jax.eval_shape``; and
        the largest certificate of its exact inner solves (0 for the iterative solvers).
    """
    batched, one = _compiled(name, tuple(sorted(kwargs.items())))
    X, y = jnp.asarray(X), jnp.asarray(y)
    info = jax.eval_shape(one, keys[0], X, y)
    result = batched(keys, X, y)
    params = np.asarray(result.params)
    if np.isnan(params).any():
        raise RuntimeError(f"dpjax.erm.{name} failed closed (NaN params) on a rate cell")
    return params, info, float(np.max(np.asarray(result.certificate)))
