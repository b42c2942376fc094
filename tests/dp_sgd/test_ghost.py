"""Ghost clipping equals per-example clipping (sums, norms, masks, NaN rows, fallback).

The reference is independent of dpjax: per-example gradients by ``jax.vmap(jax.grad)``, then
clipping and summation in float64 NumPy.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import dpjax
from dpjax.dp_sgd import ghost
from dpjax.dp_sgd.clipping import MIN_CLIP_NORM


def reference(loss_fn, params, batch, clip, mask=None):
    """(clipped sum, norms) from materialised per-example gradients, in float64 NumPy."""
    grads = jax.vmap(jax.grad(loss_fn), in_axes=(None,) + (0,) * len(batch))(params, *batch)
    leaves = [np.asarray(g, np.float64) for g in jax.tree.leaves(grads)]
    rows = np.concatenate([g.reshape(g.shape[0], -1) for g in leaves], axis=1)
    norms = np.linalg.norm(rows, axis=1)
    scale = np.minimum(1.0, clip / norms)
    if mask is not None:
        scale = np.where(mask, scale, 0.0)
    sums = [np.tensordot(scale, g, axes=1) for g in leaves]
    return jax.tree.unflatten(jax.tree.structure(grads), sums), norms


def assert_close(actual, expected, rtol):
    """Every leaf within rtol of the leaf's largest entry."""
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
        a = np.asarray(a, np.float64)
        assert a.shape == e.shape
        assert np.max(np.abs(a - e)) <= rtol * max(np.max(np.abs(e)), 1e-30), (a, e)


def shrink_of(loss_fn, params, batch):
    """The public factor f by which ghost multiplies C for this batch (the certified rounding
    of the batch sum, issue 20): the reference clips at f·C."""
    return ghost.ghost_clipped_pairs(loss_fn, params, tuple(batch), l2_clip_norm=1.0)[3]


def run(loss_fn, params, batch, clip=1.0, **kw):
    fn = jax.jit(lambda p, b: ghost.ghost_clipped_sum(loss_fn, p, b, l2_clip_norm=clip, **kw))
    return fn(params, batch)


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(32)(x))
        x = nn.LayerNorm()(x)  # scale/bias: not dense weights -> vmap fallback
        return nn.Dense(5)(x)


def xent(logits, y):
    return -jax.nn.log_softmax(logits)[y]


@pytest.fixture
def linen_mlp(key):
    kx, ky, kp = jax.random.split(key, 3)
    x = 3.0 * jax.random.normal(kx, (24, 12), jnp.float32)
    y = jax.random.randint(ky, (24,), 0, 5)
    model = MLP()
    params = model.init(kp, x[0])["params"]
    return (lambda p, x, y: xent(model.apply({"params": p}, x), y)), params, (x, y)


@pytest.mark.slow  # default: test_clipped_grad_dispatch_ghost_equals_vmap (same model, reference)
def test_linen_mlp_matches_per_example_clipping(linen_mlp):
    loss_fn, params, batch = linen_mlp
    total, norms, bad = run(loss_fn, params, batch, clip=7.5)
    ref_sum, ref_norms = reference(loss_fn, params, batch, 7.5 * shrink_of(loss_fn, params, batch))
    assert np.sum(ref_norms > 7.5) >= 4 and np.sum(ref_norms < 7.5) >= 4  # both regimes
    np.testing.assert_allclose(np.asarray(norms), ref_norms, rtol=2e-6)
    assert_close(total, ref_sum, 2e-6)
    assert int(bad) == 0
    assert jax.tree.structure(total) == jax.tree.structure(params)


def test_clipped_grad_dispatch_ghost_equals_vmap(linen_mlp):
    loss_fn, params, batch = linen_mlp
    mask = jnp.arange(24) % 5 != 0
    outs, shrink = {}, {}
    for method in ("ghost", "vmap", "auto"):
        fn = dpjax.clipped_grad(loss_fn, l2_clip_norm=0.5, backend=method)
        outs[method] = jax.jit(lambda p, x, y, f=fn: f(p, x, y, mask=mask))(params, *batch)
        shrink[method] = fn.recorded_shrink(fn.release_for(24))  # the factor C was shrunk by
    # the two paths certify the batch sum with different factors (ghost: groups of 32 rows in
    # one matrix product); each equals the reference clipped at its own f·C
    assert shrink["auto"] == shrink["ghost"] < shrink["vmap"] < 1.0
    for method in ("ghost", "vmap", "auto"):
        ref_sum, _ = reference(loss_fn, params, batch, 0.5 * shrink[method], mask=np.asarray(mask))
        assert_close(outs[method][0], ref_sum, 2e-6)
    for method in ("ghost", "auto"):
        np.testing.assert_allclose(
            outs[method][1].per_example_norms, outs["vmap"][1].per_example_norms, rtol=2e-6
        )
        assert int(outs[method][1].num_clipped) == int(outs["vmap"][1].num_clipped)


def plain_mlp_loss(p, x, y):
    h = jnp.tanh(x @ p["w1"] + p["b1"])
    return 0.5 * jnp.sum((h @ p["w2"] + p["b2"] - y) ** 2)


def test_weights_cast_before_the_matmul_are_tapped(key):
    """Mixed precision: a float32 weight cast to the float64 compute dtype is still tapped."""
    k1, k2 = jax.random.split(key)
    params = {"w": jax.random.normal(k1, (6, 4), jnp.float32)}
    x = jax.random.normal(k2, (9, 6))

    def loss(p, x):
        return jnp.sum(jnp.sin(x @ p["w"].astype(x.dtype)))

    assert len(ghost.plan(loss, params, x)[0].taps) == 1
    total, norms, _ = run(loss, params, (x,), clip=1.0)
    ref_sum, ref_norms = reference(loss, params, (x,), shrink_of(loss, params, (x,)))
    assert total["w"].dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(norms), ref_norms, rtol=2e-6)
    assert_close(total, ref_sum, 2e-6)


