"""The exponential mechanism for learning over a finite hypothesis grid (003, KLNRS11), d ≤ 2."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from dpjax import _validate
from dpjax.accounting.events import EpsilonDeltaEvent
from dpjax.erm.losses import Loss
from dpjax.erm.result import ERMResult
from dpjax.erm.solver import objective, prepare_data, require_x64
from dpjax.mechanisms import exponential_mechanism, exponential_mechanism_expected_gap_bound
from dpjax.relation import REPLACE_ONE, NeighbouringRelation, as_relation

__all__ = ["hypothesis_grid", "grid_score_sensitivity", "exponential_mechanism_grid"]


def hypothesis_grid(*, d: int, radius: float, resolution: int) -> jax.Array:
    """The cube grid {−D, …, D}^d with ``resolution`` points per axis, shape (resolution^d, d)."""
    d = _validate.positive_int("d", d)
    if d > 2:
        _validate.fail("d", d, "1 or 2 (the grid has resolution^d points)")
    _validate.positive("radius", radius)
    resolution = _validate.positive_int("resolution", resolution)
    if resolution < 2:
        _validate.fail("resolution", resolution, "at least 2")
    axis = jnp.linspace(-float(radius), float(radius), resolution, dtype=jnp.float64)
    mesh = jnp.meshgrid(*([axis] * d), indexing="ij")
    return jnp.stack([m.ravel() for m in mesh], axis=1)


def grid_score_sensitivity(
    *, loss: Loss, n: int, d: int, radius: float, relation=REPLACE_ONE
) -> float:
    """Sensitivity of the score u(w) = −J(w) on the grid, up to a per-pair constant.

    For a linear-model loss ℓ = φ(s), one record moves u by (φ(s) − φ(s₀))/n plus a constant
    common to all candidates (s₀ = s at w = 0), and |s − s₀| = |⟨w, x⟩| ≤ D√d on the cube;
    constants cancel in the exponential mechanism's normaliser. Hence Δ = L·D√d/n under
    add/remove-one (public normaliser n) and 2L·D√d/n under replace-one.
    """
    reach = float(radius) * math.sqrt(d)
    if loss.domain_radius is not None and reach > loss.domain_radius:
        _validate.fail("radius", radius, f"≤ {loss.domain_radius / math.sqrt(d):g} for {loss.name}")
    factor = 2.0 if as_relation(relation) == REPLACE_ONE else 1.0
    return factor * loss.lipschitz * reach / _validate.positive_int("n", n)


def exponential_mechanism_grid(
    key: jax.Array,
    X,
    y,
    *,
    loss: Loss,
    epsilon: float,
    radius: float,
    mu: float = 0.0,
    resolution: int = 65,
    relation: NeighbouringRelation | str = REPLACE_ONE,
) -> ERMResult:
    r"""Pick w from a grid with probability ∝ exp(−εJ(w)/(2Δ)) (KLNRS11; 003 "Exponential
    Mechanism for ML"), via :func:`dpjax.mechanisms.exponential_mechanism`.

    Args:
        key: PRNG key, used once.
        X, y: data, ‖x_i‖ ≤ 1 (d ≤ 2 features).
        loss: a linear-model loss (only L is used).
        epsilon: ε > 0 (pure DP).
        radius: D, the half-width of the cube [−D, D]^d the grid covers.
        mu: μ ≥ 0, data-independent ridge added to the score.
        resolution: grid points per axis (spacing h = 2D/(resolution − 1)).
        relation: neighbouring relation; the sensitivity follows it.

    Returns:
        :class:`ERMResult` with ``EpsilonDeltaEvent(ε, 0)`` and ``excess_risk_bound`` =
        2Δ ln(m)/ε + (L + μD√d)·h√d/2 ≥ E[J(ŵ)] − min_{cube} J (m grid points).

    Formal guarantees:
        ε-DP: exponential mechanism with score sensitivity Δ (:func:`grid_score_sensitivity`;
        004 Theorem 27; McSherry & Talwar 2007). Utility: E-gap ≤ 2Δ ln m/ε (004 Lemma 28,
        expectation form) plus the grid error: the nearest grid point is within h√d/2 of the
        cube minimiser and J is (L + μD√d)-Lipschitz on the cube.
    """
    require_x64()
    _validate.epsilon(epsilon)
    _validate.non_negative("mu", mu)
    n, d = jnp.shape(X)
    grid = hypothesis_grid(d=d, radius=radius, resolution=resolution)
    sens = grid_score_sensitivity(loss=loss, n=n, d=d, radius=radius, relation=relation)
    spacing = 2.0 * float(radius) / (resolution - 1)
    lip = loss.lipschitz + float(mu) * float(radius) * math.sqrt(d)
    bound = (
        exponential_mechanism_expected_gap_bound(
            sensitivity=sens, epsilon=epsilon, num_candidates=grid.shape[0]
        )
        + lip * spacing * math.sqrt(d) / 2.0
    )
    X, y = prepare_data(X, y, loss)
    scores = -jax.vmap(objective(loss, float(mu), X, y))(grid)
    index = exponential_mechanism(key, scores, sensitivity=sens, epsilon=epsilon)
    return ERMResult(
        params=grid[index],
        certificate=jnp.zeros((), grid.dtype),
        excess_risk_bound=bound,
        event=EpsilonDeltaEvent(epsilon=float(epsilon), delta=0.0, relation=as_relation(relation)),
        relation=as_relation(relation),
        sensitivity=sens,
        noise_scale=2.0 * sens / float(epsilon),
    )
