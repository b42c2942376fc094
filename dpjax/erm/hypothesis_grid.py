"""The exponential mechanism for learning over a finite hypothesis grid (KLNRS11), d ≤ 2."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from dpjax import _validate
from dpjax.erm._common import prepare_data, public_dataset_size, require_x64
from dpjax.erm.losses import Loss
from dpjax.erm.result import ERMResult
from dpjax.erm.solver import objective
from dpjax.events import EpsilonDeltaEvent
from dpjax.mechanisms import exponential_mechanism, exponential_mechanism_expected_gap_bound
from dpjax.mechanisms._vmap_guard import guarded_release
from dpjax.relation import REPLACE_ONE, NeighbouringRelation, as_relation, sensitivity_factor

__all__ = ["hypothesis_grid", "grid_score_sensitivity", "grid_scores", "exponential_mechanism_grid"]


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
    return sensitivity_factor(relation) * loss.lipschitz * reach / _validate.positive_int("n", n)


def grid_scores(X, y, grid: jax.Array, *, loss: Loss, mu: float, dataset_size: int) -> jax.Array:
    """The score u(w) = −J_N(w) of every grid point, J_N = (1/N)Σℓ + (μ/2)‖w‖², N PUBLIC.

    Data pass through :func:`dpjax.erm._common.prepare_data` (concrete data checked; traced
    data mapped into the loss's bounds, non-finite entries to 0).
    """
    X, y = prepare_data(X, y, loss)
    return -jax.vmap(objective(loss, float(mu), X, y, normalizer=dataset_size))(grid)


@guarded_release("X", "y")
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
    dataset_size: int | None = None,
) -> ERMResult:
    r"""Pick w from a grid with probability ∝ exp(−εJ_N(w)/(2Δ)) (KLNRS11;
    the exponential mechanism for ML), via :func:`dpjax.mechanisms.exponential_mechanism`.

    Args:
        key: PRNG key, used once.
        X, y: data, ‖x_i‖ ≤ 1 (d ≤ 2 features), finite; ±1 labels for margin losses.
        loss: a linear-model loss (only L is used).
        epsilon: ε > 0 (pure DP).
        radius: D, the half-width of the cube [−D, D]^d the grid covers.
        mu: μ ≥ 0, data-independent ridge added to the score.
        resolution: grid points per axis (spacing h = 2D/(resolution − 1)).
        relation: neighbouring relation; the sensitivity follows it.
        dataset_size: the PUBLIC N of J_N = (1/N)Σℓ + (μ/2)‖w‖² and of Δ; default len(X)
            under replace-one, REQUIRED under add/remove-one (len(X) differs between
            neighbours: a score and a Δ normalised by it leak it).

    Returns:
        :class:`ERMResult` with ``EpsilonDeltaEvent(ε, 0)`` and ``excess_risk_bound`` =
        2Δ ln(m)/ε + (L + μD√d)·h√d/2 ≥ E[J(ŵ)] − min_{cube} J (m grid points).

    Raises:
        ValueError: bad parameters, invalid concrete data, or add/remove-one without
            ``dataset_size``.

    Formal guarantees:
        ε-DP under ``relation``: exponential mechanism with score sensitivity Δ
        (:func:`grid_score_sensitivity` with the public N; Dwork & Roth 2014, Theorem 3.10
        (exponential mechanism); McSherry & Talwar 2007). With a public N, neighbours' scores
        differ by one term ℓ/N (plus a constant common to all candidates). Utility:
        E-gap ≤ 2Δ ln m/ε (Dwork & Roth 2014, Theorem 3.11, expectation form) plus the grid
        error: the nearest grid point is within h√d/2 of the cube minimiser and J is
        (L + μD√d)-Lipschitz on the cube.
    """
    require_x64()
    _validate.epsilon("epsilon", epsilon)
    _validate.non_negative("mu", mu)
    relation = as_relation(relation)
    n, d = jnp.shape(X)
    n = public_dataset_size(n, dataset_size, relation)
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
    scores = grid_scores(X, y, grid, loss=loss, mu=mu, dataset_size=n)
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