@pytest.mark.slow  # float64 ghost keeps a default test: test_lax_conv_nchw_float64
def test_plain_pytree_mlp_float64(key):
    k1, k2, k3, k4 = jax.random.split(key, 4)
    params = {
        "w1": jax.random.normal(k1, (6, 9)),
        "b1": jnp.zeros(9),
        "w2": jax.random.normal(k2, (9, 3)),
        "b2": jnp.ones(3),
    }
    batch = (jax.random.normal(k3, (16, 6)), jax.random.normal(k4, (16, 3)))
    assert params["w1"].dtype == jnp.float64  # x64 on: exactness to float64 rounding
    total, norms, _ = run(plain_mlp_loss, params, batch, clip=2.0)
    ref_sum, ref_norms = reference(plain_mlp_loss, params, batch, 2.0)
    np.testing.assert_allclose(np.asarray(norms), ref_norms, rtol=1e-12)
    assert_close(total, ref_sum, 1e-12)
    taps = ghost.plan(plain_mlp_loss, params, *batch)[0].taps
    assert sorted(t.leaf for t in taps) == [2, 3]  # w1, w2 (leaves sorted b1, b2, w1, w2)


def test_logistic_regression(key):
    kx, ky = jax.random.split(key)
    d = 2000
    x = jax.random.normal(kx, (64, d), jnp.float32)
    y = jax.random.bernoulli(ky, 0.5, (64,)).astype(jnp.float32)
    params = {"w": 0.01 * jnp.ones(d, jnp.float32), "b": jnp.zeros((), jnp.float32)}

    def loss(p, x, y):
        return jax.nn.softplus(-(2.0 * y - 1.0) * (x @ p["w"] + p["b"]))

    assert ghost.supports(loss, params, x, y)
    total, norms, _ = run(loss, params, (x, y), clip=10.0)
    ref_sum, ref_norms = reference(loss, params, (x, y), 10.0 * shrink_of(loss, params, (x, y)))
    np.testing.assert_allclose(np.asarray(norms), ref_norms, rtol=2e-6)
    assert_close(total, ref_sum, 2e-6)


@pytest.mark.slow  # default-run budget; CI runs it in make test-slow
def test_sequence_inputs_and_weight_on_the_left(key):
    """T > 1 rows per example: Gram-trick norms (large layer) and materialised ones (small)."""
    k1, k2, k3, k4 = jax.random.split(key, 4)

    def loss(p, x):
        h = jnp.tanh(x @ p["wide"]) / 10.0  # K·N = 96² > 8192: Gram trick
        h = jnp.einsum("on,tn->to", p["left"], h)  # weight as lhs operand, small: materialised
        return jnp.sum(jnp.sin(h @ p["narrow"]))

    params = {
        "wide": jax.random.normal(k1, (96, 96)) / 10.0,
        "left": jax.random.normal(k2, (5, 96)),
        "narrow": jax.random.normal(k3, (5, 2)),
    }
    x = jax.random.normal(k4, (10, 3, 96))
    taps = ghost.plan(loss, params, x)[0].taps
    assert {(t.t, t.k, t.n) for t in taps} == {(3, 96, 96), (3, 96, 5), (3, 5, 2)}
    assert {t.k * t.n: ghost._materialise(t) for t in taps} == {9216: False, 480: True, 10: True}
    total, norms, _ = run(loss, params, (x,), clip=30.0)
    ref_sum, ref_norms = reference(loss, params, (x,), 30.0)
    assert np.sum(ref_norms > 30.0) >= 2 and np.sum(ref_norms < 30.0) >= 2
    np.testing.assert_allclose(np.asarray(norms), ref_norms, rtol=1e-10)
    assert_close(total, ref_sum, 1e-10)


class ConvNet(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(4, (3, 3), strides=2, padding="VALID")(x))
        x = nn.relu(nn.Conv(5, (2, 3), padding="SAME", kernel_dilation=(1, 2))(x))
        return nn.Dense(3)(x.reshape(-1))


@pytest.mark.slow  # the im2col claim keeps its default test: test_lax_conv_nchw_float64
def test_flax_convolutions_are_tapped_as_im2col(key):
    kx, kp = jax.random.split(key)
    x = jax.random.normal(kx, (12, 9, 9, 2), jnp.float32)
    y = jnp.arange(12) % 3
    model = ConvNet()
    params = model.init(kp, x[:1])["params"]

    def loss(p, x, y):
        return xent(model.apply({"params": p}, x[None]), y)

    taps = ghost.plan(loss, params, x, y)[0].taps
    assert {(t.t, t.k, t.n) for t in taps} == {(16, 18, 4), (16, 24, 5), (1, 80, 3)}
    total, norms, _ = run(loss, params, (x, y), clip=0.1)
    ref_sum, ref_norms = reference(loss, params, (x, y), 0.1 * shrink_of(loss, params, (x, y)))
    np.testing.assert_allclose(np.asarray(norms), ref_norms, rtol=2e-6)
    assert_close(total, ref_sum, 2e-6)


def test_lax_conv_nchw_float64(key):
    k1, k2 = jax.random.split(key)
    params = {"k": jax.random.normal(k1, (3, 2, 2, 3)), "t": jax.random.normal(k1, (2, 3, 2, 2))}
    x = jax.random.normal(k2, (6, 2, 7, 8))

    def loss(p, x):
        dims = ("NCHW", "OIHW", "NCHW")
        h = jax.lax.conv_general_dilated(x[None], p["k"], (1, 2), "VALID", dimension_numbers=dims)
        h = jax.lax.conv_general_dilated(  # transposed-style: input dilation, HWIO-free OIHW
            jnp.tanh(h),
            p["t"],
            (1, 1),
            ((1, 1), (0, 1)),
            lhs_dilation=(2, 1),
            dimension_numbers=dims,
        )
        return jnp.sum(jnp.tanh(h) ** 2)

    assert len(ghost.plan(loss, params, x)[0].taps) == 2

    total, norms, _ = run(loss, params, (x,), clip=0.5)
    ref_sum, ref_norms = reference(loss, params, (x,), 0.5)
    np.testing.assert_allclose(np.asarray(norms), ref_norms, rtol=1e-12)
    assert_close(total, ref_sum, 1e-12)


