"""Run in a subprocess with 8 forced CPU devices (``python -m tests.dp_sgd.mesh_checks MODE``).

Prints one JSON line (further arguments: the mesh shapes, e.g. ``1x1 2x4``; default all of
1×1, 8×1, 4×2, 2×4, 1×8). ``pieces``: per mesh shape, the clipped sum and the noisy release of
the pieces path (``sharded_clipped_grad`` + ``add_sharded_gaussian_noise``) on a fixed batch,
the release of the all-masked batch (pure noise), the releases without one example, and the
per-device HLO buffers shaped like a whole leaf. ``make_private``: two ``make_private`` steps
per mesh shape. ``process``: one process of a 2-process ``jax.distributed`` job (4 CPU devices
each, a 4×2 mesh).
"""

from __future__ import annotations

import json
import os
import sys

MESHES = [(1, 1), (8, 1), (4, 2), (2, 4), (1, 8)]
BATCH, D_IN, HIDDEN = 16, 6, 24  # HIDDEN divisible by 1, 2, 4, 8
CLIP, STD = 1.0, 3.0


def loss(p, x, y):
    import jax.numpy as jnp

    h = jnp.tanh(x @ p["w1"] + p["b1"])
    return 0.5 * (h @ p["w2"] - y) ** 2


def problem():
    import jax

    k = jax.random.split(jax.random.key(0), 4)
    params = {
        "w1": jax.random.normal(k[0], (D_IN, HIDDEN)),
        "b1": jax.random.normal(k[1], (HIDDEN,)),
        "w2": jax.random.normal(k[2], (HIDDEN,)),
    }
    x = jax.random.normal(k[3], (BATCH, D_IN))
    y = jax.numpy.arange(BATCH, dtype=x.dtype) / 4.0
    return params, x, y


def specs():
    from jax.sharding import PartitionSpec as P

    return {"w1": P(None, "model"), "b1": P("model"), "w2": P("model")}


def make_mesh(shape, devices=None):
    import jax

    auto = (jax.sharding.AxisType.Auto,) * 2
    devices = jax.devices()[: shape[0] * shape[1]] if devices is None else devices
    return jax.make_mesh(shape, ("data", "model"), axis_types=auto, devices=devices)


def tolist(tree):
    import numpy as np

    return {k: np.asarray(v).tolist() for k, v in tree.items()}


def full_shapes(hlo: str) -> list[str]:
    """Per-device buffers shaped like a whole w1 (or its per-example / noise-word stacks)."""
    needle = f"{D_IN},{HIDDEN}]"
    return sorted({line.split("=")[0].strip() for line in hlo.splitlines() if needle in line})


def pieces(shape, devices=None):
    import jax
    import jax.numpy as jnp

    import dpjax
    from dpjax.dp_sgd import sharded

    params, x, y = problem()
    layout = sharded.mesh_layout(make_mesh(shape, devices), specs())
    grad_fn = sharded.sharded_clipped_grad(dpjax.clipped_grad(loss, l2_clip_norm=CLIP), layout)
    tx = sharded.add_sharded_gaussian_noise(STD, key=jax.random.key(7), layout=layout)
    params = jax.device_put(params, layout.param_shardings())
    state = tx.init(params)

    def release(p, st, x, y, mask):
        clipped, info = grad_fn(p, x, y, mask=mask)
        noisy, _ = tx.update(clipped, st, p)
        return clipped, noisy, info.num_clipped

    mask = jnp.ones(BATCH, bool)
    compiled = jax.jit(release).lower(params, state, x, y, mask).compile()
    clipped, noisy, num_clipped = compiled(params, state, x, y, mask)
    _, noise_only, _ = compiled(params, state, x, y, jnp.zeros(BATCH, bool))
    without = [compiled(params, state, x, y, mask.at[i].set(False))[1] for i in (0, 5)]
    return {
        "clipped": tolist(clipped),
        "noisy": tolist(noisy),
        "noise_only": tolist(noise_only),
        "without": [tolist(w) for w in without],
        "num_clipped": int(num_clipped),
        "out_specs": {k: str(v.sharding.spec) for k, v in noisy.items()},
        "full_shape_buffers": full_shapes(compiled.as_text()),
    }


def make_private_step(shape):
    import jax
    import optax

    import dpjax
    from dpjax.dp_sgd import sharded

    params, x, y = problem()
    x, y = jax.numpy.tile(x, (8, 1)), jax.numpy.tile(y, 8)  # 128 records
    layout = sharded.mesh_layout(make_mesh(shape), specs())
    private = dpjax.make_private(
        lambda p, ex: loss(p, ex["x"], ex["y"]),
        optimizer=optax.sgd(0.5),
        l2_clip_norm=CLIP,
        dataset_size=8 * BATCH,
        batch_size=8,
        steps=2,
        noise_multiplier=1.0,
        delta=1e-5,
        key=jax.random.key(3),
        layout=layout,
    )
    params = jax.device_put(params, layout.param_shardings())
    state = private.init(params)
    for _ in range(2):
        params, state, _ = private.step(params, state, {"x": x, "y": y})
    return {"params": tolist(params), "specs": {k: str(v.sharding.spec) for k, v in params.items()}}


def main(mode: str) -> None:
    import jax

    if mode == "process":  # python -m tests.dp_sgd.mesh_checks process PORT ID
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(f"localhost:{sys.argv[2]}", 2, int(sys.argv[3]))
        mesh = make_mesh((4, 2), jax.devices())
        out = pieces((4, 2), mesh.devices.reshape(-1))
        out = {k: out[k] for k in ("noisy", "noise_only", "out_specs")}
        out["processes"] = jax.process_count()
        print(json.dumps(out), flush=True)
        jax.distributed.shutdown()
        return
    assert jax.device_count() == 8, os.environ.get("XLA_FLAGS")
    run = pieces if mode == "pieces" else make_private_step
    shapes = [tuple(int(v) for v in s.split("x")) for s in sys.argv[2:]] or MESHES
    print(json.dumps({f"{a}x{b}": run((a, b)) for a, b in shapes}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
