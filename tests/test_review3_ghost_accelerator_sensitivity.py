"""Review 3 (adversarial): ghost clipping's sensitivity under the ACCELERATOR policy, forced on
the CPU, with narrow dtypes and extreme rows.

Each example's removal must move the released (rounded) sum by at most C in ℓ2, whatever its
magnitude (1e±30 in float32: squares overflow float32), with bfloat16 / float16 parameters
and inputs (book-kept per-example matrices of a narrow dtype), a NaN or inf row (counted bad
and dropped), and rows that cancel in the sum.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpjax.dp_sgd import _ghost_policy, ghost

B = 6
# (T, K): K·K = 16384 > 2·T·2K: the Gram path (streamed sum, accurate retry, batched by
# 16 under ACCELERATOR); K·K = 9216 ≤ 2·T·2K: book-kept (per-example matrices formed)
SHAPES = [(8, 128), (32, 96)]
CLIP = 0.05


def seq_loss(p, x):
    return jnp.sum((x @ p["w"]) @ p["head"])


def _released(params, x, mask):
    total, _, bad = ghost.ghost_clipped_sum(seq_loss, params, (x,), l2_clip_norm=CLIP, mask=mask)
    leaves = [np.asarray(v, np.float64) for v in jax.tree.leaves(total)]
    return leaves, int(bad)


def _moves(dtype, scales, t, k):
    key = jax.random.key(4)
    k1, k2, k3 = jax.random.split(key, 3)
    params = {
        "w": (jax.random.normal(k1, (k, k)) / 5.0).astype(dtype),
        "head": jax.random.normal(k2, (k, 2)).astype(dtype),
    }
    x = (
        jax.random.normal(k3, (B, t, k), jnp.float32)
        * jnp.asarray(scales, jnp.float32)[:, None, None]
    )
    x = x.at[5].set(-x[4])  # row 5 cancels row 4 in the sum
    x = x.astype(dtype)
    with _ghost_policy.use(_ghost_policy.ACCELERATOR):
        full, bad = _released(params, x, None)
        moves = []
        for i in range(B):
            less, _ = _released(params, x, np.arange(B) != i)
            moves.append(np.sqrt(sum(np.sum((a - b) ** 2) for a, b in zip(full, less))))
    return np.array(moves), bad, full


@pytest.mark.slow
@pytest.mark.parametrize("shape", SHAPES, ids=["gram", "book_kept"])
@pytest.mark.parametrize(
    "dtype", [jnp.float32, jnp.bfloat16, jnp.float16], ids=lambda d: jnp.dtype(d).name
)
def test_removing_any_extreme_row_moves_the_sum_by_at_most_c(dtype, shape):
    big = float(jnp.finfo(dtype).max) ** 0.5 * 4.0  # its square overflows the dtype
    scales = [big, 1.0, float(jnp.finfo(dtype).tiny), np.nan, 1e3, 1e3]
    moves, bad, full = _moves(dtype, scales, *shape)
    assert all(np.all(np.isfinite(v)) for v in full)
    assert bad >= 1  # the NaN row
    assert np.all(moves <= CLIP * (1.0 + 1e-6)), moves
    assert moves[3] == 0.0  # the NaN row contributes nothing
    assert np.sum(moves > CLIP * 0.99) >= 2  # the big rows are clipped to C, not lost


def test_the_shapes_take_the_gram_and_the_book_kept_paths_under_the_accelerator_policy():
    with _ghost_policy.use(_ghost_policy.ACCELERATOR):
        for (t, k), formed in zip(SHAPES, (False, True), strict=True):
            p = {"w": jnp.zeros((k, k)), "head": jnp.zeros((k, 2))}
            taps = ghost.plan(seq_loss, p, jnp.zeros((B, t, k)))[0].taps
            assert [ghost._materialise(tap, B) for tap in taps if tap.k == tap.n] == [formed]