@pytest.mark.slow  # ~2 s each under load; the im2col claim keeps test_lax_conv_nchw_float64
@pytest.mark.parametrize(
    "shape, dims, filt, strides, padding, dilation",
    [
        ((2, 11, 10, 3), ("NHWC", "HWIO", "NHWC"), (3, 2), (2, 1), ((0, 0), (1, 1)), (1, 2)),
        ((2, 9, 1), ("NWC", "WIO", "NWC"), (3,), (2,), ((1, 2),), (1,)),
        (
            (2, 3, 11, 10),
            ("NCHW", "OIHW", "NCHW"),
            (4, 4),
            (2, 3),
            ((3, 3), (0, 2)),
            (1, 1),
        ),
        (
            (2, 7, 6, 5, 2),
            ("NDHWC", "DHWIO", "NDHWC"),
            (2, 3, 2),
            (1, 2, 2),
            ((1, 0),) * 3,
            (2, 1, 1),
        ),
    ],
)
def test_im2col_equals_the_convolution_patches(shape, dims, filt, strides, padding, dilation):
    """The sliced patches are XLA's own patches (a copy of input entries, so bit for bit), in
    the (*filter, C) feature order, and patches @ kernel is the convolution."""
    from dpjax.dp_sgd._ghost_trace import im2col

    x = jax.random.normal(jax.random.key(0), shape)
    c = shape[dims[0].index("C")]
    spatial = [d for d in dims[1] if d not in "IO"]
    rhs = tuple({"I": c, "O": 3}.get(d) or filt[spatial.index(d)] for d in dims[1])
    kernel = jax.random.normal(jax.random.key(1), rhs)
    dn = jax.lax.conv_dimension_numbers(shape, rhs, dims)
    keys = dict(filter_shape=filt, window_strides=strides, padding=padding, rhs_dilation=dilation)

    @jax.jit  # one program: eager slices would each compile
    def patches_both_ways(x, kernel):
        conv = jax.lax.conv_general_dilated(
            x, kernel, strides, padding, rhs_dilation=dilation, dimension_numbers=dn
        )
        want = jax.lax.conv_general_dilated_patches(x, **keys, dimension_numbers=dn)
        want = jnp.moveaxis(want, dn.out_spec[1], -1)  # features (C, *f) -> (*f, C)
        want = want.reshape(want.shape[:-1] + (c, -1)).swapaxes(-1, -2).reshape(want.shape)
        out_spatial = tuple(conv.shape[d] for d in dn.out_spec[2:])
        more = dict(lhs_dilation=(1,) * len(filt), dimension_numbers=dn, out_spatial=out_spatial)
        got = im2col(x, keys | more)
        w = jnp.transpose(kernel, (*dn.rhs_spec[2:], dn.rhs_spec[1], dn.rhs_spec[0]))
        as_dense = jnp.einsum("...k,kn->...n", got, w.reshape(-1, 3), precision="highest")
        return got, want, as_dense, jnp.moveaxis(conv, dn.out_spec[1], -1)

    got, want, as_dense, as_conv = patches_both_ways(x, kernel)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    np.testing.assert_allclose(np.asarray(as_dense), np.asarray(as_conv), rtol=1e-5, atol=1e-5)


class Unsupported(nn.Module):
    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(11, 4)(tokens)  # a gather of the table: an embedding tap
        x = nn.Conv(4, (2,), feature_group_count=2)(x)  # grouped: not tapped either
        return nn.Dense(3)(jnp.tanh(x).reshape(-1))


@pytest.mark.slow  # default-run budget; CI runs it in make test-slow
def test_unsupported_layer_falls_back_to_vmap(key):
    kx, kp = jax.random.split(key)
    tokens = jax.random.randint(kx, (12, 5), 0, 11)
    y = jnp.arange(12) % 3
    model = Unsupported()
    params = model.init(kp, tokens[0])["params"]

    def loss(p, t, y):
        return xent(model.apply({"params": p}, t), y)

    tapped = ghost.plan(loss, params, tokens, y)[0].tapped_leaves
    assert len(tapped) == 2  # the Dense kernel and the embedding; the grouped conv uses vmap
    total, norms, _ = run(loss, params, (tokens, y), clip=0.1)
    f = shrink_of(loss, params, (tokens, y))
    ref_sum, ref_norms = reference(loss, params, (tokens, y), 0.1 * f)
    np.testing.assert_allclose(np.asarray(norms), ref_norms, rtol=2e-6)
    assert_close(total, ref_sum, 2e-6)


def test_tied_weight_is_not_tapped(key):
    k1, k2 = jax.random.split(key)
    params = {"w": jax.random.normal(k1, (5, 5)), "v": jax.random.normal(k1, (5,))}

    def loss(p, x):
        return jnp.sum(jnp.tanh(jnp.tanh(x @ p["w"]) @ p["w"]) * p["v"])

    x = jax.random.normal(k2, (7, 5))
    assert not ghost.supports(loss, params, x)
    total, norms, _ = run(loss, params, (x,), clip=0.5)
    ref_sum, ref_norms = reference(loss, params, (x,), 0.5)
    np.testing.assert_allclose(np.asarray(norms), ref_norms, rtol=1e-10)
    assert_close(total, ref_sum, 1e-10)


