"""Adversarial review: the δ floor of the truncated 64-bit Gaussian sampler.

``noise_truncation_delta`` (and the docstrings of ``dpjax._random`` / ``add_gaussian_noise``:
"below 1e-12 per release at σ ≥ 0.5") take the differing example's clipped gradient along ONE
axis, g = C·e₁. But the sampler puts an ATOM of mass ≥ 2⁻⁶⁴ at +z_max on EVERY coordinate (the
one 64-bit word pair with U = 2⁻⁶⁴: the whole ideal tail cell [0, 2⁻⁶³) is lumped there).
Spreading the gradient, g = (C/√d)·(1, …, 1) (‖g‖₂ = C), every coordinate i with g_i > 0 can
land at s_i + g_i + σC·z_max, an output the neighbour without the example never produces
(|Z_i| ≤ z_max). So one release has the infinite-loss event

    A = {∃ i : Y_i − s_i > σC·z_max},   P_D(A) ≥ q·(1 − (1 − 2⁻⁶⁴)^d),   P_D′(A) = 0,

and δ(ε) ≥ P_D(A) for every ε, whatever σ. The reported floor has no dimension and is smaller
by orders of magnitude for models with ≥ 10⁷ parameters.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import mpmath
import numpy as np
import pytest

from dpjax import _random
from dpjax.accounting import noise_truncation_delta


@functools.cache
def _enumerating_impl(hi_word: int):
    """A PRNG whose bits(key, (2, n)) are hi = ``hi_word`` everywhere and lo = 0, 1, …, n−1."""
    from jax.extend.random import define_prng_impl

    def random_bits(key, bit_width, shape):
        del key
        n = int(np.prod(shape[1:], dtype=np.int64))
        hi = jnp.full((n,), hi_word, jnp.uint32)
        lo = jnp.arange(n, dtype=jnp.uint32)
        return jnp.stack([hi, lo]).reshape(shape)

    return define_prng_impl(
        key_shape=(1,),
        seed=lambda seed: jnp.zeros((1,), jnp.uint32),
        split=lambda key, shape: jnp.zeros((*shape, 1), jnp.uint32),
        random_bits=random_bits,
        fold_in=lambda key, data: key,
        name=f"review_enumerate_lo_{hi_word:#x}",
    )


def _atom_floor(*, dimension: int, sampling_rate: float, steps: int, atom: float) -> float:
    """1 − (1 − q·(1 − (1 − atom)^d))^T: P_D of hitting the top atom on some coordinate."""
    per_release = sampling_rate * -math.expm1(dimension * math.log1p(-atom))
    return -math.expm1(steps * math.log1p(-per_release))


@pytest.mark.parametrize("dtype", [np.float64])  # float32: tests/core/test_random_normal32.py
def test_top_of_support_is_an_atom_of_one_word_pair(dtype):
    """Premise (holds): word pair (hi=0, lo=0) — 1 of 2⁶⁴ equiprobable pairs — gives +z_max,
    and the next words (lo = 1, 2, …) give strictly smaller values: an atom of mass 2⁻⁶⁴.
    (Float32 normal noise takes one word a lane; its top atom is tested in
    tests/core/test_random_normal32.py.)"""
    key = jax.random.key(0, impl=_enumerating_impl(0))
    z = np.asarray(_random.normal(key, (64,), dtype), np.float64)
    z_max = _random.gaussian_support_max(dtype)
    assert z[0] == z_max
    assert np.all(z[1:] < z_max)
    exact = -float(mpmath.sqrt(2) * mpmath.erfinv(2 * mpmath.mpf(2) ** -65 - 1))
    assert abs(z_max - exact) <= 1e-6 * exact  # z_max = Φ̄⁻¹(2⁻⁶⁵) = 9.1553


def test_reported_floor_covers_a_spread_gradient():
    """VIOLATION: d = 10⁸ coordinates, σ = 1, q = 1, one release. The atom alone forces
    δ ≥ 1 − (1 − 2⁻⁶⁴)^d = 5.4e-12 (> the documented "below 1e-12 at σ ≥ 0.5"); the function
    reports Φ̄(9.155 − 1) = 1.7e-16, 3·10⁴ times less."""
    floor = _atom_floor(dimension=10**8, sampling_rate=1.0, steps=1, atom=2.0**-64)
    reported = noise_truncation_delta(
        noise_multiplier=1.0, sampling_rate=1.0, steps=1, num_coordinates=10**8
    )
    assert floor > 1e-12
    assert reported >= floor, f"reported {reported:.3g} < forced floor {floor:.3g}"


def test_reported_floor_covers_a_dpsgd_run_on_a_large_model():
    """VIOLATION: σ = 1.1, q = 0.0051, T = 10⁴ (the docstring's setting), a 10⁹-parameter
    model: forced floor 2.8e-9 vs reported 4.2e-15."""
    floor = _atom_floor(dimension=10**9, sampling_rate=0.0051, steps=10**4, atom=2.0**-64)
    reported = noise_truncation_delta(
        noise_multiplier=1.1, sampling_rate=0.0051, steps=10**4, num_coordinates=10**9
    )
    assert reported >= floor, f"reported {reported:.3g} < forced floor {floor:.3g}"


@pytest.mark.parametrize(
    ("sigma", "q", "steps"),
    [(0.3, 1.0, 1), (0.3, 1.0, 10**6), (1.1, 0.0051, 10**4), (0.5, 1.0, 1), (100.0, 1.0, 1)],
)
def test_one_axis_formula_matches_high_precision(sigma, q, steps):
    """Holds: the one-axis number 1 − (1 − q·Φ̄(z_max − 1/σ))^T agrees with mpmath (50
    digits) to 1e-12 relative, including σ = 0.3 and T = 10⁶ (floor 2.9e-3)."""
    mpmath.mp.dps = 50
    z_max = mpmath.mpf(_random.gaussian_support_max(np.float32))
    p = q * mpmath.ncdf(-(z_max - 1 / mpmath.mpf(sigma)))
    expected = float(1 - (1 - p) ** steps)
    got = noise_truncation_delta(
        noise_multiplier=sigma, sampling_rate=q, steps=steps, num_coordinates=1
    )
    assert got == pytest.approx(expected, rel=1e-12)
