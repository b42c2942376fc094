"""Make JAX strict for the whole test suite.

* several CPU devices, so multi-device code (sharding / shard_map) is tested on a laptop;
* strict dtype promotion, so an accidental float32/float64 or int/float mix is an error;
* float64 enabled (x64): the ERM solvers and excess-risk measurements need it (their privacy
  proofs rest on exact minimisation); float32 paths are tested with explicit float32 arrays.

It also gives each pytest run a persistent compilation cache (see `pytest_configure`) and, when
DPJAX_TEST_FAST_COMPILE=1 (the first pass of `make test`), compiles with LLVM at -O0 and skips the
`codegen` tests (see FAST_COMPILE_FLAGS).
"""

import os
import pathlib
import re
import shutil
import tempfile

os.environ.setdefault("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=4"
# Fast compiles (off by default, so a plain `pytest` runs every test on the users' code generation;
# DPJAX_TEST_FAST_COMPILE=1, set by the first pass of `make test`, turns them on): LLVM at -O0, and
# XLA's older loop emitters for fusions instead of its MLIR fusion emitters (XLA's HLO passes,
# fusion included, still run; only how a fusion becomes machine code changes). The suite is
# compile-bound. Measured, one process on one core: tests/dp_sgd/test_make_private.py +
# test_noise_transforms.py 81 -> 64 CPU-s with -O0 (-21 %); tests/erm, test_make_private.py,
# test_peer_known_bugs.py and tests/auditing/test_audit_mechanisms.py at -O0 206 -> 128 CPU-s
# with the loop emitters as well (-38 %).
# The price: at -O3 the CPU backend contracts a * b + c into one FMA (one rounding), at -O0 it does
# not (two roundings), and the two emitters need not round alike, so the last bit of a float result
# can differ from the code users run
# (checked: jit(a * b + c) in float32 equals the FMA on every element at -O3, on 77 % at -O0).
# `--xla_llvm_disable_expensive_passes` or `--xla_cpu_parallel_codegen_split_count=1` alone keep
# the users' bits but save nothing (measured). So a test whose claim is about rounding in compiled
# code (certified bounds, float32 clipping within C, sampler support ends, rounding direction,
# bit equality of two different compiled programs)
# carries the `codegen` marker: under fast compiles it is skipped (`pytest_collection_modifyitems`)
# and `make test` runs it in a second pass without the switch, on the users' code.
# Subprocesses started by a test (README blocks, the multi-process test) inherit XLA_FLAGS.
FAST_COMPILE_SWITCH = "DPJAX_TEST_FAST_COMPILE"
FAST_COMPILE = os.environ.get(FAST_COMPILE_SWITCH, "0") == "1"
FAST_COMPILE_FLAGS = (
    "--xla_backend_optimization_level=0",
    "--xla_llvm_disable_expensive_passes=true",
    "--xla_cpu_use_fusion_emitters=false",
)
if FAST_COMPILE:
    for _flag in FAST_COMPILE_FLAGS:
        if _flag.split("=")[0] not in os.environ["XLA_FLAGS"]:
            os.environ["XLA_FLAGS"] += " " + _flag

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_num_cpu_devices", 4)
jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_enable_x64", True)


# JAX's persistent compilation cache, one fresh directory per run. The suite is compile-bound and
# many tests build an equal program again (a new `make_private` or `jax.jit` of an equal function
# misses JAX's in-memory cache, which is keyed by the Python function). A hit loads the executable
# XLA built for the same program, XLA flags, compile options and devices (the cache key hashes
# them all), so results are bit-identical. The controller makes the directory and deletes it when
# the run ends: no state carries from one run (or checkout) to the next. Each xdist worker writes
# its own sub-directory (JAX's cache writes are not atomic across processes; the hits are within
# a worker anyway: in tests/dp_sgd's training files 1 of 285 distinct programs recurred in another
# file; and the cache key hashes the compile options, which hold a path inside the cache
# directory, so two directories never share an entry). Compiles under CACHE_MIN_COMPILE_S are
# not written (a read costs about as much). Measured (2 workers, shared machine):
# tests/dp_sgd/test_workflow_privacy.py and tests/mechanisms/test_nonfinite_records.py
# 121 -> 71 CPU-s. DPJAX_TEST_COMPILATION_CACHE=0: off.
CACHE_SWITCH = "DPJAX_TEST_COMPILATION_CACHE"
CACHE_MIN_COMPILE_S = 0.1
_CACHE_DIR = pytest.StashKey[str]()
_WORKER_INPUT = "dpjax_compilation_cache_dir"


def pytest_configure(config):
    """Point JAX at this run's compilation cache (made by the controller, one sub-dir a worker)."""
    if os.environ.get(CACHE_SWITCH) == "0":
        return
    worker = getattr(config, "workerinput", None)
    if worker is None:
        cache_dir = tempfile.mkdtemp(prefix="dpjax-test-xla-cache-")
        config.stash[_CACHE_DIR] = cache_dir
    elif worker.get(_WORKER_INPUT):
        cache_dir = os.path.join(worker[_WORKER_INPUT], worker["workerid"])
    else:
        return
    jax.config.update("jax_compilation_cache_dir", cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", CACHE_MIN_COMPILE_S)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """pytest-xdist: tell each worker the run's cache directory."""
    node.workerinput[_WORKER_INPUT] = node.config.stash.get(_CACHE_DIR, None)


def pytest_unconfigure(config):
    """Delete the run's cache (controller or serial run only)."""
    cache_dir = config.stash.get(_CACHE_DIR, None)
    if cache_dir:
        shutil.rmtree(cache_dir, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    """Skip the `codegen` tests under fast compiles: their claims hold for the users' -O3 code."""
    if not FAST_COMPILE:
        return
    skip = pytest.mark.skip(
        reason=f"rounding claim of compiled code: unset {FAST_COMPILE_SWITCH} (make test does)"
    )
    for item in items:
        if item.get_closest_marker("codegen"):
            _check_names_codegen(item)
            item.add_marker(skip)


def _check_names_codegen(item):
    """`make test`'s second pass collects only the test files whose text names `codegen`
    (Makefile: CODEGEN_FILES); a test marked from elsewhere (a helper module, a conftest) would
    run in neither pass, so the first pass refuses it."""
    path = pathlib.Path(str(item.fspath))
    if re.search(r"\bcodegen\b", path.read_text()) is None:
        raise pytest.UsageError(
            f"{item.nodeid} carries the codegen marker but its file does not name it: put "
            "`pytestmark = pytest.mark.codegen` or `@pytest.mark.codegen` in the file"
        )


@pytest.fixture
def key():
    """A fixed root key; tests split it, never reuse it."""
    return jax.random.key(20261125)
