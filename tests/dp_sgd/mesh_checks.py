"""Run in a subprocess with 8 forced CPU devices (``python -m tests.dp_sgd.mesh_checks MODE``).

Prints one JSON line (further arguments: the mesh shapes, e.g. ``1x1 2x4``; default all of
1×1, 8×1, 4×2, 2×4, 1×8). ``pieces``: per mesh shape, the clipped sum and the noisy release of
the pieces path (``sharded_clipped_grad`` + ``add_sharded_gaussian_noise``) on a fixed batch,
the release of the all-masked batch (pure noise), the releases without one example, the
per-device HLO buffers shaped like a whole leaf, and the add/remove search with bfloat16 and
float16 parameters (:func:`low_precision`; ``2x4:bfloat16`` searches bfloat16 only, ``2x4:``
neither).
``make_private``: two ``make_private`` steps per mesh shape. ``process``: one process of a
2-process ``jax.distributed`` job (4 CPU devices each, a 4×2 mesh).
"""

from __future__ import annotations

import json
import os
import sys

MESHES = [(1, 1), (8, 1), (4, 2), (2, 4), (1, 8)]
BATCH, D_IN, HIDDEN = 16, 6, 24  # HIDDEN divisible by 1, 2, 4, 8
CLIP, STD = 1.0, 3.0
LOW_DTYPES = ("bfloat16", "float16")


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


def pieces(shape, devices=None, low=LOW_DTYPES):
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
        "low_precision": low_precision(shape, devices, low),
        "clipped": tolist(clipped),
        "noisy": tolist(noisy),
        "noise_only": tolist(noise_only),
        "without": [tolist(w) for w in without],
        "num_clipped": int(num_clipped),
        "out_specs": {k: str(v.sharding.spec) for k, v in noisy.items()},
        "full_shape_buffers": full_shapes(compiled.as_text()),
    }


def low_precision_batches(dtype):
    """Structured batches of BATCH rows (x, y) in ``dtype`` for the add/remove search.

    * ladder: |x| from 10^-2 to 10^1.5 (tanh from linear to saturated), |y| from 10^2.5 down;
    * small: |x| ~ 10^U(-1.5, 0.5), |y| ~ 10^U(-1, 2.5) (unsaturated tanh: the per-example
      gradient is a product of several roundings in the parameters' dtype), two seeds;
    * hostile: NaN / ±inf features or labels, features at the dtype's max (the gradient
      overflows: dropped), subnormal features, one dominating feature, a zero input with a
      huge label, the rest ordinary.
    """
    import jax.numpy as jnp
    import numpy as np

    info = jnp.finfo(dtype)
    rng = np.random.default_rng(17)
    direction = rng.standard_normal((BATCH, D_IN))
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    batches = [(direction * np.logspace(-2, 1.5, BATCH)[:, None], np.logspace(2.5, -1.5, BATCH))]
    for _ in range(2):
        x = rng.standard_normal((BATCH, D_IN)) * 10.0 ** rng.uniform(-1.5, 0.5, (BATCH, 1))
        y = rng.choice([-1.0, 1.0], BATCH) * 10.0 ** rng.uniform(-1, 2.5, BATCH)
        batches.append((x, y))
    x = rng.standard_normal((BATCH, D_IN))
    y = rng.standard_normal(BATCH)
    x[0, 0], x[1, 1], y[2] = np.nan, np.inf, -np.inf
    x[3], x[4] = float(info.max), -float(info.max) / 2
    x[5] = float(info.smallest_subnormal) * np.arange(1, D_IN + 1)
    x[6] = np.r_[1e3, np.full(D_IN - 1, 1e-3)]
    x[7], y[7] = 0.0, float(info.max) / 4
    batches.append((x, y))
    with np.errstate(over="ignore", invalid="ignore"):
        return [(np.asarray(a, dtype), np.asarray(b, dtype)) for a, b in batches]


def low_precision(shape, devices=None, dtypes=LOW_DTYPES):
    """bfloat16 / float16 parameters: per dtype, the worst ‖S(D) − S(D without i)‖ of the
    clipped sums over the batches of :func:`low_precision_batches` (every i), whether every
    sum was finite, and the sum's dtype (float32: the noise is drawn and added in it)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import dpjax
    from dpjax.dp_sgd import sharded

    out = {}
    for name in dtypes:
        dtype = jnp.dtype(name)
        params, _, _ = problem()
        params = jax.tree.map(lambda v, d=dtype: v.astype(d), params)
        layout = sharded.mesh_layout(make_mesh(shape, devices), specs())
        grad_fn = sharded.sharded_clipped_grad(dpjax.clipped_grad(loss, l2_clip_norm=CLIP), layout)
        params = jax.device_put(params, layout.param_shardings())
        clipped = jax.jit(lambda p, x, y, mask, g=grad_fn: g(p, x, y, mask=mask)[0])
        worst, finite, full = 0.0, True, jnp.ones(BATCH, bool)
        for x, y in low_precision_batches(dtype):
            total = clipped(params, x, y, full)
            finite &= all(bool(np.all(np.isfinite(np.asarray(v)))) for v in total.values())
            for i in range(BATCH):
                rest = clipped(params, x, y, full.at[i].set(False))
                moved = sum(
                    float(np.sum((np.float64(total[k]) - np.float64(rest[k])) ** 2)) for k in total
                )
                worst = max(worst, float(np.sqrt(moved)))
        out[name] = {"worst": worst, "finite": finite, "sum_dtype": str(total["w1"].dtype)}
    return out


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
        out = pieces((4, 2), mesh.devices.reshape(-1), low=())
        out = {k: out[k] for k in ("noisy", "noise_only", "out_specs")}
        out["processes"] = jax.process_count()
        print(json.dumps(out), flush=True)
        jax.distributed.shutdown()
        return
    assert jax.device_count() == 8, os.environ.get("XLA_FLAGS")
    out = {}
    for arg in sys.argv[2:] or [f"{a}x{b}" for a, b in MESHES]:
        # "2x4:bfloat16": the low-precision dtypes to search ("2x4:" none, "2x4" all)
        name, colon, low = arg.partition(":")
        shape = tuple(int(v) for v in name.split("x"))
        if mode == "pieces":
            out[name] = pieces(
                shape, low=tuple(low.split(",") if low else ()) if colon else LOW_DTYPES
            )
        else:
            out[name] = make_private_step(shape)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
