"""The result every private ERM solver returns: private weights + what they cost and promise."""

from __future__ import annotations

import dataclasses

import jax

from dpjax.events import PrivacyEvent
from dpjax.relation import NeighbouringRelation

__all__ = ["ERMResult"]


@dataclasses.dataclass(frozen=True)
class ERMResult:
    """A private ERM release (a pytree: ``params`` and ``certificate`` are its leaves).

    The other fields are static (host-side numbers fixed before any data is touched), so the
    whole result can be returned from ``jax.jit`` / ``jax.vmap`` over keys.

    Attributes:
        params: the private weights w_priv, shape (d,).
        certificate: a diagnostic, ‖∇J(ŵ)‖²/(2μ) ≥ J(ŵ) − J* of the problem the inner solver
            solved (0 for the iterative solvers, whose optimisation error is in the bound).
            The guarantee never depends on it: the inner solvers run a public number of steps
            that guarantees their accuracy (:mod:`dpjax.erm.accelerated`), with no failure branch.
        excess_risk_bound: the theorem's bound on E[J(w_priv)] − J(w*) for the objective the
            caller passed (see each solver's docstring for which J), or ``inf`` where no
            theorem's assumptions hold (``bound_note`` then says why).
        event: the privacy event (``dpjax.events``) the release spent.
        relation: the neighbouring relation of the guarantee (same as ``event.relation``).
        sensitivity: the sensitivity the noise was calibrated to (ℓ2 unless stated), or None.
        noise_scale: σ (Gaussian), 1/β (Gamma-norm noise) or the Laplace scale.
        extra_regularization: the privacy-required extra ridge Δ added on top of μ (0 if none).
        bound_note: why ``excess_risk_bound`` is ``inf`` (an assumption of the theorem that
            this call does not meet), or ``None`` when the bound is stated.
    """

    params: jax.Array
    certificate: jax.Array
    excess_risk_bound: float
    event: PrivacyEvent
    relation: NeighbouringRelation
    sensitivity: float | None = None
    noise_scale: float | None = None
    extra_regularization: float = 0.0
    bound_note: str | None = None


jax.tree_util.register_dataclass(
    ERMResult,
    data_fields=["params", "certificate"],
    meta_fields=[
        "excess_risk_bound",
        "event",
        "relation",
        "sensitivity",
        "noise_scale",
        "extra_regularization",
        "bound_note",
    ],
)
