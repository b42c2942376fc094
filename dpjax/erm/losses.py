"""Per-example losses for linear models, each carrying the constants its privacy proofs use.

A loss is a :class:`Loss` object: ``loss(w, x, y)`` is the loss of ONE example for the linear
model w ∈ R^d. Every loss here is a *linear-model* loss, ℓ(w, x, y) = φ(s) with

* ``kind="margin"``   (classification, y ∈ [−1, 1], usually ±1): s = y·⟨w, x⟩;
* ``kind="residual"`` (regression): s = ⟨w, x⟩ − y.

so ∇_w ℓ = φ'(s)·(±x) and ∇²_w ℓ = φ''(s)·x xᵀ has rank one. With ‖x‖ ≤ 1 (and |y| ≤ 1 for
margin losses) the constants are

* ``lipschitz`` L = sup|φ'| — the Lipschitz constant of ℓ(·, x, y) (output and
  objective perturbation, Chaudhuri, Monteleoni, Sarwate 2011);
* ``smoothness`` c = sup|φ''| — the bound on the second derivative used by CMS11 Algorithm 2 and
  KST12; ``None`` when φ is not differentiable (hinge, absolute);
* ``twice_differentiable`` — whether the change-of-variables proof of objective perturbation
  applies (median regression, the absolute loss, is what goes wrong
  without it).

Example:
    >>> import jax.numpy as jnp
    >>> from dpjax.erm import losses
    >>> round(float(losses.logistic(jnp.zeros(2), jnp.array([1.0, 0.0]), 1.0)), 6)  # log 2
    0.693147
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from dpjax import _validate

__all__ = [
    "Loss",
    "logistic",
    "huber_svm",
    "hinge",
    "absolute",
    "squared",
    "bounded_squared",
    "linear",
    "moreau_smoothed",
]


@dataclasses.dataclass(frozen=True, eq=False)
class Loss:
    """A linear-model loss ℓ(w, x, y) = φ(s) with the constants its guarantees need.

    Attributes:
        name: a short name for messages and reports.
        phi: the scalar function φ of the margin / residual s.
        kind: ``"margin"`` (s = y⟨w, x⟩) or ``"residual"`` (s = ⟨w, x⟩ − y).
        lipschitz: L, the Lipschitz constant of ℓ(·, x, y) in w for ‖x‖ ≤ 1 (and |y| ≤ 1 for
            margin losses; on the ball ‖w‖ ≤ ``domain_radius`` when that is set).
        smoothness: c = sup|φ''| (the per-example Hessian is φ''·xxᵀ with eigenvalue ≤ c), or
            ``None`` when φ is not differentiable.
        twice_differentiable: whether φ has a (bounded) second derivative everywhere the proofs
            of objective perturbation need it.
        linear_model: True: ∇²ℓ has rank ≤ 1 (KST12's assumption).
        label_bound: the bound B the labels must satisfy (|y| ≤ B), or ``None`` if unbounded.
        domain_radius: the radius R of the ball on which ``lipschitz`` holds, or ``None`` if it
            holds everywhere (only the squared loss needs one).
        dual: the name of the SDCA dual update the exact solver uses for a non-smooth φ
            (``"hinge"`` or ``"absolute"``), else ``None``.
        continuous_hessian: whether φ'' is continuous (KST12's assumption; the Huber-SVM's φ''
            jumps at |1 − z| = h, which CMS11's own Huber analysis allows but KST12's does not).
    """

    name: str
    phi: Callable[[jax.Array], jax.Array]
    kind: str
    lipschitz: float
    smoothness: float | None
    twice_differentiable: bool
    linear_model: bool = True
    label_bound: float | None = None
    domain_radius: float | None = None
    dual: str | None = None
    continuous_hessian: bool = True

    def __post_init__(self) -> None:
        _validate.one_of("kind", self.kind, ("margin", "residual"))
        _validate.positive("lipschitz", self.lipschitz)
        if self.smoothness is not None:
            _validate.non_negative("smoothness", self.smoothness)

    def score(self, w: jax.Array, x: jax.Array, y: jax.Array) -> jax.Array:
        """The argument s of φ: y⟨w, x⟩ (margin) or ⟨w, x⟩ − y (residual)."""
        inner = jnp.dot(x, w)
        return y * inner if self.kind == "margin" else inner - y

    def __call__(self, w: jax.Array, x: jax.Array, y: jax.Array) -> jax.Array:
        """The loss of one example (x of shape (d,), y a scalar)."""
        return self.phi(self.score(w, x, y))

    def mean(self, w: jax.Array, X: jax.Array, y: jax.Array) -> jax.Array:
        """F(w) = (1/n) Σ_i ℓ(w, x_i, y_i) for X of shape (n, d)."""
        return jnp.mean(self.phi(_scores(self, w, X, y)))

    @property
    def is_smooth(self) -> bool:
        """Whether ℓ has a Lipschitz gradient (c is known)."""
        return self.smoothness is not None

    def __repr__(self) -> str:
        c = "None" if self.smoothness is None else f"{self.smoothness:g}"
        return f"Loss({self.name}, L={self.lipschitz:g}, c={c})"


def _scores(loss: Loss, w: jax.Array, X: jax.Array, y: jax.Array) -> jax.Array:
    inner = X @ w
    return y * inner if loss.kind == "margin" else inner - y


def _logistic_phi(s: jax.Array) -> jax.Array:
    return jnp.logaddexp(jnp.zeros_like(s), -s)


logistic = Loss(
    name="logistic",
    phi=_logistic_phi,
    kind="margin",
    lipschitz=1.0,
    smoothness=0.25,
    twice_differentiable=True,
    label_bound=1.0,
)
"""Logistic loss log(1 + exp(−y⟨w, x⟩)): L = 1, c = 1/4 (CMS11)."""


def huber_svm(h: float) -> Loss:
    """The Huber-SVM loss of CMS11 with parameter h.

    φ(z) = 0 if z > 1 + h;  (1 + h − z)²/(4h) if |1 − z| ≤ h;  1 − z if z < 1 − h.

    L = 1 and c = 1/(2h). φ is C¹ with a piecewise-constant φ'' bounded by c; CMS11 apply
    Algorithm 2 to it (their Huber-SVM analysis), so objective perturbation accepts it with
    ``variant="cms"``; KST12 assume a continuous Hessian, so ``variant="kst"`` refuses it.

    Args:
        h: the width of the quadratic piece, h > 0.

    Returns:
        The loss object.
    """
    _validate.positive("h", h)
    h = float(h)

    def phi(z: jax.Array) -> jax.Array:
        quad = (1.0 + h - z) ** 2 / (4.0 * h)
        return jnp.where(z > 1.0 + h, jnp.zeros_like(z), jnp.where(z < 1.0 - h, 1.0 - z, quad))

    return Loss(
        name=f"huber_svm(h={h:g})",
        phi=phi,
        kind="margin",
        lipschitz=1.0,
        smoothness=1.0 / (2.0 * h),
        twice_differentiable=True,
        label_bound=1.0,
        continuous_hessian=False,
    )


hinge = Loss(
    name="hinge",
    phi=lambda z: jnp.maximum(1.0 - z, jnp.zeros_like(z)),
    kind="margin",
    lipschitz=1.0,
    smoothness=None,
    twice_differentiable=False,
    label_bound=1.0,
    dual="hinge",
)
"""Hinge loss max(0, 1 − y⟨w, x⟩): L = 1, not differentiable (output perturbation / DP-GD only)."""

absolute = Loss(
    name="absolute",
    phi=jnp.abs,
    kind="residual",
    lipschitz=1.0,
    smoothness=None,
    twice_differentiable=False,
    label_bound=None,
    dual="absolute",
)
"""Absolute loss |⟨w, x⟩ − y|: L = 1, sharp (median regression:
refused by objective perturbation)."""

linear = Loss(
    name="linear",
    phi=lambda z: -z,
    kind="margin",
    lipschitz=1.0,
    smoothness=0.0,
    twice_differentiable=True,
    label_bound=1.0,
)
"""BST14's lower-bound loss −y⟨w, x⟩ (with y = 1: −⟨w, x⟩): L = 1, c = 0.

With the regulariser (μ/2)‖w‖² its minimiser is w* = mean(y_i x_i)/μ, so the argmin
sensitivity 2L/(μn) is attained exactly — the tight instance of the audits (instance E)."""


def bounded_squared(radius: float, label_bound: float) -> Loss:
    """The squared loss ½(⟨w, x⟩ − y)² on the ball ‖w‖ ≤ ``radius`` with |y| ≤ ``label_bound``.

    Its gradient (⟨w, x⟩ − y)x has norm ≤ R + B there, so L = R + B and c = 1. The regularised
    minimiser of F + (μ/2)‖w‖² has ‖w*‖ ≤ ‖∇F(0)‖/μ ≤ B/μ, so output perturbation and DP-GD
    require μ ≥ B/R (checked before any data is touched). Objective perturbation refuses it:
    the tilt can push the minimiser out of the ball where L holds.

    Args:
        radius: R > 0, the radius of the parameter ball.
        label_bound: B > 0, the bound on |y| (labels are clipped to [−B, B]).

    Returns:
        The loss object.
    """
    _validate.positive("radius", radius)
    _validate.positive("label_bound", label_bound)
    return Loss(
        name=f"squared(R={float(radius):g}, B={float(label_bound):g})",
        phi=lambda r: 0.5 * r**2,
        kind="residual",
        lipschitz=float(radius) + float(label_bound),
        smoothness=1.0,
        twice_differentiable=True,
        label_bound=float(label_bound),
        domain_radius=float(radius),
    )


squared = bounded_squared(radius=1.0, label_bound=1.0)
"""½(⟨w, x⟩ − y)² with the default bounds ‖w‖ ≤ 1, |y| ≤ 1 (L = 2, c = 1; needs μ ≥ 1).
Use :func:`bounded_squared` for other bounds."""


def moreau_smoothed(loss: Loss, width: float) -> Loss:
    """The Moreau envelope φ_h(s) = min_u φ(u) + (s − u)²/(2h) of the hinge or absolute loss.

    * hinge: φ_h(z) = 0 (z ≥ 1), (1 − z)²/(2h) (1 − h ≤ z < 1), 1 − z − h/2 (z < 1 − h);
    * absolute: φ_h(r) = r²/(2h) (|r| ≤ h), |r| − h/2 otherwise (the Huber function).

    The envelope of a convex L-Lipschitz φ is convex, L-Lipschitz, with a (1/h)-Lipschitz
    derivative (Beck 2017, "First-Order Methods in Optimization", §6.7), and
    φ − L²h/2 ≤ φ_h ≤ φ (u = s gives φ_h ≤ φ; φ(u) ≥ φ(s) − L|s − u| and
    min_t (t²/(2h) − Lt) = −L²h/2 give the other side), so the minimiser ŵ_h of the smoothed
    objective has J_φ(ŵ_h) − min J_φ ≤ L²h/2.

    Args:
        loss: :data:`hinge` or :data:`absolute` (a loss with an SDCA ``dual``).
        width: h > 0, public.

    Returns:
        The smoothed loss (same kind, L and label bound; c = 1/h; twice differentiable).
    """
    h = float(_validate.positive("width", width))
    if loss.dual == "hinge":

        def phi(z: jax.Array) -> jax.Array:
            gap = 1.0 - z
            quad = gap**2 / (2.0 * h)
            return jnp.where(gap <= 0.0, jnp.zeros_like(z), jnp.where(gap < h, quad, gap - 0.5 * h))

    elif loss.dual == "absolute":

        def phi(r: jax.Array) -> jax.Array:
            return jnp.where(jnp.abs(r) <= h, r**2 / (2.0 * h), jnp.abs(r) - 0.5 * h)

    else:
        _validate.fail("loss", loss.name, "hinge or absolute (the non-smooth losses)")
    return Loss(
        name=f"moreau({loss.name}, h={h:g})",
        phi=phi,
        kind=loss.kind,
        lipschitz=loss.lipschitz,
        smoothness=1.0 / h,
        twice_differentiable=True,
        label_bound=loss.label_bound,
        continuous_hessian=False,
    )
