"""The bounded Laplace mechanism on [l, u] (Holohan et al. 2018).

The output has density ∝ exp(−|v − q|/b) on [l, u], q = f(D) ∈ [l, u]: the Laplace density
*restricted* to the domain (not clamped), with the data-dependent normaliser

    C_q = 1 − ½(exp(−(q − l)/b) + exp(−(u − q)/b)).

Because C_q depends on the data, b = Δ/ε is not enough; the published analysis (Holohan,
Antonatos, Braghin & Mac Aonghusa 2018, "The Bounded Laplace Mechanism in Differential
Privacy", Journal of Privacy and Confidentiality; the ΔC condition) gives the condition solved
here on the host.

Non-finite values follow the rule of ``dpjax.mechanisms.sensitivity.clip_into_range``: under
``jit`` a NaN coordinate of f(D) is released as if it were (l + u)/2 and ±inf as u / l; an eager
call with a concrete non-finite value raises ``ValueError``.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from dpjax import _random, _validate
from dpjax._noise import float_dtype_of
from dpjax.mechanisms._nonfinite import refuse_nonfinite
from dpjax.mechanisms._vmap_guard import guarded_release
from dpjax.mechanisms.sensitivity import clip_into_range

__all__ = [
    "bounded_laplace",
    "bounded_laplace_scale",
    "bounded_laplace_delta_c",
    "bounded_laplace_epsilon",
]


def _domain(lower: float, upper: float) -> tuple[float, float]:
    for name, v in (("lower", lower), ("upper", upper)):
        _validate.in_range(name, v, float("-inf"), float("inf"), low_inclusive=False)
    if not float(lower) < float(upper):
        _validate.fail("upper", upper, f"greater than lower={lower!r} (need l < u)")
    return float(lower), float(upper)


def _check_sensitivity(sensitivity: float, width: float) -> float:
    _validate.in_range(
        "sensitivity", sensitivity, 0.0, width, low_inclusive=False, high_inclusive=True
    )
    return float(sensitivity)


def bounded_laplace_delta_c(*, b: float, sensitivity: float, lower: float, upper: float) -> float:
    r"""ΔC = C_{l+Δ}/C_l (Holohan et al. 2018): the largest ratio of normalisers of neighbours.

    .. math:: \Delta C(b) = \frac{2 - e^{-\Delta/b} - e^{-(u-l-\Delta)/b}}{1 - e^{-(u-l)/b}}

    (C_q is concave in q and symmetric about the midpoint, so max_{|q−q'|≤Δ} C_{q'}/C_q is
    attained at q = l, q' = l + Δ.) Computed with ``expm1`` so it is accurate for b ≫ u − l.
    """
    _validate.positive("b", b)
    lo, hi = _domain(lower, upper)
    width = hi - lo
    delta_q = _check_sensitivity(sensitivity, width)
    b = float(b)
    numerator = -math.expm1(-delta_q / b) - math.expm1(-(width - delta_q) / b)
    return numerator / -math.expm1(-width / b)


def bounded_laplace_epsilon(*, b: float, sensitivity: float, lower: float, upper: float) -> float:
    """Pure-DP level of the bounded Laplace mechanism: Δ/b + ln ΔC(b).

    The density ratio of neighbours is at most e^{Δ/b}·C_{q'}/C_q ≤ e^{Δ/b}ΔC, and this is
    attained (q = l, q' = l + Δ, v = l), so this is the exact ε of the (ε, 0) guarantee.
    """
    delta_c = bounded_laplace_delta_c(b=b, sensitivity=sensitivity, lower=lower, upper=upper)
    return float(sensitivity) / float(b) + math.log(delta_c)


def bounded_laplace_scale(
    *,
    sensitivity: float,
    epsilon: float,
    lower: float,
    upper: float,
    delta: float = 0.0,
) -> float:
    r"""Smallest b with :math:`b \ge \Delta/(\varepsilon - \ln\Delta C(b) - \ln(1-\delta))`.

    Solved by bisection on the host (ΔC depends on b); the returned b is the upper end of the
    final bracket, so it always satisfies the condition.

    Args:
        sensitivity: Δ of f under the caller's neighbouring relation, in (0, u − l].
        epsilon: ε > 0.
        lower: l, the lower end of the output domain.
        upper: u > l.
        delta: δ in [0, 1); δ = 0 gives pure ε-DP.

    Returns:
        The scale b.

    Formal guarantees:
        With this b the mechanism is ε'-DP for ε' = Δ/b + ln ΔC(b) ≤ ε − ln(1 − δ), hence
        (ε, 1 − e^{ε−ε'}) ⊆ (ε, δ)-DP (Holohan et al.
        2018, the ΔC condition). b ≥ Δ/(ε − ln(1 − δ)) always, since ΔC ≥ 1.

    Example:
        >>> b = bounded_laplace_scale(sensitivity=1.0, epsilon=1.0, lower=0.0, upper=10.0)
        >>> b > 1.0
        True
    """
    _validate.epsilon("epsilon", epsilon)
    _validate.delta("delta", delta)
    lo, hi = _domain(lower, upper)
    delta_q = _check_sensitivity(sensitivity, hi - lo)
    budget = float(epsilon) - math.log1p(-float(delta))

    def ok(b: float) -> bool:
        return bounded_laplace_epsilon(b=b, sensitivity=delta_q, lower=lo, upper=hi) <= budget

    b_lo = delta_q / budget  # necessary: ΔC ≥ 1
    b_hi = 2.0 * b_lo
    while not ok(b_hi):
        b_lo, b_hi = b_hi, 2.0 * b_hi
    for _ in range(200):
        mid = math.sqrt(b_lo * b_hi)
        b_lo, b_hi = (b_lo, mid) if ok(mid) else (mid, b_hi)
        if b_hi / b_lo - 1.0 < 1e-13:
            break
    return b_hi


def _working_dtype() -> Any:
    """float64 when x64 is on, else float32 (never a narrower float)."""
    return jax.dtypes.canonicalize_dtype(jnp.float64)


def _inverse_cdf_from_ends(
    q: jax.Array, w: jax.Array, from_top: jax.Array, b: float, lo: float, hi: float
) -> jax.Array:
    """The point of Lap(q, b) restricted to [lo, hi] with CDF mass w/2 below it (or above it if
    ``from_top``), for w ∈ (0, 1]: the quantile function measured from the nearer end.

    Stable tail forms (unnormalised masses, total C_q = m_lo + m_hi,
    m_lo = ½(1 − e^{−(q−lo)/b}), m_hi = ½(1 − e^{−(hi−q)/b})): a mass a ≤ m_lo from ``lo``
    gives v = lo + b·softplus(ln 2a + (q − lo)/b) (accurate as a → 0, where v → lo); a mass
    a > m_lo gives v = q − b·log1p(−2(a − m_lo)); symmetrically from ``hi``. q must be in
    [lo, hi] (finite); all arithmetic is in q's dtype.
    """
    dtype = q.dtype
    w = w.astype(dtype)
    m_lo = -0.5 * jnp.expm1(-(q - lo) / b)
    m_hi = -0.5 * jnp.expm1(-(hi - q) / b)
    mass = 0.5 * w * (m_lo + m_hi)  # mass between the chosen end and v
    near = jnp.where(from_top, m_hi, m_lo)  # mass between that end and q
    end = jnp.where(from_top, jnp.asarray(hi, dtype), jnp.asarray(lo, dtype))
    gap = jnp.where(from_top, hi - q, q - lo)
    inward = jnp.where(from_top, -1.0, 1.0).astype(dtype)
    tiny = jnp.asarray(jnp.finfo(dtype).tiny, dtype)
    # Between the end and q: distance from the end = b·softplus(ln 2a + gap/b).
    log_2a = jnp.log(jnp.maximum(2.0 * mass, tiny))
    from_end = end + inward * b * jax.nn.softplus(log_2a + gap / b)
    # Past q: the mass beyond q is r = a − near; distance from q = −b·log1p(−2r).
    r = jnp.clip(mass - near, 0.0, 0.5)
    past_q = q + inward * (-b) * jnp.log1p(-2.0 * r)
    return jnp.clip(jnp.where(mass <= near, from_end, past_q), lo, hi)


def _truncated_laplace(q: jax.Array, u01: jax.Array, b: float, lo: float, hi: float) -> jax.Array:
    """Inverse CDF of Lap(q, b) restricted to [lo, hi] at a uniform u01 ∈ [0, 1).

    q is first mapped into [lo, hi] by the non-finite rule (NaN ↦ midpoint, clip) and the
    arithmetic is in u01's dtype. The public release does NOT feed it a 2⁻²³-grid uniform any
    more (see ``bounded_laplace``); this form is kept to evaluate the quantile at a given u.
    """
    q = clip_into_range(q, lower=lo, upper=hi).astype(u01.dtype)
    from_top = u01 >= 0.5
    w = jnp.where(from_top, 2.0 * (1.0 - u01), 2.0 * u01)
    return _inverse_cdf_from_ends(q, w, from_top, b, lo, hi)


def _sample(key: jax.Array, q: Any, b: float, lo: float, hi: float) -> jax.Array:
    """One release per coordinate of q: a fair bit picks the end, 63 bits the mass w/2 from it.

    ``dpjax._random._unit_and_sign`` gives w on the midpoint grid {(k + ½)2⁻⁶³} ⊂ (0, 1]
    (smallest 2⁻⁶⁴) and an independent fair sign; v = F_q⁻¹(w/2) or F_q⁻¹(1 − w/2). So the
    CDF position V is uniform on (0, 1) up to cells of 2⁻⁶⁴, and both ends of [lo, hi] are
    approached to CDF mass 2⁻⁶⁵ instead of 2⁻²⁴ (float32 uniform).
    """
    q = jnp.asarray(q)
    out_dtype = float_dtype_of(q)
    dtype = _working_dtype()
    w, from_top = _random._unit_and_sign(key, jnp.shape(q), dtype)
    q_wide = clip_into_range(q, lower=lo, upper=hi).astype(dtype)
    v = _inverse_cdf_from_ends(q_wide, w, from_top, b, lo, hi)
    return jnp.clip(v.astype(out_dtype), lo, hi)


@guarded_release("value")
def bounded_laplace(
    key: jax.Array,
    value: Any,
    *,
    sensitivity: float,
    epsilon: float,
    lower: float,
    upper: float,
    delta: float = 0.0,
) -> Any:
    """Release f(D) with bounded Laplace noise: a sample of Lap(f(D), b) restricted to [l, u].

    Sampling is exact and loop-free (inverse CDF of the restricted density), so it runs
    under ``jit`` and ``vmap``.

    Args:
        key: a JAX PRNG key, used once.
        value: f(D), scalar/array/pytree. Finite values outside [lower, upper] are clipped
            into it (a fixed 1-Lipschitz map, so the sensitivity stays ≤ Δ). Non-finite values:
            an eager call with a concrete NaN or ±inf raises ``ValueError``; under ``jit`` a
            NaN coordinate is replaced by (lower + upper)/2 and ±inf by upper / lower (see
            ``dpjax.mechanisms.sensitivity.clip_into_range``).
        sensitivity: Δ of each coordinate under the caller's neighbouring relation, in
            (0, u − l]. For k coordinates released together, compose (k releases).
        epsilon: ε > 0 (per coordinate).
        lower: l.
        upper: u > l.
        delta: δ in [0, 1) (per coordinate).

    Returns:
        Noisy values in [lower, upper], with the structure of ``value``.

    Formal guarantees:
        Each coordinate is (ε, δ)-DP under the relation Δ holds for, with b from
        ``bounded_laplace_scale`` (Holohan et al.
        2018). Unlike the Laplace mechanism, the guarantee is
        per coordinate: a vector release composes over its coordinates. Δ is a bound on
        |g(D) − g(D′)| for the mapped statistic g = clip_into_range ∘ f; for a finite f this is
        implied by f's sensitivity. If f itself can be NaN on D and finite on a neighbour D′,
        the released law on D is that of q = (l + u)/2, so Δ must cover |(l + u)/2 − f(D′)|
        (at most (u − l)/2); the release is never NaN.
        Under ``jax.vmap``: each row of a vmap that batches ``key`` with distinct keys is its own
        release with this guarantee (account for every row); a vmap of ``value`` with one key for
        all rows raises ``ValueError``, and repeated keys in the batch raise eagerly and void the
        release under ``jit`` (NaN): rows that share a key share one noise draw and would release
        their differences noise-free.

        Sampling and floating point: the quantile function is evaluated at a CDF position V
        built from 64 random bits (a fair bit picks the end of [l, u] it is measured from, 63
        bits the mass w/2 ∈ [2⁻⁶⁵, ½] from that end, ``dpjax._random``), in float64 when x64
        is on (float32 otherwise), with tail forms that stay accurate as the mass → 0; the
        result is cast to the value's dtype (post-processing). Every q reaches within CDF mass
        2⁻⁶⁵ of both ends of [l, u], so the region a neighbour reaches beyond q's support has
        mass ≤ e^ε·2⁻⁶⁵ per end: a δ floor of at most e^ε·2⁻⁶⁴ per coordinate on top of the
        stated guarantee. (Formerly one float32 uniform on the 2⁻²³ grid: from q = l with
        Δ = 0.1, b = 0.161 nothing above 2.5709 was possible while q′ = l + 0.1 reached 2.67,
        a δ of ≈ 1e-7.) Porosity caveat: this is still FLOAT noise; its outputs lie on an
        irregular grid, so an exact output of D can be impossible on D′ (Mironov 2012, "On
        significance of the least significant bits for differential privacy"): the exact
        law on the old float32 grid had δ(1) = 0.80 (q = 0 vs 1, [0, 10]). The guarantee is
        for the real-valued mechanism; releases of real data to untrusted parties need
        non-porous noise (``dpjax.mechanisms.discrete_laplace`` on a grid). Research use only.

    Example:
        >>> import jax
        >>> y = bounded_laplace(jax.random.key(0), 0.5, sensitivity=1.0, epsilon=1.0,
        ...                     lower=0.0, upper=10.0)
        >>> bool(0.0 <= y <= 10.0)
        True
    """
    b = bounded_laplace_scale(
        sensitivity=sensitivity, epsilon=epsilon, lower=lower, upper=upper, delta=delta
    )
    lo, hi = float(lower), float(upper)
    refuse_nonfinite("value", value)
    leaves, treedef = jax.tree.flatten(value)
    keys = jax.random.split(key, len(leaves))
    released = [_sample(k, q, b, lo, hi) for k, q in zip(keys, leaves, strict=True)]
    return jax.tree.unflatten(treedef, released)