def test_product_of_two_parameters(key):
    """``x @ (U @ V)``: U is tapped (its 'activation' is V), V falls back to vmap."""
    k1, k2, k3 = jax.random.split(key, 3)
    params = {"u": jax.random.normal(k1, (5, 3)), "v": jax.random.normal(k2, (3, 4))}

    def loss(p, x):
        return jnp.sum(jnp.tanh(x @ (p["u"] @ p["v"])))

    x = jax.random.normal(k3, (7, 5))
    assert len(ghost.plan(loss, params, x)[0].taps) == 1
    total, norms, _ = run(loss, params, (x,), clip=0.5)
    ref_sum, ref_norms = reference(loss, params, (x,), 0.5)
    np.testing.assert_allclose(np.asarray(norms), ref_norms, rtol=1e-10)
    assert_close(total, ref_sum, 1e-10)


@pytest.mark.slow  # default: test_clipped_grad_dispatch_ghost_equals_vmap checks a mask
def test_mask_rows_contribute_zero(linen_mlp):
    loss_fn, params, (x, y) = linen_mlp
    mask = jnp.arange(24) < 17
    x = x.at[20].set(jnp.nan)  # garbage in a padding row must not leak
    total, norms, bad = run(loss_fn, params, (x, y), clip=1.0, mask=mask)
    f = shrink_of(loss_fn, params, (x, y))
    ref_sum, ref_norms = reference(loss_fn, params, (x[:17], y[:17]), f)
    assert_close(total, ref_sum, 2e-6)
    np.testing.assert_allclose(np.asarray(norms[:17]), ref_norms, rtol=2e-6)
    assert np.all(np.asarray(norms[17:]) == 0.0) and int(bad) == 0


# default: tests/dp_sgd/test_clipping.py::test_nan_example_is_zeroed_and_counted (auto)
@pytest.mark.slow
def test_nan_example_is_zeroed_and_counted(linen_mlp):
    loss_fn, params, (x, y) = linen_mlp
    x_bad = x.at[3].set(jnp.nan)
    total, norms, bad = run(loss_fn, params, (x_bad, y), clip=1.0)
    keep = np.arange(24) != 3
    ref_sum, _ = reference(loss_fn, params, (x[keep], y[keep]), shrink_of(loss_fn, params, (x, y)))
    assert int(bad) == 1 and not np.isfinite(norms[3])
    assert_close(total, ref_sum, 2e-6)
    unsafe, _, _ = run(loss_fn, params, (x_bad, y), clip=1.0, nan_safe=False)
    assert not np.all(np.isfinite(np.asarray(jax.tree.leaves(unsafe)[0])))


@pytest.mark.slow  # default-run budget; CI runs it in make test-slow
def test_nnx_linear_model(key):
    model = nnx.Sequential(
        nnx.Linear(6, 8, rngs=nnx.Rngs(0)), nnx.relu, nnx.Linear(8, 2, rngs=nnx.Rngs(1))
    )
    graphdef, params = nnx.split(model, nnx.Param)

    def loss(p, x, y):
        return jnp.sum((nnx.merge(graphdef, p)(x) - y) ** 2)

    x = jax.random.normal(key, (10, 6), jnp.float32)
    y = jnp.ones((10, 2), jnp.float32)
    assert len(ghost.plan(loss, params, x, y)[0].taps) == 2
    total, norms, _ = run(loss, params, (x, y), clip=1.0)
    ref_sum, ref_norms = reference(loss, params, (x, y), shrink_of(loss, params, (x, y)))
    np.testing.assert_allclose(np.asarray(norms), ref_norms, rtol=2e-6)
    assert_close(total, ref_sum, 2e-6)


def test_supports_false_when_nothing_to_speed_up(key):
    x = jax.random.normal(key, (4, 3))
    assert not ghost.supports(lambda w, x: jnp.sum((w - x) ** 2), jnp.zeros(3), x)  # no matmul
    assert not ghost.supports(lambda w, x: jnp.sum(x @ x) * w, jnp.zeros(()), x)  # data @ data
    assert not ghost.supports(lambda w, x: x @ w, jnp.zeros((3, 2)), x)  # not a scalar loss
    assert ghost.supports(lambda w, x: jnp.sum(x @ w), jnp.zeros((3, 2)), x)


def test_rejects_bad_clip_norm(linen_mlp):
    loss_fn, params, batch = linen_mlp
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="l2_clip_norm"):
            ghost.ghost_clipped_sum(loss_fn, params, batch, l2_clip_norm=bad)


@pytest.mark.slow  # default-run budget; CI runs it in make test-slow
def test_microbatched_ghost_equals_one_pass(key):
    k1, k2, k3 = jax.random.split(key, 3)
    params = {"w1": jax.random.normal(k1, (6, 9)), "b1": jnp.zeros(9)}
    params |= {"w2": jax.random.normal(k2, (9, 3)), "b2": jnp.ones(3)}
    x, y = jax.random.normal(k3, (20, 6)), jnp.zeros((20, 3))
    fn = dpjax.clipped_grad(plain_mlp_loss, l2_clip_norm=2.0, backend="ghost", microbatch_size=8)
    total, info = fn(params, x, y)
    ref_sum, ref_norms = reference(plain_mlp_loss, params, (x, y), 2.0)
    assert_close(total, ref_sum, 1e-12)
    np.testing.assert_allclose(np.asarray(info.per_example_norms), ref_norms, rtol=1e-12)


