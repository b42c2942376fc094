"""Noise and normalisation transforms: noise scale (KS), fresh noise per step/leaf, keys."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy import stats

import dpjax
from dpjax import _random
from dpjax.dp_sgd import transforms
from dpjax.dp_sgd.transforms import laplace_dp_sgd_theta
from tests.helpers import assert_distribution

# rounding claims of compiled code: run on the users' -O3 code (tests/conftest.py)
pytestmark = pytest.mark.codegen


def normal_cdf(scale):
    return lambda x: stats.norm.cdf(x, scale=scale)


def laplace_cdf(scale):
    return lambda x: stats.laplace.cdf(x, scale=scale)


def test_released_noise_has_std_sigma_c_over_normaliser(key):
    sigma, C, normaliser = 1.3, 0.8, 16.0
    tx = dpjax.dp_sgd_optimizer(
        optimizer=optax.sgd(1.0),
        noise_multiplier=sigma,
        l2_clip_norm=C,
        normalizer=normaliser,
        key=key,
    )
    params = {"a": jnp.zeros((40, 50)), "b": jnp.zeros(2000)}
    zeros = jax.tree.map(jnp.zeros_like, params)
    updates, _ = jax.jit(tx.update)(zeros, tx.init(params), params)
    samples = np.concatenate([np.ravel(u) for u in jax.tree.leaves(updates)])  # n = 4000
    std = sigma * C / normaliser
    assert_distribution(
        samples, normal_cdf(std), wrong_cdfs=[normal_cdf(1.5 * std), normal_cdf(std / 1.5)]
    )


def test_noise_differs_across_steps_and_leaves(key):
    tx = dpjax.add_gaussian_noise(1.0, key=key)
    params = {"a": jnp.zeros(500), "b": jnp.zeros(500)}
    state = tx.init(params)
    step = jax.jit(tx.update)
    n1, state = step(params, state, params)
    n2, state = step(params, state, params)
    assert int(state.count) == 2
    draws = [np.asarray(n1["a"]), np.asarray(n1["b"]), np.asarray(n2["a"]), np.asarray(n2["b"])]
    bound = 5.0 / math.sqrt(500)  # |corr| of independent N(0,1) vectors, 5 standard errors
    for i in range(4):
        for j in range(i + 1, 4):
            assert not np.array_equal(draws[i], draws[j])
            assert abs(np.corrcoef(draws[i], draws[j])[0, 1]) < bound


def test_same_key_reproduces_and_different_key_differs(key):
    k1, k2 = jax.random.split(key)
    params = jnp.zeros(100)

    def draw(k):
        tx = dpjax.add_gaussian_noise(2.0, key=k)
        return np.asarray(tx.update(params, tx.init(params), params)[0])

    assert np.array_equal(draw(k1), draw(k1))
    assert not np.array_equal(draw(k1), draw(k2))


def test_key_is_required():
    with pytest.raises(TypeError):
        dpjax.add_gaussian_noise(1.0)
    with pytest.raises(TypeError, match="key"):
        dpjax.add_gaussian_noise(1.0, key=None)
    with pytest.raises(TypeError, match="key"):
        dpjax.add_gaussian_noise(1.0, key=0)
    with pytest.raises(TypeError, match="key"):
        dpjax.add_gaussian_noise(1.0, key=jnp.zeros(3))
    with pytest.raises(TypeError):
        dpjax.dp_sgd_optimizer(
            optimizer=optax.sgd(1.0), noise_multiplier=1.0, l2_clip_norm=1.0, normalizer=1.0
        )
    with pytest.raises(TypeError):
        dpjax.add_laplace_dp_sgd_noise(l1_sensitivity=1.0, epsilon=1.0, rho=0.5, kappa=1.0)


def test_legacy_uint32_key_is_accepted():
    tx = dpjax.add_gaussian_noise(1.0, key=jax.random.PRNGKey(3))
    out, _ = tx.update(jnp.zeros(4), tx.init(jnp.zeros(4)))
    assert out.shape == (4,)


def test_noise_keeps_float32(key):
    tx = dpjax.add_gaussian_noise(1.0, key=key)
    p = jnp.zeros(3, jnp.float32)
    out, _ = jax.jit(tx.update)(p, tx.init(p), p)
    assert out.dtype == jnp.float32


def test_normalize_by_divides_by_the_constant():
    tx = dpjax.normalize_by(8.0)
    out, _ = tx.update({"a": jnp.array([4.0, -8.0])}, tx.init(None))
    np.testing.assert_allclose(out["a"], [0.5, -1.0])


@pytest.mark.parametrize("bad", [0.0, -2.0, float("nan"), float("inf")])
def test_normalize_by_refuses_non_positive(bad):
    with pytest.raises(ValueError, match="constant"):
        dpjax.normalize_by(bad)


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_noise_stddev_validated(key, bad):
    with pytest.raises(ValueError, match="stddev"):
        dpjax.add_gaussian_noise(bad, key=key)


# ----------------------------------------------------------------------------- Laplace DP-SGD


def theta_by_definition(h, l1, eps, rho, kappa):
    """Theorem 36 of 004, written out with an explicit loop."""
    gamma = [(1 + j) ** (-rho) for j in range(h)]
    past = sum(gamma[j] for j in range(h - 1))  # j = 0..h-2
    return (past / gamma[h - 1] + 1.0) * l1 / eps / h**kappa


def test_laplace_theta_matches_theorem_36():
    l1, eps, rho, kappa = 0.7, 2.0, 0.5, 0.8
    for h in [1, 2, 3, 10, 57]:
        got = float(
            laplace_dp_sgd_theta(
                np.array([h]), l1_sensitivity=l1, epsilon=eps, rho=rho, kappa=kappa
            )[0]
        )
        assert got == pytest.approx(theta_by_definition(h, l1, eps, rho, kappa), rel=1e-12)
    assert float(
        laplace_dp_sgd_theta(np.array([1]), l1_sensitivity=l1, epsilon=eps, rho=rho, kappa=kappa)[0]
    ) == pytest.approx(l1 / eps)


def test_laplace_theta_traced_matches_exact():
    h = np.array([1, 2, 5, 16, 17, 18, 100, 5000, 123456], dtype=np.float64)
    kw = dict(l1_sensitivity=1.0, epsilon=1.0, rho=0.6, kappa=0.9)
    exact = laplace_dp_sgd_theta(h, **kw)
    traced = np.asarray(jax.jit(lambda x: laplace_dp_sgd_theta(x, **kw))(jnp.asarray(h)))
    np.testing.assert_allclose(traced, exact, rtol=1e-9)


def test_laplace_noise_scale_at_step_h(key):
    kw = dict(l1_sensitivity=0.5, epsilon=1.0, rho=0.5, kappa=0.75)
    tx = dpjax.add_laplace_dp_sgd_noise(key=key, **kw)
    params = jnp.zeros(3000)
    state = tx.init(params)
    step = jax.jit(tx.update)
    for _ in range(3):  # h = 1, 2, 3
        noise, state = step(params, state, params)
    theta3 = theta_by_definition(3, 0.5, 1.0, 0.5, 0.75)
    assert_distribution(
        np.asarray(noise),
        laplace_cdf(theta3),
        wrong_cdfs=[laplace_cdf(1.5 * theta3), laplace_cdf(theta3 / 1.5)],
    )


def test_laplace_dpsgd_applies_step_size(key):
    kw = dict(l1_sensitivity=1e-9, epsilon=1e9, rho=0.5, kappa=1.0)  # ~noise-free
    tx = dpjax.laplace_dp_sgd_optimizer(key=key, **kw)
    p = jnp.zeros(2)
    state = tx.init(p)
    g = jnp.array([1.0, -2.0])
    for h in [1, 2, 3]:
        u, state = tx.update(g, state, p)
        np.testing.assert_allclose(u, -(h**-0.5) * g, rtol=1e-6)


def test_laplace_dpsgd_event():
    kw = dict(l1_sensitivity=2.0, epsilon=0.5, rho=0.5, kappa=0.75)
    ev = dpjax.laplace_dp_sgd_event(steps=40, **kw)
    assert isinstance(ev, dpjax.accounting.LaplaceDPSGDEvent)
    assert ev.relation == dpjax.REPLACE_ONE
    expected = [2.0 / theta_by_definition(h, 2.0, 0.5, 0.5, 0.75) for h in range(1, 41)]
    np.testing.assert_allclose(ev.epsilons, expected, rtol=1e-12)
    assert ev.epsilons[0] == pytest.approx(0.5)  # θ_1 = Δ/ε: step 1 is ε-DP


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(l1_sensitivity=0.0, epsilon=1.0, rho=0.5, kappa=1.0), "l1_sensitivity"),
        (dict(l1_sensitivity=1.0, epsilon=-1.0, rho=0.5, kappa=1.0), "epsilon"),
        (dict(l1_sensitivity=1.0, epsilon=1.0, rho=1.0, kappa=1.0), "rho"),
        (dict(l1_sensitivity=1.0, epsilon=1.0, rho=0.0, kappa=1.0), "rho"),
        (dict(l1_sensitivity=1.0, epsilon=1.0, rho=0.5, kappa=-0.1), "kappa"),
    ],
)
def test_laplace_arguments_validated(key, kwargs, name):
    with pytest.raises(ValueError, match=name):
        dpjax.add_laplace_dp_sgd_noise(key=key, **kwargs)
    with pytest.raises(ValueError, match=name):
        dpjax.laplace_dp_sgd_event(steps=3, **kwargs)


@pytest.mark.parametrize(
    "module",
    [
        "dpjax.dp_sgd.clipping",
        "dpjax.dp_sgd.transforms",
        "dpjax.dp_sgd.optimizers",
        "dpjax.dp_sgd.samplers",
    ],
)
def test_docstring_examples_run(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_laplace_dpsgd_event_composes_basically_in_the_accountant():
    from dpjax.accounting import PrivacyAccountant

    ev = dpjax.laplace_dp_sgd_event(l1_sensitivity=1.0, epsilon=0.1, rho=0.5, kappa=0.8, steps=50)
    acc = PrivacyAccountant([ev])
    assert acc.releases == 50
    assert acc.epsilon(0.0, accounting="basic") == pytest.approx(sum(ev.epsilons), rel=1e-12)


# ------------------------------------------------------------- fusion barrier (issue 15)


def _noise_without_barrier(key, updates, sampler, scale):
    """What update_fn drew before the barrier: the same keys through dpjax._noise directly."""
    from dpjax import _noise

    _, noise_key = jax.random.split(key)
    return _noise.tree_add_iid_noise(noise_key, updates, sampler, scale)


@pytest.mark.parametrize("jit", [False, True])
def test_fusion_barrier_leaves_gaussian_noise_bit_identical(key, jit):
    from dpjax import _random

    updates = {"w": jnp.ones((37, 11), jnp.float32), "b": jnp.arange(5, dtype=jnp.float64)}
    tx = dpjax.add_gaussian_noise(0.7, key=key)
    update = jax.jit(tx.update) if jit else tx.update
    noisy, _ = update(updates, tx.init(updates))
    without = functools.partial(_noise_without_barrier, sampler=_random.normal, scale=0.7)
    expected = (jax.jit(without) if jit else without)(key, updates)
    for got, want in zip(jax.tree.leaves(noisy), jax.tree.leaves(expected), strict=True):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_fusion_barrier_leaves_laplace_noise_bit_identical(key):
    from dpjax import _random
    from dpjax.dp_sgd.transforms import _theta_on_host

    kw = dict(l1_sensitivity=2.0, epsilon=1.0, rho=0.5, kappa=0.0)
    updates = jnp.zeros(300, jnp.float32)
    tx = dpjax.add_laplace_dp_sgd_noise(**kw, key=key)
    noisy, _ = jax.jit(tx.update)(updates, tx.init(updates))
    theta = jnp.asarray(_theta_on_host(np.array(1), np.float32, kw), jnp.float32)
    without = functools.partial(_noise_without_barrier, sampler=_random.laplace)
    expected = jax.jit(without)(key, updates, scale=theta)
    np.testing.assert_array_equal(np.asarray(noisy), np.asarray(expected))


@pytest.mark.parametrize("make", ["gaussian", "laplace"])
def test_noise_transforms_put_the_clipped_sum_behind_a_barrier(key, make):
    if make == "gaussian":
        tx = dpjax.add_gaussian_noise(1.0, key=key)
    else:
        tx = dpjax.add_laplace_dp_sgd_noise(
            l1_sensitivity=1.0, epsilon=1.0, rho=0.5, kappa=0.0, key=key
        )
    updates = {"w": jnp.ones((4, 3), jnp.float32)}
    jaxpr = jax.make_jaxpr(tx.update)(updates, tx.init(updates))
    assert "optimization_barrier" in str(jaxpr)


# ------------------------------------------------------------------------------------------------
# key handling in the noise transforms (these checks HOLD).
#
# * a checkpoint (flax to_bytes / from_bytes) restored into ``tx.init`` continues the stream bit
#   for bit, for threefry, rbg and unsafe_rbg keys (the impl comes from the transform's key);
# * no two coordinates of one release, no two dtype groups, no two consecutive releases, and no
#   two states of a vmapped batch share noise.
# ------------------------------------------------------------------------------------------------

serialization = pytest.importorskip("flax.serialization")


@pytest.mark.parametrize("impl", ["threefry2x32", "rbg", "unsafe_rbg"])
@pytest.mark.parametrize("make", ["gaussian", "laplace"])
def test_restored_state_continues_the_stream(impl, make):
    """Catches a checkpoint-restored noise state restarting (reusing) the noise stream."""
    key = jax.random.key(11, impl=impl)
    if make == "gaussian":
        tx = transforms.add_gaussian_noise(1.0, key=key)
    else:
        tx = transforms.add_laplace_dp_sgd_noise(
            l1_sensitivity=1.0, epsilon=1.0, rho=0.5, kappa=0.0, key=key
        )
    params = jnp.zeros(4, jnp.float32)
    first, state = tx.update(params, tx.init(params))
    second, _ = tx.update(params, state)
    restored = serialization.from_bytes(tx.init(params), serialization.to_bytes(state))
    again, _ = tx.update(params, restored)
    np.testing.assert_array_equal(np.asarray(again), np.asarray(second))
    assert not np.any(np.asarray(second) == np.asarray(first))  # not a replay


def test_no_shared_noise_across_coordinates_groups_steps_or_batched_states():
    """Catches noise shared across coordinates, dtype groups, steps or batched states."""
    tx = transforms.add_gaussian_noise(1.0, key=jax.random.key(12))
    tree = {"a": jnp.zeros(64, jnp.float32), "b": jnp.zeros(64, jnp.float64)}
    state = tx.init(tree)
    out1, state1 = tx.update(tree, state)
    out2, _ = tx.update(tree, state1)
    values = np.concatenate(
        [np.asarray(v, np.float64) for out in (out1, out2) for v in jax.tree.leaves(out)]
    )
    assert np.unique(values).size == values.size  # 256 continuous draws, all distinct
    batch = jax.vmap(lambda s: tx.update(tree, s)[0])(
        jax.tree.map(lambda x: jnp.stack([x, x]), state)
    )
    np.testing.assert_array_equal(np.asarray(batch["a"][0]), np.asarray(batch["a"][1]))
    # identical states give identical noise: the only replay risk is the caller's (a vmapped
    # batch must carry distinct keys); distinct states give distinct noise:
    states = jax.vmap(lambda k: tx.init(tree)._replace(key=jax.random.key_data(k)))(
        jax.random.split(jax.random.key(13), 2)
    )
    distinct = jax.vmap(lambda s: tx.update(tree, s)[0])(states)
    assert not np.any(np.asarray(distinct["a"][0]) == np.asarray(distinct["a"][1]))


# ------------------------------------------------------------------------------------------------
# : what reaches the noise, and the noise scale that is released.
#
# Grey-box shape (Cebere et al., "Privacy in Theory, Bugs in Practice", PETS 2026): with additive
# noise the release on D minus the release on D′ under the SAME key is the difference of the
# pre-noise values, which must be ≤ the declared sensitivity.
#
# * bfloat16 models: ``clipped_grad`` returns the clipped SUM rounded to bfloat16 (the weighted
#   row sum is a bf16 tensordot) and ``accumulate_clipped_sums`` keeps its running total in the
#   params' dtype. The noise is then drawn and added in float32, but the sum it is added to has
#   already moved by ulp_bf16(S) ≈ 2⁻⁸·|S| between neighbours: 2·C at |S| ≈ 258, 512·C at
#   |S| ≈ 65 792 (add/remove-one, declared sensitivity C).
# * Laplace DP-SGD: θ_h is rounded UP to the FIRST leaf's noise dtype; a later leaf of a narrower
#   dtype re-rounds it to nearest, below the float64 θ_h that ``laplace_dp_sgd_event`` accounts.
# ------------------------------------------------------------------------------------------------


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


# h = 37's batched and scanned checks cover every θ_i for i ≤ 37; the other h re-check the
# single jitted release at their own count (slow).
@pytest.mark.parametrize(
    "h", [1, 37] + [pytest.param(h, marks=pytest.mark.slow) for h in (4, 8, 9, 11)]
)
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
