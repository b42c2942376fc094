"""Private linear regression from noisy sufficient statistics (noisy S_xx, S_xy; least squares)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from dpjax import _validate
from dpjax._noise import tree_add_noise
from dpjax.erm._common import finite_or_zero, public_dataset_size, require_x64
from dpjax.erm.result import ERMResult
from dpjax.events import GaussianEvent
from dpjax.mechanisms import gaussian_sigma
from dpjax.mechanisms._vmap_guard import guarded_release
from dpjax.relation import REPLACE_ONE, NeighbouringRelation, as_relation, sensitivity_factor

__all__ = [
    "sufficient_statistics_sensitivity",
    "bounded_records",
    "sufficient_statistics",
    "noisy_sufficient_statistics_regression",
]


def sufficient_statistics_sensitivity(
    *, label_bound: float, relation: NeighbouringRelation | str = REPLACE_ONE
) -> float:
    """ℓ2 sensitivity of (upper-triangle of XᵀX, Xᵀy) for ‖x‖ ≤ 1, |y| ≤ B.

    One record contributes v = (upper(xxᵀ), y·x) with ‖v‖² ≤ ‖xxᵀ‖_F² + B² ≤ 1 + B², so the
    sensitivity is √(1 + B²) under add/remove-one and 2√(1 + B²) under replace-one.
    """
    _validate.positive("label_bound", label_bound)
    base = math.sqrt(1.0 + float(label_bound) ** 2)
    return sensitivity_factor(relation) * base


def bounded_records(X, y, *, label_bound: float) -> tuple[jax.Array, jax.Array]:
    """The records as the release sees them: every record mapped into its bounds.

    Non-finite entries of X and y become 0 (a fixed public value), rows are scaled to ‖x‖ ≤ 1
    and labels clipped to [−B, B], in that order, so ONE record — whatever its values,
    NaN and ±inf included — moves the statistics vector by at most the sensitivity.
    """
    X = finite_or_zero(jnp.asarray(X, dtype=jnp.float64))
    y = finite_or_zero(jnp.asarray(y, dtype=jnp.float64))
    if X.ndim != 2 or y.shape != (X.shape[0],):
        _validate.fail("X, y", (X.shape, y.shape), "shapes (n, d) and (n,)")
    y = jnp.clip(y, -float(label_bound), float(label_bound))
    X = X / jnp.maximum(jnp.linalg.norm(X, axis=1), 1.0)[:, None]
    return X, y


def sufficient_statistics(X, y, *, label_bound: float) -> tuple[jax.Array, jax.Array]:
    """(XᵀX, Xᵀy) of :func:`bounded_records`: the vector the Gaussian noise is added to."""
    X, y = bounded_records(X, y, label_bound=label_bound)
    return X.T @ X, X.T @ y


def _upper_mask(d: int) -> jax.Array:
    return jnp.triu(jnp.ones((d, d), dtype=bool))


@guarded_release("X", "y")
def noisy_sufficient_statistics_regression(
    key: jax.Array,
    X,
    y,
    *,
    mu: float,
    epsilon: float,
    delta: float,
    label_bound: float = 1.0,
    relation: NeighbouringRelation | str = REPLACE_ONE,
    calibration: str = "analytic",
    dataset_size: int | None = None,
) -> ERMResult:
    r"""Ridge regression from Gaussian-noised XᵀX and Xᵀy (sufficient statistics).

    .. math::  \hat w = (\Pi_{\succeq 0}(X^\top X + E)/N + \mu I)^{-1}(X^\top y + e)/N

    with E symmetric (noise on the upper triangle, mirrored), e ~ N(0, σ²I), σ calibrated to
    :func:`sufficient_statistics_sensitivity`, and Π the projection onto PSD matrices
    (post-processing). :func:`bounded_records` maps every record into its bounds first
    (non-finite entries → 0, rows scaled to ‖x‖ ≤ 1, labels clipped to [−B, B]), so a NaN or
    infinite record cannot make the release NaN. N is the PUBLIC ``dataset_size``.

    Args:
        key: PRNG key, used once.
        X, y: data (n, d), (n,).
        mu: ridge μ > 0 (public; makes the solve well posed).
        epsilon, delta: the budget, δ ∈ (0, 1).
        label_bound: B, the public bound on |y|.
        relation: neighbouring relation; the sensitivity follows it.
        calibration: ``"analytic"`` or ``"classic"`` (:func:`dpjax.mechanisms.gaussian_sigma`).
        dataset_size: the PUBLIC N of the post-processing; default len(X) under replace-one,
            REQUIRED under add/remove-one (len(X) differs between neighbours; normalising by it
            would make the post-processing depend on private data).

    Returns:
        :class:`ERMResult` with ``GaussianEvent(σ/Δ)``; ``excess_risk_bound`` is ``inf`` (the
        textbooks give no bound for this estimator; measure it), ``bound_note`` says so.

    Raises:
        ValueError: bad parameters, or add/remove-one without ``dataset_size``.

    Formal guarantees:
        One Gaussian mechanism on the statistics vector of ℓ2 sensitivity Δ
        (:func:`sufficient_statistics_sensitivity`; Dwork & Roth 2014, Gaussian
        mechanism; sufficient-statistics regression: S_xx, S_xy are
        statistical queries), under ``relation``; the estimate is post-processing by a map
        fixed by public values only (μ, N).
    """
    require_x64()
    _validate.positive("mu", mu)
    _validate.epsilon("epsilon", epsilon)
    _validate.in_range("delta", delta, 0.0, 1.0, low_inclusive=False)
    relation = as_relation(relation)
    sens = sufficient_statistics_sensitivity(label_bound=label_bound, relation=relation)
    sigma = gaussian_sigma(sensitivity=sens, epsilon=epsilon, delta=delta, calibration=calibration)
    X, y = bounded_records(X, y, label_bound=label_bound)
    d = X.shape[1]
    n = public_dataset_size(X.shape[0], dataset_size, relation)
    sxx, sxy = tree_add_noise(key, (X.T @ X, X.T @ y), jax.random.normal, sigma)
    upper = jnp.where(_upper_mask(d), sxx, 0.0)
    sym = upper + upper.T - jnp.diag(jnp.diag(upper))
    evals, evecs = jnp.linalg.eigh(sym)
    psd = (evecs * jnp.maximum(evals, 0.0)) @ evecs.T
    w = jnp.linalg.solve(psd / n + mu * jnp.eye(d, dtype=X.dtype), sxy / n)
    return ERMResult(
        params=w,
        certificate=jnp.zeros((), X.dtype),
        excess_risk_bound=math.inf,
        event=GaussianEvent(noise_multiplier=sigma / sens, relation=relation),
        relation=relation,
        sensitivity=sens,
        noise_scale=sigma,
        bound_note="no excess-risk theorem for this estimator (measure it)",
    )
