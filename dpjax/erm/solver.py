"""The certified exact (non-private) solver for strongly convex regularised ERM.

    J(w) = (1/n) Σ_i ℓ(w, x_i, y_i) + (μ/2)‖w‖² [+ ⟨t, w⟩, a public or private linear tilt]

This solver is the REFERENCE: experiments and tests measure excess risk against its certified
optimum. The private solvers do not use it: a stopping rule on a certificate is reached or
not depending on the data, and a release that fails (NaN, or an exception) on D but not on D′
tells them apart with probability 1. They use :mod:`dpjax.erm.accelerated` instead (a public
step count that guarantees ‖ŵ − w*‖ ≤ τ on every input).

How exact is exact enough:
    The solver stops on a **certificate** ``cert ≥ J(ŵ) − J*``: ‖∇J(ŵ)‖²/(2μ) for the
    smooth methods (PL inequality of a μ-strongly convex J) and the duality gap for SDCA. By
    strong convexity ‖ŵ − w*‖ ≤ √(2·cert/μ). ``converged`` is ``cert ≤ tol``.

Solvers: damped Newton in float64 (default for smooth losses, moderate d), optax L-BFGS
(``solver="lbfgs"``, large d), and SDCA with a duality-gap certificate for the non-smooth
hinge and absolute losses (Shalev-Shwartz & Zhang 2013). All are pure and jit/vmap-able.

Requires ``jax.config.update("jax_enable_x64", True)``; the library never flips that flag.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from dpjax import _validate
from dpjax.erm._common import check_domain, prepare_data, require_x64
from dpjax.erm.losses import Loss, huber_svm

__all__ = [
    "SolveResult",
    "solve",
    "objective",
    "distance_bound",
    "DEFAULT_TOL",
    "SDCA_TOL",
]

DEFAULT_TOL = 1e-18
"""Default certificate tolerance (bound on J(ŵ) − J*) of Newton and L-BFGS."""

SDCA_TOL = 1e-11
"""Default duality-gap tolerance of SDCA (the gap is a difference of O(1) float64 numbers)."""

_SOLVERS = ("auto", "newton", "lbfgs", "sdca")


class SolveResult(NamedTuple):
    """The output of :func:`solve` (a pytree of arrays: jit/vmap friendly).

    Attributes:
        params: the minimiser ŵ, float64, shape (d,).
        certificate: a certified upper bound on J(ŵ) − J*.
        converged: ``certificate <= tol``.
        iterations: Newton / L-BFGS iterations or SDCA epochs used.
    """

    params: jax.Array
    certificate: jax.Array
    converged: jax.Array
    iterations: jax.Array


def distance_bound(certificate: float, mu: float) -> float:
    """‖ŵ − w*‖ ≤ √(2·cert/μ) for a μ-strongly convex J with J(ŵ) − J* ≤ cert."""
    return (2.0 * float(certificate) / float(mu)) ** 0.5


def objective(
    loss: Loss,
    mu: float,
    X: jax.Array,
    y: jax.Array,
    tilt: jax.Array | None = None,
    normalizer: int | None = None,
) -> Callable[[jax.Array], jax.Array]:
    """J(w) = (1/N)Σℓ(w, x_i, y_i) + (μ/2)‖w‖² (+ ⟨tilt, w⟩), N = ``normalizer`` or n."""
    factor = 1.0 if normalizer is None else X.shape[0] / float(normalizer)

    def J(w: jax.Array) -> jax.Array:
        value = factor * loss.mean(w, X, y) + 0.5 * mu * jnp.dot(w, w)
        return value if tilt is None else value + jnp.dot(tilt, w)

    return J


def _line_search(J, w, p, slope):
    """Backtracking t = 1, 1/2, … (≥ 2^-40) to Armijo decrease, with rounding slack."""
    f0 = J(w)
    slack = 16.0 * jnp.finfo(w.dtype).eps * (1.0 + jnp.abs(f0))

    def rejected(t):
        return (J(w - t * p) > f0 - 0.25 * t * slope + slack) & (t > 2.0**-40)

    return jax.lax.while_loop(rejected, lambda t: 0.5 * t, jnp.ones((), w.dtype))


def _newton(J, w0, mu, tol, max_iter):
    grad, hess = jax.grad(J), jax.hessian(J)

    def cert(g):
        return jnp.dot(g, g) / (2.0 * mu)

    def cond(state):
        _, g, it = state
        return (cert(g) > tol) & (it < max_iter)

    def body(state):
        w, g, it = state
        p = jnp.linalg.solve(hess(w), g)
        t = _line_search(J, w, p, jnp.dot(g, p))
        w = w - t * p
        return w, grad(w), it + 1

    w, g, it = jax.lax.while_loop(cond, body, (w0, grad(w0), jnp.asarray(0)))
    c = cert(g)
    return SolveResult(w, c, c <= tol, it)


def _lbfgs(J, w0, mu, tol, max_iter):
    opt = optax.lbfgs()
    value_and_grad = optax.value_and_grad_from_state(J)

    def cert(g):
        return jnp.dot(g, g) / (2.0 * mu)

    def cond(state):
        _, _, g, it = state
        return (cert(g) > tol) & (it < max_iter)

    def body(state):
        w, opt_state, _, it = state
        value, g = value_and_grad(w, state=opt_state)
        updates, opt_state = opt.update(g, opt_state, w, value=value, grad=g, value_fn=J)
        w = optax.apply_updates(w, updates)
        return w, opt_state, jax.grad(J)(w), it + 1

    # optax 0.2.8's L-BFGS mixes int32/int64 indices, which strict promotion (x64) refuses.
    with jax.numpy_dtype_promotion("standard"):
        init = (w0, opt.init(w0), jax.grad(J)(w0), jnp.asarray(0))
        w, _, g, it = jax.lax.while_loop(cond, body, init)
    c = cert(g)
    return SolveResult(w, c, c <= tol, it)


def _sdca_terms(loss: Loss, y):
    """(u, c, lo, hi): w = (1/(μN))Σ a_i u_i x_i, dual = (1/N)Σ a_i c_i − (μ/2)‖w‖², a ∈ [lo, hi].

    Hinge φ_i(s) = max(0, 1 − y_i s): −φ_i*(−y_i a) = a for a ∈ [0, 1] (any |y_i| ≤ 1).
    Absolute φ_i(s) = |s − y_i|: −φ_i*(−a) = a y_i for a ∈ [−1, 1].
    """
    if loss.dual == "hinge":
        return y, jnp.ones_like(y), 0.0, 1.0
    return jnp.ones_like(y), y, -1.0, 1.0


def _sdca(loss: Loss, X, y, mu, tol, max_epochs, normalizer=None, a0=None):
    """SDCA (Shalev-Shwartz & Zhang 2013) with exact coordinate maximisation; gap certificate."""
    n = X.shape[0] if normalizer is None else normalizer
    u, c, lo, hi = _sdca_terms(loss, y)
    curvature = u**2 * jnp.sum(X**2, axis=1)  # u_i²‖x_i‖²

    def coordinate(a_i, i, w):
        step = mu * n * (c[i] - u[i] * jnp.dot(X[i], w)) / jnp.maximum(curvature[i], 1e-300)
        flat = jnp.where(c[i] >= 0, hi, lo)  # no curvature: maximise the linear term
        return jnp.where(curvature[i] > 0, jnp.clip(a_i + step, lo, hi), flat)

    def weights(a):
        return X.T @ (a * u) / (mu * n)

    def epoch(a):
        def step(i, carry):
            a, w = carry
            new = coordinate(a[i], i, w)
            return a.at[i].set(new), w + (new - a[i]) * u[i] * X[i] / (mu * n)

        a, _ = jax.lax.fori_loop(0, X.shape[0], step, (a, weights(a)))
        return a

    def gap(a):
        w = weights(a)
        primal = objective(loss, mu, X, y, normalizer=normalizer)(w)
        dual = jnp.sum(a * c) / n - 0.5 * mu * jnp.dot(w, w)
        return jnp.maximum(primal - dual, 0.0), w

    def cond(state):
        _, g, it = state
        return (g > tol) & (it < max_epochs)

    def body(state):
        a, _, it = state
        a = epoch(a)
        return a, gap(a)[0], it + 1

    a0 = jnp.zeros(X.shape[0], dtype=X.dtype) if a0 is None else a0
    a, g, it = jax.lax.while_loop(cond, body, (a0, gap(a0)[0], jnp.asarray(0)))
    g, w = gap(a)
    return SolveResult(w, g, g <= tol, it)


def _smoothed(loss: Loss, h: float) -> Loss:
    """A Huber-smoothed twin of the hinge / absolute loss (for the SDCA warm start only)."""
    if loss.dual == "hinge":
        return huber_svm(h)

    def phi(r):
        return jnp.where(jnp.abs(r) <= h, r**2 / (2.0 * h), jnp.abs(r) - 0.5 * h)

    return Loss("huber_abs", phi, "residual", 1.0, 1.0 / h, True)


def _sdca_warm_start(loss: Loss, X, y, mu, normalizer, h=1e-2, iterations=30):
    """Dual point a_i = −φ_h'(s_i) at the smoothed problem's (approximate) Newton solution.

    Only a starting point: the certificate is SDCA's own duality gap, whatever a0 is.
    """
    smooth = _smoothed(loss, h)
    J = objective(smooth, mu, X, y, normalizer=normalizer)
    w = _newton(J, jnp.zeros(X.shape[1], dtype=X.dtype), mu, 0.0, iterations).params
    inner = X @ w
    s = y * inner if loss.dual == "hinge" else inner - y
    lo, hi = _sdca_terms(loss, y)[2:]
    return jnp.clip(-jax.vmap(jax.grad(smooth.phi))(s), lo, hi)


def resolve_solver(loss: Loss, solver: str) -> str:
    """The solver ``"auto"`` picks: Newton for twice-differentiable losses, else SDCA."""
    _validate.one_of("solver", solver, _SOLVERS)
    if solver == "auto":
        solver = "newton" if loss.twice_differentiable else "sdca"
    if solver == "sdca" and loss.dual is None:
        _validate.fail("solver", solver, f"'newton' or 'lbfgs' for {loss.name} (no SDCA dual)")
    if solver in ("newton", "lbfgs") and not loss.twice_differentiable:
        _validate.fail(
            "solver", solver, f"'sdca' for the non-smooth {loss.name} loss (gradient ≠ 0 at w*)"
        )
    return solver


def default_tol(solver: str) -> float:
    """The certificate tolerance each solver is run to by default."""
    return SDCA_TOL if solver == "sdca" else DEFAULT_TOL


@functools.partial(
    jax.jit, static_argnames=("loss", "mu", "solver", "tol", "max_iter", "normalizer")
)
def solve_prepared(
    X: jax.Array,
    y: jax.Array,
    *,
    loss: Loss,
    mu: float,
    tilt: jax.Array | None = None,
    solver: str = "newton",
    tol: float = DEFAULT_TOL,
    max_iter: int = 100,
    normalizer: int | None = None,
) -> SolveResult:
    """:func:`solve` on data already passed through :func:`prepare_data` (no checks).

    Jitted with the hyperparameters static, so repeated solves of same-shaped problems reuse
    one compiled program (and it inlines into an outer ``jit``/``vmap``).
    """
    w0 = jnp.zeros(X.shape[1], dtype=X.dtype)
    if solver == "sdca":
        if tilt is not None:
            raise ValueError("tilt is not supported by solver='sdca'")
        a0 = _sdca_warm_start(loss, X, y, mu, normalizer)
        return _sdca(loss, X, y, mu, tol, max_iter, normalizer, a0)
    J = objective(loss, mu, X, y, tilt, normalizer)
    run = _newton if solver == "newton" else _lbfgs
    return run(J, w0, mu, tol, max_iter)


def solve(
    X,
    y,
    *,
    loss: Loss,
    mu: float,
    solver: str = "auto",
    tol: float | None = None,
    max_iter: int | None = None,
    normalizer: int | None = None,
) -> SolveResult:
    r"""The exact minimiser of J(w) = (1/n)Σℓ(w, x_i, y_i) + (μ/2)‖w‖², with a certificate.

    .. math::  J(\hat w) - J^* \le \mathrm{cert} = \|\nabla J(\hat w)\|^2 / (2\mu)
               \quad(\text{Newton, L-BFGS; duality gap for SDCA})

    Args:
        X: features, shape (n, d), rows with ‖x_i‖ ≤ 1.
        y: labels, shape (n,): for margin losses ±1 (or 0 < |y_i| ≤ 1 as example weights;
            a 0 label is refused when concrete: it carries no gradient, so {0, 1} labels would
            drop every 0-row), |y| ≤ the loss's label bound for residual losses.
        loss: a :class:`~dpjax.erm.losses.Loss`.
        mu: the strong-convexity parameter μ > 0 of the regulariser.
        solver: ``"auto"`` (Newton if the loss is twice differentiable, else SDCA),
            ``"newton"`` (damped Newton with Armijo backtracking, O(nd² + d³) per step),
            ``"lbfgs"`` (optax L-BFGS, for large d) or ``"sdca"`` (hinge / absolute).
        tol: certificate tolerance; default 1e-18 (Newton, L-BFGS) or 1e-11 (SDCA gap).
        max_iter: iteration (SDCA: epoch) cap; default 100 (Newton), 5000 (L-BFGS), 2000 (SDCA).
        normalizer: N in (1/N)Σℓ; default n (the mean). A public N is what makes add/remove-one
            neighbours differ by exactly one term ℓ/N.

    Returns:
        A :class:`SolveResult`; ``converged`` is False if the certificate missed ``tol``.

    Raises:
        ValueError: float64 disabled, μ ≤ 0, bad shapes, rows with ‖x_i‖ > 1, a margin label
            0 (e.g. {0, 1} labels: map them to {−1, +1}), or a solver that cannot certify this
            loss.

    Formal guarantees:
        cert ≥ J(ŵ) − J* by the PL inequality of a μ-strongly convex function (Newton, L-BFGS)
        or weak duality (SDCA); hence ‖ŵ − w*‖ ≤ √(2·cert/μ).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> jax.config.update("jax_enable_x64", True)
        >>> from dpjax.erm import losses, solve
        >>> X = jnp.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]]); y = jnp.array([1.0, -1.0, 1.0])
        >>> bool(solve(X, y, loss=losses.logistic, mu=0.1).converged)
        True
    """
    require_x64()
    _validate.positive("mu", mu)
    solver = resolve_solver(loss, solver)
    tol = default_tol(solver) if tol is None else _validate.positive("tol", tol)
    if max_iter is None:
        max_iter = {"newton": 100, "lbfgs": 5000, "sdca": 2000}[solver]
    max_iter = _validate.positive_int("max_iter", max_iter)
    check_domain(loss, mu)
    X, y = prepare_data(X, y, loss, sign_labels=False)
    if normalizer is not None:
        normalizer = _validate.positive_int("normalizer", normalizer)
    return solve_prepared(
        X,
        y,
        loss=loss,
        mu=float(mu),
        solver=solver,
        tol=float(tol),
        max_iter=max_iter,
        normalizer=normalizer,
    )
