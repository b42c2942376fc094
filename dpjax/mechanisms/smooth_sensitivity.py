"""Smooth sensitivity of the median and its noise recipes (Nissim, Raskhodnikova & Smith
2007, "Smooth sensitivity and sampling in private data analysis", STOC; local vs smooth).

Data: n scalars in [0, Λ]; neighbours differ in one record (Hamming distance 1, fixed n):
the relation is ``REPLACE_ONE``. The released statistic is the median x_(m), m = ⌈n/2⌉ (for
odd n the usual median; for even n the lower median).

* Local sensitivity (NRS 2007, the median) LS(x) = max(x_(m+1) − x_(m), x_(m) − x_(m−1)) with
  x_(i) = 0 for i ≤ 0 and Λ for i > n. Noise scaled to it is **not** DP (the median example).
* β-smooth sensitivity (Nissim, Raskhodnikova & Smith
  2007, Proposition 3.4):
  S*(x) = max_{k=0..n} e^{−kβ} max_{t=0..k+1} (x_(m+t) − x_(m+t−k−1)).
* Noise recipes: Laplace Lap(2S/ε) (NRS 2007), the heavy-tailed
  density ∝ 1/(1 + |z|^γ) (pure ε; by default with the tight calibration proved in
  ``heavy_tailed_privacy_loss``, or the textbook 2(γ+1)S/ε), Gaussian
  5√(2 ln(2/δ))S/ε · N(0, 1).

Non-finite records follow the rule of ``dpjax.mechanisms.sensitivity.clip_into_range``: an eager
call with concrete NaN, ±inf or out-of-range data raises ``ValueError``; under ``jit`` a NaN
record becomes Λ/2 and the others are clipped to [0, Λ], so it is just another record in the
range and every guarantee below holds for every input.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from dpjax import _validate
from dpjax._noise import noise_dtype_of, scale_rounded_up, tree_add_noise
from dpjax.mechanisms._nonfinite import refuse_nonfinite
from dpjax.mechanisms._vmap_guard import guarded_release
from dpjax.mechanisms.sensitivity import clip_into_range

__all__ = [
    "SmoothNoise",
    "local_sensitivity_median",
    "smooth_sensitivity_median",
    "smooth_noise_parameters",
    "smooth_laplace_delta",
    "heavy_tailed_privacy_loss",
    "heavy_tailed_noise",
    "smooth_median",
]

_NOISES = ("heavy_tailed", "laplace", "gaussian")
_RECIPES = ("tight", "lecture")
# The tight heavy-tailed bound is proved for dilations |t| ≤ 2 (so that |1 − λt| ≤ 1 below).
_MAX_TIGHT_BETA = 2.0
# Relative margin for the float evaluation of the (real-number) bound.
_ROUNDING_MARGIN = 1e-12


class SmoothNoise(NamedTuple):
    """Calibration of a smooth-sensitivity release: noise scale = ``multiplier`` · S_β(x)."""

    beta: float
    multiplier: float
    noise: str


def smooth_laplace_delta(*, epsilon: float, delta_prime: float) -> float:
    """δ of the Laplace recipe: δ = (δ'/2)(e^{ε/2} + 1).

    Laplace noise Lap(2S/ε) with S β-smooth, β ≤ ε/(2 ln(2/δ')), is (ε, δ)-DP for this δ.
    """
    _validate.epsilon("epsilon", epsilon)
    _validate.in_range("delta_prime", delta_prime, 0.0, 1.0, low_inclusive=False)
    return 0.5 * float(delta_prime) * (math.exp(0.5 * float(epsilon)) + 1.0)


def _max_of_concave(
    f: Callable[[float], float], df: Callable[[float], float], lo: float, hi: float
) -> float:
    """Upper bound on max_{[lo, hi]} f for f concave, by bisection on the sign of f'.

    The maximiser p* stays in [p_l, p_h]; f(p*) ≤ f(c) + |f'(c)|·(p_h − p_l) for c ∈ {p_l, p_h}
    (tangent line of a concave f), with c an interior point so that f'(c) is finite.
    """
    p_l, p_h = lo, hi
    for _ in range(200):
        mid = 0.5 * (p_l + p_h)
        if not p_l < mid < p_h:
            break
        if df(mid) > 0.0:
            p_l = mid
        else:
            p_h = mid
    c = p_l if p_l > lo else p_h
    return f(c) + abs(df(c)) * (p_h - p_l)


def heavy_tailed_privacy_loss(*, shift: float, dilation: float, gamma: float) -> float:
    r"""Proven bound ε(α, β) on the privacy loss of smooth-sensitivity noise h ∝ 1/(1 + |z|^γ).

    .. math:: \varepsilon(\alpha, \beta) = \sup_{p \in [0, 1]}
        \alpha\gamma\, p^{1 - 1/\gamma} (1 - p)^{1/\gamma} + \beta\, |1 - \gamma p|

    for the release A(x) = f(x) + (S(x)/α)·Z, Z ~ h, with S a β-smooth upper bound on the local
    sensitivity of f (α = ``shift``, β = ``dilation`` ≤ 2). The supremand is concave on
    [0, 1/γ] and on [1/γ, 1]; each piece is maximised by bisection on its derivative and bounded
    above by a tangent line, then inflated by a relative 1e-12 for rounding, so the returned
    value is ≥ the real-number supremum. γ = 2 (Cauchy) gives √(α² + β²) in closed form.

    Args:
        shift: α ≥ 0, the largest shift of f in units of the noise scale (1/multiplier).
        dilation: β in [0, 2], the smoothness parameter of S.
        gamma: γ > 1.

    Returns:
        ε(α, β).

    Formal guarantees:
        For neighbours x, y (``REPLACE_ONE``) and every output v,
        |ln p_x(v)/p_y(v)| ≤ ε(α, β). Proof. Write φ(w) = ln(1 + |w|^γ) (so ln h = −φ + c),
        t = ln(S(y)/S(x)) ∈ [−β, β] (β-smoothness), Δ = f(y) − f(x) and s = αΔ/S(x),
        s' = αΔ/S(y); |s|, |s'| ≤ α because |Δ| ≤ LS(x) ≤ S(x) and |Δ| ≤ LS(y) ≤ S(y).
        With u = α(v − f(y))/S(y), ln p_x(v)/p_y(v) = φ(u) − φ(e^t u + s) + t =: G(1) for
        G(λ) = φ(u) − φ(e^{λt}u + λs) + λt, G(0) = 0. At w = e^{λt}u + λs,
        G'(λ) = t(1 − wφ'(w)) − s(1 − λt)φ'(w). If t < 0, run the same path in the frame of y
        (z = α(v − f(x))/S(x), u = e^{−t}z − s'), giving t(1 − wφ'(w)) − s'(1 + λt)φ'(w).
        Choosing the path by the sign of t, the factor 1 ∓ λt lies in [1 − β, 1] ⊆ [−1, 1]
        (β ≤ 2), so |G(1)| ≤ sup_w β|1 − wφ'(w)| + α|φ'(w)|. Substituting
        p = |w|^γ/(1 + |w|^γ) gives wφ'(w) = γp and |φ'(w)| = γp^{1−1/γ}(1 − p)^{1/γ}. ∎
        The bound is the supremum of the first-order privacy loss −sφ'(w) + t(1 − wφ'(w)) over
        |s| ≤ α, |t| ≤ β, so it is sharp as α, β → 0 (measured on a grid plus local search:
        the true supremum is 0.85ε–0.95ε for the default recipe at ε = 1, γ ∈ {2, 3, 4}). It
        refines the (α, β)-admissibility argument of Nissim, Raskhodnikova & Smith 2007
        (Definition 2.5, Lemma 2.6), which bounds the shift and dilation parts separately and
        adds the two suprema; Bun & Steinke 2019 ("Average-case averages: private algorithms
        for smooth sensitivity and mean estimation", NeurIPS) analyse smooth-sensitivity
        noise through the same shift and dilation privacy losses.

    Example:
        >>> round(heavy_tailed_privacy_loss(shift=0.3, dilation=0.4, gamma=2.0), 9)
        0.5
    """
    alpha = float(_validate.non_negative("shift", shift))
    beta = _validate.in_range("dilation", dilation, 0.0, _MAX_TIGHT_BETA, high_inclusive=True)
    beta = float(beta)
    _validate.in_range("gamma", gamma, 1.0, math.inf, low_inclusive=False)
    g = float(gamma)
    a = 1.0 - 1.0 / g
    kink = 1.0 / g

    def shape(p: float) -> float:  # p^a (1 − p)^{1−a}, concave on [0, 1]
        return p**a * (1.0 - p) ** (1.0 - a)

    def shape_slope(p: float) -> float:
        return shape(p) * (a - p) / (p * (1.0 - p))

    def piece(sign: float) -> tuple[Callable[[float], float], Callable[[float], float]]:
        """β|1 − γp| = sign·β(1 − γp) on one side of the kink: value and derivative."""
        return (
            lambda p: alpha * g * shape(p) + sign * beta * (1.0 - g * p),
            lambda p: alpha * g * shape_slope(p) - sign * beta * g,
        )

    left = _max_of_concave(*piece(1.0), 0.0, kink)
    right = _max_of_concave(*piece(-1.0), kink, 1.0)
    # The ends p = 0, 1 (where the slope is infinite) are covered by the continuity of f.
    ends = max(beta, beta * (g - 1.0))
    return max(left, right, ends) * (1.0 + _ROUNDING_MARGIN)


def _tight_heavy_tailed(eps: float, gamma: float) -> SmoothNoise:
    """α = β = ε/ε(1, 1) (ε homogeneous of degree 1); β capped at 2, then α by bisection."""
    unit = heavy_tailed_privacy_loss(shift=1.0, dilation=1.0, gamma=gamma)
    alpha = eps / unit
    if alpha <= _MAX_TIGHT_BETA:
        return SmoothNoise(alpha, 1.0 / alpha, "heavy_tailed")
    beta = _MAX_TIGHT_BETA

    def loss(a: float) -> float:
        return heavy_tailed_privacy_loss(shift=a, dilation=beta, gamma=gamma)

    a_lo, a_hi = (
        _MAX_TIGHT_BETA,
        eps / heavy_tailed_privacy_loss(shift=1.0, dilation=0.0, gamma=gamma),
    )
    while loss(a_hi) <= eps:  # ε(α, 2) ≥ α ε(1, 0), so this stops at once; kept for safety
        a_hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (a_lo + a_hi)
        if not a_lo < mid < a_hi:
            break
        a_lo, a_hi = (mid, a_hi) if loss(mid) <= eps else (a_lo, mid)
    return SmoothNoise(beta, 1.0 / a_lo, "heavy_tailed")


def smooth_noise_parameters(
    *,
    epsilon: float,
    delta: float = 0.0,
    noise: str = "heavy_tailed",
    gamma: float = 4.0,
    recipe: str = "tight",
) -> SmoothNoise:
    r"""Smoothness β and noise multiplier for each recipe (scale = multiplier · S_β).

    * ``"heavy_tailed"`` (pure ε; δ ignored): density h ∝ 1/(1+|z|^γ), γ > 1.

      - ``recipe="tight"`` (default): β = α = ε/ε(1, 1), multiplier 1/α, where ε(α, β) is the
        proven privacy-loss bound of ``heavy_tailed_privacy_loss`` (homogeneous of degree 1,
        so ε(α, α) = ε exactly); if that α exceeds 2, β = 2 and α is the largest with
        ε(α, 2) ≤ ε. ε(1, 1) = √2 ≈ 1.414 for γ = 2 and ≈ 4.681 for γ = 4.
      - ``recipe="lecture"``: β = ε/(2(γ+1)), multiplier 2(γ+1)/ε (the textbook recipe; at
        γ = 2 NRS's 6S/ε Cauchy recipe). Its worst-case log-ratio is only ≈ 0.25ε (γ = 2) and
        ≈ 0.48ε (γ = 4): 2–4× more noise than ε needs.

      The tight recipe has the same β/α = 1 as the textbook but both larger (by
      2(γ+1)/ε(1, 1): 4.24× at γ = 2, 2.14× at γ = 4), so its noise multiplier is smaller and
      S_β (non-increasing in β) no larger on every data set.
    * ``"laplace"`` (δ > 0): δ' = 2δ/(e^{ε/2}+1) (Corollary 17 solved for δ'),
      β = ε/(2 ln(2/δ')), multiplier 2/ε (NRS 2007's Laplace recipe).
    * ``"gaussian"`` (δ > 0): β = ε/(2 ln(2/δ)), multiplier 5√(2 ln(2/δ))/ε.

    Args:
        epsilon: ε > 0.
        delta: δ in (0, 1) for ``"laplace"`` and ``"gaussian"``.
        noise: one of ``"heavy_tailed"``, ``"laplace"``, ``"gaussian"``.
        gamma: tail exponent γ > 1 of the heavy-tailed density (γ = 2 is Cauchy).
        recipe: ``"tight"`` or ``"lecture"``; only the heavy-tailed noise has a tight variant
            (for ``"laplace"`` and ``"gaussian"`` both names give the textbook calibration).

    Returns:
        ``SmoothNoise(beta, multiplier, noise)``.

    Formal guarantees:
        Under ``REPLACE_ONE``. Heavy-tailed, tight: ε-DP by ``heavy_tailed_privacy_loss``
        (proof there; ε(α, β) ≤ ε by construction, with the rounding margin). Heavy-tailed,
        ``recipe="lecture"``: ε-DP (the textbook recipes after the Laplace one; Nissim,
        Raskhodnikova & Smith 2007, Lemmas 2.5–2.9: the log-density has slope ≤ γ and dilation
        by e^λ changes it by ≤ (γ+1)|λ|, so h is (ε/(2γ), ε/(2(γ+1)))-admissible and
        2(γ+1)/ε ≥ 2γ/ε is valid; it also satisfies ε(α, β) ≤ ε). Laplace: (ε, δ)-DP,
        NRS 2007's Laplace recipe. Gaussian: (ε, δ)-DP, NRS 2007 Lemma 2.9 (the Gaussian
        is (ε/(5√(2 ln(2/δ))), ε/(2 ln(2/δ)))-admissible).

    Example:
        >>> smooth_noise_parameters(epsilon=1.0, noise="heavy_tailed", gamma=2.0, recipe="lecture")
        SmoothNoise(beta=0.16666666666666666, multiplier=6.0, noise='heavy_tailed')
        >>> p = smooth_noise_parameters(epsilon=1.0, noise="heavy_tailed", gamma=2.0)
        >>> round(p.beta, 6), round(p.multiplier, 6)
        (0.707107, 1.414214)
    """
    _validate.epsilon("epsilon", epsilon)
    _validate.one_of("noise", noise, _NOISES)
    _validate.one_of("recipe", recipe, _RECIPES)
    eps = float(epsilon)
    if noise == "heavy_tailed":
        _validate.in_range("gamma", gamma, 1.0, math.inf, low_inclusive=False)
        if recipe == "tight":
            return _tight_heavy_tailed(eps, float(gamma))
        return SmoothNoise(eps / (2.0 * (gamma + 1.0)), 2.0 * (gamma + 1.0) / eps, noise)
    _validate.in_range("delta", delta, 0.0, 1.0, low_inclusive=False)
    if noise == "laplace":
        delta_prime = 2.0 * float(delta) / (math.exp(0.5 * eps) + 1.0)
        return SmoothNoise(eps / (2.0 * math.log(2.0 / delta_prime)), 2.0 / eps, noise)
    log_term = math.log(2.0 / float(delta))
    return SmoothNoise(eps / (2.0 * log_term), 5.0 * math.sqrt(2.0 * log_term) / eps, noise)


def heavy_tailed_noise(
    key: jax.Array, shape: tuple[int, ...] = (), dtype: Any = float, *, gamma: float
) -> jax.Array:
    r"""Exact samples of the density h(z) = γ sin(π/γ) / (2π (1 + |z|^γ)).

    Ratio construction: if V ~ Beta(1/γ, 1 − 1/γ) then |Z| = (V/(1 − V))^{1/γ} has density
    ∝ 1/(1 + w^γ) on [0, ∞) (substitute v = w^γ/(1 + w^γ)); V/(1 − V) = G₁/G₂ with
    G₁ ~ Gamma(1/γ), G₂ ~ Gamma(1 − 1/γ), drawn in log space (``jax.random.loggamma``) so
    tiny shapes do not underflow. A fair sign makes Z symmetric.

    Args:
        key: a JAX PRNG key, used once.
        shape: output shape.
        dtype: floating dtype.
        gamma: γ > 1.

    Returns:
        An array of iid samples.
    """
    _validate.in_range("gamma", gamma, 1.0, math.inf, low_inclusive=False)
    if not jnp.issubdtype(dtype, jnp.floating):
        dtype = float
    dtype = jax.dtypes.canonicalize_dtype(dtype)  # float64 only when x64 is enabled
    k1, k2, k3 = jax.random.split(key, 3)
    a = 1.0 / float(gamma)
    log_g1 = jax.random.loggamma(k1, a, shape, dtype)
    log_g2 = jax.random.loggamma(k2, 1.0 - a, shape, dtype)
    magnitude = jnp.exp((log_g1 - log_g2) * a)
    sign = jnp.where(jax.random.bernoulli(k3, 0.5, shape), 1.0, -1.0).astype(dtype)
    return sign * magnitude


def _sorted_data(data: jax.Array, upper: float) -> jax.Array:
    _validate.positive("upper", upper)
    data = jnp.asarray(data)
    if data.ndim != 1 or data.shape[0] == 0:
        _validate.fail("data", data.shape, "a non-empty 1-D array (one value per record)")
    if not jnp.issubdtype(data.dtype, jnp.floating):
        data = data.astype(jnp.result_type(float))
    if _validate.is_concrete(data):
        _refuse_out_of_range(data, float(upper))
    # The non-finite rule is a no-op on valid data and keeps a traced call inside the proof's
    # domain: NaN ↦ Λ/2, ±inf and out-of-range values clipped to [0, Λ].
    return jnp.sort(clip_into_range(data, lower=0.0, upper=float(upper)))


def _refuse_out_of_range(data: jax.Array, upper: float) -> None:
    """Eager usage check on concrete data, in numpy (also under an outer ``jit`` trace).

    The message names the argument and the valid range only: it never shows a value, a min or
    max, or a count computed from the private data.
    """
    refuse_nonfinite("data", data)
    values = np.asarray(data)
    if np.any(values < 0.0) or np.any(values > upper):
        raise ValueError(
            f"data must be inside [0, upper={upper!r}] in every entry; got an array with "
            "entries outside it (the values are not shown)"
        )


def _padded(sorted_x: jax.Array, upper: float) -> jax.Array:
    """x_(i) for i = −n..2n+1 at index i + n: zeros to the left, Λ to the right."""
    n = sorted_x.shape[0]
    left = jnp.zeros((n + 1,), sorted_x.dtype)
    right = jnp.full((n + 1,), upper, sorted_x.dtype)
    return jnp.concatenate([left, sorted_x, right])


def _median_index(n: int) -> int:
    return (n + 1) // 2  # m = ⌈n/2⌉, 1-based


def local_sensitivity_median(data: jax.Array, *, upper: float) -> jax.Array:
    """Local sensitivity of the median of data in [0, Λ] (NRS 2007, the median): A⁽⁰⁾(x).

    Using it to scale noise is not differentially private (Nissim,
    Raskhodnikova & Smith 2007): it can be 0 on one data set and Λ on a neighbour.
    """
    x = _sorted_data(data, upper)
    n = x.shape[0]
    p = _padded(x, upper)
    i = _median_index(n) + n
    return jnp.maximum(p[i + 1] - p[i], p[i] - p[i - 1])


def smooth_sensitivity_median(data: jax.Array, *, upper: float, beta: float) -> jax.Array:
    r"""β-smooth sensitivity S*_β(x) of the median of data in [0, Λ] (NRS 2007).

    .. math:: S^*_\beta(x) = \max\Bigl(c,\ \max_{k=0,\dots,n} e^{-k\beta}
        \max_{t=0,\dots,k+1}\bigl(x_{(m+t)} - x_{(m+t-k-1)}\bigr)\Bigr)

    Evaluated with a ``lax.while_loop`` over k that stops once Λe^{−kβ} cannot beat the
    running maximum, so it is exact, jit-able and vmap-able. Cost O(n·K) for the K ≤ n + 1
    distances visited (K ≈ ln(Λ/S)/β on typical data; up to n/2 when most values coincide).
    It is computed in the working dtype (float64 when x64 is on, else float32, whatever the
    data's dtype) with the weights e^{−kβ} tabulated on the host, and floored at the public
    constant c = max(2Λ·tiny, tiny) (tiny: the working dtype's smallest normal number), so
    that it never underflows to 0: S ≥ Λe^{−nβ} > 0 in real numbers, but with many records
    tied at the median (0/1 data) that is e^{−200} and below.

    Args:
        data: 1-D array of n values in [0, upper] (non-finite values: see the module docstring).
        upper: Λ > 0.
        beta: β > 0.

    Returns:
        S*_β(x) (floored at c), a scalar array of the working dtype.

    Formal guarantees:
        The unfloored value is exactly the β-smooth sensitivity of Definition 14 (the smallest
        β-smooth upper bound on the local sensitivity, Lemma 15) under ``REPLACE_ONE``:
        the smooth sensitivity of the median,
        Nissim, Raskhodnikova & Smith 2007, Proposition 3.4. The floor keeps both
        properties, for any constant c ≥ 0 that does not depend on the data: (i)
        LS(x) ≤ S(x) ≤ max(S(x), c); (ii) for neighbours x, y,
        max(S(x), c) ≤ max(e^β S(y), c) ≤ e^β max(S(y), c) (as e^β ≥ 1). So max(S, c) is a
        β-smooth upper bound on LS and every recipe of ``smooth_noise_parameters`` applies to
        it unchanged. Rounding: every term is rounded to nearest in the working dtype, and
        fl(a − b) and fl(w·a) are monotone, so A⁽ᵏ⁾(x) ≤ A⁽ᵏ⁺¹⁾(y) survives rounding; the
        weights' relative error (2⁻⁵³ in float64, absorbed by the 1e-12 margin of
        ``heavy_tailed_privacy_loss``) is covered in float32 by tabulating e^{−kβ'} with
        β' = β − 2⁻²⁰ (or β/2 for β < 2⁻¹⁹) and inflating the result by 1 + 2⁻²⁰. A term
        whose weight is subnormal is below 2Λ·tiny ≤ c, so it cannot matter.

    Example:
        >>> import jax.numpy as jnp
        >>> x = jnp.array([0.0, 0.0, 0.0, 1.0, 1.0])  # n = 5, the median at 0
        >>> float(smooth_sensitivity_median(x, upper=1.0, beta=0.1))
        1.0
    """
    _validate.positive("beta", beta)
    x = _sorted_data(data, upper)
    floor = _underflow_floor(float(upper), _working_dtype())
    return _smooth_sensitivity_sorted(x, float(upper), float(beta), floor)


def _working_dtype() -> Any:
    """float64 when x64 is on, else float32 (S_β never lives in float16 / bfloat16)."""
    return jax.dtypes.canonicalize_dtype(jnp.float64)


def _underflow_floor(upper: float, dtype: Any) -> float:
    """c = max(2Λ·tiny, tiny) in ``dtype``: above every term with a subnormal weight."""
    tiny = float(jnp.finfo(dtype).tiny)
    return max(2.0 * upper * tiny, tiny)


def _release_floor(upper: float, multiplier: float, noise_dtype: Any) -> float:
    """Floor on S_β for a release: multiplier·S ≥ 2³²·tiny of the noise dtype (and ≥ c).

    Then multiplier·S·Z is a normal number of the noise dtype unless |Z| < 2⁻³², an event of
    probability ≤ 2⁻³¹·h(0) ≤ 2⁻³¹ that is the same for every data set whose S is at the floor.
    """
    tiny = float(jnp.finfo(noise_dtype).tiny)
    return max(_underflow_floor(upper, _working_dtype()), 2.0**32 * tiny / multiplier)


def _decay_weights(n: int, beta: float, dtype: Any) -> np.ndarray:
    """e^{−kβ'} for k = 0..n, on the host in float64; β' = β in float64, smaller in float32.

    In float32 the rounded weights satisfy w_k/w_{k+1} ≤ e^{β'}(1 + 2⁻²⁴)²/(1 − 2⁻²⁴)² ≤ e^β
    with β' = β − 2⁻²⁰ (β/2 for tiny β), so the tabulated weights are still β-smooth.
    """
    if np.dtype(dtype) != np.dtype(np.float64):
        beta = beta - 2.0**-20 if beta > 2.0**-19 else 0.5 * beta
    return np.exp(-beta * np.arange(n + 1, dtype=np.float64)).astype(dtype)


def _scale_rounded_up(multiplier: float, s: jax.Array) -> jax.Array:
    """multiplier·S in S's dtype, never below the real product (the scale the recipe needs).

    In float64 the product is used as is (as every other float64 noise scale). In float32
    (x64 off) fl(fl(m)·S) lands up to about one ulp below m·S; here m is rounded up to float32
    and the rounded product moved one float up, which is ≥ m·S because a rounding to nearest is
    off by at most half an ulp of the result.
    """
    if np.dtype(s.dtype) == np.dtype(np.float64):
        return multiplier * s
    product = scale_rounded_up(multiplier, s.dtype) * s
    return jnp.nextafter(product, jnp.asarray(jnp.inf, s.dtype))


@functools.partial(jax.jit, static_argnames=("upper", "beta", "floor"))
def _smooth_sensitivity_sorted(x: jax.Array, upper: float, beta: float, floor: float) -> jax.Array:
    """Equation (4) on sorted, in-range data, floored at ``floor`` (jitted per shape, Λ, β, c)."""
    dtype = _working_dtype()
    n = x.shape[0]
    p = _padded(x.astype(dtype), upper)
    m = _median_index(n)
    j = jnp.arange(p.shape[0])
    weights = jnp.asarray(_decay_weights(n, beta, dtype))

    def width_at_distance(k: jax.Array) -> jax.Array:
        """A⁽ᵏ⁾(x) = max_{t=0..k+1} x_(m+t) − x_(m+t−k−1): lower index j = m+t−k−1+n."""
        top = jnp.minimum(j + k + 1, p.shape[0] - 1)
        valid = (j >= m - k - 1 + n) & (j <= m + n)
        return jnp.max(jnp.where(valid, p[top] - p, jnp.zeros((), dtype)))

    def cond(state):
        k, best = state
        return (k <= n) & (weights[jnp.minimum(k, n)] * upper > best)

    def body(state):
        k, best = state
        return k + 1, jnp.maximum(best, weights[k] * width_at_distance(k))

    init = (jnp.asarray(0), jnp.asarray(0.0, dtype))
    best = jax.lax.while_loop(cond, body, init)[1]
    if np.dtype(dtype) != np.dtype(np.float64):
        best = best * jnp.asarray(1.0 + 2.0**-20, dtype)
    return jnp.maximum(best, jnp.asarray(floor, dtype))


@guarded_release("data")
def smooth_median(
    key: jax.Array,
    data: jax.Array,
    *,
    upper: float,
    epsilon: float,
    delta: float = 0.0,
    noise: str = "heavy_tailed",
    gamma: float = 4.0,
    recipe: str = "tight",
) -> jax.Array:
    """Release the median of data in [0, Λ] plus noise scaled to its β-smooth sensitivity.

    Args:
        key: a JAX PRNG key, used once.
        data: 1-D array of n values in [0, upper]. An eager call with concrete values
            outside the range, NaN or ±inf raises ``ValueError``; under ``jit`` NaN ↦ upper/2
            and the others are clipped into [0, upper]
            (``dpjax.mechanisms.sensitivity.clip_into_range``).
        upper: Λ > 0.
        epsilon: ε > 0.
        delta: δ in (0, 1) for ``noise="laplace"`` or ``"gaussian"``; ignored (pure ε) for
            ``"heavy_tailed"``.
        noise: ``"heavy_tailed"`` (default, ε-DP), ``"laplace"`` or ``"gaussian"``
            ((ε, δ)-DP); see ``smooth_noise_parameters``.
        gamma: γ > 1 for the heavy-tailed density.
        recipe: ``"tight"`` (default) or ``"lecture"`` calibration of the heavy-tailed noise;
            see ``smooth_noise_parameters``.

    Returns:
        median(x) + multiplier · S_β(x) · Z, a scalar array.

    Formal guarantees:
        Under ``REPLACE_ONE`` (fixed n), for every input (a NaN or ±inf record is mapped to a
        record in [0, Λ] before the median and S_β are computed): ε-DP for ``"heavy_tailed"``
        (``heavy_tailed_privacy_loss`` for the tight recipe) and (ε, δ)-DP for ``"laplace"``
        (NRS 2007's Laplace recipe) and ``"gaussian"`` (the
        textbook Gaussian recipe; Nissim, Raskhodnikova & Smith 2007, Lemma 2.9 and
        Theorem 2.6). S_β is computed in float64 (x64 on; float32 otherwise) and floored at
        the public constant c = max(2Λ·tiny_w, 2³²·tiny_z/multiplier) (tiny_w, tiny_z: the
        smallest normal numbers of the working and noise dtypes; ``smooth_sensitivity_median``
        proves that max(S_β, c) is still a β-smooth upper bound on LS), and the noise is drawn
        and added in at least float32, then cast to the data's dtype (post-processing). So
        multiplier·S·Z never underflows to 0: without the floor, 1001 records of which 910
        are 0 (the rest Λ) released exactly the median in float32 while the neighbour with
        909 zeros got noise (δ ≈ 0.8 at a claimed pure ε). Floating-point caveat: the scale
        is data dependent, so porous-float attacks (Mironov 2012) apply a fortiori; the
        guarantee is for the real-valued mechanism; research use only.
        Under ``jax.vmap``: each row of a vmap that batches ``key`` with distinct keys is its own
        release with this guarantee (account for every row); a vmap of ``data`` with one key for all
        rows raises ``ValueError``, and repeated keys in the batch raise eagerly and void the
        release under ``jit`` (NaN): rows that share a key share one noise draw and would release
        their differences noise-free.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> y = smooth_median(jax.random.key(0), jnp.linspace(0.0, 1.0, 101), upper=1.0,
        ...                   epsilon=1.0)
        >>> y.shape
        ()
    """
    params = smooth_noise_parameters(
        epsilon=epsilon, delta=delta, noise=noise, gamma=gamma, recipe=recipe
    )
    x = _sorted_data(data, upper)
    median = x[_median_index(x.shape[0]) - 1]
    floor = _release_floor(float(upper), params.multiplier, noise_dtype_of(median))
    s = _smooth_sensitivity_sorted(x, float(upper), params.beta, floor)
    sampler = {
        "heavy_tailed": functools.partial(heavy_tailed_noise, gamma=gamma),
        "laplace": jax.random.laplace,
        "gaussian": jax.random.normal,
    }[noise]
    return tree_add_noise(key, median, sampler, _scale_rounded_up(params.multiplier, s))