def test_bfloat16_weights_with_float32_accumulation(key):
    k1, k2 = jax.random.split(key)
    params = {"w": jax.random.normal(k1, (6, 4), jnp.bfloat16)}
    x = jax.random.normal(k2, (8, 6), jnp.bfloat16)

    def loss(p, x):
        dims = (((0,), (0,)), ((), ()))
        h = jax.lax.dot_general(x, p["w"], dims, preferred_element_type=jnp.float32)
        return jnp.sum(jnp.sin(h))

    assert ghost.supports(loss, params, x)
    total, norms, _ = run(loss, params, (x,), clip=1.0)
    params32 = jax.tree.map(lambda v: v.astype(jnp.float32), params)
    ref_sum, ref_norms = reference(loss, params32, (x.astype(jnp.float32),), 1.0)
    # float32, not bfloat16: neighbouring sums rounded to bf16 differ by more than C (issue 12)
    assert total["w"].dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(norms), ref_norms, rtol=1e-2)
    assert_close(total, ref_sum, 2e-2)


# ----------------------------------------------------------------------------- certified clipping

X64_OFF_SCRIPT = r"""
import json
import jax, jax.numpy as jnp, numpy as np
import dpjax

assert not jax.config.jax_enable_x64
T, K, N = 8, 128, 10
kw, kh, kx, kb = jax.random.split(jax.random.key(12), 4)
params = {
    "w": jax.random.normal(kw, (K, K), jnp.float32) / np.sqrt(K),
    "head": jax.random.normal(kh, (K, N), jnp.float32) / np.sqrt(K),
}

def loss(p, x, y):  # dense 128x128 on T = 8 positions (Gram path), mean-pooled, linear head
    return jnp.sum(jnp.mean(x @ p["w"], axis=0) @ p["head"] * y)

def norm64(tree):
    sq = sum(np.sum(np.asarray(v, np.float64) ** 2) for v in jax.tree.leaves(tree))
    return float(np.sqrt(sq))

out = {}
for method in ("ghost", "vmap"):
    fn = jax.jit(dpjax.clipped_grad(loss, l2_clip_norm=1.0, backend=method))
    worst, least = 0.0, np.inf
    for i in range(16):
        k1, k2, k3 = jax.random.split(jax.random.fold_in(kx, i), 3)
        x = jax.random.normal(k1, (1, T, K), jnp.float32)
        b = 10.0 ** jax.random.uniform(k2, (), jnp.float32, 2.5, 4.5)
        x = x.at[0, :, 0].set(b * (-1.0) ** jnp.arange(T, dtype=jnp.float32))
        y = jax.random.normal(k3, (1, N), jnp.float32)
        s, info = fn(params, x, y)
        c = norm64(s)
        worst, least = max(worst, c), min(least, c)
    out[method] = [worst, least]
print(json.dumps(out))
"""


def run_without_x64(script):
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, JAX_ENABLE_X64="0", JAX_PLATFORMS="cpu")
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # default: test_gram_trick_cancellation_float32[seq8-ghost] (adversarial)
def test_gram_cancellation_in_float32_stays_within_c():
    """Finding 2: the float32 Gram norm cancelled and let one example contribute 1.2–1.83 C.

    Inputs whose first feature alternates ±B (B in 10^2.5…10^4.5) make Σ_{t,s}(a_t·a_s)(g_t·g_s)
    lose its digits; the certified bound (or the accurate branch) must keep every contribution
    ≤ C(1 + 1e-6), measured in float64, and still clip to ≈ C (no gross over-clipping).
    """
    out = run_without_x64(X64_OFF_SCRIPT)
    for method, (worst, least) in out.items():
        assert worst <= 1.0 + 1e-6, (method, worst)
        assert least >= 0.99, (method, least)


def overflow_loss(p, x):
    """Activations x (up to 1e200) times a loss scale 1e-200: ‖a‖² overflows, ‖∇W‖ does not."""
    return 1e-200 * jnp.sum(jnp.sin(1e-200 * (x @ p["w"])) * 1e200)


@pytest.mark.codegen  # a rounding claim: runs on the users' -O3 code
def test_overflowing_activations_ghost_equals_vmap(key):
    """Finding 8: ‖a‖²‖g‖² = inf·0 = NaN made ghost drop an example that vmap keeps."""
    k1, k2 = jax.random.split(key)
    params = {"w": jax.random.normal(k1, (5, 3))}
    x = jax.random.normal(k2, (6, 5))
    x = 1e195 * x.at[1].multiply(1e5).at[4].multiply(1e-30)  # every ‖a‖² overflows float64
    outs = {}
    for method in ("ghost", "vmap"):
        fn = jax.jit(dpjax.clipped_grad(overflow_loss, l2_clip_norm=1.0, backend=method))
        outs[method] = fn(params, x)
    (g_sum, g_info), (v_sum, v_info) = outs["ghost"], outs["vmap"]
    assert int(v_info.num_nonfinite) == 0 and int(g_info.num_nonfinite) == 0
    np.testing.assert_allclose(g_info.per_example_norms, v_info.per_example_norms, rtol=1e-12)
    assert_close(g_sum, jax.tree.map(np.asarray, v_sum), 1e-12)
    ref_sum, ref_norms = reference(overflow_loss, params, (x,), 1.0)
    np.testing.assert_allclose(np.asarray(g_info.per_example_norms), ref_norms, rtol=1e-12)


