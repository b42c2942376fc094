"""Per-example clipping: bound, closed-form sums, NaN safety, masks, misuse errors, sensitivity."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dpjax
from dpjax.dp_sgd.clipping import clip_pytree

# rounding claims of compiled code: run on the users' -O3 code (tests/conftest.py)
pytestmark = pytest.mark.codegen


def linreg_loss(params, x, y):
    return 0.5 * (jnp.dot(params["w"], x) + params["b"] - y) ** 2


def numpy_clipped_sum(w, b, X, Y, C):
    """Independent reference: closed-form per-example grads (r·x, r), clipped, summed in NumPy."""
    X, Y = np.asarray(X, np.float64), np.asarray(Y, np.float64)
    r = X @ np.asarray(w) + float(b) - Y
    G = np.concatenate([r[:, None] * X, r[:, None]], axis=1)
    norms = np.linalg.norm(G, axis=1)
    scale = np.minimum(1.0, C / np.maximum(norms, 1e-300))
    return (scale[:, None] * G).sum(axis=0), norms


@pytest.fixture
def data(key):
    kx, ky, kw = jax.random.split(key, 3)
    X = 3.0 * jax.random.normal(kx, (13, 4))
    Y = jax.random.normal(ky, (13,))
    params = {"w": jax.random.normal(kw, (4,)), "b": jnp.asarray(0.3)}
    return params, X, Y


def flat(tree):
    return np.concatenate([np.ravel(tree["w"]), np.ravel(tree["b"])])


@pytest.mark.parametrize("method", ["vmap", "auto"])
def test_sum_matches_closed_form_reference(data, method):
    params, X, Y = data
    C = 1.5
    grad_fn = dpjax.clipped_grad(linreg_loss, l2_clip_norm=C, backend=method)
    s, info = jax.jit(grad_fn)(params, X, Y)
    ref, ref_norms = numpy_clipped_sum(params["w"], params["b"], X, Y, C)
    np.testing.assert_allclose(flat(s), ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(info.per_example_norms, ref_norms, rtol=1e-10)
    assert int(info.num_clipped) == int(np.sum(ref_norms > C))
    assert int(info.num_nonfinite) == 0


def test_clipping_bound_holds_for_every_example(data):
    params, X, Y = data
    X = X.at[0].multiply(1e6)  # one huge gradient
    C = 0.7
    grad_fn = dpjax.clipped_grad(linreg_loss, l2_clip_norm=C, backend="vmap")
    one = jax.jit(lambda x, y: grad_fn(params, x[None], y[None])[0])
    contributions = [flat(one(X[i], Y[i])) for i in range(X.shape[0])]
    norms = np.linalg.norm(contributions, axis=1)
    assert np.all(norms <= C * (1 + 1e-12)), norms
    assert np.isclose(norms[0], C)  # the clipped one sits exactly on the bound
    total = flat(grad_fn(params, X, Y)[0])
    np.testing.assert_allclose(total, np.sum(contributions, axis=0), rtol=1e-9)


def test_nan_example_is_zeroed_and_counted(data):
    params, X, Y = data
    grad_fn = dpjax.clipped_grad(linreg_loss, l2_clip_norm=1.0)
    X_bad = X.at[4, 1].set(jnp.nan)
    Y_bad = Y.at[7].set(jnp.inf)
    s, info = jax.jit(grad_fn)(params, X_bad, Y_bad)
    assert np.all(np.isfinite(flat(s)))
    assert int(info.num_nonfinite) == 2
    keep = np.ones(X.shape[0], bool)
    keep[[4, 7]] = False
    ref, _ = numpy_clipped_sum(params["w"], params["b"], X[keep], Y[keep], 1.0)
    np.testing.assert_allclose(flat(s), ref, rtol=1e-10)


def test_nan_unsafe_propagates(data):
    params, X, Y = data
    grad_fn = dpjax.clipped_grad(linreg_loss, l2_clip_norm=1.0, nan_safe=False, backend="vmap")
    s, info = grad_fn(params, X.at[4, 1].set(jnp.nan), Y)
    assert not np.all(np.isfinite(flat(s)))
    assert int(info.num_nonfinite) == 1


def test_padding_rows_contribute_zero(data):
    params, X, Y = data
    mask = np.arange(X.shape[0]) < 9
    X_pad = X.at[9:].set(jnp.nan).at[10].set(1e9)  # garbage in padding rows
    grad_fn = dpjax.clipped_grad(linreg_loss, l2_clip_norm=1.0)
    s, info = jax.jit(grad_fn)(params, X_pad, Y, mask=jnp.asarray(mask))
    ref, _ = numpy_clipped_sum(params["w"], params["b"], X[:9], Y[:9], 1.0)
    np.testing.assert_allclose(flat(s), ref, rtol=1e-10)
    assert np.all(np.asarray(info.per_example_norms)[9:] == 0.0)
    assert int(info.num_nonfinite) == 0
    assert int(info.num_clipped) == int(np.sum(np.asarray(info.per_example_norms)[:9] > 1.0))
    all_masked = grad_fn(params, X_pad, Y, mask=jnp.zeros(X.shape[0], bool))[0]
    assert np.all(flat(all_masked) == 0.0)


# the code paths: one row a chunk (1), a padded last chunk (5), one chunk = the batch (13);
# another padding (4) and a chunk larger than the batch (100, the same path as 13) are slow
SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    "microbatch_size", [1, pytest.param(4, marks=SLOW), 5, 13, pytest.param(100, marks=SLOW)]
)
def test_microbatching_gives_the_same_sum(data, microbatch_size):
    params, X, Y = data
    mask = jnp.asarray(np.arange(X.shape[0]) != 3)
    full = dpjax.clipped_grad(linreg_loss, l2_clip_norm=1.0, backend="vmap")
    micro = dpjax.clipped_grad(
        linreg_loss, l2_clip_norm=1.0, microbatch_size=microbatch_size, backend="vmap"
    )
    s_full, i_full = full(params, X.at[5, 0].set(jnp.nan), Y, mask=mask)
    s_micro, i_micro = jax.jit(micro)(params, X.at[5, 0].set(jnp.nan), Y, mask=mask)
    np.testing.assert_allclose(flat(s_micro), flat(s_full), rtol=1e-10)
    np.testing.assert_allclose(i_micro.per_example_norms, i_full.per_example_norms, rtol=1e-12)
    assert int(i_micro.num_nonfinite) == int(i_full.num_nonfinite) == 1
    assert int(i_micro.num_clipped) == int(i_full.num_clipped)


def test_sensitivity_values():
    g = dpjax.clipped_grad(linreg_loss, l2_clip_norm=2.5)
    assert g.l2_clip_norm == 2.5
    assert g.sensitivity(dpjax.ADD_OR_REMOVE_ONE) == 2.5
    assert g.sensitivity(dpjax.REPLACE_ONE) == 5.0
    assert g.sensitivity("replace_one") == 5.0
    per_leaf = dpjax.clipped_grad(linreg_loss, l2_clip_norm={"w": 3.0, "b": 4.0}, per_layer=True)
    assert per_leaf.sensitivity(dpjax.ADD_OR_REMOVE_ONE) == pytest.approx(5.0)
    assert per_leaf.sensitivity(dpjax.REPLACE_ONE) == pytest.approx(10.0)
    with pytest.raises(ValueError, match="relation"):
        g.sensitivity("zero_out")


def test_per_layer_clipping_bounds_each_leaf(data):
    params, X, Y = data
    X = X * 100.0
    C = 2.0
    g = dpjax.clipped_grad(linreg_loss, l2_clip_norm=C, per_layer=True)
    assert g.sensitivity() == C
    for i in range(3):
        s, _ = g(params, X[i : i + 1], Y[i : i + 1])
        for leaf in jax.tree.leaves(s):  # 2 leaves: each ≤ C/√2, total ≤ C
            assert np.linalg.norm(np.ravel(leaf)) <= C / np.sqrt(2) * (1 + 1e-12)
        assert np.linalg.norm(flat(s)) <= C * (1 + 1e-12)
    g_tree = dpjax.clipped_grad(linreg_loss, l2_clip_norm={"w": 0.3, "b": 0.4}, per_layer=True)
    s, _ = g_tree(params, X[:1], Y[:1])
    assert np.linalg.norm(s["w"]) == pytest.approx(0.3)
    assert abs(float(s["b"])) == pytest.approx(0.4)


def test_mean_gradient_misuse_is_an_error(data):
    params, X, Y = data
    g = dpjax.clipped_grad(linreg_loss, l2_clip_norm=1.0)
    with pytest.raises(ValueError, match="leading batch axis"):
        g(params, X, Y[:5])  # arguments disagree on B
    with pytest.raises(ValueError, match="leading batch axis"):
        g(params, X[0], jnp.asarray(1.0))  # a single example without a batch axis

    def batch_mean_loss(p, x, y):  # written for a batch: returns per-row residuals
        return 0.5 * (x @ p["w"] + p["b"] - y) ** 2

    with pytest.raises(ValueError, match="loss_fn"):
        dpjax.clipped_grad(batch_mean_loss, l2_clip_norm=1.0)(params, X[:, None, :], Y[:, None])
    with pytest.raises(ValueError, match="mask"):
        g(params, X, Y, mask=jnp.ones(4, bool))
    with pytest.raises(ValueError, match="mask"):
        g(params, X, Y, mask=jnp.ones(X.shape[0]))


def test_noise_transform_refuses_per_example_gradients(key, data):
    params, X, Y = data
    per_example = jax.vmap(jax.grad(linreg_loss), in_axes=(None, 0, 0))(params, X, Y)
    tx = dpjax.add_gaussian_noise(1.0, key=key)
    with pytest.raises(ValueError, match="updates"):
        tx.update(per_example, tx.init(params), params)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"l2_clip_norm": 0.0}, "l2_clip_norm"),
        ({"l2_clip_norm": -1.0}, "l2_clip_norm"),
        ({"l2_clip_norm": float("inf")}, "l2_clip_norm"),
        ({"l2_clip_norm": 1.0, "backend": "fast"}, "backend"),
        ({"l2_clip_norm": 1.0, "microbatch_size": 0}, "microbatch_size"),
        ({"l2_clip_norm": {"w": 1.0, "b": 1.0}}, "l2_clip_norm"),
        ({"l2_clip_norm": {"w": 1.0, "b": 0.0}, "per_layer": True}, "l2_clip_norm"),
    ],
)
def test_bad_arguments_raise(kwargs, name):
    with pytest.raises(ValueError, match=name):
        dpjax.clipped_grad(linreg_loss, **kwargs)


def test_float32_dtype_is_preserved(data):
    params, X, Y = data
    p32 = jax.tree.map(lambda x: x.astype(jnp.float32), params)
    g = dpjax.clipped_grad(linreg_loss, l2_clip_norm=1.0)
    s, info = jax.jit(g)(p32, X.astype(jnp.float32), Y.astype(jnp.float32))
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(s))
    ref, _ = numpy_clipped_sum(params["w"], params["b"], X, Y, 1.0)
    np.testing.assert_allclose(flat(s), ref, rtol=1e-4)


def test_clip_pytree_edge_cases():
    clipped, norm = clip_pytree({"a": jnp.zeros(3)}, 1.0)
    assert float(norm) == 0.0 and np.all(np.asarray(clipped["a"]) == 0.0)
    clipped, norm = clip_pytree({"a": jnp.array([0.3, 0.4])}, 1.0)
    np.testing.assert_allclose(clipped["a"], [0.3, 0.4])
    with pytest.raises(ValueError, match="l2_clip_norm"):
        clip_pytree({"a": jnp.ones(2)}, 0.0)


def test_vmap_over_datasets(data):
    """Audits vmap the clipped sum over neighbouring data sets D, D'."""
    params, X, Y = data
    Xs = jnp.stack([X, X.at[0].set(10.0)])
    g = dpjax.clipped_grad(linreg_loss, l2_clip_norm=1.0, microbatch_size=4)
    sums, info = jax.jit(jax.vmap(g, in_axes=(None, 0, None)))(params, Xs, Y)
    for i in range(2):
        ref, _ = numpy_clipped_sum(params["w"], params["b"], Xs[i], Y, 1.0)
        np.testing.assert_allclose(flat(jax.tree.map(lambda s: s[i], sums)), ref, rtol=1e-10)
    diff = np.linalg.norm(flat(jax.tree.map(lambda s: s[0] - s[1], sums)))
    assert diff <= 2.0 * (1 + 1e-12)  # replace-one sensitivity 2C
    assert info.per_example_norms.shape == (2, X.shape[0])


