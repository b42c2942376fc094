r"""DP optimisers built from the transforms: DP-SGD, gradient accumulation, Laplace DP-SGD.

The one place where σ, C and the normaliser meet is :func:`dp_sgd_optimizer`:

.. math::  \theta_{t+1} = \theta_t - \text{opt}\Big(\frac{1}{\bar B}\Big[\sum_{i \in B_t}
   \text{clip}_C(g_i) + N(0, \sigma^2 C^2 I)\Big]\Big)

with :math:`\bar B` a PUBLIC constant (the expected batch size q·n). A training step is::

    grad_fn = dpjax.clipped_grad(loss_fn, l2_clip_norm=C)
    tx = dpjax.dp_sgd_optimizer(optimizer=optax.adam(1e-3), noise_multiplier=σ, l2_clip_norm=C,
                     normalizer=q * n, key=jax.random.key(0))
    clipped_sum, info = grad_fn(params, x, y, mask=mask)
    updates, opt_state = tx.update(clipped_sum, opt_state, params)
    params = optax.apply_updates(params, updates)

and the privacy is accounted from the sampler's event (:mod:`dpjax.dp_sgd.samplers`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dpjax import _noise, _validate
from dpjax.dp_sgd.transforms import (
    add_gaussian_noise,
    add_laplace_dp_sgd_noise,
    laplace_dp_sgd_theta,
    laplace_dpsgd_step_size,
    normalize_by,
)
from dpjax.events import LaplaceDPSGDEvent
from dpjax.relation import REPLACE_ONE

__all__ = [
    "dp_sgd_optimizer",
    "AccumulationState",
    "accumulate_clipped_sums",
    "laplace_dp_sgd_optimizer",
    "laplace_dp_sgd_event",
]


def dp_sgd_optimizer(
    *,
    optimizer: optax.GradientTransformation,
    noise_multiplier: float,
    l2_clip_norm: float,
    normalizer: float,
    key: jax.Array,
) -> optax.GradientTransformation:
    r"""DP-SGD (or DP-Adam, …): Gaussian noise on the clipped sum, public normalisation, optimizer.

    ``chain(add_gaussian_noise(σ·C), normalize_by(normalizer), optimizer)``. Feed it the clipped
    SUM from ``clipped_grad(loss_fn, l2_clip_norm=C)`` with the same C.

    Args:
        optimizer: any optax optimizer (``optax.sgd``, ``optax.adam``, …); post-processing.
        noise_multiplier: σ ≥ 0, noise std in units of C (σ = 0: non-private, for debugging).
        l2_clip_norm: C > 0, the clip norm of the clipped sum (its add/remove-one sensitivity).
        normalizer: a PUBLIC positive constant, typically the expected batch size q·n.
        key: a JAX PRNG key (required; stored in the noise state and split every step).

    Returns:
        An ``optax.GradientTransformation``.

    Formal guarantees:
        One update is the Gaussian mechanism with noise multiplier σ = stddev/C on a sum of
        ℓ2 sensitivity C (add/remove-one; 2C replace-one — the accountant doubles it, see
        :mod:`dpjax.events`). With Poisson sampling at rate q for T steps the run is
        accounted by ``PoissonSampledGaussianEvent(σ, q, T)`` (Abadi et al. 2016;
        lecture on ML under DP, DP-SGD with amplification by subsampling). The normaliser
        and the optimizer are post-processing.

    Example:
        >>> import jax, jax.numpy as jnp, optax
        >>> tx = dp_sgd_optimizer(optimizer=optax.sgd(0.1), noise_multiplier=1.0, l2_clip_norm=1.0,
        ...            normalizer=32.0, key=jax.random.key(0))
        >>> params = jnp.zeros(3)
        >>> updates, state = tx.update(jnp.ones(3), tx.init(params), params)
        >>> updates.shape
        (3,)
    """
    _validate.non_negative("noise_multiplier", noise_multiplier)
    _validate.positive("l2_clip_norm", l2_clip_norm)
    _validate.positive("normalizer", normalizer)
    if not isinstance(optimizer, optax.GradientTransformation):
        _validate.fail("optimizer", optimizer, "an optax.GradientTransformation")
    return optax.chain(
        add_gaussian_noise(noise_multiplier * l2_clip_norm, key=key),
        normalize_by(normalizer),
        optimizer,
    )


class AccumulationState(NamedTuple):
    """State of :func:`accumulate_clipped_sums`.

    Attributes:
        micro_step: int32 in [0, every_k): micro-batches accumulated so far in this logical batch.
        clipped_sum: running sum of the clipped sums of this logical batch.
        inner_state: state of the private optimizer (noise key, optimizer moments).
    """

    micro_step: jax.Array
    clipped_sum: Any
    inner_state: Any


def accumulate_clipped_sums(
    private_optimizer: optax.GradientTransformation, *, every_k: int
) -> optax.GradientTransformation:
    r"""Gradient accumulation for DP: sum clipped sums of k micro-batches, noise ONCE, then step.

    The wrapped ``private_optimizer`` (e.g. :func:`dp_sgd_optimizer`) sees only the total
    :math:`\sum_{m=1}^{k} S_m` of a logical batch, so its noise is drawn once per logical batch
    (not per micro-batch, optax#527) and its key is split once per release. On the first
    k − 1 calls the emitted update is zero.

    Args:
        private_optimizer: the noise + normaliser + optimizer chain to run on the total. Its
            normaliser must be the expected size of the LOGICAL batch (k micro-batches).
        every_k: k ≥ 1 micro-batches per logical batch.

    Returns:
        An ``optax.GradientTransformation`` with state :class:`AccumulationState`.

    Formal guarantees:
        The released quantity per logical batch is exactly the Gaussian mechanism on the clipped
        sum of the logical batch (sensitivity C), so the accountant counts T = (#calls)/k
        releases with the logical batch's sampling rate — never #calls.

    Example:
        >>> import jax, jax.numpy as jnp, optax
        >>> inner = dp_sgd_optimizer(optimizer=optax.sgd(1.0), noise_multiplier=0.0,
        ...     l2_clip_norm=1.0, normalizer=1.0, key=jax.random.key(0))
        >>> tx = accumulate_clipped_sums(inner, every_k=2)
        >>> state = tx.init(jnp.zeros(1))
        >>> u1, state = tx.update(jnp.ones(1), state)
        >>> u2, state = tx.update(jnp.ones(1), state)
        >>> float(u1[0]), float(u2[0])
        (0.0, -2.0)
    """
    every_k = _validate.positive_int("every_k", every_k)

    def init_fn(params: Any) -> AccumulationState:
        # the running total is kept in at least float32: a bfloat16 total rounds differently
        # with and without one example's contribution (2C at 258 micro-batch sums of C)
        zeros = jax.tree.map(lambda p: jnp.zeros(jnp.shape(p), _noise.noise_dtype_of(p)), params)
        return AccumulationState(jnp.zeros([], jnp.int32), zeros, private_optimizer.init(params))

    def update_fn(updates: Any, state: AccumulationState, params: Any = None):
        total = jax.tree.map(lambda s, u: s + u.astype(s.dtype), state.clipped_sum, updates)

        def release(_):
            out, inner = private_optimizer.update(total, state.inner_state, params)
            return out, inner, jax.tree.map(jnp.zeros_like, total)

        out_shape = jax.eval_shape(release, None)[0]

        def hold(_):
            zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), out_shape)
            return zeros, state.inner_state, total

        is_last = state.micro_step == every_k - 1
        out, inner, acc = jax.lax.cond(is_last, release, hold, None)
        micro = jnp.where(is_last, 0, state.micro_step + 1).astype(jnp.int32)
        return out, AccumulationState(micro, acc, inner)

    return optax.GradientTransformation(init_fn, update_fn)


# ----------------------------------------------------------------------------- Laplace DP-SGD


def laplace_dp_sgd_optimizer(
    *, l1_sensitivity: float, epsilon: float, rho: float, kappa: float, key: jax.Array
) -> optax.GradientTransformation:
    r"""The Laplace-noise batch-1 DP-SGD (lecture on advances in DP, Theorems 36–37).

    .. math::  \beta^{(h)} = \beta^{(h-1)} - \gamma_{h-1}\big(\nabla L_{\Omega_h}(\beta^{(h-1)})
       + \theta_h Z_h\big),\quad \gamma_j = (1+j)^{-\rho},\ Z_h \sim \text{Laplace}(0, I),

    θ_h from :func:`dpjax.dp_sgd.transforms.laplace_dp_sgd_theta` with a_h = h^κ. Feed it the
    (clipped)
    gradient of ONE uniformly drawn example per step.

    Args:
        l1_sensitivity: Δ₁ = Δ(∇L), replace-one ℓ1 sensitivity of the per-step gradient.
        epsilon: ε of Theorem 36.
        rho: step-size exponent ρ ∈ (0, 1).
        kappa: privacy-weight exponent κ ≥ 0 (the noise term of Theorem 37 vanishes iff
            2κ + ρ > 2; ρ = 1/2 needs κ > 3/4).
        key: required JAX PRNG key.

    Returns:
        An ``optax.GradientTransformation``; account with :func:`laplace_dp_sgd_event`.

    Formal guarantees:
        See :func:`dpjax.dp_sgd.transforms.add_laplace_dp_sgd_noise`: step h is (Δ₁/θ_h)-DP
        (replace-one), the run of T steps (Σ_{h≤T} Δ₁/θ_h, 0)-DP by basic composition
        (:func:`laplace_dp_sgd_event`); Theorem 36 of the lecture states ε·a_h-DP for the h-th
        iterate.
    """
    noise = add_laplace_dp_sgd_noise(
        l1_sensitivity=l1_sensitivity, epsilon=epsilon, rho=rho, kappa=kappa, key=key
    )

    def step_size(count: jax.Array) -> jax.Array:  # γ_{h-1} at iteration h = count + 1
        return -laplace_dpsgd_step_size((count + 1).astype(jnp.result_type(float)), rho)

    step = optax.scale_by_schedule(step_size)
    return optax.chain(noise, step)


def laplace_dp_sgd_event(
    *, l1_sensitivity: float, epsilon: float, rho: float, kappa: float, steps: int
) -> LaplaceDPSGDEvent:
    """The privacy event of ``steps`` iterations of :func:`laplace_dp_sgd_optimizer` (replace-one).

    Args:
        l1_sensitivity, epsilon, rho, kappa: as given to :func:`laplace_dp_sgd_optimizer`.
        steps: T ≥ 1 iterations run (= noisy releases).

    Returns:
        ``LaplaceDPSGDEvent(epsilons=(Δ₁/θ_1, …, Δ₁/θ_T))``: per-release pure-DP budgets;
        the run is (Σ_h ε_h, 0)-DP by basic composition.

    Example:
        >>> ev = laplace_dp_sgd_event(l1_sensitivity=1.0, epsilon=1.0, rho=0.5, kappa=0.0, steps=2)
        >>> [round(e, 4) for e in ev.epsilons]  # θ_2 = (1/2^-0.5 + 1)/1 = 1 + √2
        [1.0, 0.4142]
    """
    _validate.positive("l1_sensitivity", l1_sensitivity)
    _validate.epsilon("epsilon", epsilon)
    _validate.in_range("rho", rho, 0.0, 1.0, low_inclusive=False)
    _validate.non_negative("kappa", kappa)
    steps = _validate.positive_int("steps", steps)
    h = np.arange(1, steps + 1, dtype=np.float64)
    theta = laplace_dp_sgd_theta(
        h, l1_sensitivity=l1_sensitivity, epsilon=epsilon, rho=rho, kappa=kappa
    )
    return LaplaceDPSGDEvent(epsilons=tuple(l1_sensitivity / theta), relation=REPLACE_ONE)
