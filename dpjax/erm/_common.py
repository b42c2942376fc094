"""Helpers shared by the ERM solvers: float64 guard, data preparation, public n, loss domain.

Private to :mod:`dpjax.erm`: every solver module imports these from here, never from a sibling
module's public surface.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dpjax import _validate
from dpjax.erm.losses import Loss
from dpjax.relation import ADD_OR_REMOVE_ONE, NeighbouringRelation

__all__ = [
    "check_domain",
    "finite_or_zero",
    "prepare_data",
    "public_dataset_size",
    "require_x64",
]


def require_x64() -> None:
    """Raise unless JAX's float64 mode is on (exact solvers need it)."""
    if not jax.config.jax_enable_x64:
        raise ValueError(
            "dpjax.erm needs float64: the privacy of objective perturbation and the certified "
            "excess-risk measurements rest on exact minimisation, which float32 (resolution "
            "~6e-8) cannot deliver. Enable it at program start with "
            "`jax.config.update('jax_enable_x64', True)` (or JAX_ENABLE_X64=1)."
        )


def prepare_data(X, y, loss: Loss, *, sign_labels: bool = True) -> tuple[jax.Array, jax.Array]:
    """Cast (X, y) to float64 and check the bounds the loss constants assume.

    Concrete data are checked (``ValueError``): at least one row, finite entries, ‖x_i‖ ≤ 1
    (up to the rounding of the input dtype, :func:`row_norm_slack`; such rows are rescaled),
    |y_i| ≤ ``loss.label_bound`` and, for margin losses with ``sign_labels`` (every private
    solver), y_i ∈ {−1, +1} (the reference :func:`solve` accepts 0 < |y_i| ≤ 1, never a 0
    label, which would drop its row). Traced data (inside
    ``jax.jit``) cannot be checked; they are mapped onto the assumptions instead, a no-op on
    valid data: non-finite entries become 0 (a fixed public value), rows are scaled to
    ‖x_i‖ ≤ 1 and labels clipped to [−B, B]. A traced margin label y_i = 0 is kept and makes
    row i contribute nothing (no gradient): pass ±1 labels.
    """
    concrete = _validate.is_concrete(X) and _validate.is_concrete(y)
    if concrete:
        slack = row_norm_slack(getattr(X, "dtype", np.float64))
        X_np, y_np = np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.float64)
        _check_bounds(X_np, y_np, loss, sign_labels, slack)
    X = jnp.asarray(X, dtype=jnp.float64)
    y = jnp.asarray(y, dtype=jnp.float64)
    if X.ndim != 2 or y.shape != (X.shape[0],):
        _validate.fail("X, y", (X.shape, y.shape), "shapes (n, d) and (n,)")
    X, y = finite_or_zero(X), finite_or_zero(y)
    X = X / jnp.maximum(jnp.linalg.norm(X, axis=1), 1.0)[:, None]
    if loss.label_bound is not None:
        y = jnp.clip(y, -loss.label_bound, loss.label_bound)
    return X, y


def finite_or_zero(a: jax.Array) -> jax.Array:
    """Replace NaN and ±inf entries by 0 (a fixed public value, before any bounded step)."""
    return jnp.where(jnp.isfinite(a), a, jnp.zeros_like(a))


def row_norm_slack(dtype) -> float:
    """How far above 1 a row normalised to ‖x‖ ≤ 1 IN ``dtype`` may read in float64.

    A float32 row clipped to norm 1 has float64 norm up to 1 + a few float32 ulps (each entry
    is rounded to 24 bits): such rows are accepted and rescaled to ‖x‖ ≤ 1 (:func:`prepare_data`
    divides every row by max(1, ‖x‖)), so the rounding is neither refused nor hidden. The
    slack is 16·eps(dtype) for floating inputs below float64 and 1e-9 otherwise.
    """
    if jnp.issubdtype(dtype, jnp.floating) and float(jnp.finfo(dtype).eps) > 2.0**-52:
        return 16.0 * float(jnp.finfo(dtype).eps)
    return 1e-9