# ----------------------------------------------------------------------------- certified clipping


def contribution_norm(tree):
    """ℓ2 norm of a returned sum, measured in float64 NumPy (the sum of a batch of one)."""
    return float(
        np.sqrt(sum(np.sum(np.asarray(x, np.float64) ** 2) for x in jax.tree.leaves(tree)))
    )


def int_feature_loss(w, x, y):
    dims = (((0,), (0,)), ((), ()))
    h = jax.lax.dot_general(x, w, dims, preferred_element_type=w.dtype)  # int x, float w
    return 0.5 * (h - y) ** 2


# "auto" (= ghost here) in the slow suite; its integer case stays in the default suite in
# tests/dp_sgd/test_clip_contribution_search.py::test_integer_features_are_clipped.
@pytest.mark.parametrize("method", ["vmap", "ghost", pytest.param("auto", marks=pytest.mark.slow)])
@pytest.mark.parametrize("int_dtype", [jnp.int32, jnp.int64])
def test_integer_features_are_clipped(method, int_dtype):
    """Finding 1: int activations made ‖a‖²‖g‖² = 2³² wrap to 0 (contribution 65536 C)."""
    grad_fn = dpjax.clipped_grad(int_feature_loss, l2_clip_norm=1.0, backend=method)
    for w_dtype in (jnp.float32, jnp.float64):
        w = jnp.ones(1, w_dtype)
        s, info = grad_fn(w, jnp.array([[256]], int_dtype), jnp.zeros(1, w_dtype))
        norm = contribution_norm(s)
        assert 0.999 <= norm <= 1.0 + 1e-6, (method, w_dtype, norm)
        np.testing.assert_allclose(np.asarray(info.per_example_norms), [65536.0], rtol=1e-6)
        assert int(info.num_clipped) == 1
        # fractional gradients are not truncated: exact sum 0.5·256·... with a small residual
        s, _ = grad_fn(w, jnp.array([[1], [2]], int_dtype), jnp.array([0.75, 1.5], w_dtype))
        # the second gradient has norm exactly C: it is clipped to f·C, f the summation shrink
        f = grad_fn.recorded_shrink(grad_fn.release_for(2))
        np.testing.assert_allclose(np.asarray(s, np.float64), [0.25 + f], rtol=1e-6)


