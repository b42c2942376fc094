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
import numpy as np

from dpjax import _random, _validate
from dpjax._noise import exact_in, float_dtype_of, host_dtype, scale_rounded_up
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
    q: jax.Array,
    w: jax.Array,
    from_top: jax.Array,
    b: float,
    lo: float,
    hi: float,
    xp: Any = jnp,
) -> jax.Array:
    """The point of Lap(q, b) restricted to [lo, hi] with CDF mass w/2 below it (or above it if
    ``from_top``), for w ∈ (0, 1]: the quantile function measured from the nearer end.

    Stable tail forms (unnormalised masses, total C_q = m_lo + m_hi,
    m_lo = ½(1 − e^{−(q−lo)/b}), m_hi = ½(1 − e^{−(hi−q)/b})): a mass a ≤ m_lo from ``lo``
    gives v = lo + b·softplus(ln 2a + (q − lo)/b) (accurate as a → 0, where v → lo); a mass
    a > m_lo gives v = q − b·log1p(−2(a − m_lo)); symmetrically from ``hi``. q must be in
    [lo, hi] (finite); all arithmetic is in q's dtype. ``xp``: ``jax.numpy``, or ``numpy``
    for the same formulas on the host in float64 (:func:`_sample_on_host`).
    """
    dtype = q.dtype
    w = w.astype(dtype)
    m_lo = -0.5 * xp.expm1(-(q - lo) / b)
    m_hi = -0.5 * xp.expm1(-(hi - q) / b)
    mass = 0.5 * w * (m_lo + m_hi)  # mass between the chosen end and v
    near = xp.where(from_top, m_hi, m_lo)  # mass between that end and q
    end = xp.where(from_top, xp.asarray(hi, dtype), xp.asarray(lo, dtype))
    gap = xp.where(from_top, hi - q, q - lo)
    inward = xp.where(from_top, -1.0, 1.0).astype(dtype)
    tiny = xp.asarray(xp.finfo(dtype).tiny, dtype)
    # Between the end and q: distance from the end = b·softplus(ln 2a + gap/b).
    log_2a = xp.log(xp.maximum(2.0 * mass, tiny))
    from_end = end + inward * b * xp.logaddexp(log_2a + gap / b, 0.0)  # softplus
    # Past q: the mass beyond q is r = a − near; distance from q = −b·log1p(−2r).
    r = xp.clip(mass - near, 0.0, 0.5)
    past_q = q + inward * (-b) * xp.log1p(-2.0 * r)
    return xp.clip(xp.where(mass <= near, from_end, past_q), lo, hi)


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

    q is never rounded before the sample is drawn around it (:func:`_rounding_free_centre`):
    a host value the working dtype cannot hold exactly is sampled on the host in float64
    (eager calls) or refused (inside a trace).
    """
    out_dtype = float_dtype_of(q)
    dtype = _working_dtype()
    host_values = _host_values_wider_than(q, dtype)
    if host_values is not None:
        words_concrete = _validate.is_concrete(jax.random.bits(key, (), jnp.uint32))
        if words_concrete:
            return _sample_on_host(key, host_values, b, lo, hi, out_dtype)
        _refuse_inexact_constant(host_values, dtype)
    q = _exact_integer_centre(jnp.asarray(q), dtype)
    w, from_top = _random._unit_and_sign(key, jnp.shape(q), dtype)
    q_wide = clip_into_range(q, lower=lo, upper=hi).astype(dtype)
    # b in ``dtype`` rounded UP (a nearest cast could land below the b the condition holds for;
    # the condition holds for every larger b, which the bisection of the scale relies on)
    b_wide = float(scale_rounded_up(b, dtype))
    v = _inverse_cdf_from_ends(q_wide, w, from_top, b_wide, lo, hi)
    return jnp.clip(v.astype(out_dtype), lo, hi)


def _host_values_wider_than(q: Any, dtype: Any) -> np.ndarray | None:
    """q as a numpy array if it is a concrete value whose dtype ``dtype`` cannot hold exactly
    (a numpy/Python float64 or a wide integer with x64 off; an int64 with x64 on), else None."""
    host = host_dtype(q)
    if host is None and _validate.is_concrete(q) and hasattr(q, "dtype"):
        host = np.dtype(q.dtype)
    if host is None or exact_in(host, dtype):
        return None
    return np.asarray(q)


def _float64_centre(values: np.ndarray) -> np.ndarray:
    """``values`` in float64, refusing integers float64 cannot hold (|v| > 2⁵³)."""
    if (np.issubdtype(values.dtype, np.integer) or values.dtype == np.object_) and values.size:
        if np.max(np.abs(values.astype(np.float64))) > 2.0**53:
            _validate.fail(
                "value",
                "an integer beyond 2**53 in magnitude",
                "integers that float64 holds exactly (|v| <= 2**53); rescale the statistic",
            )
    return values.astype(np.float64)


def _sample_on_host(
    key: jax.Array, values: np.ndarray, b: float, lo: float, hi: float, out_dtype: Any
) -> jax.Array:
    """:func:`_sample` in float64 on the host (numpy) for an eager call: the same key words and
    formulas, the centre q = clip(f(D)) in float64, one rounding to ``out_dtype`` after."""
    w, negative = _random.unit_and_sign_on_host(key, values.shape)
    q = np.clip(_float64_centre(values), lo, hi)  # non-finite values were refused eagerly
    v = _inverse_cdf_from_ends(q, w, negative, b, lo, hi, xp=np)
    return jnp.clip(jnp.asarray(v.astype(np.dtype(out_dtype))), lo, hi)


def _refuse_inexact_constant(values: np.ndarray, dtype: Any) -> None:
    """Inside a trace (the noise is traced): refuse a host constant ``dtype`` cannot hold."""
    name = np.dtype(dtype).name
    if np.array_equal(_float64_centre(values).astype(dtype).astype(np.float64), values):
        return
    _validate.fail(
        "value",
        f"a {values.dtype.name} constant inside a traced function that {name} cannot hold exactly",
        f"a value that {name} holds exactly: here the sample would be drawn around the value "
        f"rounded to {name}, which can widen the sensitivity (float64 16777217 and 16777218 "
        "are 2 apart in float32); pass the value as an argument of the jitted function (it "
        "then arrives in its JAX dtype and that rounding is part of your query), call the "
        "mechanism outside jit, or enable jax_enable_x64",
    )


def _exact_integer_centre(q: jax.Array, dtype: Any) -> jax.Array:
    """A traced integer q clamped to ±2^p (p = ``dtype``'s significand bits) so that its cast
    is exact (int32 under float32); the clamp is 1-Lipschitz, the sensitivity is unchanged."""
    if not jnp.issubdtype(q.dtype, jnp.integer) or exact_in(q.dtype, dtype):
        return q
    limit = 2 ** (int(jnp.finfo(dtype).nmant) + 1)
    info = jnp.iinfo(q.dtype)
    return jnp.clip(q, max(int(info.min), -limit), min(int(info.max), limit))


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
            ``dpjax.mechanisms.sensitivity.clip_into_range``). The value is never rounded
            before the sample is drawn around it: a float64 or wide-integer value that the
            working dtype (float32 with x64 off) cannot hold exactly is sampled on the host in
            float64 and rounded once, afterwards (eager calls); such a constant closed over
            inside ``jit``/``vmap`` raises ``ValueError`` naming ``value`` (pass it as an
            argument: it then arrives in its JAX dtype, and that rounding is part of the
            caller's query); a traced integer beyond the working dtype's exact range is
            clamped to ±2^p first (1-Lipschitz: the sensitivity is unchanged).
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
