"""DP-SGD over several processes with ``jax.distributed``: one noise draw per step for the job.

Every process runs this same file. It joins the job (``jax.distributed.initialize``), builds a
global mesh over every device of every process, loads ONLY its rows of each global batch
(``distributed.process_rows``), assembles them into global arrays (``distributed.global_batch``),
and runs a jitted DP-SGD step: per-device clipped sums, ``psum`` over the whole job, then ONE
Gaussian draw from the noise key that is identical on every process (``distributed.replicate``
checks it). Every process ends with the same parameters, equal to a single-process run.

One machine, 2 processes x 2 CPU devices each (CPU collectives: gloo); from any directory once
dpjax is installed, or ``python -m examples.distributed_dp_sgd`` at the repository root::

    dpjax-example-distributed --spawn 2 --cpu-devices 2

A SLURM cluster (``jax.distributed.initialize()`` reads the SLURM variables) or a TPU pod (the
same command on every host; ``initialize()`` finds the pod)::

    srun --nodes=2 --ntasks-per-node=1 dpjax-example-distributed
    gcloud compute tpus tpu-vm ssh NAME --worker=all --command="dpjax-example-distributed"
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import optax

import dpjax
from dpjax.dp_sgd import distributed
from examples.cli import distributed_parser as build_parser

NOISE_SEED = 7  # the noise key: the SAME on every process (never derived from the process index)
STEPS = 3
GLOBAL_BATCH = 16  # a public constant: the normalizer of every step
CLIP = 1.0


@dataclass(frozen=True)
class Problem:
    """Initial parameters and one global batch per step (host arrays, float64)."""

    params: dict
    x: np.ndarray  # (steps, global batch, 6)
    y: np.ndarray  # (steps, global batch)
    mask: np.ndarray  # (steps, global batch) bool: padding rows are False


def loss(params: dict, x: jax.Array, y: jax.Array) -> jax.Array:
    """Squared error of a one-hidden-layer tanh network on ONE example."""
    h = jnp.tanh(x @ params["w1"])
    return 0.5 * (h @ params["w2"] - y) ** 2


def problem(seed: int = 0) -> Problem:
    """The data every process could build; in a real job each process LOADS only its rows."""
    rng = np.random.default_rng(seed)
    params = {"w1": rng.normal(size=(6, 8)), "w2": rng.normal(size=(8,))}
    x = rng.normal(size=(STEPS, GLOBAL_BATCH, 6))
    y = rng.normal(size=(STEPS, GLOBAL_BATCH))
    mask = rng.random((STEPS, GLOBAL_BATCH)) < 0.8
    return Problem(params, x, y, mask)


def optimizer(noise_multiplier: float, noise_key: jax.Array) -> optax.GradientTransformation:
    """DP-SGD: noise σC once per step on the global sum, ÷ the public global batch size."""
    return dpjax.dp_sgd_optimizer(
        optimizer=optax.sgd(0.1),
        noise_multiplier=noise_multiplier,
        l2_clip_norm=CLIP,
        normalizer=float(GLOBAL_BATCH),
        key=noise_key,
    )


def train(prob: Problem, noise_multiplier: float, axis_name: str = "batch") -> dict:
    """Run every step on the global mesh; return final params and what this process held."""
    mesh = jax.make_mesh(
        (jax.device_count(),), (axis_name,), axis_types=(jax.sharding.AxisType.Auto,)
    )
    grad_fn = distributed.data_parallel(
        dpjax.clipped_grad(loss, l2_clip_norm=CLIP, backend="vmap"), mesh=mesh, axis_name=axis_name
    )
    noise_key = jax.random.key(NOISE_SEED)
    distributed.assert_same_on_every_process("noise_key", noise_key)  # one draw for the job
    tx = optimizer(noise_multiplier, noise_key)
    params = distributed.replicate(prob.params, mesh)  # checks: same on every process
    opt_state = distributed.replicate(tx.init(prob.params), mesh)  # the noise key included

    @jax.jit
    def step(params, opt_state, x, y, mask):
        clipped_sum, _ = grad_fn(params, x, y, mask=mask)  # psum over the whole job
        updates, opt_state = tx.update(clipped_sum, opt_state, params)  # one draw, σC
        return optax.apply_updates(params, updates), opt_state

    rows = distributed.process_rows(mesh, GLOBAL_BATCH, axis_name)
    for t in range(STEPS):
        local = (prob.x[t, rows], prob.y[t, rows], prob.mask[t, rows])  # only this process's rows
        x, y, mask = distributed.global_batch(local, mesh, axis_name)
        params, opt_state = step(params, opt_state, x, y, mask)
    return {
        "process": jax.process_index(),
        "processes": jax.process_count(),
        "devices": jax.device_count(),
        "rows": [rows.start, rows.stop],
        "params": {k: np.asarray(v).tolist() for k, v in params.items()},
        "dtypes": {k: str(v.dtype) for k, v in params.items()},
    }


def per_process_key_is_refused(prob: Problem) -> dict[str, str | None]:
    """The footgun: a noise key derived from the process index. Both checks must refuse it."""
    mesh = jax.make_mesh((jax.device_count(),), ("batch",))
    bad_key = jax.random.key(NOISE_SEED + jax.process_index())
    refused: dict[str, str | None] = {}
    checks = {
        "assert_same_on_every_process": lambda: distributed.assert_same_on_every_process(
            "noise_key", bad_key
        ),
        "replicate": lambda: distributed.replicate(optimizer(1.0, bad_key).init(prob.params), mesh),
    }
    for name, check in checks.items():
        try:
            check()
            refused[name] = None
        except ValueError as err:
            refused[name] = str(err)
    return refused


def replicated_shared_key(mesh_axis: str = "batch") -> list[int]:
    """A typed key that IS shared: replicated over the job, its data read back on this process."""
    mesh = jax.make_mesh((jax.device_count(),), (mesh_axis,))
    key = distributed.replicate({"noise_key": jax.random.key(NOISE_SEED)}, mesh)["noise_key"]
    assert key.sharding.is_fully_replicated and len(key.sharding.device_set) == jax.device_count()
    return np.asarray(jax.random.key_data(key)).tolist()


def free_port() -> int:
    """A TCP port nobody listens on now (for the coordinator on this machine)."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def spawn(
    num_processes: int, cpu_devices: int, extra_args: list[str], timeout: float
) -> list[subprocess.CompletedProcess]:
    """Run this file as ``num_processes`` processes on this machine (a free port, CPU devices).

    When one process fails the others are killed at once (they would wait for it at the next
    collective). Returns every process's completed run, stdout/stderr captured (from files, so
    a chatty process cannot block on a full pipe).

    Raises:
        subprocess.TimeoutExpired: after killing every process, when they outlive ``timeout``
            seconds; it carries every process's output so far.
    """
    port = free_port()
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in f]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # for -m examples.…
    path = os.pathsep.join([root] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=path)
    env["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={cpu_devices}"])
    base = [sys.executable, "-m", "examples.distributed_dp_sgd", "--cpu-devices", str(cpu_devices)]
    base += ["--coordinator", f"localhost:{port}", "--num-processes", str(num_processes)]
    with contextlib.ExitStack() as stack:
        files = [
            (
                stack.enter_context(tempfile.TemporaryFile("w+")),
                stack.enter_context(tempfile.TemporaryFile("w+")),
            )
            for _ in range(num_processes)
        ]
        procs = [
            subprocess.Popen(
                [*base, "--process-id", str(i), *extra_args],
                env=env,
                cwd=root,
                stdout=out,
                stderr=err,
                text=True,
            )
            for i, (out, err) in enumerate(files)
        ]
        timed_out = not _wait_all_or_first_failure(procs, time.monotonic() + timeout)
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        texts = [(_read(out), _read(err)) for out, err in files]
    if timed_out:
        joined = [f"--- process {i} ---\n{o}\n{e}" for i, (o, e) in enumerate(texts)]
        raise subprocess.TimeoutExpired(base, timeout, output="\n".join(joined))
    return [
        subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        for proc, (out, err) in zip(procs, texts, strict=True)
    ]


