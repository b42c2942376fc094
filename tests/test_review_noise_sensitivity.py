"""Adversarial review: what reaches the noise, and the noise scale that is released.

Grey-box shape (Cebere et al., "Privacy in Theory, Bugs in Practice", PETS 2026): with additive
noise the release on D minus the release on D′ under the SAME key is the difference of the
pre-noise values, which must be ≤ the declared sensitivity.

* bfloat16 models: ``clipped_grad`` returns the clipped SUM rounded to bfloat16 (the weighted
  row sum is a bf16 tensordot) and ``accumulate_clipped_sums`` keeps its running total in the
  params' dtype. The noise is then drawn and added in float32, but the sum it is added to has
  already moved by ulp_bf16(S) ≈ 2⁻⁸·|S| between neighbours: 2·C at |S| ≈ 258, 512·C at
  |S| ≈ 65 792 (add/remove-one, declared sensitivity C).
* Laplace DP-SGD: θ_h is rounded UP to the FIRST leaf's noise dtype; a later leaf of a narrower
  dtype re-rounds it to nearest, below the float64 θ_h that ``laplace_dp_sgd_event`` accounts.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dpjax
from dpjax import _random
from dpjax.dp_sgd import transforms

C = 1.0


def _linear_loss(params, x):
    return jnp.sum(params * x)


@pytest.mark.parametrize("n", [258, 65_792])
def test_bf16_clipped_sum_moves_by_at_most_c(n):
    """VIOLATION: n examples of gradient +1 (norm 1 = C, unclipped) vs the same plus one more.
    Exact sums 258 → 259 (resp. 65 792 → 65 793); bf16 rounding (ties to even) returns
    258 → 260 (resp. 65 536 → 66 048): the clipped sum moves by 2·C (resp. 512·C)."""
    grad_fn = dpjax.clipped_grad(_linear_loss, l2_clip_norm=C)
    params = jnp.zeros((1,), jnp.bfloat16)
    s_without, _ = grad_fn(params, jnp.ones((n, 1), jnp.bfloat16))
    s_with, _ = grad_fn(params, jnp.ones((n + 1, 1), jnp.bfloat16))
    moved = abs(float(s_with[0]) - float(s_without[0]))
    assert moved <= grad_fn.sensitivity() * (1 + 1e-6), f"clipped sum moved by {moved} > C"


def test_bf16_release_moves_by_at_most_c_under_the_same_key():
    """VIOLATION, end to end through dp_sgd_optimizer's noise: same
    key, D′ = 258 examples, D = 259; the
    float32-wide release (noise σ = 1) cast to bf16 differs by 2 = 2·C in every draw tried,
    where the Gaussian mechanism with sensitivity C assumes pre-noise values ≤ C apart."""
    grad_fn = dpjax.clipped_grad(_linear_loss, l2_clip_norm=C)
    params = jnp.zeros((1,), jnp.bfloat16)
    tx = transforms.add_gaussian_noise(1.0 * C, key=jax.random.key(3))
    state = tx.init(params)
    s_without, _ = grad_fn(params, jnp.ones((258, 1), jnp.bfloat16))
    s_with, _ = grad_fn(params, jnp.ones((259, 1), jnp.bfloat16))
    y_without, _ = tx.update(s_without, state, params)
    y_with, _ = tx.update(s_with, state, params)
    moved = abs(float(y_with[0]) - float(y_without[0]))
    assert moved <= C * (1 + 1e-6), f"release moved by {moved} under the same key"


def test_accumulated_bf16_total_moves_by_at_most_c():
    """VIOLATION: accumulate_clipped_sums keeps the running total in the params' bf16. Micro-
    batch sums 258 then 1 (D) vs 258 then 0 (D′), both exact in bf16: the released total is
    260 vs 258 (noise 0 to read it), a move of 2·C."""
    inner = dpjax.dp_sgd_optimizer(
        optimizer=optax.sgd(1.0),
        noise_multiplier=0.0,
        l2_clip_norm=C,
        normalizer=1.0,
        key=jax.random.key(0),
    )
    tx = dpjax.accumulate_clipped_sums(inner, every_k=2)
    params = jnp.zeros((1,), jnp.bfloat16)

    def release(second):
        state = tx.init(params)
        _, state = tx.update(jnp.asarray([258.0], jnp.bfloat16), state, params)
        out, _ = tx.update(jnp.asarray([second], jnp.bfloat16), state, params)
        return float(out[0])

    moved = abs(release(1.0) - release(0.0))
    assert moved <= C * (1 + 1e-6), f"accumulated release moved by {moved}"


def _exact_theta(h: int, **kw) -> float:
    return float(transforms.laplace_dp_sgd_theta(np.asarray([float(h)]), **kw)[0])


def test_laplace_theta_not_below_accounted_in_a_mixed_dtype_tree(monkeypatch):
    """VIOLATION (1 ulp, 5.5e-8 relative): {"a": float64, "b": float32} at h = 4 (ρ = ½, κ = 0,
    Δ₁ = ε = 1). θ_4 = 5.568914100752346 is rounded up in float64 (the first leaf's noise
    dtype) and re-rounded to NEAREST float32 for leaf b: 5.5689139 < θ_4, so b's Laplace scale
    is below the one ``laplace_dp_sgd_event`` accounts. (The scale each leaf receives is read
    where ``_add_scaled`` checks it; it casts it with ``astype``, i.e. round to nearest.)"""
    from dpjax import _noise

    kw = dict(l1_sensitivity=1.0, epsilon=1.0, rho=0.5, kappa=0.0)
    h = 4
    theta = _exact_theta(h, **kw)
    assert float(np.float32(theta)) < theta  # precondition: nearest float32 is below
    seen = []
    original = _noise.check_scale_representable

    def record(scale, dtype):
        seen.append(float(np.asarray(scale).astype(dtype)))
        return original(scale, dtype)

    monkeypatch.setattr(_noise, "check_scale_representable", record)
    tx = transforms.add_laplace_dp_sgd_noise(key=jax.random.key(5), **kw)
    tree = {"a": jnp.zeros(1, jnp.float64), "b": jnp.zeros(1, jnp.float32)}
    state = tx.init(tree)._replace(count=jnp.asarray(h - 1, jnp.int32))
    tx.update(tree, state)
    assert len(seen) == 2
    assert min(seen) >= theta, f"leaf scales {seen!r}; accounted θ_4 = {theta!r}"


@pytest.mark.parametrize("h", [1, 4, 8, 9, 11, 37])
def test_laplace_theta_rounded_up_for_a_float32_tree(h):
    """Holds: a float32-only tree gets θ_h rounded UP (released/L ≥ θ_h), also under vmap
    over a batch of states and under lax.scan."""
    kw = dict(l1_sensitivity=1.0, epsilon=1.0, rho=0.5, kappa=0.75)
    key = _random.constant_bits_key(0)
    tx = transforms.add_laplace_dp_sgd_noise(key=key, **kw)
    tree = jnp.zeros(2, jnp.float32)
    laplace_top = float(_random.laplace(key, (1,), np.float32)[0])
    state = tx.init(tree)._replace(count=jnp.asarray(h - 1, jnp.int32))
    noisy, _ = jax.jit(tx.update)(tree, state)
    assert float(noisy[0]) / laplace_top >= _exact_theta(h, **kw) * (1 - 2**-24)
    states = jax.vmap(lambda c: state._replace(count=c))(jnp.arange(h, dtype=jnp.int32))
    batched = jax.vmap(lambda s: tx.update(tree, s)[0])(states)
    expect = np.asarray([_exact_theta(i + 1, **kw) for i in range(h)])
    assert np.all(np.asarray(batched[:, 0], np.float64) / laplace_top >= expect * (1 - 2**-24))

    def body(s, _):
        out, s = tx.update(tree, s)
        return s, out[0]

    _, scanned = jax.lax.scan(body, tx.init(tree), None, length=h)
    np.testing.assert_array_equal(np.asarray(scanned), np.asarray(batched[:, 0]))


_X64_OFF_CODE = """
import jax, jax.numpy as jnp, numpy as np
from dpjax import _noise
from dpjax.dp_sgd import transforms
kw = dict(l1_sensitivity=1.0, epsilon=1.0, rho=0.5, kappa=0.0)
seen = []
original = _noise.check_scale_representable
def record(scale, dtype):
    seen.append(float(np.asarray(scale).astype(dtype)))
    return original(scale, dtype)
_noise.check_scale_representable = record
tx = transforms.add_laplace_dp_sgd_noise(key=jax.random.key(1), **kw)
tree = {"a": jnp.zeros(1, jnp.int32), "b": jnp.zeros(1, jnp.float32)}
for h in (4, 8, 9, 11):
    seen.clear()
    tx.update(tree, tx.init(tree)._replace(count=jnp.asarray(h - 1, jnp.int32)))
    exact = float(transforms.laplace_dp_sgd_theta(np.asarray([float(h)]), **kw)[0])
    assert len(seen) == 2 and min(seen) >= exact, (h, seen, exact)
print("ok")
"""


def test_laplace_theta_rounded_up_with_x64_off():
    """Holds: x64 off, int32 + float32 leaves (both float32 noise): every leaf's θ_h ≥ the
    float64 θ_h for h = 4, 8, 9, 11 (the h where nearest-float32 is below)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "JAX_ENABLE_X64": "0"}
    result = subprocess.run(
        [sys.executable, "-c", _X64_OFF_CODE], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("ok")
