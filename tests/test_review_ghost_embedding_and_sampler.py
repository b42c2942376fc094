"""Review 15: ghost clipping of embedding tables and the chunked 64-bit noise samplers.

Embeddings: token ids of every integer dtype and lookup mode reach the ghost path; each
example's contribution to the clipped sum stays ≤ C(1 + 1e-6) (measured in float64 NumPy);
a table used twice is left to vmap. Samplers: the chunked word → sample transform gives the
same bits as the unchunked (compiled) transform, reaches the same extremes and never reuses a
random word across coordinates or leaves.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dpjax
from dpjax import _noise
from dpjax import _random as R
from dpjax.dp_sgd import ghost
from dpjax.dp_sgd._ghost_trace import EmbeddingTap

CLIP = 1.0
BOUND = CLIP * (1.0 + 1e-6)
V, D, T = 300, 4, 6
ROW_GATHER = jax.lax.GatherDimensionNumbers(
    offset_dims=(1,), collapsed_slice_dims=(0,), start_index_map=(0,)
)


def to64(tree):
    """Leaves as float64 NumPy (``jnp.asarray(x, float64)`` stays float32 with x64 off)."""
    return [np.asarray(v, np.float64) for v in jax.tree.leaves(tree)]


def norm64(leaves):
    return float(np.sqrt(sum(np.sum(v * v) for v in leaves)))


def clipped_sum_reference(loss_fn, params, batch, clip):
    """Per-example grads by ``vmap(grad)``, clipped and summed in float64 NumPy (no dpjax);
    an example with a non-finite gradient is dropped (``nan_safe``)."""
    per_example = to64(jax.vmap(jax.grad(loss_fn), in_axes=(None, 0, 0))(params, *batch))
    norms = np.sqrt(sum(np.sum(g.reshape(g.shape[0], -1) ** 2, axis=1) for g in per_example))
    finite = np.isfinite(norms)  # nan_safe: a non-finite example contributes zero
    scale = np.where(finite, np.minimum(1.0, clip / np.where(finite, norms, 1.0)), 0.0)
    return [np.einsum("b...,b->...", np.where(np.isfinite(g), g, 0.0), scale) for g in per_example]


def embedding_params(dtype=jnp.float32):
    rng = np.random.default_rng(15)
    return {
        "e": jnp.asarray(rng.standard_normal((V, D)), dtype),
        "w": jnp.asarray(rng.standard_normal(D), dtype),
    }


def lookup(mode):
    """A per-example loss reading the table through one row-lookup ``gather`` of ``mode``."""

    def loss(p, tok, y):
        if mode in ("clip", "fill"):
            rows = jnp.take(p["e"], tok, axis=0, mode=mode)
        elif mode == "promise_in_bounds":
            rows = p["e"].at[tok].get(mode=mode)
        else:  # raw lax.gather: the token dtype reaches the gather unchanged
            rows = jax.lax.gather(p["e"], tok[:, None], ROW_GATHER, (1, D), mode=mode[4:])
        return jnp.sum(jnp.nan_to_num(rows @ p["w"]) * y)

    return loss


@pytest.mark.parametrize("token_dtype", [jnp.int8, jnp.uint8])
@pytest.mark.parametrize("mode", ["clip", "fill", "raw_clip", "raw_fill"])
def test_narrow_token_ids_with_a_larger_vocabulary_match_per_example_clipping(token_dtype, mode):
    """int8 / uint8 ids into a table with V = 300 > 256 rows (the vmap path handles them).

    The ghost path compared the ids with ``jnp.asarray(V − 1, id dtype)`` and scattered the
    clipped rows with the id dtype; both raised OverflowError for V − 1 > the dtype's max, so
    ``backend="ghost"`` (and ``"auto"``, which picks it) crashed on such a batch.
    """
    params = embedding_params()
    loss = lookup(mode)
    toks = np.array([[0, 5, 5, 120, 127, 1], [3, 3, 3, 3, 3, 3], [1, 2, 0, 4, 100, 6]])
    if jnp.issubdtype(token_dtype, jnp.signedinteger):
        toks[2] = [-1, -5, -128, 7, 7, 100]  # negative ids: clamped to 0 (clip) or dropped
    toks = jnp.asarray(toks, token_dtype)
    y = jnp.asarray(np.random.default_rng(0).standard_normal((3, T)) * 100.0, jnp.float32)
    plan, _ = ghost.plan(loss, params, toks, y)
    assert any(isinstance(t, EmbeddingTap) for t in plan.taps)
    expected = clipped_sum_reference(loss, params, (toks, y), CLIP)
    for backend in ("ghost", "auto"):
        total = jax.jit(dpjax.clipped_grad(loss, l2_clip_norm=CLIP, backend=backend))(
            params, toks, y
        )
        total = total[0] if isinstance(total, tuple) else total
        for got, want in zip(to64(total), expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model", ["promise_in_bounds", "fill", "tied", "twice"])
def test_embedding_add_remove_contribution_within_clip(model):
    """Out-of-range ids (V, V + 7, −1), all-equal tokens with cancelling ±1e30 gradients, a
    masked padding row holding inf: removing one example changes the sum by ≤ C(1 + 1e-6) in
    float64, the masked row changes it by exactly 0.

    A table used as lookup and output head (tied) or looked up twice is not tapped (vmap).
    """
    params = embedding_params()
    params["w"] = jnp.asarray(np.random.default_rng(1).standard_normal((D, 5)), jnp.float32)
    if model in ("promise_in_bounds", "fill"):
        look = lookup(model)

        def loss(p, tok, y):
            return look({"e": p["e"], "w": p["w"][:, 0]}, tok, y)
    elif model == "tied":

        def loss(p, tok, y):
            return jnp.sum((p["e"][tok] @ p["e"].T)[:, 0] * y) + jnp.sum(p["w"])
    else:

        def loss(p, tok, y):
            return jnp.sum(((p["e"][tok] + p["e"][(tok + 1) % V]) @ p["w"])[:, 0] * y)

    rng = np.random.default_rng(2)
    plan, _ = ghost.plan(loss, params, jnp.zeros((5, T), jnp.int32), jnp.zeros((5, T), jnp.float32))
    tapped_table = any(isinstance(t, EmbeddingTap) for t in plan.taps)
    assert tapped_table == (model in ("promise_in_bounds", "fill"))
    fn = jax.jit(dpjax.clipped_grad(loss, l2_clip_norm=CLIP, backend="auto"))
    toks = rng.integers(0, V, (5, T))
    toks[1] = 3
    toks[0, :3] = [V, V + 7, -1]
    alternating = (-1.0) ** np.arange(T) * (1.0 + 10.0 ** rng.uniform(-7, -2, (5, T)))
    mask = jnp.asarray([True, True, True, True, False])
    worst, least = 0.0, np.inf
    for mag in (1.0, 1e3, 1e30):
        tok, y = jnp.asarray(toks, jnp.int32), jnp.asarray(mag * alternating, jnp.float32)
        y = y.at[4, 0].set(jnp.inf)  # the masked padding row is non-finite: still contributes 0
        full = to64(fn(params, tok, y, mask=mask)[0])
        assert all(np.all(np.isfinite(v)) for v in full)
        for i in range(5):
            rest = to64(fn(params, tok, y, mask=mask.at[i].set(False))[0])
            diff = norm64([a - b for a, b in zip(full, rest, strict=True)])
            worst = max(worst, diff)
            if 1 <= i < 4 and mag == 1e3:  # row 0 (out-of-range ids) is NaN under "fill"
                least = min(least, diff)
            if i == 4:  # the padding row contributes exactly nothing
                assert diff == 0.0
    assert worst <= BOUND, worst
    assert least >= 0.99 * CLIP, least  # non-vacuous: these examples are clipped


# ------------------------------------------------------------------------------ samplers

TRANSFORMS = {
    "normal": R._normal_of_words,
    "laplace": R._laplace_of_words,
    "exponential": R._exponential_of_words,
    "gumbel": R._gumbel_of_words,
}
SIZES = [0, 1, 2047, 2048, 2049, 2**20, 2**20 + 1]


def wide_dtypes():
    return [np.float32] + ([np.float64] if jax.config.jax_enable_x64 else [])


@pytest.mark.slow  # 8–14 s a case (compiles of d-sized draws); make test-slow
@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_chunked_transform_equals_the_unchunked_compiled_transform(name):
    """Bit-identical to the compiled elementwise transform of the same words, every size.

    (Eager op-by-op evaluation of the transform differs from any compiled one by ≤ 3 ulp in
    the normal's ndtri: fusion, not chunking.)
    """
    sampler, transform = getattr(R, name), jax.jit(TRANSFORMS[name], static_argnums=2)
    key = jax.random.key(7)
    for dtype in wide_dtypes():
        for size in SIZES:
            shape = (size,) if size != 2049 else (3, 683)
            out = np.asarray(jax.jit(lambda k, s=shape, d=dtype: sampler(k, s, d))(key))
            if name == "normal" and dtype == np.float32:  # one word a lane (issue 24)
                words = R._normal32_words(key, size)
                want = np.asarray(jax.jit(R._normal32_of_words)(*words)).reshape(shape)
            else:
                hi, lo = jax.random.bits(key, (2, *shape), jnp.uint32)
                want = np.asarray(transform(hi, lo, np.dtype(dtype)))
            assert out.shape == shape and out.dtype == dtype
            np.testing.assert_array_equal(out, want)
            assert np.all(np.isfinite(out))


@pytest.mark.slow  # 8–14 s a case (compiles of d-sized draws); make test-slow
@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_chunked_draws_reach_the_same_extremes_and_no_further(name):
    """All-zero / all-one words: every lane of a chunked draw (padding cut off) equals the
    one-coordinate extreme that the support functions report."""
    sampler = getattr(R, name)
    for dtype in wide_dtypes():
        for word in (0, 0xFFFFFFFF):
            key = R.constant_bits_key(word)
            single = np.asarray(sampler(key, (1,), dtype))[0]
            for size in (2048, 2049, 2**20 + 1):
                draw = np.asarray(jax.jit(lambda k, s=size, d=dtype: sampler(k, (s,), d))(key))
                assert draw.shape == (size,)
                if name == "normal" and dtype == np.float32:
                    # every lane is a tail lane: the first and last of each block of 4096 are
                    # refined (the extreme), the others keep the body value at m = 0 (6.338)
                    assert np.abs(draw).max() == abs(single)
                    refined = np.zeros(size, bool)
                    refined[0::4096] = refined[
                        np.minimum(np.arange(4095, size + 4095, 4096), size - 1)
                    ] = True
                    np.testing.assert_array_equal(draw[refined], single)
                    assert np.all(np.abs(draw[~refined]) == pytest.approx(6.338, abs=1e-3))
                else:
                    np.testing.assert_array_equal(draw, np.full(size, single))
    if name == "normal":
        assert R.gaussian_support_max(np.float32) == pytest.approx(9.1553, abs=1e-4)
    if name == "laplace":
        assert R.laplace_support_max(np.float32) == pytest.approx(64 * np.log(2), rel=1e-6)


def test_no_random_word_is_used_twice_across_coordinates_or_leaves():
    """Leaves of sizes that straddle the chunk boundaries get disjoint slices of one draw:
    every coordinate's 64-bit (hi, lo) pair is distinct, and the values are a slice of the
    flat draw in order (no lane drawn twice, no padding lane)."""
    key = jax.random.key(11)
    sizes = [2047, 1, 2049, 2**20 + 1]
    tree = [jnp.zeros((s,), jnp.float32) for s in sizes]
    noise = _noise.tree_iid_noise_like(key, tree, R.normal)
    flat = np.concatenate([np.asarray(x) for x in noise])
    (group_key,) = jax.random.split(key, 1)
    np.testing.assert_array_equal(flat, np.asarray(R.normal(group_key, (sum(sizes),))))
    hi, lo = jax.random.bits(group_key, (2, sum(sizes)), jnp.uint32)
    pairs = np.asarray(hi, np.uint64) << np.uint64(32) | np.asarray(lo, np.uint64)
    assert np.unique(pairs).size == pairs.size


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.int32])
def test_narrow_sampler_dtypes_are_refused(dtype):
    with pytest.raises(ValueError, match="dtype must be float32 or float64"):
        R.normal(jax.random.key(0), (3,), dtype)