def _wait_all_or_first_failure(procs: list[subprocess.Popen], deadline: float) -> bool:
    """Wait until every process ended or one failed (True), or the deadline passed (False)."""
    while time.monotonic() < deadline:
        codes = [proc.poll() for proc in procs]
        if all(code is not None for code in codes) or any(code for code in codes):
            return True
        time.sleep(0.1)
    return False


def _read(file) -> str:
    file.seek(0)
    return file.read()


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    args = build_parser(prog).parse_args(argv)
    if args.spawn:
        extra = ["--noise-multiplier", str(args.noise_multiplier)] + ["--x64"] * args.x64
        for run in spawn(args.spawn, args.cpu_devices or 2, extra, timeout=300):
            print(run.stdout, end="")
            print(run.stderr, end="", file=sys.stderr)
            if run.returncode:
                sys.exit(run.returncode)
        return
    if args.cpu_devices:
        jax.config.update("jax_num_cpu_devices", args.cpu_devices)
        jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU cross-process
    jax.config.update("jax_enable_x64", args.x64)
    if args.coordinator:
        jax.distributed.initialize(args.coordinator, args.num_processes, args.process_id)
    else:
        jax.distributed.initialize()  # SLURM, TPU pods, ... : read from the environment
    prob = problem()
    result = train(prob, args.noise_multiplier)
    if args.check_key_mismatch:
        result["per_process_key_refused"] = per_process_key_is_refused(prob)
        result["shared_key_replicated"] = replicated_shared_key()
    print(json.dumps(result), flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
