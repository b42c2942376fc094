r"""Adaptive clipping: the clip norm follows a quantile of the per-example gradient norms.

Andrew, Thakkar, McMahan, Ramaswamy 2021, "Differentially private learning with adaptive
clipping" (NeurIPS): at every step the clip norm C_t is moved towards the target quantile γ of
the per-example norms by a geometric update driven by a NOISY count of the unclipped examples,

.. math::  b̃_t = \frac{\sum_{i \in B_t} (\mathbb{1}[\|g_i\| \le C_t] - \tfrac12)
           + N(0, σ_b^2)}{q n} + \tfrac12, \qquad
           C_{t+1} = C_t \exp(-η (b̃_t - γ)),

normalised by the PUBLIC expected batch size q·n (never the realised one: it differs between
neighbours). The count is released centred: each real example adds ±1/2 (a zero gradient,
the zero-out row that stands for a removed record, adds 0), so under add/remove-one and under
zero-out the released count moves by at most 1/2 (padding rows add 0). The budget is
split (their Theorem 1): the user's noise multiplier σ is what the accountant records; the
clipped gradient sum gets σ_Δ = (σ⁻² − (2σ_b)⁻²)^(−1/2) (:func:`effective_noise_multiplier`),
which needs σ_b > σ/2.

How it runs inside :func:`dpjax.make_private` (``l2_clip_norm=AdaptiveClip(...)``): clipping at
C_t equals C_t times clipping at 1 of g/C_t, so every example's loss is divided by the traced
C_t and clipped with the STATIC clip norm 1 (the certified clipping of
:func:`dpjax.dp_sgd.clipped_grad` unchanged: each example adds ≤ f·1 to the released sum S′,
which moves by ≤ 1 when one record is added or removed). Gaussian noise N(0, σ_Δ²) is added
to S′ and the NOISY sum is multiplied by C_t afterwards: C_t·(S′ + Z) has the law of
C_t·S′ + N(0, (σ_Δ C_t)²), and the product is post-processing (C_t is public), so no rounding
of the product needs certifying. C_t lives in the optimizer state (:class:`AdaptiveClipState`,
first element of ``PrivateState.opt_state``) and is published by ``public_state``.

The pieces path (your own loop) uses the same functions; account with σ, NOT with the
gradient transform's σ_Δ (``event_for`` of a ``dp_sgd_optimizer`` built with σ_Δ would read
σ_Δ > σ and report too small an ε)::

    sigma_d = effective_noise_multiplier(sigma, config.count_noise_multiplier)
    grad_fn = dpjax.clipped_grad(lambda p, x, c: loss(p, x) / c, l2_clip_norm=1.0)
    clip = init_adaptive_clip(config, key=count_key)        # C_0, count-noise key
    noise = dpjax.add_gaussian_noise(sigma_d, key=noise_key)  # on the sum in units of C_t
    # per step, batch = sampler.sample(k):
    s, info = grad_fn(params, x, jnp.full(n, clip.clip_norm), batch=batch)
    noisy, noise_state = noise.update(s, noise_state)
    grads = jax.tree.map(lambda g: g * clip.clip_norm / (q * n), noisy)
    c = centred_unclipped_count(info.per_example_norms, batch.mask, 1.0)
    clip, _ = next_clip_norm(config, clip, c, expected_batch_size=q * n)
    # ε: sampler.event(noise_multiplier=sigma, steps=T)  (Theorem 1)

Formal guarantees:
    One step releases (S′ + N(0, σ_Δ² I), c + N(0, σ_b²)) with S′ the clipped sum in units of
    C_t (ℓ2 sensitivity 1 under add/remove-one and zero-out, certified in floating point) and c
    the centred unclipped count (each row adds −1/2, 0 or +1/2, a zero-gradient row 0, so the
    sensitivity is 1/2 under add/remove-one and under zero-out: an integer-valued half count,
    exact in float32 for batches below 2²⁴ rows). Rescaling the count coordinate by σ_Δ/σ_b,
    this is one Gaussian mechanism with noise σ_Δ and joint ℓ2 sensitivity
    √(1 + (σ_Δ/(2σ_b))²), i.e. noise multiplier (σ_Δ⁻² + (2σ_b)⁻²)^(−1/2) = σ (Andrew et al.
    2021, Theorem 1; https://arxiv.org/abs/1905.03871). With
    Poisson sampling at rate q, T steps are accounted exactly as DP-SGD with noise
    multiplier σ: ``PoissonSampledGaussianEvent(σ, q, count=T)`` (Abadi et al. 2016,
    amplification by subsampling); the mechanisms compose adaptively, so C_t
    may depend on every earlier release. C_t (and b̃_t) are functions of the noisy releases
    and public constants: C_t is public, is released with the model (``public_state``) and is
    covered by the guarantee. The count noise is drawn by the same sound sampler as the
    gradient noise (:func:`dpjax._random.normal`), from its own key stream (secret).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from dpjax import _noise, _random, _validate
from dpjax.dp_sgd import _vmap_guard
from dpjax.dp_sgd.transforms import NoiseState, _init_noise_state, _next_keys

__all__ = [
    "AdaptiveClip",
    "AdaptiveClipState",
    "accounted_noise_multiplier",
    "centred_unclipped_count",
    "effective_noise_multiplier",
    "init_adaptive_clip",
    "next_clip_norm",
]

#: log C_t is kept in [−LOG_CLIP_LIMIT, LOG_CLIP_LIMIT] (finite, positive and normal in
#: float32: e^±80 ≈ 5.5·10^±34): a clamp of a public value, post-processing.
LOG_CLIP_LIMIT = 80.0


class AdaptiveClip(NamedTuple):
    """Adaptive clipping for :func:`dpjax.make_private` (``l2_clip_norm=AdaptiveClip(...)``).

    Attributes:
        target_quantile: γ in (0, 1), the fraction of examples to leave unclipped (0.5: C
            follows the median per-example norm).
        learning_rate: η > 0 of the geometric update C ← C·exp(−η(b̃ − γ)) (paper: 0.2).
        count_noise_multiplier: σ_b > 0, the std of the noise on the unclipped count; must
            exceed σ/2 (σ the run's noise multiplier). Paper: σ_b = q·n/20.
        initial: C_0 > 0, the clip norm of the first step.

    Example:
        >>> AdaptiveClip(target_quantile=0.5, learning_rate=0.2, count_noise_multiplier=5.0,
        ...     initial=1.0).validated().target_quantile
        0.5
    """

    target_quantile: float
    learning_rate: float
    count_noise_multiplier: float
    initial: float

    def validated(self) -> AdaptiveClip:
        """This config with every field checked and converted to float.

        Raises:
            ValueError: a field outside its range (named, with the range).
        """
        gamma = _validate.in_range(
            "target_quantile", self.target_quantile, 0.0, 1.0, low_inclusive=False
        )
        if gamma >= 1.0:
            _validate.fail("target_quantile", self.target_quantile, "in (0, 1)")
        return AdaptiveClip(
            target_quantile=gamma,
            learning_rate=_validate.positive("learning_rate", self.learning_rate),
            count_noise_multiplier=_validate.positive(
                "count_noise_multiplier", self.count_noise_multiplier
            ),
            initial=_validate.positive("initial", self.initial),
        )


class AdaptiveClipState(NamedTuple):
    """State of adaptive clipping (first element of ``PrivateState.opt_state``).

    Attributes:
        clip_norm: float32 scalar C_t, the clip norm of the next step (PUBLIC: a function of
            the noisy releases; ``public_state`` keeps it).
        count_noise: the :class:`~dpjax.dp_sgd.transforms.NoiseState` of the count noise (its
            key data is SECRET; ``public_opt_state`` reduces it to its count).
    """

    clip_norm: jax.Array
    count_noise: NoiseState


def effective_noise_multiplier(noise_multiplier: float, count_noise_multiplier: float) -> float:
    r"""σ_Δ, the gradient's noise multiplier when the run's σ is split with the count's σ_b.

    .. math::  σ_Δ = \left(σ^{-2} - (2σ_b)^{-2}\right)^{-1/2}

    The direction (Andrew et al. 2021, Theorem 1): the user gives the TOTAL σ, which the
    accountant records (the run is DP-SGD at σ); the clipped sum receives noise σ_Δ·C_t ≥ σ·C_t,
    the unclipped count noise σ_b. The 2 is the count's sensitivity 1/2 (centred count).
    σ = 0 (not private) gives 0. Inverse: :func:`accounted_noise_multiplier`.

    Args:
        noise_multiplier: σ ≥ 0, the accounted noise multiplier.
        count_noise_multiplier: σ_b > σ/2.

    Returns:
        σ_Δ.

    Raises:
        ValueError: σ < 0, σ_b ≤ 0, or σ_b ≤ σ/2 (no budget left for the gradient).

    Formal guarantees:
        A step releasing the clipped sum (ℓ2 sensitivity C_t) with noise σ_Δ·C_t and the
        centred unclipped count (sensitivity 1/2) with noise σ_b is the Gaussian mechanism
        with noise multiplier σ (Andrew et al. 2021, "Differentially private learning with
        adaptive clipping", Theorem 1): account it as DP-SGD at σ.

    Example:
        >>> round(effective_noise_multiplier(1.0, 5.0), 6)  # (1 - 1/100)^(-1/2)
        1.005038
    """
    sigma = _validate.non_negative("noise_multiplier", noise_multiplier)
    sigma_b = _validate.positive("count_noise_multiplier", count_noise_multiplier)
    if sigma == 0.0:
        return 0.0
    if not 2.0 * sigma_b > sigma:
        _validate.fail(
            "count_noise_multiplier",
            count_noise_multiplier,
            f"> noise_multiplier/2 = {sigma / 2:g} (Andrew et al. 2021, Theorem 1: the count "
            "takes (2σ_b)⁻² of the budget σ⁻²; at σ_b ≤ σ/2 nothing is left for the gradient)",
        )
    rest = sigma**-2 - (2.0 * sigma_b) ** -2
    return 1.0 / math.sqrt(rest)


def accounted_noise_multiplier(
    gradient_noise_multiplier: float, count_noise_multiplier: float
) -> float:
    r"""σ of a step whose gradient noise is σ_Δ and count noise σ_b (Theorem 1's direction).

    .. math::  σ = \left(σ_Δ^{-2} + (2σ_b)^{-2}\right)^{-1/2}

    Args:
        gradient_noise_multiplier: σ_Δ > 0.
        count_noise_multiplier: σ_b > 0.

    Returns:
        σ, the noise multiplier of the equivalent DP-SGD step.

    Example:
        >>> round(accounted_noise_multiplier(effective_noise_multiplier(1.0, 5.0), 5.0), 12)
        1.0
    """
    s_d = _validate.positive("gradient_noise_multiplier", gradient_noise_multiplier)
    s_b = _validate.positive("count_noise_multiplier", count_noise_multiplier)
    return 1.0 / math.sqrt(s_d**-2 + (2.0 * s_b) ** -2)


def centred_unclipped_count(norms: jax.Array, mask: jax.Array, clip_norm: Any) -> jax.Array:
    """Σ_i mask_i·s_i as float32, exact (an integer over 2), with s_i ∈ {−1/2, 0, +1/2}.

    s_i = +1/2 for 0 < ‖g_i‖ ≤ C (unclipped), −1/2 for ‖g_i‖ > C or a NaN norm (clipped), and
    0 for a zero gradient ‖g_i‖ = 0, the row that stands for a removed record (the "zero-out"
    neighbour ``make_private`` accounts: a row that contributes 0). Padding adds 0. So adding,
    removing or zeroing out one record moves the count by at most 1/2: a zero row that counted
    as unclipped (+1/2) where the record counted as clipped (−1/2) moved it by 1, twice the
    accounted sensitivity.

    Args:
        norms: (B,) per-example norms (e.g. ``ClippingInfo.per_example_norms``).
        mask: (B,) bool, real rows.
        clip_norm: C, in the units of ``norms`` (1 when the loss was divided by C_t).

    Returns:
        float32 scalar.
    """
    counted = mask & (norms != jnp.zeros((), norms.dtype))  # NaN != 0: counted (as clipped)
    unclipped = counted & (norms <= jnp.asarray(clip_norm, norms.dtype))
    twice = 2 * jnp.sum(unclipped, dtype=jnp.int32) - jnp.sum(counted, dtype=jnp.int32)
    return twice.astype(jnp.float32) * jnp.float32(0.5)


def init_adaptive_clip(config: AdaptiveClip, *, key: jax.Array) -> AdaptiveClipState:
    """The state of step 0: C_0 = ``config.initial`` and the count noise's key stream."""
    config = config.validated()
    return AdaptiveClipState(
        clip_norm=jnp.asarray(config.initial, jnp.float32),
        count_noise=_init_noise_state(key),
    )


def next_clip_norm(
    config: AdaptiveClip,
    state: AdaptiveClipState,
    centred_count: jax.Array,
    *,
    expected_batch_size: float,
    impl: Any = None,
) -> tuple[AdaptiveClipState, jax.Array]:
    r"""Release the noisy count and update the clip norm (the pieces path uses it too).

    .. math::  b̃ = (c + σ_b Z)/(q n) + 1/2, \qquad C ← C \exp(-η(b̃ - γ))

    with c the centred count of :func:`centred_unclipped_count` and q·n PUBLIC; log C is kept
    within ±``LOG_CLIP_LIMIT`` (post-processing).

    Args:
        config: the :class:`AdaptiveClip`.
        state: the current :class:`AdaptiveClipState` (C_t and the count noise key).
        centred_count: c (float32 scalar).
        expected_batch_size: q·n > 0, public.
        impl: the PRNG implementation of the stored key data (default threefry).

    Returns:
        ``(new_state, noisy_fraction)``: C_{t+1} and the next key in ``new_state``; b̃.

    Raises:
        ValueError: (naming ``updates``) ``centred_count`` batched by a ``jax.vmap`` that
            ``state`` is not (one count noise draw would be added to every row).

    Formal guarantees:
        The only data-dependent input is c (sensitivity 1/2 under add/remove-one); the
        release c + N(0, σ_b²) is the count half of Theorem 1 (Andrew et al. 2021), and b̃,
        C_{t+1} are post-processing of it with public constants (q·n, γ, η, the clamp).
    """
    # a vmap over per-example counts with one state would add ONE draw to every row
    key_data, ok = _vmap_guard.guard_key(centred_count, state.count_noise.key)
    next_key, noise_key = _next_keys(state.count_noise._replace(key=key_data), impl)
    noisy = _noise.tree_add_iid_noise(
        noise_key, centred_count, _random.normal, config.count_noise_multiplier
    )
    if not _validate.is_concrete(ok):
        noisy = _vmap_guard.void_unless(ok, noisy)
    fraction = noisy / jnp.float32(expected_batch_size) + jnp.float32(0.5)
    log_c = jnp.log(state.clip_norm) - jnp.float32(config.learning_rate) * (
        fraction - jnp.float32(config.target_quantile)
    )
    log_c = jnp.clip(log_c, -LOG_CLIP_LIMIT, LOG_CLIP_LIMIT)
    count = state.count_noise.count + 1
    new = AdaptiveClipState(
        clip_norm=jnp.exp(log_c).astype(jnp.float32),
        count_noise=NoiseState(key=next_key, count=count),
    )
    return new, fraction


# ----------------------------------------------------------------------------- make_private


def resolve_clip(l2_clip_norm: Any) -> float | AdaptiveClip:
    """``make_private``'s ``l2_clip_norm``: a positive float or a validated AdaptiveClip."""
    if isinstance(l2_clip_norm, AdaptiveClip):
        return l2_clip_norm.validated()
    return _validate.positive("l2_clip_norm", l2_clip_norm)


def check_budget(config: Any, noise_multiplier: float) -> None:
    """Refuse an AdaptiveClip whose σ_b ≤ σ/2 (raises ValueError naming the argument)."""
    if isinstance(config, AdaptiveClip):
        effective_noise_multiplier(noise_multiplier, config.count_noise_multiplier)


def plan_fields(config: float | AdaptiveClip) -> dict[str, float]:
    """The fields of the plan ledger (``_plan.Plan``) that identify the clipping."""
    if not isinstance(config, AdaptiveClip):
        return {"l2_clip_norm": float(config)}
    return {
        "l2_clip_norm": float(config.initial),
        "target_quantile": float(config.target_quantile),
        "learning_rate": float(config.learning_rate),
        "count_noise_multiplier": float(config.count_noise_multiplier),
    }


class AdaptiveUpdate:
    """Noise, C_t, normalisation and the optimizer of one adaptive step (make_private's tx).

    ``init(params)`` gives ``(AdaptiveClipState, noise_state, optimizer_state)``;
    ``update(clipped_sum, state, params, centred_count=c)`` takes the clipped sum IN UNITS OF
    C_t (loss divided by C_t, clipped at 1), adds N(0, σ_Δ²), multiplies the noisy sum by C_t
    and divides by q·n (post-processing), applies the optimizer, then releases the noisy
    count and moves C_t (:func:`next_clip_norm`).
    """

    def __init__(
        self,
        config: AdaptiveClip,
        *,
        noise_multiplier: float,
        key: jax.Array,
        normalizer: float,
        optimizer: Any,
    ):
        from dpjax.dp_sgd.transforms import add_gaussian_noise  # noqa: PLC0415

        self.config = config.validated()
        self.gradient_noise_multiplier = effective_noise_multiplier(
            noise_multiplier, self.config.count_noise_multiplier
        )
        self.normalizer = float(normalizer)
        self.impl = jax.random.key_impl(key)
        noise_key, self._count_key = jax.random.split(key)
        self.noise = add_gaussian_noise(self.gradient_noise_multiplier, key=noise_key)
        self.optimizer = optimizer

    def init(self, params: Any) -> tuple[AdaptiveClipState, Any, Any]:
        clip = init_adaptive_clip(self.config, key=self._count_key)
        return clip, self.noise.init(params), self.optimizer.init(params)

    def update(self, clipped_sum: Any, state: tuple, params: Any, *, centred_count: jax.Array):
        clip, noise_state, opt_state = state
        noisy, noise_state = self.noise.update(clipped_sum, noise_state, params)
        scale = clip.clip_norm / jnp.float32(self.normalizer)
        grads = jax.tree.map(lambda x: x * scale.astype(x.dtype), noisy)
        updates, opt_state = self.optimizer.update(grads, opt_state, params)
        clip, _ = next_clip_norm(
            self.config, clip, centred_count, expected_batch_size=self.normalizer, impl=self.impl
        )
        return updates, (clip, noise_state, opt_state)


def clip_norm_of(opt_state: Any) -> float | None:
    """C_t of an adaptive run's optimizer state (private or public form); None otherwise."""
    if isinstance(opt_state, tuple) and opt_state and isinstance(opt_state[0], AdaptiveClipState):
        return float(jax.device_get(opt_state[0].clip_norm))
    return None


def check_continuable(opt_state: Any, config: float | AdaptiveClip) -> None:
    """Refuse continuing a fixed-C state with adaptive clipping or the other way round."""
    adaptive = clip_norm_of(opt_state) is not None
    if adaptive != isinstance(config, AdaptiveClip):
        _validate.fail(
            "state",
            f"a state of a run with {'adaptive' if adaptive else 'fixed'} clipping",
            f"a state with {'adaptive' if not adaptive else 'fixed'} clipping, as this "
            "PrivateTraining's l2_clip_norm (the optimizer states differ in structure)",
        )