@pytest.mark.codegen  # a rounding claim: runs on the users' -O3 code
def test_infinite_activations_are_dropped_alike(key):
    """One rule for non-finite examples: a non-finite certified bound → contribution 0, counted."""
    k1, k2 = jax.random.split(key)
    params = {"w": jax.random.normal(k1, (5, 3)), "b": jnp.zeros(3)}
    x = jax.random.normal(k2, (6, 5)).at[2, 0].set(jnp.inf).at[3, 1].set(1e300)

    def loss(p, x):
        return jnp.sum(jnp.tanh(x @ p["w"] + p["b"]))

    outs = {}
    for method in ("ghost", "vmap"):
        fn = jax.jit(dpjax.clipped_grad(loss, l2_clip_norm=1.0, backend=method))
        outs[method] = fn(params, x)
    (g_sum, g_info), (v_sum, v_info) = outs["ghost"], outs["vmap"]
    assert int(g_info.num_nonfinite) == int(v_info.num_nonfinite) >= 1
    assert all(np.all(np.isfinite(np.asarray(v))) for v in jax.tree.leaves(g_sum))
    assert_close(g_sum, jax.tree.map(np.asarray, v_sum), 1e-12)


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_eager_ghost_steps_do_not_recompile_or_grow(linen_mlp):
    """Finding 7: every eager ghost call compiled a fresh lax.cond (199 compiles in 200 steps)."""
    loss_fn, params, (x, y) = linen_mlp
    grad_fn = dpjax.clipped_grad(loss_fn, l2_clip_norm=0.5, backend="ghost")
    compiles = []

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        jax.block_until_ready(grad_fn(params, x, y))  # first call: compiles
        jax.block_until_ready(grad_fn(params, x, y))
        masks = [jnp.arange(24) != i for i in range(24)]
        after_first, rss0 = len(compiles), rss_bytes()
        for i in range(200):
            out = grad_fn(params, x, y, mask=masks[i % 24])
        jax.block_until_ready(out)
        growth = rss_bytes() - rss0
        assert len(compiles) == after_first, len(compiles) - after_first
        jitted = jax.jit(grad_fn)
        jax.block_until_ready(jitted(params, x, y))
        before = len(compiles)
        for _ in range(1000):
            out = jitted(params, x, y)
        jax.block_until_ready(out)
        assert len(compiles) == before
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert growth < 20 * 2**20, growth  # was ≈ 2 MB per step on main


def test_bfloat16_dense_with_bias_norm_and_sum_see_the_same_activations():
    """XLA may recompute bf16 activations with excess precision inside each fusion; the norm and
    the sum must read one stored copy, else one example contributes ≈ 1.0001 C (found by the
    adversarial sweep: dense bf16, nearly cancelling inputs of magnitude ~1e3)."""
    rng = np.random.default_rng(61)
    params = {
        "w": jnp.asarray(0.3 * rng.standard_normal((16, 8)), jnp.bfloat16),
        "b": jnp.asarray(0.3 * rng.standard_normal(8), jnp.bfloat16),
        "head": jnp.asarray(0.3 * rng.standard_normal(8), jnp.bfloat16),
    }

    def loss(p, x, y):
        dims = (((1,), (0,)), ((), ()))
        h = jax.lax.dot_general(x, p["w"], dims, preferred_element_type=jnp.bfloat16) + p["b"]
        out = jnp.sum(jax.lax.dot_general(h, p["head"], dims, preferred_element_type=jnp.bfloat16))
        return 0.5 * (out - y) ** 2

    worst = 0.0
    for method in ("ghost", "vmap"):
        fn = jax.jit(dpjax.clipped_grad(loss, l2_clip_norm=1.0, backend=method))
        for _ in range(24):
            v = 10.0 ** rng.uniform(1, 4) * rng.standard_normal((1, 16))
            x = np.where(rng.random() < 0.5, v, -v * (1 + 10.0 ** rng.uniform(-7, -2)))
            x = jnp.asarray(x, jnp.bfloat16)[None]
            y = jnp.asarray([rng.standard_normal()], jnp.bfloat16)
            s, _ = fn(params, x, y)
            norm = np.sqrt(sum(np.sum(np.asarray(u, np.float64) ** 2) for u in s.values()))
            worst = max(worst, norm)
    assert worst <= 1.0 + 1e-6, worst


@pytest.mark.slow  # default: tests/dp_sgd/test_finetune.py ghost-vs-vmap on the adapters
def test_lora_frozen_constant_and_stacked_adapters(key):
    """LoRA: ``x·W0 + (x·A)·B`` with W0 a closed-over constant (never a parameter, so never
    clipped or noised) and the two stacked adapters both ghost taps; equals per-example vmap."""
    k0, ka, kb, kx, kh = jax.random.split(key, 5)
    w0 = jax.random.normal(k0, (12, 16)) / 4.0  # public pre-trained weight

    def loss(p, x, y):
        h = jnp.tanh(x @ w0 + (x @ p["A"]) @ p["B"])
        return xent(h @ p["head"], y)

    params = {
        "A": jax.random.normal(ka, (12, 3)),
        "B": jax.random.normal(kb, (3, 16)) / 2.0,
        "head": jax.random.normal(kh, (16, 5)),
    }
    x = 2.0 * jax.random.normal(kx, (40, 12))
    y = jnp.arange(40) % 5
    taps = ghost.plan(loss, params, x, y)[0].taps
    assert sorted((t.k, t.n) for t in taps) == [(3, 16), (12, 3), (16, 5)]
    total, norms, _ = run(loss, params, (x, y), clip=2.0)
    f = shrink_of(loss, params, (x, y))
    ref_sum, ref_norms = reference(loss, params, (x, y), 2.0 * f)
    assert np.sum(ref_norms > 2.0) >= 5 and np.sum(ref_norms < 2.0) >= 5
    np.testing.assert_allclose(np.asarray(norms), ref_norms, rtol=1e-10)
    assert_close(total, ref_sum, 1e-10)
    assert set(total) == {"A", "B", "head"}  # W0 gets no gradient, clipped or noised


