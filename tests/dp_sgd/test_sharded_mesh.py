"""DP-SGD with parameters sharded over a (data, model) mesh: same release on every mesh shape.

The mesh checks run in a subprocess with 8 forced CPU devices (``tests/dp_sgd/mesh_checks.py``):
the default suite runs the two ends (1×1 and 2×4: both axes sharded; the add/remove search with
bfloat16 parameters on both, float16 on 2×4), the slow suite every shape (1×1, 8×1, 4×2, 2×4,
1×8) with both low-precision dtypes, ``make_private`` on each, and a two-process
``jax.distributed`` job. The cheap checks (layout validation, the noise's law and its
independence of the sharding on this process's 4 devices) run in process.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import dpjax
from dpjax.dp_sgd import _certified, sharded
from tests.dp_sgd import mesh_checks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT_S = 600


def _env(devices: int) -> dict:
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in f]
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, JAX_ENABLE_X64="0")
    env["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={devices}"])
    return env


def run_checks(*args: str) -> dict:
    cmd = [sys.executable, "-m", "tests.dp_sgd.mesh_checks", *args]
    out = subprocess.run(
        cmd, env=_env(8), cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def two_ends():
    return run_checks("pieces", "1x1:bfloat16", "2x4:bfloat16,float16")


@pytest.fixture(scope="module")
def every_shape():
    return run_checks("pieces")


def _arrays(tree: dict) -> dict:
    return {k: np.asarray(v, np.float32) for k, v in tree.items()}


def _l2(a: dict, b: dict) -> float:
    return float(np.sqrt(sum(np.sum((np.float64(a[k]) - np.float64(b[k])) ** 2) for k in a)))


def check_same_release(results: dict) -> None:
    """Noise bit-identical on every shape; the noisy release equal up to the clipped sum's
    rounding. The sharded forward pass adds h·w2 over the model axis in another order, so a
    per-example gradient moves by a few ulps (relative γ_HIDDEN per contraction): over B
    clipped rows of norm ≤ C that is ≤ B·C·γ_HIDDEN·4 per coordinate."""
    ref = results["1x1"]
    tol = mesh_checks.BATCH * mesh_checks.CLIP * _certified.gamma(mesh_checks.HIDDEN, "float32") * 4
    for name, res in results.items():
        for leaf, value in _arrays(res["noise_only"]).items():
            np.testing.assert_array_equal(value, _arrays(ref["noise_only"])[leaf], err_msg=name)
        for leaf, value in _arrays(res["noisy"]).items():
            np.testing.assert_allclose(value, _arrays(ref["noisy"])[leaf], rtol=0, atol=tol)
        assert res["num_clipped"] == ref["num_clipped"]


def check_add_remove(results: dict) -> None:
    """Same key, one example masked out: the difference of the two releases is S − S′."""
    for name, res in results.items():
        for without in res["without"]:
            moved = _l2(_arrays(res["noisy"]), _arrays(without))
            assert 0.9 * mesh_checks.CLIP < moved <= mesh_checks.CLIP, (name, moved)


def check_low_precision(results: dict) -> None:
    """bfloat16 / float16 parameters, the structured batches of
    :func:`mesh_checks.low_precision_batches` (unsaturated and saturated tanh, NaN/inf, the
    dtype's max, subnormals): removing any one example moves the clipped sum by ≤ C, every sum
    is finite and float32 (the noise is drawn and added in float32). Without one stored copy of
    the per-example gradients (XLA recomputed the bfloat16 gradient with excess precision in
    the sum's fusion, not in the norm's) the 1×1 mesh moved it by 1.00044·C."""
    for name, res in results.items():
        for dtype, low in res["low_precision"].items():
            assert low["finite"], (name, dtype)
            assert low["sum_dtype"] == "float32", (name, dtype, low["sum_dtype"])
            assert 0.9 * mesh_checks.CLIP < low["worst"] <= mesh_checks.CLIP, (name, dtype, low)


def check_no_full_size_buffers(results: dict) -> None:
    for name, res in results.items():
        model = int(name.split("x")[1])
        if model == 1:  # the check finds the full leaves where they must exist
            assert res["full_shape_buffers"], name
        else:
            assert res["full_shape_buffers"] == [], (name, res["full_shape_buffers"][:5])
            assert res["out_specs"] == {k: str(v) for k, v in mesh_checks.specs().items()}


def test_two_mesh_ends_release_the_same_noise_and_sum(two_ends):
    check_same_release(two_ends)


def test_two_mesh_ends_one_example_moves_the_release_by_at_most_c(two_ends):
    check_add_remove(two_ends)


def test_two_mesh_ends_low_precision_params_move_the_clipped_sum_by_at_most_c(two_ends):
    assert set(two_ends["1x1"]["low_precision"]) == {"bfloat16"}
    assert set(two_ends["2x4"]["low_precision"]) == {"bfloat16", "float16"}
    check_low_precision(two_ends)


def test_sharded_mesh_holds_no_full_size_noise_or_gradient_buffer(two_ends):
    check_no_full_size_buffers(two_ends)


@pytest.mark.slow
def test_every_mesh_shape_same_release_sensitivity_and_memory(every_shape):
    check_same_release(every_shape)
    check_add_remove(every_shape)
    check_low_precision(every_shape)
    check_no_full_size_buffers(every_shape)


@pytest.mark.slow
def test_make_private_on_every_mesh_shape_agrees_with_one_device():
    results = run_checks("make_private")
    ref = _arrays(results["1x1"]["params"])
    for name, res in results.items():
        for leaf, value in _arrays(res["params"]).items():
            np.testing.assert_allclose(value, ref[leaf], rtol=0, atol=1e-4, err_msg=name)
        if name in ("2x4", "1x8"):
            assert res["specs"] == {k: str(v) for k, v in mesh_checks.specs().items()}


@pytest.mark.slow
def test_two_processes_release_what_one_process_releases():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = str(s.getsockname()[1])
    cmd = [sys.executable, "-m", "tests.dp_sgd.mesh_checks", "process", port]
    procs = [
        subprocess.Popen(
            [*cmd, str(i)],
            env=_env(4),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    try:
        outs = [p.communicate(timeout=TIMEOUT_S) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-4000:]
    two = [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]
    one = run_checks("pieces", "4x2:")["4x2"]
    assert [r["processes"] for r in two] == [2, 2]
    for r in two:
        for leaf in one["noisy"]:
            np.testing.assert_array_equal(
                _arrays(r["noise_only"])[leaf], _arrays(one["noise_only"])[leaf]
            )
            np.testing.assert_array_equal(_arrays(r["noisy"])[leaf], _arrays(one["noisy"])[leaf])


# ---- in process (conftest: 4 CPU devices) ------------------------------------------------


def _mesh(shape):
    auto = (jax.sharding.AxisType.Auto,) * 2
    n = shape[0] * shape[1]
    return jax.make_mesh(shape, ("data", "model"), axis_types=auto, devices=jax.devices()[:n])


@pytest.mark.slow
def test_noise_is_the_same_on_every_sharding_of_four_devices():
    key = jax.random.key(11)
    ref = np.asarray(sharded.sharded_normal(key, (8, 12)))
    for shape, spec in [((1, 4), P(None, "model")), ((2, 2), P("model")), ((4, 1), P())]:
        layout = sharded.mesh_layout(_mesh(shape), spec)
        sharding = layout.sharding(spec)
        z = jax.jit(lambda k, s=sharding: sharded.sharded_normal(k, (8, 12), s))(key)
        np.testing.assert_array_equal(np.asarray(z), ref)


def test_sharded_normal_has_unit_variance_and_rejects_a_wrong_scale():
    """n = 2·10⁵ draws: the variance estimate has sd √(2/n) = 0.0032; 5 sd = 0.016 accepts 1
    and rejects 1.05² = 1.1025 (and 0.95²)."""
    z = np.asarray(sharded.sharded_normal(jax.random.key(5), (200_000,)), np.float64)
    tol = 5 * np.sqrt(2 / z.size)
    assert abs(z.var() - 1.0) < tol
    assert abs(z.mean()) < 5 / np.sqrt(z.size)
    assert abs(z.var() - 1.05**2) > tol and abs(z.var() - 0.95**2) > tol
    assert np.max(np.abs(z)) < 9.2


def test_layout_refuses_specs_on_the_data_axis_and_unknown_axes():
    mesh = _mesh((2, 2))
    with pytest.raises(ValueError, match="param_specs"):
        sharded.mesh_layout(mesh, {"w": P("data")})
    with pytest.raises(ValueError, match="model_axis"):
        sharded.mesh_layout(mesh, {"w": P()}, model_axis="tensor")
    layout = sharded.mesh_layout(mesh, {"w": P("model")})
    grad_fn = sharded.sharded_clipped_grad(
        dpjax.clipped_grad(lambda p, x: jnp.sum(p["w"] * x), l2_clip_norm=1.0), layout
    )
    with pytest.raises(ValueError, match="divisible"):
        grad_fn({"w": jnp.ones(3)}, jnp.ones((4, 3)))


def test_make_private_refuses_micro_batches_on_a_mesh():
    layout = sharded.mesh_layout(_mesh((2, 2)), {"w": P("model")})
    with pytest.raises(ValueError, match="physical_batch_size"):
        dpjax.make_private(
            lambda w, ex: jnp.sum(w * ex),
            optimizer=optax.sgd(0.1),
            l2_clip_norm=1.0,
            dataset_size=8,
            batch_size=4,
            steps=1,
            noise_multiplier=1.0,
            delta=1e-5,
            key=jax.random.key(0),
            physical_batch_size=2,
            layout=layout,
        )


def test_the_shrink_factor_is_the_same_on_every_mesh_shape_and_covers_two_roundings():
    """f is certified for the depth of any split of the rows: one value for every mesh."""
    base = dpjax.clipped_grad(lambda p, x: jnp.sum(p["w"] * x), l2_clip_norm=1.0)
    shrinks = {
        shape: sharded.sharded_clipped_grad(
            base, sharded.mesh_layout(_mesh(shape), {"w": P("model")})
        ).summation_shrink(256)
        for shape in [(1, 1), (4, 1), (2, 2), (1, 4)]
    }
    assert len(set(shrinks.values())) == 1
    two_roundings = _certified.summation_shrink(256, stages=2, depth=2 * (8 + 1) + 2)
    assert shrinks[(1, 1)] == two_roundings < base.summation_shrink(256) < 1.0


def test_a_mesh_refuses_a_clipped_grad_built_to_be_accumulated():
    """``rows_per_release`` promises that the clip norm covers adding several calls' sums;
    the mesh path certifies one call's two roundings only (its shrink ignored the promise:
    0.99994 for 256 rows, where 4096 accumulated rows need ≤ 0.9991), so it must refuse."""
    layout = sharded.mesh_layout(_mesh((2, 2)), {"w": P("model")})
    base = dpjax.clipped_grad(
        lambda p, x: jnp.sum(p["w"] * x), l2_clip_norm=1.0, rows_per_release=4096
    )
    with pytest.raises(ValueError, match="rows_per_release"):
        sharded.sharded_clipped_grad(base, layout)


def test_make_private_refuses_ghost_clipping_on_a_mesh():
    """The mesh path materialises the per-example gradients: clipping="ghost" ran silently
    as vmap (memory the caller chose ghost to avoid), so it is refused by name."""
    layout = sharded.mesh_layout(_mesh((2, 2)), {"w": P("model")})
    with pytest.raises(ValueError, match="clipping"):
        dpjax.make_private(
            lambda w, ex: jnp.sum(w["w"] * ex),
            optimizer=optax.sgd(0.1),
            l2_clip_norm=1.0,
            dataset_size=1000,
            batch_size=8,
            steps=1,
            noise_multiplier=1.0,
            delta=1e-5,
            key=jax.random.key(0),
            clipping="ghost",
            layout=layout,
        )


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_sharded_noise_on_low_precision_updates_is_float32_noise_cast_once(dtype):
    """bfloat16/float16 updates given straight to ``add_sharded_gaussian_noise`` (make_private
    hands it float32 sums): the noise is drawn and added in float32 and the sum cast once, so
    the release is exactly the float32 release cast to the dtype. Not the 16-bit sampler: its
    reach is 2.89 (bf16) / 3.49 (fp16) with at most 2^nmant + 1 values; n = 32768 draws of the
    float32 sampler reach ≈ 4.1 (P(max < 3.5) ≈ 2e-7). The std is 1 within 5·√(1/2n) (≈ 2 %;
    the 16-bit rounding moves it by < 0.4 %) and not 1.05. A stddev float16 cannot hold is
    refused, as by add_gaussian_noise."""
    layout = sharded.mesh_layout(_mesh((2, 2)), {"w": P("model")})
    n = 32768

    def noisy(updates):
        tx = sharded.add_sharded_gaussian_noise(1.0, key=jax.random.key(3), layout=layout)
        return tx.update(updates, tx.init(updates), updates)[0]["w"]

    low = noisy({"w": jnp.zeros(n, dtype)})
    wide = noisy({"w": jnp.zeros(n, jnp.float32)})
    assert low.dtype == dtype and wide.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(low), np.asarray(wide.astype(dtype)))
    values = np.asarray(low, np.float64)
    assert np.max(np.abs(values)) > 3.5
    assert np.unique(values).size > 1100  # 16-bit sampler: ≤ 1025 values
    tol = 5 * np.sqrt(1 / (2 * n))
    assert abs(values.std() - 1.0) < tol < abs(values.std() - 1.05)
    big = sharded.add_sharded_gaussian_noise(1e4, key=jax.random.key(3), layout=layout)
    half = {"w": jnp.zeros(8, jnp.float16)}
    with pytest.raises(ValueError, match="stddev"):
        big.update(half, big.init(half), half)


def test_sharded_noise_refuses_a_std_the_device_flushes_to_zero():
    """σ·C = 1e-40 is subnormal in float32: the device flushed the (rounded-up) scale to 0 and
    released the sum without noise; refused as by add_gaussian_noise."""
    layout = sharded.mesh_layout(_mesh((1, 1)), {"w": P("model")})
    tx = sharded.add_sharded_gaussian_noise(1e-40, key=jax.random.key(3), layout=layout)
    updates = {"w": jnp.zeros(8, jnp.float32)}
    with pytest.raises(ValueError, match="noise scale"):
        tx.update(updates, tx.init(updates), updates)
