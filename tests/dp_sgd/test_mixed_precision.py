"""float16/bfloat16 models: the noise and the public normaliser never become inf (or 0).

The noise is drawn and added in float32; a noise std a low-precision update cannot hold is
refused, the normaliser divides in float32, and ``make_private`` keeps the clipped sum, the
noise and the normalisation in float32 until ``optax.apply_updates`` casts the update once.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dpjax.dp_sgd import add_gaussian_noise, make_private, normalize_by

FP16_MAX = 65504.0


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_normaliser_beyond_float16_range_divides(dtype):
    """A constant above 65504 used to be cast to float16 inf: every update became 0."""
    tx = normalize_by(1e5)
    out, _ = tx.update(jnp.full(3, 1000.0, dtype), tx.init(None))
    assert out.dtype == dtype
    np.testing.assert_allclose(np.asarray(out, np.float32), 0.01, rtol=2**-7)


def test_noise_a_float16_update_cannot_hold_is_refused():
    """stddev 1e4 on float16 updates: draws beyond 65504 became ±inf."""
    tx = add_gaussian_noise(1e4, key=jax.random.key(0))
    u = jnp.zeros(8, jnp.float16)
    with pytest.raises(ValueError, match="stddev"):
        tx.update(u, tx.init(u), u)
    with pytest.raises(ValueError, match="stddev"):
        jax.jit(tx.update)(u, tx.init(u), u)
    assert 9.2 * 7000.0 < FP16_MAX  # just below the bound: accepted and finite
    tx = add_gaussian_noise(7000.0, key=jax.random.key(0))
    noisy, _ = tx.update(u, tx.init(u), u)
    assert noisy.dtype == jnp.float16 and bool(jnp.all(jnp.isfinite(noisy)))
    wide = add_gaussian_noise(1e4, key=jax.random.key(0))  # float32 sums take it
    noisy, _ = wide.update(u.astype(jnp.float32), wide.init(u), u)
    assert bool(jnp.all(jnp.isfinite(noisy)))


def test_float16_params_release_finite_updates_with_the_planned_noise_std():
    """σ·C = 2·10⁵ > 65504 with float16 parameters: the update of one SGD step (lr 1) is
    −(noisy sum)/(q·n), finite, with std σ·C/(q·n) = 2000 per coordinate (the clipped sum of
    a zero-gradient loss is 0). d = 4096 coordinates: the sample std is within 4·σ/√(2d)
    (≈ 4.4 %) of 2000 and rejects a std off by 10 %."""
    d, n, b, sigma, clip = 4096, 200, 100, 2.0, 1e5
    private = make_private(
        lambda w, ex: jnp.sum(w * ex),  # ex = 0: gradient 0, the update is pure noise
        optimizer=optax.sgd(1.0),
        l2_clip_norm=clip,
        dataset_size=n,
        batch_size=b,
        steps=1,
        noise_multiplier=sigma,
        delta=1e-5,
        key=jax.random.key(11),
        clipping="vmap",
    )
    w0 = jnp.zeros(d, jnp.float16)
    w1, _, _ = private.fit(w0, jnp.zeros((n, d), jnp.float16), progress=False)
    assert w1.dtype == jnp.float16 and bool(jnp.all(jnp.isfinite(w1)))
    std = float(np.std(np.asarray(w1, np.float64)))
    expected = sigma * clip / private.expected_batch_size
    assert abs(std / expected - 1) < 4 / math.sqrt(2 * d)
    assert abs(std / (1.1 * expected) - 1) > 4 / math.sqrt(2 * d)