@pytest.mark.parametrize("batch", [100, pytest.param(300, marks=pytest.mark.slow)])
def test_dense_sum_in_merged_groups_equals_vmap(key, batch):
    """T = 1 sums: groups of 32 products, 4 added per double-float merge, padded batches."""
    k1, k2, k3 = jax.random.split(key, 3)

    def loss(p, x, y):
        return xent(jnp.tanh(x @ p["w1"] + p["b1"]) @ p["w2"], y)

    params = {
        "w1": jax.random.normal(k1, (6, 7)),
        "b1": jnp.zeros(7),
        "w2": jax.random.normal(k2, (7, 5)),
    }
    x = 3.0 * jax.random.normal(k3, (batch, 6))
    y = jnp.arange(batch) % 5
    clip = float(np.median(reference(loss, params, (x, y), 1.0)[1]))  # half the rows clipped
    total, norms, _ = run(loss, params, (x, y), clip=clip)
    f = ghost.ghost_clipped_pairs(loss, params, (x, y), l2_clip_norm=clip)[3]
    ref_sum, ref_norms = reference(loss, params, (x, y), clip * f)
    np.testing.assert_allclose(np.asarray(norms), ref_norms, rtol=1e-10)
    assert_close(total, ref_sum, 1e-10)


def _conditionals(loss_fn, params, batch):
    fn = jax.jit(lambda p, b: ghost.ghost_clipped_sum(loss_fn, p, b, l2_clip_norm=1.0))
    return fn.lower(params, batch).as_text().count("stablehlo.case")


def test_sums_compiled_once_per_step(linen_mlp, key):
    """Compile time (issue 24): the clipped sums are compiled once (dropped rows are zeroed
    before the contractions; a second, NaN-retry branch of every sum doubled the compile
    time); one cond remains, the accurate retry of the norm bounds."""
    loss_fn, params, batch = linen_mlp
    assert _conditionals(loss_fn, params, batch) == 1

    def seq_loss(p, x):
        return jnp.sum(jnp.tanh(x @ p["w"]))

    w = jax.random.normal(key, (96, 96))
    assert _conditionals(seq_loss, {"w": w}, (jnp.ones((4, 3, 96)),)) == 1


# ------------------------------------------------------------------------------------------------
# the accurate-retry cond couples every example's clip factor.
#
# ``_ghost_impl`` recomputes ALL rows' bounds with the accurate formulas when ANY kept row's fast
# bound is non-finite or loose (``lax.cond(retry, ...)``). Since the certified-clipping changes,
# the accurate T = 1 bounds of several layers are stacked and zero-padded to the widest width W
# (``_rank_one_bounds_scaled``) and certified with γ_{W+2} and the floor 4(W+2)·tiny, so they
# are LARGER than the fast bounds (γ_{K+2}) for every narrower part. One example whose fast
# bound overflows (‖a‖² = inf, ‖a‖·‖g‖ finite) thus lowers the clip factor of every OTHER
# clipped example by ≈ (W − K)·u: removing it moves the released sum by its own ≈ C plus
# (B − 1)·δ·C. Before the change the accurate T = 1 bound was the fast one scaled by exact
# powers of two (same bits), so the flip was harmless for T = 1 layers (this test passes on
# eed4a2e: 0.9988·C in float32, 0.999999999998·C in float64). For T > 1 Gram taps the
# same coupling is OLDER and larger (fast and accurate Gram bounds differ by up to 2 % for
# rows that are not "loose"): ``test_retry_flip_gram_float32``, 1.58·C on eed4a2e too.
#
# Attack: 2-layer linear MLP (K = 512 → 4 → 2, W1 = 0, W2 = 1), every example x = e₁, v = 10
# (clipped, same direction); example 0 has x = −2⁶⁵·e₁ (float32; −2⁵¹⁵ in float64) and
# v = 2⁻¹⁰: its fast bound overflows, its accurate bound is finite, and its clipped gradient
# points against the others'. Its contribution is measured by differencing the released sums
# with and without it (mask), in float64.
#
# Fixed: the retry branch selects per row, so a row's bound depends on its own data only:
# ``cond(retry, lambda: where(loose, accurate_total, fast_total), lambda: fast_total)``
# (row-wise where over sq/n2/u2; ``loose`` is per row). These tests failed before the fix.
# ------------------------------------------------------------------------------------------------


def _loss(params, x, v):
    h = x @ params["w1"]
    return jnp.dot(h @ params["w2"], v)


def _contribution_of_first(batch: int, dtype, big: float) -> float:
    """ℓ2 change of the released sum when example 0 is removed (mask), C = 1."""
    k, h, n = 512, 4, 2
    params = {"w1": jnp.zeros((k, h), dtype), "w2": jnp.ones((h, n), dtype)}
    xs = np.zeros((batch, k), dtype)
    xs[:, 0] = 1.0
    xs[0, 0] = -big
    vs = np.full((batch, n), 10.0, dtype)
    vs[0] = 2.0**-10
    grad_fn = dpjax.clipped_grad(_loss, l2_clip_norm=1.0, backend="ghost")
    args = (params, jnp.asarray(xs), jnp.asarray(vs))
    full, info = grad_fn(*args, mask=jnp.ones(batch, bool))
    assert int(info.num_nonfinite) == 0  # example 0 is kept (clipped), not dropped
    drop = np.ones(batch, bool)
    drop[0] = False
    rest, _ = grad_fn(*args, mask=jnp.asarray(drop))
    diff = [np.asarray(full[p], np.float64) - np.asarray(rest[p], np.float64) for p in full]
    return float(np.sqrt(sum(np.sum(d * d) for d in diff)))


@pytest.mark.codegen  # a rounding claim: runs on the users' -O3 code
def test_retry_flip_float32():
    """Catches the accurate-retry cond letting one removed example move the sum > C (float32)."""
    with jax.enable_x64(False):
        got = _contribution_of_first(64, np.float32, 2.0**65)
    assert got <= 1.0, f"removing example 0 moved the sum by {got!r} > C = 1"


@pytest.mark.codegen  # a rounding claim: runs on the users' -O3 code
def test_retry_flip_float64():
    """Catches the accurate-retry cond letting one removed example move the sum > C (float64)."""
    got = _contribution_of_first(256, np.float64, 2.0**515)
    assert got <= 1.0, f"removing example 0 moved the sum by {got!r} > C = 1"


