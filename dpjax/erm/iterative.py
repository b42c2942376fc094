"""Iterative private ERM: projected DP-GD / DP-SGD, Laplace DP-SGD .

DP-GD and DP-SGD follow Bassily, Smith, Thakurta 2014 (DP gradient descent with per-example
clipping, zCDP accounting; DP-SGD with amplification by subsampling; Abadi et al. 2016).

All three are built from the shared DP-SGD parts: the samplers (:class:`dpjax.PoissonSampler`,
never truncated here; :class:`dpjax.UniformBatchSampler` of one example for Laplace DP-SGD),
:func:`dpjax.clipped_grad` (per-example clipped SUM, gathered and masked from the sampler's
batch; its ``sensitivity(relation)`` is the Δ every calibration uses) and the noise
transforms via :func:`dpjax.dp_sgd_optimizer` / :func:`dpjax.laplace_dp_sgd_optimizer` (noise
once, divide by a PUBLIC constant: n, or q·n for Poisson sampling; add the exact regulariser
gradient μw; step), then the projection onto the ball ‖w‖ ≤ D.

    J(w) = (1/n) Σ_i ℓ(w, x_i, y_i) + (μ/2)‖w‖²   over   W = {‖w‖ ≤ D}

Schedules (projected SGD; Shamir & Zhang 2013): convex (μ = 0):
constant η = D/√(T(G² + dσ²)), uniform average of the iterates; μ-strongly convex:
η_t = 2/(μ(t+1)), t-weighted average (Lacoste-Julien, Schmidt & Bach 2012). G = C + μD bounds
the exact gradient on W (C the clip norm, default L).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from dpjax import _validate
from dpjax.accounting import (
    calibrate_noise_multiplier,
    zcdp_gaussian_sigma,
    zcdp_rho_for_epsilon,
)
from dpjax.dp_sgd.clipping import ClippedGrad, clipped_grad
from dpjax.dp_sgd.optimizers import (
    dp_sgd_optimizer,
    laplace_dp_sgd_chain,
    laplace_dp_sgd_event,
)
from dpjax.dp_sgd.samplers import PoissonSampler, UniformBatchSampler
from dpjax.erm import bounds
from dpjax.erm._common import prepare_data, public_dataset_size, require_x64
from dpjax.erm.losses import Loss
from dpjax.erm.result import ERMResult
from dpjax.events import GaussianEvent
from dpjax.mechanisms._vmap_guard import guarded_release
from dpjax.relation import REPLACE_ONE, NeighbouringRelation, as_relation

__all__ = [
    "Schedule",
    "schedule",
    "default_steps",
    "dp_gd",
    "dp_sgd",
    "noisy_gradient_descent",
    "laplace_dp_sgd",
]


class Schedule(NamedTuple):
    """Step sizes η_t (t = 1..T) and averaging weights of the T evaluation points."""

    step_sizes: jax.Array
    weights: jax.Array


def schedule(*, steps: int, mu: float, radius: float, grad_bound_sq: float) -> Schedule:
    """The theory's schedule: constant η & uniform average (μ = 0), else 2/(μ(t+1)) & t-weights.

    Args:
        steps: T.
        mu: μ ≥ 0.
        radius: D, the projection radius (‖w_0 − w*‖ ≤ D with w_0 = 0).
        grad_bound_sq: E‖ĝ‖² ≤ this (G² + dσ² + sampling variance).
    """
    t = jnp.arange(1, steps + 1, dtype=jnp.float64)
    if mu == 0.0:
        eta = float(radius) / math.sqrt(steps * grad_bound_sq)
        return Schedule(jnp.full_like(t, eta), jnp.full_like(t, 1.0 / steps))
    return Schedule(2.0 / (float(mu) * (t + 1.0)), 2.0 * t / (steps * (steps + 1.0)))


def default_steps(*, n: int, d: int, rho: float) -> int:
    """T = ⌈n²ρ/(2d)⌉: beyond it the 1/T term is below the noise term.

    (DP-GD bound with zCDP accounting; Bassily, Smith, Thakurta 2014.)
    """
    return max(1, math.ceil(n**2 * float(rho) / (2.0 * d)))


def _project(w: jax.Array, radius: float) -> jax.Array:
    norm = jnp.linalg.norm(w)
    return w * jnp.minimum(1.0, radius / jnp.maximum(norm, 1e-300))


def _descent(mu: float, step_sizes: jax.Array) -> optax.GradientTransformation:
    """g ↦ −η_t (g + μw): the exact regulariser gradient, then the step of iteration t."""
    return optax.chain(
        optax.add_decayed_weights(mu), optax.scale_by_schedule(lambda count: -step_sizes[count])
    )


@guarded_release("X", "y")
def noisy_gradient_descent(
    key: jax.Array,
    X: jax.Array,
    y: jax.Array,
    *,
    loss: Loss,
    mu: float,
    radius: float,
    steps: int,
    l2_clip_norm: float,
    noise_multiplier: float,
    sampler: PoissonSampler | None = None,
    normalizer: float,
    step_sizes: jax.Array,
    weights: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """The hot path (no calibration): T projected steps on the noisy clipped gradient.

    Built from the DP-SGD parts: ``sampler`` (a :class:`~dpjax.dp_sgd.PoissonSampler` over the
    rows of X, or None for the full batch), :func:`~dpjax.clipped_grad` (gathers and masks the
    sampled rows, clips, sums) and :func:`~dpjax.dp_sgd_optimizer` (noise σ·C once, division by
    the PUBLIC ``normalizer``, then ``+ μw`` and the step η_t), then the projection on ‖w‖ ≤ D:

        ĝ_t = (clip-sum over the batch + N(0, σ²C² I)) / normalizer + μ w_t.

    Pure in (key, X, y); hyperparameters static. ``noise_multiplier`` is σ in units of C
    (the add/remove-one sensitivity of the clipped sum). Returns (weighted average of
    w_1..w_T, last iterate).
    """
    n, d = X.shape
    grad_fn = clipped_grad(loss, l2_clip_norm=l2_clip_norm, backend="vmap")
    noise_key, sample_key = jax.random.split(key)
    tx = dp_sgd_optimizer(
        optimizer=_descent(mu, step_sizes),
        clipped_grad=grad_fn,
        noise_multiplier=noise_multiplier,
        normalizer=normalizer,
        key=noise_key,
    )
    w0 = jnp.zeros(d, dtype=X.dtype)

    def step(carry, inputs):
        w, avg, state = carry
        weight, k = inputs
        if sampler is None:
            clipped_sum, _ = grad_fn(w, X, y)
        else:
            clipped_sum, _ = grad_fn(w, X, y, batch=sampler.sample(k))
        updates, state = tx.update(clipped_sum, state, w)
        return (_project(w + updates, radius), avg + weight * w, state), None

    sample_keys = jax.random.split(sample_key, steps)
    init = (w0, jnp.zeros_like(w0), tx.init(w0))
    (w_last, w_avg, _), _ = jax.lax.scan(step, init, (weights, sample_keys))
    return w_avg, w_last


def _clipped_grad(loss: Loss, l2_clip_norm: float | None) -> ClippedGrad:
    """The per-example clipped sum at C = ``l2_clip_norm`` (default: the loss's L)."""
    clip = loss.lipschitz if l2_clip_norm is None else l2_clip_norm
    clip = float(_validate.positive("l2_clip_norm", clip))
    return clipped_grad(loss, l2_clip_norm=clip, backend="vmap")


def _check_common(loss, mu, radius, epsilon, delta, relation):
    require_x64()
    _validate.non_negative("mu", mu)
    _validate.positive("radius", radius)
    _validate.epsilon("epsilon", epsilon)
    _validate.in_range("delta", delta, 0.0, 1.0, low_inclusive=False)
    if loss.domain_radius is not None and float(radius) > loss.domain_radius:
        _validate.fail(
            "radius",
            radius,
            f"≤ {loss.domain_radius:g} for {loss.name} (its Lipschitz constant, hence the bound, "
            "holds on that ball only)",
        )
    return as_relation(relation)


def bound_assumption_note(*, clip: float, lipschitz: float, output: str) -> str | None:
    """Why the DP-GD/DP-SGD theorem does not apply to this call, or None when it does.

    The bound (projected SGD, Shamir & Zhang 2013) is for SGD on
    unbiased estimates of ∇J, returned as the average. With C < L the clipped field clip_C∇ℓ
    is not ∇ℓ (the iterates minimise something else, and J(w̄) − J* need not shrink), and the
    last iterate is not what the theorem bounds.
    """
    if clip < lipschitz:
        return (
            f"l2_clip_norm C = {clip:g} < L = {lipschitz:g}: the clipped gradients are not "
            "unbiased estimates of ∇J, so the DP-GD/DP-SGD excess-risk theorem does not apply"
        )
    if output != "average":
        return "output='last': the theorem bounds the (weighted) average of the iterates only"
    return None


def _finish(w_avg, w_last, output, bound, event, relation, stddev, sens, public_batch, note):
    params = w_avg if output == "average" else w_last
    return ERMResult(
        params=params,
        certificate=jnp.zeros((), params.dtype),
        excess_risk_bound=math.inf if note is not None else bound,
        event=event,
        relation=relation,
        sensitivity=sens,
        noise_scale=stddev / public_batch,
        bound_note=note,
    )


@guarded_release("X", "y")
def dp_gd(
    key: jax.Array,
    X,
    y,
    *,
    loss: Loss,
    epsilon: float,
    delta: float,
    radius: float,
    mu: float = 0.0,
    steps: int | None = None,
    l2_clip_norm: float | None = None,
    relation: NeighbouringRelation | str = REPLACE_ONE,
    conversion: str = "cks",
    output: str = "average",
    dataset_size: int | None = None,
) -> ERMResult:
    r"""Full-batch projected DP-GD with the theory's step sizes, T and averaging.

    .. math::  w_{t+1} = \Pi_D\Big(w_t - \eta_t\big[\tfrac1n\big(\textstyle\sum_i
               \mathrm{clip}_C\nabla\ell(w_t; z_i) + N(0, \sigma_s^2 I)\big) + \mu w_t\big]\Big)

    σ_s = Δ√(T/(2ρ)) with Δ = ``grad_fn.sensitivity(relation)`` (2C replace-one, C add/remove)
    and ρ the largest zCDP budget that converts to (ε, δ) (``conversion``: "cks" or
    "bun_steinke").

    Args:
        key: PRNG key (split: one noise key per step inside the noise transform).
        X, y: data, ‖x_i‖ ≤ 1.
        loss: any loss (only L is used; non-smooth is fine).
        epsilon, delta: total budget, δ ∈ (0, 1).
        radius: D, projection radius (should contain w*: D ≥ ‖w*‖; ≥ L/μ if μ > 0).
        mu: μ ≥ 0; μ = 0 → convex schedule, μ > 0 → strongly convex schedule.
        steps: T; default ⌈n²ρ/(2d)⌉ (:func:`default_steps`).
        l2_clip_norm: C; default L (clipping never active on valid data). With C < L the
            release is still private, but ``excess_risk_bound`` is ``inf`` and ``bound_note``
            says why (the clipped field is not ∇J: the theorem's assumption fails).
        relation: neighbouring relation of the guarantee.
        conversion: zCDP → (ε, δ) conversion.
        output: ``"average"`` (the theory's output; default) or ``"last"`` (no bound: inf,
            with ``bound_note``).
        dataset_size: the PUBLIC n used as normaliser and in T, η (default len(X) under
            replace-one; required under add/remove-one, see :func:`public_dataset_size`).

    Returns:
        :class:`ERMResult` with ``GaussianEvent(noise_multiplier=σ_s/Δ, count=T)``.

    Raises:
        ValueError: bad parameters, invalid concrete data (empty, non-finite, ‖x_i‖ > 1,
            margin labels not ±1; :func:`dpjax.erm._common.prepare_data`), or add/remove-one
            without ``dataset_size``.

    Formal guarantees:
        Privacy: T Gaussian mechanisms on a sum of sensitivity Δ (Bassily, Smith,
        Thakurta 2014; its analysis with concentrated DP, Bun & Steinke 2016): ρ-zCDP ⇒ (ε, δ)-DP
        under ``relation``.
        Utility (projected SGD, Shamir & Zhang 2013; with σ = σ_s/n on
        the average gradient, G = C + μD), stated
        only when C ≥ L (then clip_C∇ℓ = ∇ℓ and ĝ is unbiased for ∇J) and output="average":
        convex: E[J(w̄)] − J* ≤ D√((G² + dσ²)/T); μ-SC: ≤ 2(G² + dσ²)/(μ(T+1)), J* = min_W J.
    """
    relation = _check_common(loss, mu, radius, epsilon, delta, relation)
    _validate.one_of("output", output, ("average", "last"))
    X, y = prepare_data(X, y, loss)
    n, d = X.shape
    n = public_dataset_size(n, dataset_size, relation)
    rho = zcdp_rho_for_epsilon(epsilon=epsilon, delta=delta, conversion=conversion)
    steps = _validate.positive_int(
        "steps", default_steps(n=n, d=d, rho=rho) if steps is None else steps
    )
    grad_fn = _clipped_grad(loss, l2_clip_norm)
    clip = grad_fn.l2_norm_bound
    sens = grad_fn.sensitivity(relation)
    multiplier = zcdp_gaussian_sigma(rho=rho, sensitivity=1.0, steps=steps)  # σ / Δ
    stddev = multiplier * sens
    g2 = (clip + float(mu) * float(radius)) ** 2 + d * (stddev / n) ** 2
    sched = schedule(steps=steps, mu=float(mu), radius=radius, grad_bound_sq=g2)
    bound = _iterative_bound(d, steps, stddev / n, clip, mu, radius, 0.0)
    event = GaussianEvent(noise_multiplier=multiplier, count=steps, relation=relation)
    note = bound_assumption_note(clip=clip, lipschitz=loss.lipschitz, output=output)
    w_avg, w_last = noisy_gradient_descent(
        key,
        X,
        y,
        loss=loss,
        mu=float(mu),
        radius=float(radius),
        steps=steps,
        l2_clip_norm=clip,
        noise_multiplier=multiplier * (sens / clip),  # σ / C: the exact factor 2 or 1
        normalizer=float(n),
        step_sizes=sched.step_sizes,
        weights=sched.weights,
    )
    return _finish(w_avg, w_last, output, bound, event, relation, stddev, sens, float(n), note)


def _iterative_bound(d, steps, sigma_avg, clip, mu, radius, variance):
    """Projected-SGD bounds (μ-SC: Lacoste-Julien et al. 2012), E‖ĝ‖² ≤ G² + variance + dσ²."""
    if float(mu) == 0.0:
        lip = math.sqrt(clip**2 + variance)
        return bounds.dp_gd_convex(d=d, steps=steps, sigma=sigma_avg, lipschitz=lip, radius=radius)
    g = clip + float(mu) * float(radius)
    g2 = g**2 + variance
    return 2.0 * (g2 + d * sigma_avg**2) / (float(mu) * (steps + 1))


@guarded_release("X", "y")
def dp_sgd(
    key: jax.Array,
    X,
    y,
    *,
    loss: Loss,
    epsilon: float,
    delta: float,
    radius: float,
    sampling_rate: float,
    steps: int,
    mu: float = 0.0,
    l2_clip_norm: float | None = None,
    relation: NeighbouringRelation | str = "add_or_remove_one",
    accounting: str = "pld",
    output: str = "average",
    dataset_size: int | None = None,
) -> ERMResult:
    r"""Projected DP-SGD with Poisson sampling at rate q, same schedules as :func:`dp_gd`.

    ĝ_t = (Σ_{i∈B_t} clip_C ∇ℓ(w_t; z_i) + N(0, σ_s² I))/(q n) + μ w_t, B_t ~ Poisson(q):
    divided by the PUBLIC expected batch size q·n, never by |B_t|.

    Args:
        sampling_rate: q ∈ (0, 1].
        steps: T.
        relation: ``"add_or_remove_one"`` (default: the relation Poisson amplification is proved
            for) or ``REPLACE_ONE``.
        accounting: ``"pld"`` or ``"rdp"`` (:func:`dpjax.accounting.calibrate_noise_multiplier`).
        dataset_size: the PUBLIC n of the normaliser q·n (required under add/remove-one, the
            default relation; :func:`public_dataset_size`).
        Others: as :func:`dp_gd`.

    Returns:
        :class:`ERMResult` with ``PoissonSampledGaussianEvent(σ_s/C, q, T)``.

    Formal guarantees:
        Privacy: the subsampled Gaussian mechanism composed T times, calibrated by the tight
        accountant (Abadi et al. 2016, DP-SGD privacy analysis).
        Utility: as :func:`dp_gd` (stated only when C ≥ L and output="average") with
        E‖ĝ‖² ≤ G² + (1 − q)C²/(qn) + dσ² (Poisson sampling variance), σ = σ_s/(qn).
    """
    relation = _check_common(loss, mu, radius, epsilon, delta, relation)
    _validate.probability("sampling_rate", sampling_rate)
    _validate.one_of("output", output, ("average", "last"))
    steps = _validate.positive_int("steps", steps)
    X, y = prepare_data(X, y, loss)
    rows, d = X.shape
    n = public_dataset_size(rows, dataset_size, relation)
    grad_fn = _clipped_grad(loss, l2_clip_norm)
    clip = grad_fn.l2_norm_bound
    # Poisson sampling at rate q, never truncated (max_batch_size = rows): no δ slack
    sampler = PoissonSampler(
        dataset_size=rows, sampling_rate=float(sampling_rate), max_batch_size=rows
    )
    multiplier = calibrate_noise_multiplier(
        target_epsilon=epsilon,
        delta=delta,
        sampling_rate=sampling_rate,
        steps=steps,
        accounting=accounting,
        relation=relation,
    )
    stddev = multiplier * clip
    public_batch = float(sampling_rate) * n
    variance = (1.0 - float(sampling_rate)) * clip**2 / public_batch
    g2 = (clip + float(mu) * float(radius)) ** 2 + variance + d * (stddev / public_batch) ** 2
    sched = schedule(steps=steps, mu=float(mu), radius=radius, grad_bound_sq=g2)
    bound = _iterative_bound(d, steps, stddev / public_batch, clip, mu, radius, variance)
    event = sampler.event(noise_multiplier=multiplier, steps=steps, relation=relation)
    note = bound_assumption_note(clip=clip, lipschitz=loss.lipschitz, output=output)
    w_avg, w_last = noisy_gradient_descent(
        key,
        X,
        y,
        loss=loss,
        mu=float(mu),
        radius=float(radius),
        steps=steps,
        l2_clip_norm=clip,
        noise_multiplier=multiplier,
        sampler=sampler,
        normalizer=public_batch,
        step_sizes=sched.step_sizes,
        weights=sched.weights,
    )
    sens = grad_fn.sensitivity(relation)
    return _finish(w_avg, w_last, output, bound, event, relation, stddev, sens, public_batch, note)


@guarded_release("X", "y")
def laplace_dp_sgd(
    key: jax.Array,
    X,
    y,
    *,
    loss: Loss,
    epsilon: float,
    steps: int,
    rho: float = 0.5,
    kappa: float = 0.8,
    mu: float = 0.0,
    l2_clip_norm: float | None = None,
) -> ERMResult:
    r"""The Laplace-noise batch-1 DP-SGD (no published source located).

    .. math::  \beta^{(h)} = \beta^{(h-1)} - \gamma_{h-1}\big(\mathrm{clip}_C\nabla\ell(
               \beta^{(h-1)}; z_{\Omega_h}) + \mu\beta^{(h-1)} + \theta_h Z_h\big),\quad
               \gamma_j = (1+j)^{-\rho}

    Ω_h uniform in {1..n} (with replacement), Z_h standard Laplace, θ_h of the privacy theorem with
    a_h = h^κ and Δ₁ = 2C√d (ℓ1 sensitivity of a clipped gradient under replace-one). Output:
    the γ-weighted average β̄ of the utility theorem.

    Args:
        epsilon: ε of the privacy theorem. steps: N. rho: ρ ∈ (0, 1). kappa: κ ≥ 0 (noise term of
        the utility theorem vanishes iff 2κ + ρ > 2). mu: μ ≥ 0 (exact, not noised).
        l2_clip_norm: C (default L).

    Returns:
        :class:`ERMResult` with ``event = dpjax.laplace_dp_sgd_event(...)`` (per-step Δ₁/θ_h;
        the whole trajectory, hence β̄, is (Σ_h Δ₁/θ_h, 0)-DP by basic composition) and
        ``excess_risk_bound = inf`` (the utility theorem's constant C is not explicit).

    Formal guarantees:
        Replace-one. Per step the Laplace mechanism (Dwork & Roth 2014) with
        b = θ_h on a gradient of ℓ1 sensitivity Δ₁; basic composition over the N releases
        (Dwork & Roth 2014). The stated analysis claims
        ε·a_h-DP for the h-th iterate alone; dpjax records the composition, which covers β̄.
    """
    require_x64()
    _validate.epsilon("epsilon", epsilon)
    _validate.non_negative("mu", mu)
    steps = _validate.positive_int("steps", steps)
    X, y = prepare_data(X, y, loss)
    n, d = X.shape
    grad_fn = _clipped_grad(loss, l2_clip_norm)
    l1 = grad_fn.sensitivity(REPLACE_ONE) * math.sqrt(d)  # ‖v‖₁ ≤ √d‖v‖₂
    event = laplace_dp_sgd_event(
        l1_sensitivity=l1, epsilon=epsilon, rho=rho, kappa=kappa, steps=steps
    )
    noise_key, index_key = jax.random.split(key)
    opt = laplace_dp_sgd_chain(  # fed grad_fn's nan_safe sums: finite by construction
        l1_sensitivity=l1,
        epsilon=epsilon,
        rho=rho,
        kappa=kappa,
        key=noise_key,
        gradients_finite_by_construction=True,
    )
    sampler = UniformBatchSampler(dataset_size=n, batch_size=1)
    index_keys = jax.random.split(index_key, steps)
    gammas = jnp.arange(1, steps + 1, dtype=jnp.float64) ** (-rho)

    def step(carry, inputs):
        w, acc, state = carry
        k, gamma = inputs
        i = sampler.sample(k)  # Ω_h: one index, uniform, independent of the other steps
        g, _ = grad_fn(w, X[i], y[i])
        updates, state = opt.update(g + mu * w, state)
        return (w + updates, acc + gamma * w, state), None

    w0 = jnp.zeros(d, dtype=X.dtype)
    (_, acc, _), _ = jax.lax.scan(
        step, (w0, jnp.zeros_like(w0), opt.init(w0)), (index_keys, gammas)
    )
    return ERMResult(
        params=acc / jnp.sum(gammas),
        certificate=jnp.zeros((), X.dtype),
        excess_risk_bound=math.inf,
        event=event,
        relation=REPLACE_ONE,
        sensitivity=l1,
        noise_scale=None,
        bound_note="the published bound for this method has no explicit constant",
    )
