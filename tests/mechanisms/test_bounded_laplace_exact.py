"""Exact privacy of the bounded Laplace mechanism on adversarial inputs (range ends, NaN, ±inf).

The output law on [l, u] is a Laplace(q, b) density restricted to [l, u] and renormalised,

    p_q(v) = exp(−|v − q|/b) / (2b C_q),   C_q = 1 − ½(e^{−(q−l)/b} + e^{−(u−q)/b}),

so the log-ratio of two such laws is piecewise linear in v with breakpoints at q and q′: its
supremum over [l, u] is attained at one of {l, u, q, q′} and is computed exactly here. δ(ε) =
∫ (p_q − e^ε p_q′)_+ is integrated by adaptive quadrature (absolute error ≤ 1e-12).

Which law the mechanism uses on a non-finite input is read off the mechanism itself: with the
same key, its release on the adversarial value equals its release on the documented public
value (NaN → (l + u)/2, +inf → u, −inf → l), so the two have the same law.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate

from dpjax import mechanisms as M

L, U, SENS = 0.0, 10.0, 1.0
MID = 0.5 * (L + U)
QUAD_ABS_ERROR = 1e-12


def normaliser(q, b):
    """C_q in closed form: mass of exp(−|v − q|/b)/(2b) on [L, U]."""
    return 1.0 - 0.5 * (math.exp(-(q - L) / b) + math.exp(-(U - q) / b))


def log_density(v, q, b):
    return -abs(v - q) / b - math.log(2.0 * b) - math.log(normaliser(q, b))


def sup_log_ratio(q, q2, b):
    """max over v in [L, U] of |ln p_q(v) − ln p_q2(v)|: exact (piecewise-linear ratio)."""
    return max(abs(log_density(v, q, b) - log_density(v, q2, b)) for v in (L, U, q, q2))


def hockey_stick(q, q2, b, eps):
    """δ(ε) = ∫_L^U (p_q − e^ε p_q2)_+ dv by quadrature."""

    def integrand(v):
        return max(math.exp(log_density(v, q, b)) - math.exp(eps + log_density(v, q2, b)), 0.0)

    value, err = integrate.quad(
        integrand, L, U, points=sorted({q, q2}), limit=400, epsabs=QUAD_ABS_ERROR
    )
    assert err <= QUAD_ABS_ERROR
    return value


def test_closed_form_normaliser_matches_quadrature():
    for q, b in [(L, 0.7), (3.0, 2.0), (U, 40.0)]:
        ref = integrate.quad(
            lambda v, q=q, b=b: math.exp(-abs(v - q) / b) / (2 * b), L, U, points=[q], epsabs=1e-14
        )[0]
        assert normaliser(q, b) == pytest.approx(ref, rel=1e-10)


# (value on D, value on D′, public value the mechanism must use on D, on D′): neighbours whose
# in-range values differ by at most Δ = SENS after the non-finite rule.
ADVERSARIAL_PAIRS = [
    (L, L + SENS, L, L + SENS),  # worst case of Theorem 26: ends of the range
    (U, U - SENS, U, U - SENS),
    (math.inf, U - SENS, U, U - SENS),
    (-math.inf, L + SENS, L, L + SENS),
    (1e300, U - SENS, U, U - SENS),
    (math.nan, MID + SENS, MID, MID + SENS),
    (math.nan, MID - SENS, MID, MID - SENS),
]


@jax.jit
def _releases(keys, value):
    """Bounded Laplace (ε = 1, δ = 0) on one scalar value, one release per key."""

    def release(k):
        return M.bounded_laplace(k, value, sensitivity=SENS, epsilon=1.0, lower=L, upper=U)

    return jax.vmap(release)(keys)


def jitted_releases(value, keys):
    return np.asarray(_releases(keys, jnp.float64(value)))


@pytest.mark.parametrize("raw, raw2, public, public2", ADVERSARIAL_PAIRS)
def test_release_on_adversarial_values_has_the_documented_law(key, raw, raw2, public, public2):
    # Fails on the original code for NaN: the release is NaN on D and finite on D′.
    keys = jax.random.split(key, 2000)
    for value, expected in ((raw, public), (raw2, public2)):
        got = jitted_releases(value, keys)
        assert np.all(np.isfinite(got)), f"release on {value} is not finite"
        np.testing.assert_array_equal(got, jitted_releases(expected, keys))


@pytest.mark.parametrize("eps, delta", [(1.0, 0.0), (0.3, 0.0), (0.5, 0.05)])
def test_exact_privacy_on_adversarial_neighbours(eps, delta):
    b = M.bounded_laplace_scale(sensitivity=SENS, epsilon=eps, lower=L, upper=U, delta=delta)
    worst_ratio, worst_delta = 0.0, 0.0
    for _, _, q, q2 in ADVERSARIAL_PAIRS:
        for a, c in ((q, q2), (q2, q)):
            worst_ratio = max(worst_ratio, sup_log_ratio(a, c, b))
            worst_delta = max(worst_delta, hockey_stick(a, c, b, eps))
    # Pure level: ε − ln(1 − δ) (Theorem 26's condition), attained at the range ends.
    assert worst_ratio <= eps - math.log1p(-delta) + 1e-9
    assert worst_ratio >= eps - math.log1p(-delta) - 1e-6  # the calibration is tight
    assert worst_delta <= delta + 2 * QUAD_ABS_ERROR


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_concrete_non_finite_value_is_refused(key, bad):
    with pytest.raises(ValueError, match="value must be finite"):
        M.bounded_laplace(
            key, jnp.array([1.0, bad]), sensitivity=SENS, epsilon=1.0, lower=L, upper=U
        )


def test_float32_nan_under_jit_is_finite(key):
    f = jax.jit(
        lambda k, v: M.bounded_laplace(k, v, sensitivity=SENS, epsilon=1.0, lower=L, upper=U)
    )
    out = f(key, jnp.array([jnp.nan, jnp.inf, -jnp.inf], dtype=jnp.float32))
    assert out.dtype == jnp.float32
    assert bool(jnp.all(jnp.isfinite(out))) and bool(jnp.all((out >= L) & (out <= U)))