def _gram_loss(params, x, v):
    return jnp.sum((x @ params["w"]) * v)


@pytest.mark.codegen  # a rounding claim: runs on the users' -O3 code
def test_retry_flip_gram_float32():
    """T = 2 Gram tap (K = 2048, N = 8: not materialised), float32 without x64, B = 64.

    Every other example cancels: a_1 = a_2 = e₁, g_1 = 100·u, g_2 = −85·u (ε = 0.15), so its
    fast bound is 1.9 % above the accurate one yet not "loose" (n2 < 1.0201·sq): it is
    clipped 0.9 % harder when no retry happens. Example 0 (a = 2⁶⁵·e₁, g_1 = 2⁻¹²·u, the same
    direction) overflows the fast bound and triggers the retry for the whole batch: removing
    it moves the sum by its own C plus 63·0.009·C. Pre-existing (eed4a2e gives the same 1.58).
    """
    b, t, k, n = 64, 2, 2048, 8
    u = np.full(n, 0.5, np.float32)
    xs = np.zeros((b, t, k), np.float32)
    xs[:, :, 0] = 1.0
    xs[0, :, 0] = 2.0**65
    vs = np.zeros((b, t, n), np.float32)
    vs[:, 0] = 100.0 * u
    vs[:, 1] = -85.0 * u
    vs[0, 0] = 2.0**-12 * u
    vs[0, 1] = 0.0
    with jax.enable_x64(False):
        params = {"w": jnp.zeros((k, n), jnp.float32)}
        grad_fn = dpjax.clipped_grad(_gram_loss, l2_clip_norm=1.0, backend="ghost")
        full, info = grad_fn(params, jnp.asarray(xs), jnp.asarray(vs), mask=jnp.ones(b, bool))
        drop = np.ones(b, bool)
        drop[0] = False
        rest, _ = grad_fn(params, jnp.asarray(xs), jnp.asarray(vs), mask=jnp.asarray(drop))
    assert int(info.num_nonfinite) == 0
    got = float(np.linalg.norm(np.asarray(full["w"], np.float64) - np.asarray(rest["w"])))
    assert got <= 1.0, f"removing example 0 moved the sum by {got!r} > C = 1"


# ------------------------------------------------------------------------------------------------
# the ghost T = 1 bound ``‖a‖²·‖g‖²`` underflows to 0 for tiny C.
#
# ``_rank_one_from_sums`` multiplies the two certified sums of squares in the wide dtype. When
# the exact product is below the smallest normal number, XLA:CPU flushes it to 0 (FTZ), the
# bound U becomes 0 and the clip factor min(1, C/U) is 1: the example entered the sum UNCLIPPED
# (5.4·C at C = 1e-20 in float32; present before the certified-clipping changes too). Its
# contribution is then < √tiny·√(flushed terms) (2⁻⁶³ in float32), so only clip norms far
# below any real use were affected. Fix: ``clipped_grad`` refuses C < 2⁻⁴⁰
# (:data:`dpjax.dp_sgd.clipping.MIN_CLIP_NORM`), and the worst flush at C = 2⁻⁴⁰ stays ≤ C.
#
# Each contribution is measured by differencing the released sums with and without the example
# (mask), in float64.
# ------------------------------------------------------------------------------------------------


def underflow_loss(params, x, v):
    return jnp.dot(x @ params["w"], v)


def _contribution(backend: str, clip: float, dtype, tiny_scale: float) -> float:
    """ℓ2 change of the released sum when example 0 (a = g = tiny_scale·e₁) is removed."""
    b, k, n = 4, 3, 2
    xs = np.zeros((b, k), dtype)
    vs = np.zeros((b, n), dtype)
    xs[0, 0] = tiny_scale
    vs[0, 0] = tiny_scale
    params = {"w": jnp.zeros((k, n), dtype)}
    grad_fn = dpjax.clipped_grad(underflow_loss, l2_clip_norm=clip, backend=backend)
    full, _ = grad_fn(params, jnp.asarray(xs), jnp.asarray(vs), mask=jnp.ones(b, bool))
    drop = np.ones(b, bool)
    drop[0] = False
    rest, _ = grad_fn(params, jnp.asarray(xs), jnp.asarray(vs), mask=jnp.asarray(drop))
    diff = np.asarray(full["w"], np.float64) - np.asarray(rest["w"], np.float64)
    return float(np.linalg.norm(diff))


@pytest.mark.parametrize("clip", [1e-20, 1e-200, MIN_CLIP_NORM / 2])
@pytest.mark.parametrize("per_layer", [False, True])
def test_clip_norms_that_underflow_the_bounds_are_refused(clip, per_layer):
    """Catches clip norms so small that the ghost bound underflows to 0 being accepted."""
    norm = {"w": clip} if per_layer else clip
    with pytest.raises(ValueError, match="l2_clip_norm.*2\\^-40"):
        dpjax.clipped_grad(underflow_loss, l2_clip_norm=norm, per_layer=per_layer)


@pytest.mark.codegen  # a rounding claim: runs on the users' -O3 code
def test_the_worst_flushed_example_stays_below_the_smallest_clip_norm():
    """float32: a = g = 2⁻³²·e₁ flushes ‖a‖²‖g‖² = 2⁻¹²⁸ to 0 (unclipped), contribution
    2⁻⁶⁴ ≤ C = 2⁻⁴⁰: the floor on C covers the flush."""
    with jax.enable_x64(False):
        got = _contribution("ghost", MIN_CLIP_NORM, np.float32, 2.0**-32)
        control = _contribution("vmap", MIN_CLIP_NORM, np.float32, 2.0**-32)
    assert 0.0 < got <= MIN_CLIP_NORM
    assert 0.0 < control <= MIN_CLIP_NORM