LOW_PRECISION = [jnp.bfloat16, jnp.float16]


@pytest.mark.parametrize("method", ["vmap", "ghost"])
@pytest.mark.parametrize("dtype", LOW_PRECISION)
def test_low_precision_contribution_is_at_most_c(key, method, dtype):
    """Finding 5: bf16/fp16 factors and products rounded up (1.0033 C for bf16 on main)."""
    kw, kx = jax.random.split(key)
    d = 64
    w = jax.random.normal(kw, (d, 3), jnp.float32).astype(dtype)
    xs = jax.random.normal(kx, (40, d), jnp.float32).astype(dtype)

    def loss(w, x):
        return jnp.sum(jnp.sin(x @ w))

    grad_fn = jax.jit(dpjax.clipped_grad(loss, l2_clip_norm=1.0, backend=method))
    norms = [contribution_norm(grad_fn(w, 10.0 * xs[i : i + 1])[0]) for i in range(20)]
    assert max(norms) <= 1.0 + 1e-6, max(norms)
    assert min(norms) >= 0.999  # every example is clipped and the shrink is ≤ 0.1%


@pytest.mark.parametrize("method", ["vmap", "ghost", "auto"])
@pytest.mark.parametrize("microbatch_size", [None, 3])
def test_empty_batch_returns_a_zero_sum(data, method, microbatch_size):
    """Finding 8: a (0, d) batch raised ZeroDivisionError with backend="auto"."""
    params, X, Y = data
    grad_fn = dpjax.clipped_grad(
        linreg_loss, l2_clip_norm=1.0, backend=method, microbatch_size=microbatch_size
    )
    s, info = grad_fn(params, X[:0], Y[:0])
    assert jax.tree.structure(s) == jax.tree.structure(params)
    assert all(np.all(np.asarray(v) == 0.0) for v in jax.tree.leaves(s))
    assert info.per_example_norms.shape == (0,)
    assert int(info.num_nonfinite) == 0 and int(info.num_clipped) == 0