def _check_bounds(
    X: np.ndarray, y: np.ndarray, loss: Loss, sign_labels: bool, row_norm_slack: float = 1e-9
) -> None:
    if X.ndim != 2 or y.shape != (X.shape[0],):
        _validate.fail("X, y", (X.shape, y.shape), "shapes (n, d) and (n,)")
    if X.shape[0] == 0:
        _validate.fail("X", f"{X.shape[0]} rows", "a non-empty array (at least one row)")
    if not np.all(np.isfinite(X)):
        _validate.fail("X", f"{int(np.sum(~np.isfinite(X)))} non-finite entries", "finite")
    if not np.all(np.isfinite(y)):
        _validate.fail("y", f"{int(np.sum(~np.isfinite(y)))} non-finite entries", "finite")
    max_norm = float(np.max(np.linalg.norm(X, axis=1)))
    if max_norm > 1.0 + row_norm_slack:
        _validate.fail(
            "X",
            f"max row norm 1 + {max_norm - 1.0:.3g}",
            "rows with ‖x_i‖ ≤ 1 (up to the input dtype's rounding, 1 + "
            f"{row_norm_slack:.3g}); clip them first: X / max(1, ‖x_i‖) per row, e.g. "
            "dpjax.erm.estimator.clip_rows(X)",
        )
    if sign_labels and loss.kind == "margin" and not np.all(np.abs(y) == 1.0):
        bad = np.unique(y[np.abs(y) != 1.0])[:5].tolist()
        _validate.fail(
            "y",
            f"labels {bad}",
            f"in {{−1, +1}} for the margin loss {loss.name} (a 0 label "
            "carries no gradient; map {0, 1} labels to {−1, +1})",
        )
    if loss.kind == "margin" and np.any(y == 0.0):
        _validate.fail(
            "y",
            f"{int(np.sum(y == 0.0))} labels equal to 0",
            f"in {{−1, +1}} for the margin loss {loss.name} (a 0 label carries no gradient: "
            "{0, 1} labels would silently drop every 0-row; map them to {−1, +1})",
        )
    bound = loss.label_bound
    if bound is not None and float(np.max(np.abs(y))) > bound + 1e-12:
        _validate.fail("y", f"max |y_i| {float(np.max(np.abs(y))):.6g}", f"|y_i| ≤ {bound}")


def check_domain(loss: Loss, mu: float) -> None:
    """Losses Lipschitz only on ‖w‖ ≤ R need the minimiser there: ‖w*‖ ≤ B/μ ≤ R."""
    if loss.domain_radius is None:
        return
    needed = loss.label_bound / loss.domain_radius
    if float(mu) < needed:
        _validate.fail(
            "mu",
            mu,
            f">= label_bound/radius = {needed:g} for {loss.name} (‖w*‖ ≤ B/μ must lie in the "
            "ball where its Lipschitz constant holds)",
        )


def public_dataset_size(
    n: int, dataset_size: int | None, relation: NeighbouringRelation, name: str = "dataset_size"
) -> int:
    """The n that normalises objectives and gradients and sets schedules: it must be PUBLIC.

    Under replace-one, len(X) is the same on neighbours and may be used. Under add/remove-one
    it differs by one between neighbours, so dividing by it (or choosing T, η or a sensitivity
    from it) would make the release depend on a private quantity: the caller must pass it.

    Raises:
        ValueError: ``name`` is None under add/remove-one, or not a positive integer.
    """
    if dataset_size is not None:
        return _validate.positive_int(name, dataset_size)
    if relation == ADD_OR_REMOVE_ONE:
        raise ValueError(
            f"{name} must be a public positive integer under relation='add_or_remove_one' "
            "(len(X) differs between neighbours, so it may not set the normaliser, the "
            "sensitivity, T or the step sizes); got None"
        )
    return int(n)
