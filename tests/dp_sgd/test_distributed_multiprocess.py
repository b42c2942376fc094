"""DP-SGD over 2 processes (jax.distributed, 2 CPU devices each, gloo collectives).

The module launches ``examples/distributed_dp_sgd.py`` as two real processes once (free port,
timeout, both killed on failure, both outputs captured) and checks what the issue asks: every
process ends with bit-identical parameters, equal to a single-process reference computed HERE
with the plain (unsharded) ``clipped_grad`` and the same keys and data; the noise is drawn once
(σ > 0: the result matches the reference drawn from the same key, and is far from the
noiseless run); each process held only its rows; a per-process noise key is refused. If CPU
collectives do not work in the installed jax, the launch fails and these tests FAIL (no skip).
"""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dpjax
from dpjax.dp_sgd import distributed
from examples import distributed_dp_sgd as example

TIMEOUT_S = 300  # per launch; it takes ~5 s on an idle 2-core machine, ~20 s on a busy one


def launch(args: list[str]) -> list[dict]:
    runs = example.spawn(num_processes=2, cpu_devices=2, extra_args=args, timeout=TIMEOUT_S)
    for i, run in enumerate(runs):
        assert run.returncode == 0, f"process {i} failed:\n{run.stdout}\n{run.stderr}"
    return [json.loads(run.stdout.strip().splitlines()[-1]) for run in runs]


@pytest.fixture(scope="module")
def results():
    """float64 (x64 on), to compare with the reference to float64 rounding."""
    return launch(["--x64", "--noise-multiplier", "1.0"])


@pytest.fixture(scope="module")
def float32_results():
    """JAX's default (x64 off, float64 host data): the path most users take; key checks."""
    return launch(["--noise-multiplier", "1.0", "--check-key-mismatch"])


@functools.cache
def reference_params(noise_multiplier: float) -> dict:
    """One process, one device, the unsharded clipped sum: the same keys, data and steps."""
    prob = example.problem()
    grad_fn = dpjax.clipped_grad(example.loss, l2_clip_norm=1.0, backend="vmap")
    tx = dpjax.dp_sgd_optimizer(
        optimizer=optax.sgd(0.1),
        noise_multiplier=noise_multiplier,
        l2_clip_norm=1.0,
        normalizer=16.0,
        key=jax.random.key(example.NOISE_SEED),
    )

    @jax.jit
    def step(params, state, x, y, mask):
        clipped_sum, _ = grad_fn(params, x, y, mask=mask)
        updates, state = tx.update(clipped_sum, state, params)
        return optax.apply_updates(params, updates), state

    params = jax.tree.map(jnp.asarray, prob.params)
    state = tx.init(params)
    for t in range(prob.x.shape[0]):
        params, state = step(params, state, prob.x[t], prob.y[t], prob.mask[t])
    return {k: np.asarray(v) for k, v in params.items()}


def test_two_processes_four_devices_each_holding_its_own_rows(results):
    assert [r["process"] for r in results] == [0, 1]
    assert all(r["processes"] == 2 and r["devices"] == 4 for r in results)
    assert [r["rows"] for r in results] == [[0, 8], [8, 16]]


def test_every_process_ends_with_identical_params(results):
    assert results[0]["params"] == results[1]["params"]  # bit for bit (float64 via JSON repr)


def test_equal_to_the_single_process_reference_with_the_same_noise_key(results):
    ref = reference_params(noise_multiplier=1.0)
    for name, value in ref.items():
        np.testing.assert_allclose(np.array(results[0]["params"][name]), value, rtol=1e-9)


def test_the_noise_is_real_so_the_equality_above_pins_one_draw(results):
    """The noiseless run is far away: the match above is the SAME draw, not a small one.

    Per-process noise (or noise per device) would move each coordinate by O(0.1·σC/16) per
    step — 1e7 times the tolerance of the reference comparison.
    """
    noiseless = reference_params(noise_multiplier=0.0)
    gap = max(np.max(np.abs(np.array(results[0]["params"][k]) - v)) for k, v in noiseless.items())
    assert gap > 1e-3


def test_float32_default_run_ends_identical_on_every_process(float32_results):
    """x64 off: float64 host params are placed as float32 (jax 0.10's device_put failed here)."""
    assert all(r["dtypes"] == {"w1": "float32", "w2": "float32"} for r in float32_results)
    assert float32_results[0]["params"] == float32_results[1]["params"]
    ref = reference_params(noise_multiplier=1.0)  # float64 noise differs: only close-ish
    gap = max(np.max(np.abs(np.array(float32_results[0]["params"][k]) - v)) for k, v in ref.items())
    assert gap < 0.1


def test_a_per_process_noise_key_is_refused(float32_results):
    """Without the checks the run still completes, with different params on each process."""
    for r in float32_results:
        refused = r["per_process_key_refused"]
        direct, placed = refused["assert_same_on_every_process"], refused["replicate"]
        assert direct is not None and placed is not None, f"a per-process key passed: {refused}"
        assert direct.startswith("noise_key must be identical on every process")
        assert placed.startswith("tree must be identical on every process")
        assert "key" in placed  # the differing leaf: the noise state's key data


def test_a_shared_typed_key_is_replicated_over_both_processes(float32_results):
    expected = np.asarray(jax.random.key_data(jax.random.key(example.NOISE_SEED))).tolist()
    assert [r["shared_key_replicated"] for r in float32_results] == [expected, expected]


# ---- the helpers with ONE process (conftest: 4 CPU devices) -------------------------------


@pytest.fixture
def mesh():
    return jax.make_mesh((4,), ("batch",), axis_types=(jax.sharding.AxisType.Auto,))


def test_one_process_holds_every_row(mesh):
    assert distributed.process_rows(mesh, 12) == slice(0, 12)


def test_global_batch_shards_rows_over_the_local_devices(mesh):
    x = np.arange(24.0).reshape(8, 3)
    (gx,) = distributed.global_batch((x,), mesh)
    np.testing.assert_array_equal(np.asarray(gx), x)
    assert {s.data.shape for s in gx.addressable_shards} == {(2, 3)}


def test_replicate_places_a_typed_key_on_every_device(mesh):
    key = jax.random.key(3)
    out = distributed.replicate({"k": key}, mesh)["k"]
    assert len(out.sharding.device_set) == 4 and out.sharding.is_fully_replicated
    np.testing.assert_array_equal(jax.random.key_data(out), jax.random.key_data(key))


def test_helpers_validate(mesh):
    with pytest.raises(ValueError, match="global_batch_size must be a multiple of the 4"):
        distributed.process_rows(mesh, 10)
    with pytest.raises(ValueError, match="global_batch_size must be a positive"):
        distributed.process_rows(mesh, 0)
    with pytest.raises(ValueError, match="axis_name must be one of the mesh axes"):
        distributed.process_rows(mesh, 8, axis_name="data")
    with pytest.raises(ValueError, match="local_batch must be a multiple of this process's 4"):
        distributed.global_batch((np.zeros((6, 2)),), mesh)
    with pytest.raises(ValueError, match="batch"):
        distributed.global_batch((np.zeros((8, 2)), np.zeros(4)), mesh)
    distributed.assert_same_on_every_process("key", jax.random.key(0))  # one process: trivial