def test_clip_pytree_low_precision_is_at_most_c():
    tree = {"a": jnp.full((300,), 0.7, jnp.bfloat16), "b": jnp.full((5,), 3.0, jnp.float16)}
    clipped, norm = clip_pytree(tree, 1.0)
    assert clipped["a"].dtype == jnp.bfloat16 and clipped["b"].dtype == jnp.float16
    assert 0.99 <= contribution_norm(clipped) <= 1.0 + 1e-6
    np.testing.assert_allclose(float(norm), np.sqrt(300 * 0.69921875**2 + 45.0), rtol=1e-12)


@pytest.mark.parametrize("method", ["vmap", "ghost"])
def test_low_precision_sum_is_returned_wide_for_add_remove(key, method):
    """bf16 params: a sum rounded to bf16 moves by ≈ 2⁻⁹‖S‖ between neighbours, so it is float32."""
    kw, kx = jax.random.split(key)
    w = jax.random.normal(kw, (16, 4), jnp.float32).astype(jnp.bfloat16)
    xs = (3.0 * jax.random.normal(kx, (8, 16), jnp.float32)).astype(jnp.bfloat16)

    def loss(w, x):
        return jnp.sum(jnp.sin(x @ w))

    grad_fn = jax.jit(dpjax.clipped_grad(loss, l2_clip_norm=1.0, backend=method))
    full, _ = grad_fn(w, xs)
    assert full.dtype == jnp.float32
    for row in range(8):
        rest, _ = grad_fn(w, jnp.delete(xs, row, axis=0))
        diff = np.asarray(full, np.float64) - np.asarray(rest, np.float64)
        assert np.linalg.norm(diff) <= 1.0 + 1e-6


# ------------------------------------------------------------------------------------------------
# Issue 25's papercuts: each test attacks one fix and fails on the code before it.
# ------------------------------------------------------------------------------------------------

# ----------------------------------------------------------------------------- loss conventions


def test_clipped_grad_names_make_private_form_for_a_one_pytree_loss():
    """Catches an opaque error when make_private's loss form is given to clipped_grad."""
    loss = lambda w, ex: jnp.dot(w, ex[0]) - ex[1]  # noqa: E731  make_private's form
    grad_fn = dpjax.clipped_grad(loss, l2_clip_norm=1.0)
    with pytest.raises(ValueError, match=r"loss_fn.*loss_fn\(params, \*example\).*make_private"):
        grad_fn(jnp.zeros(2), jnp.ones((4, 2)), jnp.ones(4))


def test_clipped_grad_keeps_type_errors_from_inside_the_loss():
    """Catches a TypeError raised inside the loss being swallowed or mislabelled by clipped_grad."""

    def loss(w, x):
        return jnp.dot(w, x) + "not a number"

    with pytest.raises(TypeError):
        dpjax.clipped_grad(loss, l2_clip_norm=1.0)(jnp.zeros(2), jnp.ones((3, 2)))
