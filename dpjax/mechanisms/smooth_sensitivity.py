"""Smooth sensitivity of the median and its three noise recipes (004_f02b245d52dd0fec.txt).

Data: n scalars in [0, Λ]; neighbours differ in one record (Hamming distance 1, fixed n):
the relation is ``REPLACE_ONE``. The released statistic is the median x_(m), m = ⌈n/2⌉ (for
odd n the usual median; for even n the lower median).

* Local sensitivity (004 Example 12) LS(x) = max(x_(m+1) − x_(m), x_(m) − x_(m−1)) with
  x_(i) = 0 for i ≤ 0 and Λ for i > n. Noise scaled to it is **not** DP (Example 12).
* β-smooth sensitivity (004 Definitions 13–14, equation (4); Nissim, Raskhodnikova & Smith
  2007, Proposition 3.4):
  S*(x) = max_{k=0..n} e^{−kβ} max_{t=0..k+1} (x_(m+t) − x_(m+t−k−1)).
* Noise recipes: Laplace Lap(2S/ε) (004 Proposition 16 / Corollary 17), the heavy-tailed
  density ∝ 1/(1 + |z|^γ) scaled by 2(γ+1)S/ε (pure ε), Gaussian 5√(2 ln(2/δ))S/ε · N(0, 1).
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from dpjax import _validate
from dpjax._noise import tree_add_noise

__all__ = [
    "SmoothNoise",
    "local_sensitivity_median",
    "smooth_sensitivity_median",
    "smooth_noise_parameters",
    "smooth_laplace_delta",
    "heavy_tailed_noise",
    "smooth_median",
]

_NOISES = ("heavy_tailed", "laplace", "gaussian")


class SmoothNoise(NamedTuple):
    """Calibration of a smooth-sensitivity release: noise scale = ``multiplier`` · S_β(x)."""

    beta: float
    multiplier: float
    noise: str


def smooth_laplace_delta(*, epsilon: float, delta_prime: float) -> float:
    """δ of Proposition 16 / Corollary 17 of 004: δ = (δ'/2)(e^{ε/2} + 1).

    Laplace noise Lap(2S/ε) with S β-smooth, β ≤ ε/(2 ln(2/δ')), is (ε, δ)-DP for this δ.
    """
    _validate.epsilon(epsilon)
    _validate.in_range("delta_prime", delta_prime, 0.0, 1.0, low_inclusive=False)
    return 0.5 * float(delta_prime) * (math.exp(0.5 * float(epsilon)) + 1.0)


def smooth_noise_parameters(
    *, epsilon: float, delta: float = 0.0, noise: str = "heavy_tailed", gamma: float = 4.0
) -> SmoothNoise:
    r"""Smoothness β and noise multiplier for each recipe of 004 (scale = multiplier · S_β).

    * ``"heavy_tailed"`` (pure ε; δ ignored): density ∝ 1/(1+|z|^γ), γ > 1,
      β = ε/(2(γ+1)), multiplier 2(γ+1)/ε.
    * ``"laplace"`` (δ > 0): δ' = 2δ/(e^{ε/2}+1) (Corollary 17 solved for δ'),
      β = ε/(2 ln(2/δ')), multiplier 2/ε (Proposition 16).
    * ``"gaussian"`` (δ > 0): β = ε/(2 ln(2/δ)), multiplier 5√(2 ln(2/δ))/ε.

    Args:
        epsilon: ε > 0.
        delta: δ in (0, 1) for ``"laplace"`` and ``"gaussian"``.
        noise: one of ``"heavy_tailed"``, ``"laplace"``, ``"gaussian"``.
        gamma: tail exponent γ > 1 of the heavy-tailed density (γ = 2 is Cauchy).

    Returns:
        ``SmoothNoise(beta, multiplier, noise)``.

    Formal guarantees:
        004_f02b245d52dd0fec.txt, Proposition 16, Corollary 17 and the two recipes after it;
        Nissim, Raskhodnikova & Smith 2007, Lemmas 2.5–2.9 ((α, β)-admissible noise; the
        Gaussian is (ε/(5√(2 ln(2/δ))), ε/(2 ln(2/δ)))-admissible). For the heavy-tailed
        density the log-density has slope ≤ γ and dilation by e^λ changes it by ≤ (γ+1)|λ|, so
        it is (ε/(2γ), ε/(2(γ+1)))-admissible; the notes' multiplier 2(γ+1)/ε ≥ 2γ/ε is
        therefore valid (slightly conservative; at γ = 2 it is NRS's 6S/ε Cauchy recipe).

    Example:
        >>> smooth_noise_parameters(epsilon=1.0, noise="heavy_tailed", gamma=2.0)
        SmoothNoise(beta=0.16666666666666666, multiplier=6.0, noise='heavy_tailed')
    """
    _validate.epsilon(epsilon)
    _validate.one_of("noise", noise, _NOISES)
    eps = float(epsilon)
    if noise == "heavy_tailed":
        _validate.in_range("gamma", gamma, 1.0, math.inf, low_inclusive=False)
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
        lo, hi = float(jnp.min(data)), float(jnp.max(data))
        if lo < 0.0 or hi > float(upper):
            _validate.fail("data", (lo, hi), f"inside [0, upper={upper!r}] (min, max shown)")
    # Clipping is a no-op on valid data and keeps a traced call inside the proof's domain.
    return jnp.sort(jnp.clip(data, 0.0, float(upper)))


def _padded(sorted_x: jax.Array, upper: float) -> jax.Array:
    """x_(i) for i = −n..2n+1 at index i + n: zeros to the left, Λ to the right."""
    n = sorted_x.shape[0]
    left = jnp.zeros((n + 1,), sorted_x.dtype)
    right = jnp.full((n + 1,), upper, sorted_x.dtype)
    return jnp.concatenate([left, sorted_x, right])


def _median_index(n: int) -> int:
    return (n + 1) // 2  # m = ⌈n/2⌉, 1-based


def local_sensitivity_median(data: jax.Array, *, upper: float) -> jax.Array:
    """Local sensitivity of the median of data in [0, Λ] (004 Example 12): A⁽⁰⁾(x).

    Using it to scale noise is not differentially private (004 Example 12): it can be 0 on
    one data set and Λ on a neighbour.
    """
    x = _sorted_data(data, upper)
    n = x.shape[0]
    p = _padded(x, upper)
    i = _median_index(n) + n
    return jnp.maximum(p[i + 1] - p[i], p[i] - p[i - 1])


def smooth_sensitivity_median(data: jax.Array, *, upper: float, beta: float) -> jax.Array:
    r"""β-smooth sensitivity S*_β(x) of the median of data in [0, Λ] (004 equation (4)).

    .. math:: S^*_\beta(x) = \max_{k=0,\dots,n} e^{-k\beta}
        \max_{t=0,\dots,k+1}\bigl(x_{(m+t)} - x_{(m+t-k-1)}\bigr)

    Evaluated with a ``lax.while_loop`` over k that stops once Λe^{−kβ} cannot beat the
    running maximum, so it is exact, jit-able and vmap-able. Cost O(n·K) for the K ≤ n + 1
    distances visited (K ≈ ln(Λ/S)/β on typical data; up to n/2 when most values coincide).

    Args:
        data: 1-D array of n values in [0, upper].
        upper: Λ > 0.
        beta: β > 0.

    Returns:
        S*_β(x), a scalar array.

    Formal guarantees:
        Exactly the β-smooth sensitivity of Definition 14 (the smallest β-smooth upper bound
        on the local sensitivity, Lemma 15) under ``REPLACE_ONE``: 004_f02b245d52dd0fec.txt,
        Example 20, equation (4); Nissim, Raskhodnikova & Smith 2007, Proposition 3.4.

    Example:
        >>> import jax.numpy as jnp
        >>> x = jnp.array([0.0, 0.0, 0.0, 1.0, 1.0])  # 004 Example 12, data set 1 (n = 5)
        >>> float(smooth_sensitivity_median(x, upper=1.0, beta=0.1))
        1.0
    """
    _validate.positive("beta", beta)
    return _smooth_sensitivity_sorted(_sorted_data(data, upper), float(upper), float(beta))


@functools.partial(jax.jit, static_argnames=("upper", "beta"))
def _smooth_sensitivity_sorted(x: jax.Array, upper: float, beta: float) -> jax.Array:
    """Equation (4) on sorted, in-range data (jitted once per shape, Λ and β)."""
    n = x.shape[0]
    p = _padded(x, upper)
    m = _median_index(n)
    j = jnp.arange(p.shape[0])
    decay = math.exp(-float(beta))

    def width_at_distance(k: jax.Array) -> jax.Array:
        """A⁽ᵏ⁾(x) = max_{t=0..k+1} x_(m+t) − x_(m+t−k−1): lower index j = m+t−k−1+n."""
        top = jnp.minimum(j + k + 1, p.shape[0] - 1)
        valid = (j >= m - k - 1 + n) & (j <= m + n)
        return jnp.max(jnp.where(valid, p[top] - p, 0.0))

    def cond(state):
        k, weight, best = state
        return (k <= n) & (weight * upper > best)

    def body(state):
        k, weight, best = state
        best = jnp.maximum(best, weight * width_at_distance(k))
        return k + 1, weight * decay, best

    init = (jnp.asarray(0), jnp.asarray(1.0, p.dtype), jnp.asarray(0.0, p.dtype))
    return jax.lax.while_loop(cond, body, init)[2]


def smooth_median(
    key: jax.Array,
    data: jax.Array,
    *,
    upper: float,
    epsilon: float,
    delta: float = 0.0,
    noise: str = "heavy_tailed",
    gamma: float = 4.0,
) -> jax.Array:
    """Release the median of data in [0, Λ] plus noise scaled to its β-smooth sensitivity.

    Args:
        key: a JAX PRNG key, used once.
        data: 1-D array of n values in [0, upper] (values outside raise ``ValueError``;
            under ``jit`` they are clipped into the range).
        upper: Λ > 0.
        epsilon: ε > 0.
        delta: δ in (0, 1) for ``noise="laplace"`` or ``"gaussian"``; ignored (pure ε) for
            ``"heavy_tailed"``.
        noise: ``"heavy_tailed"`` (default, ε-DP), ``"laplace"`` or ``"gaussian"``
            ((ε, δ)-DP); see ``smooth_noise_parameters``.
        gamma: γ > 1 for the heavy-tailed density.

    Returns:
        median(x) + multiplier · S_β(x) · Z, a scalar array.

    Formal guarantees:
        Under ``REPLACE_ONE`` (fixed n): ε-DP for ``"heavy_tailed"`` and (ε, δ)-DP for
        ``"laplace"`` (004_f02b245d52dd0fec.txt Proposition 16, Corollary 17) and
        ``"gaussian"`` (004, the Gaussian recipe d_ε; Nissim, Raskhodnikova & Smith 2007,
        Lemma 2.9 and Theorem 2.6). Floating-point caveat: the scale is data dependent, so
        porous-float attacks (Mironov 2012) apply a fortiori; research use only.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> y = smooth_median(jax.random.key(0), jnp.linspace(0.0, 1.0, 101), upper=1.0,
        ...                   epsilon=1.0)
        >>> y.shape
        ()
    """
    params = smooth_noise_parameters(epsilon=epsilon, delta=delta, noise=noise, gamma=gamma)
    x = _sorted_data(data, upper)
    median = x[_median_index(x.shape[0]) - 1]
    s = _smooth_sensitivity_sorted(x, float(upper), params.beta)
    sampler = {
        "heavy_tailed": functools.partial(heavy_tailed_noise, gamma=gamma),
        "laplace": jax.random.laplace,
        "gaussian": jax.random.normal,
    }[noise]
    return tree_add_noise(key, median, sampler, params.multiplier * s)
