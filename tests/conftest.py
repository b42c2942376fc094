"""Make JAX strict for the whole test suite.

* several CPU devices, so multi-device code (sharding / shard_map) is tested on a laptop;
* strict dtype promotion, so an accidental float32/float64 or int/float mix is an error;
* float64 enabled (x64): the ERM solvers and excess-risk measurements need it (their privacy
  proofs rest on exact minimisation); float32 paths are tested with explicit float32 arrays.
"""

import os

os.environ.setdefault("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=4"
# Opt-in, off by default: DPJAX_TEST_FAST_COMPILE=1 compiles with LLVM at -O0 (XLA's own HLO
# passes, fusion included, still run). The suite is compile-bound: ~15-20% less CPU. The price:
# the machine code is not the one users run and may round differently (e.g. where the optimiser
# contracts a multiply-add into an FMA), so rounding claims are then checked on the users' code
# generation only where the flag is off (e.g. `make test-slow`).
FAST_COMPILE_FLAGS = (
    "--xla_backend_optimization_level=0",
    "--xla_llvm_disable_expensive_passes=true",
)
if os.environ.get("DPJAX_TEST_FAST_COMPILE") == "1":
    for _flag in FAST_COMPILE_FLAGS:
        if _flag.split("=")[0] not in os.environ["XLA_FLAGS"]:
            os.environ["XLA_FLAGS"] += " " + _flag

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_num_cpu_devices", 4)
jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_enable_x64", True)


@pytest.fixture
def key():
    """A fixed root key; tests split it, never reuse it."""
    return jax.random.key(20261125)
