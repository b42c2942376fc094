"""Automatic clipping (AUTO-S) and per-layer (group-wise) clipping: certified contributions.

Automatic: each example contributes R·g/(‖g‖ + γ); the claim is that the COMPUTED contribution
has norm ≤ R (sensitivity R, R = 1 by default) on the vmap, ghost and make_private paths, for
zero, subnormal, huge and non-finite gradients. Per-layer: leaf l of an example contributes
≤ c_l, the example ≤ sqrt(Σ c_l²), which is the sensitivity and the noise scale of make_private.

Exact checks: float32 results are measured in float64 (squares of float32 values are exact in
float64), float64 results with Python fractions (exact), so a violation by one rounding is seen.
"""

import math
import warnings
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dpjax
from dpjax.dp_sgd.clipping import DEFAULT_GAMMA, clipped_grad
from tests.dp_sgd import adv_harness as H

# rounding claims of compiled code: run on the users' -O3 code (tests/conftest.py)
pytestmark = pytest.mark.codegen

ROWS = 16


def _exact_norm(tree) -> Fraction:
    """‖tree‖² as an exact fraction (every float is a dyadic rational)."""
    total = Fraction(0)
    for leaf in jax.tree.leaves(tree):
        for v in np.asarray(leaf, np.float64).ravel():
            total += Fraction(float(v)) ** 2
    return total


def _adversarial_rows(dtype, d: int, seed: int) -> np.ndarray:
    """Rows of magnitudes 0, subnormal, 1e-30 ... 1e30, near the dtype's max, NaN and inf."""
    rng = np.random.default_rng(seed)
    info = np.finfo(dtype)
    scales = [0.0, float(info.smallest_subnormal) * 3, 1e-30, 1e-3, 1.0, 7e3, 1e6, 3e12, 1e30]
    scales += [float(info.max) / 4, float(info.max)]
    rows = [rng.standard_normal(d) * s for s in scales]
    rows += [
        rng.standard_normal(d) * 10.0 ** rng.uniform(2, 9) for _ in range(ROWS - 2 - len(rows))
    ]
    rows += [np.full(d, np.nan), np.r_[np.inf, np.zeros(d - 1)]]
    with np.errstate(over="ignore"):
        return np.asarray(rows).astype(dtype)


def _one_row_contributions(grad_fn, params, x):
    """The released sum with exactly one real row (mask one-hot): that row's contribution."""
    for i in range(x.shape[0]):
        mask = jnp.asarray(np.arange(x.shape[0]) == i)
        s, _ = grad_fn(params, x, mask=mask)
        yield i, s


def _linear(w, x):
    return jnp.dot(w, x)  # gradient = x exactly


@pytest.mark.parametrize(
    "backend, x64",
    [
        ("vmap", False),  # default; ghost's default twin: the add/remove test below
        pytest.param("ghost", True, marks=pytest.mark.slow),
        pytest.param("vmap", True, marks=pytest.mark.slow),
        pytest.param("ghost", False, marks=pytest.mark.slow),
    ],
)
def test_automatic_contribution_at_most_R(backend, x64):
    """Every computed contribution has norm ≤ R exactly; finite non-zero rows come out ≈ R."""
    dtype = np.float64 if x64 else np.float32
    d = 7
    with jax.enable_x64(x64):
        x = jnp.asarray(_adversarial_rows(dtype, d, seed=3))
        w = jnp.zeros(d, dtype)
        for r in (0.37,):
            fn = clipped_grad(_linear, l2_clip_norm=r, clip_rule="automatic", backend=backend)
            assert fn.sensitivity() == r and fn.sensitivity("replace_one") == 2 * r
            for i, s in _one_row_contributions(fn, w, x):
                assert bool(jnp.all(jnp.isfinite(s))), f"row {i}: non-finite contribution"
                sq = _exact_norm(s)
                assert sq <= Fraction(r) ** 2, f"row {i}: ‖contribution‖ = {math.sqrt(sq)} > {r}"
                g = np.asarray(x[i], np.float64)
                norm = float(np.linalg.norm(g)) if np.all(np.isfinite(g)) else math.nan
                if 1.0 <= norm <= 1e30:  # AUTO-S value R·‖g‖/(‖g‖ + γ), up to the shrink f
                    assert math.sqrt(sq) == pytest.approx(r * norm / (norm + 0.01), rel=1e-3)
                if norm == 0.0 or not math.isfinite(norm):
                    assert sq == 0  # zero gradient, NaN and inf rows contribute nothing


@pytest.mark.slow
def test_automatic_textbook_factor_would_exceed_R():
    """The uncertified factor R/(‖g‖_computed + γ) exceeds R on these rows: the test above can
    fail (it is the rounding the certified denominator covers)."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((400, 7)) * 10.0 ** rng.uniform(4, 9, (400, 1))).astype(np.float32)
    with jax.enable_x64(False):
        norm = jnp.sqrt(jnp.sum(jnp.square(jnp.asarray(x)), axis=1))
        naive = jnp.asarray(x) * (1.0 / (norm + jnp.float32(0.01)))[:, None]
    exact = np.sum(np.asarray(naive, np.float64) ** 2, axis=1)
    assert np.max(exact) > 1.0


@pytest.mark.parametrize("backend", ["vmap", "ghost"])
def test_automatic_add_remove_moves_sum_at_most_R(backend):
    """Neighbours: the released float32 sums with and without one adversarial row differ by ≤ R."""
    d = 7
    with jax.enable_x64(False):
        benign = np.random.default_rng(5).standard_normal((ROWS, d)).astype(np.float32)
        bad = _adversarial_rows(np.float32, d, seed=9)
        fn = clipped_grad(_linear, l2_clip_norm=1.0, clip_rule="automatic", backend=backend)
        w = jnp.zeros(d, jnp.float32)
        worst = 0.0
        for j in range(0, bad.shape[0], 3):
            x = benign.copy()
            x[j] = bad[j]
            full, _ = fn(w, jnp.asarray(x))
            without, _ = fn(w, jnp.asarray(x), mask=jnp.asarray(np.arange(ROWS) != j))
            diff = np.linalg.norm(np.asarray(full, np.float64) - np.asarray(without, np.float64))
            worst = max(worst, diff)
        assert worst <= 1.0 + 1e-9, worst
        assert worst > 0.9  # the rows' contributions are ≈ 1 (not a vacuous check)


def test_automatic_bad_arguments_raise():
    with pytest.raises(ValueError, match="gamma"):
        clipped_grad(_linear, clip_rule="automatic", gamma=0.0)
    with pytest.raises(ValueError, match="gamma"):
        clipped_grad(_linear, clip_rule="automatic", gamma=-1e-3)
    with pytest.raises(ValueError, match="gamma"):
        clipped_grad(_linear, clip_rule="automatic", gamma=math.inf)
    with pytest.raises(ValueError, match="clip_rule"):
        clipped_grad(_linear, l2_clip_norm=1.0, clip_rule="auto-s")
    with pytest.raises(ValueError, match="l2_clip_norm"):
        clipped_grad(_linear)  # flat clipping needs C
    with pytest.raises(ValueError, match="per_layer"):
        clipped_grad(_linear, clip_rule="automatic", per_layer=True)


# ----------------------------------------------------------------------------- per-layer


def _mlp_loss(p, x):
    h = jnp.tanh(x @ p["w1"] + p["b1"])
    return jnp.sum(h @ p["w2"]) * p["s"]


def _mlp(dtype):
    rng = np.random.default_rng(0)
    p = {
        "w1": rng.standard_normal((5, 6)),
        "b1": rng.standard_normal(6),
        "w2": rng.standard_normal((6, 3)),
        "s": np.asarray(1.0),
    }
    return jax.tree.map(lambda v: jnp.asarray(v, dtype), p)


CLIPS = {"w1": 0.3, "b1": 0.2, "w2": 0.5, "s": 0.1}


@pytest.mark.parametrize("backend", ["ghost", pytest.param("vmap", marks=pytest.mark.slow)])
def test_per_layer_each_leaf_and_total_within_bound(backend):
    """Leaf l's computed contribution ≤ c_l exactly, the example's ≤ sqrt(Σ c_l²)."""
    with jax.enable_x64(False):
        params = _mlp(jnp.float32)
        rng = np.random.default_rng(1)
        x = rng.standard_normal((8, 5)) * 10.0 ** rng.uniform(-2, 6, (8, 1))
        x = jnp.asarray(x, jnp.float32)
        fn = clipped_grad(_mlp_loss, l2_clip_norm=CLIPS, per_layer=True, backend=backend)
        total = math.sqrt(sum(c * c for c in CLIPS.values()))
        assert fn.sensitivity() == pytest.approx(total, rel=1e-15)
        saturated = 0
        for i, s in _one_row_contributions(fn, params, x):
            for name, c in CLIPS.items():
                sq = _exact_norm(s[name])
                assert sq <= Fraction(c) ** 2, f"row {i} {name}: {math.sqrt(sq)} > {c}"
                saturated += sq > Fraction(0.99 * c) ** 2
            assert _exact_norm(s) <= Fraction(total) ** 2
        assert saturated > 8  # most leaves are clipped at their own c_l


@pytest.mark.slow
def test_per_layer_ghost_matches_vmap():
    with jax.enable_x64(True):
        params = _mlp(jnp.float64)
        x = jnp.asarray(np.random.default_rng(2).standard_normal((9, 5)) * 3.0)
        sums = [
            clipped_grad(_mlp_loss, l2_clip_norm=CLIPS, per_layer=True, backend=b)(params, x)[0]
            for b in ("vmap", "ghost")
        ]
        for name in CLIPS:
            np.testing.assert_allclose(sums[0][name], sums[1][name], rtol=1e-9, atol=1e-12)


@pytest.mark.slow
def test_per_layer_float_is_equal_split():
    with jax.enable_x64(True):
        params = _mlp(jnp.float64)
        x = jnp.asarray(np.random.default_rng(4).standard_normal((6, 5)) * 5.0)
        split = {k: 2.0 / math.sqrt(4) for k in CLIPS}
        a, _ = clipped_grad(_mlp_loss, l2_clip_norm=2.0, per_layer=True, backend="ghost")(params, x)
        b, _ = clipped_grad(_mlp_loss, l2_clip_norm=split, per_layer=True, backend="ghost")(
            params, x
        )
        for k in CLIPS:
            np.testing.assert_array_equal(a[k], b[k])


@pytest.mark.parametrize(
    "bad",
    [
        {**CLIPS, "w1": 0.0},
        {**CLIPS, "b1": -1.0},
        {**CLIPS, "w2": math.inf},
        {**CLIPS, "s": math.nan},
    ],
)
def test_per_layer_bad_clip_norm_raises(bad):
    with pytest.raises(ValueError, match="l2_clip_norm"):
        clipped_grad(_mlp_loss, l2_clip_norm=bad, per_layer=True)


def test_per_layer_tree_not_matching_params_raises():
    fn = clipped_grad(_mlp_loss, l2_clip_norm={"w1": 1.0, "b1": 1.0}, per_layer=True)
    with pytest.raises(ValueError, match="l2_clip_norm"):
        fn(_mlp(jnp.float64), jnp.ones((2, 5)))


# ----------------------------------------------------------------------------- make_private


def _private(loss, **kwargs):
    kw = dict(
        optimizer=optax.sgd(1.0),
        dataset_size=64,
        batch_size=32,
        steps=1,
        delta=1e-5,
        key=jax.random.key(0),
    )
    kw.update(kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dpjax.PrivacyLeakWarning)
        return dpjax.make_private(loss, **kw)


def test_make_private_automatic_sensitivity_and_accounting():
    """make_private's clipped sum moves by ≤ 1 when a row is added; σ and ε are those of C = 1."""
    auto = _private(
        lambda w, ex: jnp.dot(w, ex), l2_clip_norm=1.0, clip_rule="automatic", noise_multiplier=1.2
    )
    flat = _private(lambda w, ex: jnp.dot(w, ex), l2_clip_norm=1.0, noise_multiplier=1.2)
    assert auto.l2_clip_norm == 1.0 and auto.gamma == 0.01
    assert auto.grad_fn.sensitivity() == 1.0 and auto.grad_fn.gamma == 0.01
    assert auto.epsilon(auto.init(jnp.zeros(7))) == flat.epsilon(flat.init(jnp.zeros(7)))
    d = 7
    x = np.random.default_rng(6).standard_normal((ROWS, d))
    x[3] = _adversarial_rows(np.float64, d, seed=1)[9]  # near float64 max / 4
    x[5] *= 1e-300
    w = jnp.zeros(d)
    for j in (3, 5, 8):
        full, _ = auto.grad_fn(w, jnp.asarray(x))
        without, _ = auto.grad_fn(w, jnp.asarray(x), mask=jnp.asarray(np.arange(ROWS) != j))
        assert np.linalg.norm(np.asarray(full) - np.asarray(without)) <= 1.0
    with pytest.raises(ValueError, match="gamma"):
        _private(_linear, l2_clip_norm=1.0, clip_rule="automatic", gamma=0.0, noise_multiplier=1.0)


def test_make_private_per_layer_bound_and_arguments():
    """Cheap twin of the noise-scale test: the bound make_private's noise uses, and refusals."""
    clips = {"a": 3.0, "b": 4.0}
    private = _private(_linear, l2_clip_norm=clips, per_layer=True, noise_multiplier=0.5)
    assert private.l2_clip_norm == 5.0 and private.grad_fn.sensitivity() == 5.0
    for bad in ({"a": 1.0, "b": -2.0}, {"a": 1.0, "b": math.nan}):
        with pytest.raises(ValueError, match="l2_clip_norm"):
            _private(_linear, l2_clip_norm=bad, per_layer=True, noise_multiplier=1.0)
    with pytest.raises(ValueError, match="per_layer"):
        _private(
            _linear,
            l2_clip_norm=1.0,
            per_layer=True,
            noise_multiplier=1.0,
            user_ids=np.arange(64) // 2,
        )


@pytest.mark.slow
def test_make_private_per_layer_noise_scale_is_total_bound():
    """The noise std is σ·sqrt(Σ c_l²) (not σ·max c_l or σ·Σ c_l) for per-layer clip norms."""
    clips = {"a": 3.0, "b": 4.0}  # total 5, max 4, sum 7
    params = {"a": jnp.zeros(1500), "b": jnp.zeros(1500)}

    def flat_loss(p, ex):  # zero gradient: the update is the noise alone
        return 0.0 * (jnp.dot(p["a"], ex[:1500]) + jnp.dot(p["b"], ex[1500:]))

    sigma = 0.5
    private = _private(flat_loss, l2_clip_norm=clips, per_layer=True, noise_multiplier=sigma)
    assert private.l2_clip_norm == 5.0 and private.layer_clip_norms == clips
    data = jnp.ones((64, 3000))
    state = private.init(params)
    new, _, _ = private.step(params, state, data)
    noise = np.concatenate([np.asarray(new[k]) for k in clips]) * -private.expected_batch_size
    std = float(np.std(noise))
    tol = 5.0 / math.sqrt(2 * noise.size)  # 5 standard errors of a sample std
    assert abs(std / (sigma * 5.0) - 1) < tol, std
    with pytest.raises(ValueError, match="l2_clip_norm"):
        _private(flat_loss, l2_clip_norm={"a": 1.0, "b": -2.0}, per_layer=True, noise_multiplier=1)
    with pytest.raises(ValueError, match="per_layer"):
        _private(
            flat_loss,
            l2_clip_norm=1.0,
            per_layer=True,
            noise_multiplier=1.0,
            user_ids=np.arange(64) // 2,
        )


def _smallest_upper(row, dtype):
    """The smallest float of ``dtype`` that is ≥ the exact ℓ2 norm of ``row``."""
    sq = _exact_norm(row)
    u = dtype(math.sqrt(sq))
    while Fraction(float(u)) ** 2 < sq:
        u = np.nextafter(u, dtype(np.inf))
    while Fraction(float(np.nextafter(u, dtype(0)))) ** 2 >= sq:
        u = np.nextafter(u, dtype(0))
    return u


@pytest.mark.parametrize("x64", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_automatic_scale_covers_its_own_rounding(x64):
    """``automatic_scale`` with the TIGHTEST valid bound U (‖g‖ rounded up): the product
    g·factor, as computed, has norm ≤ R exactly. The textbook R/(U + γ) fails here."""
    from dpjax.dp_sgd import _certified

    dtype = np.float64 if x64 else np.float32
    rng = np.random.default_rng(11)
    x = rng.standard_normal((3000, 5)) * 10.0 ** rng.uniform(5, 12, (3000, 1))
    x = x.astype(dtype)
    upper = np.asarray([_smallest_upper(row, dtype) for row in x])
    with jax.enable_x64(x64):
        dt = jnp.dtype(dtype)
        eta = _certified.shrink(dt, [dt], [dt])
        factor = _certified.automatic_scale(jnp.asarray(upper, dt), 1.0, 0.01, eta)
        out = np.asarray(jnp.asarray(x) * factor[:, None])
    worst = max(_exact_norm(row) for row in out)
    assert worst <= 1, float(worst)
    assert worst > Fraction(1 - 1e-5)  # tight: the factor is not a gross shrink


def test_sharded_refuses_automatic_clipping():
    from dpjax.dp_sgd import sharded

    fn = clipped_grad(_linear, clip_rule="automatic")
    with pytest.raises(ValueError, match="grad_fn"):
        sharded.sharded_clipped_grad(fn, None)


# ----------------------------------------------------------------------------- low precision
#
# bfloat16 / float16 parameters (so bfloat16 / float16 per-example gradients) through
# make_private's clipped sum, vmap and ghost. The search (tests/dp_sgd/adv_harness.py,
# ``block_search``) measures B = 16 examples per call: each example's gradient lives in its own
# block of the parameters, so block i of the released float32 sum is example i's contribution,
# rounding included. Starting rows: every 7th…128th mantissa of the dtype at the exponents
# subnormal, smallest normal, ≈ γ, 1/2, 1, 2^10 and the largest (one coordinate: an exact norm),
# equal magnitudes (the sum of squares rounds at every step), one coordinate dominating, norms
# near γ, entries at the dtype's max (bfloat16: ‖g‖² overflows float32: dropped), random
# magnitudes, NaN / ±inf; then 6 rounds of ±1…3-ulp mutants of the 16 worst rows. Claim: every
# contribution ≤ f·R (f: the summation shrink of the 16-row call; AUTO-S), leaf l ≤ f·c_l and the
# example ≤ f·sqrt(Σ c_l²) (per-layer), every released sum finite.

LOW = {"bf16": jnp.bfloat16, "f16": jnp.float16}
BLOCK_ROWS, BLOCK_WIDTH = 16, 4
LAYER_CLIPS = {"a": 0.3, "b": 0.4}


def _low_precision_starts(dtype, width: int, seed: int, gamma: float, count: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    sweep = H.one_hot_sweep(dtype, width, count=count)
    return np.concatenate([sweep, H.structured_rows(dtype, width, rng, gamma)])


def _two_leaf_starts(dtype, width: int, seed: int, count: int) -> np.ndarray:
    """Rows of two leaves: one leaf adversarial and the other 0, and both adversarial."""
    one = _low_precision_starts(dtype, width, seed, DEFAULT_GAMMA, count)
    zero = np.zeros_like(one)
    other = one[np.random.default_rng(seed + 1).permutation(one.shape[0])]
    return np.concatenate([np.c_[one, zero], np.c_[zero, one], np.c_[one, other]])


def _block_release(model, private):
    params = model.params()
    grad_fn = private.grad_fn

    def release(batch):
        return grad_fn(params, batch)[0]

    release(model.batch(np.zeros((model.rows, model.width * len(model.leaves)), model.dtype)))
    return release, grad_fn.recorded_shrink(grad_fn.release_for(model.rows))


def _check_search(worst, what):
    assert worst.finite, f"{what}: a non-finite released sum (NaN/inf rows must be dropped)"
    assert worst.ratio <= 1.0, f"{what}: contribution {worst.ratio!r}·bound at {worst.row!r}"
    assert worst.total_ratio <= 1.0, f"{what}: total {worst.total_ratio!r}·bound"
    assert worst.ratio > 1 - 1e-4, f"{what}: the search never reached the bound ({worst.ratio})"


def _automatic_search(dtype_name, clipping, gamma, seed, rows=BLOCK_ROWS, count=256, rounds=6):
    dtype = LOW[dtype_name]
    model = H.BlockModel(("w",), rows, BLOCK_WIDTH, dtype)
    r = 0.37
    private = _private(
        model.loss,
        l2_clip_norm=r,
        clip_rule="automatic",
        gamma=gamma,
        noise_multiplier=1.0,
        clipping=clipping,
    )
    release, f = _block_release(model, private)
    starts = _low_precision_starts(dtype, BLOCK_WIDTH, seed, gamma, count)
    worst = H.block_search(release, model, [f * r], f * r, starts, seed=seed, generations=rounds)
    return worst, f


LOW_CASES = [
    ("bf16", "vmap"),
    ("f16", "ghost"),
    pytest.param("bf16", "ghost", marks=pytest.mark.slow),
    pytest.param("f16", "vmap", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("dtype_name, clipping", LOW_CASES)
def test_automatic_low_precision_search_contribution_at_most_R(dtype_name, clipping):
    """AUTO-S with bf16/fp16 gradients (x64 off, the JAX default): the worst contribution the
    structured search finds is ≤ f·R and within 1e-4 of it."""
    with jax.enable_x64(False):
        worst, f = _automatic_search(dtype_name, clipping, DEFAULT_GAMMA, seed=21)
    _check_search(worst, f"automatic {dtype_name} {clipping}")


def _per_layer_search(dtype_name, clipping, seed, rows=BLOCK_ROWS, count=256, rounds=6):
    dtype = LOW[dtype_name]
    model = H.BlockModel(("a", "b"), rows, BLOCK_WIDTH, dtype)
    private = _private(
        model.loss,
        l2_clip_norm=LAYER_CLIPS,
        per_layer=True,
        noise_multiplier=1.0,
        clipping=clipping,
    )
    release, f = _block_release(model, private)
    clips = [f * LAYER_CLIPS[k] for k in model.leaves]
    total = f * math.sqrt(sum(c * c for c in LAYER_CLIPS.values()))
    starts = _two_leaf_starts(dtype, BLOCK_WIDTH, seed, count)
    worst = H.block_search(release, model, clips, total, starts, seed=seed, generations=rounds)
    return worst, f


@pytest.mark.parametrize(
    "dtype_name, clipping",
    [
        ("bf16", "ghost"),
        ("f16", "vmap"),
        pytest.param("bf16", "vmap", marks=pytest.mark.slow),
        pytest.param("f16", "ghost", marks=pytest.mark.slow),
    ],
)
def test_per_layer_low_precision_search_each_leaf_within_its_clip(dtype_name, clipping):
    """Per-layer clip norms c_a = 0.3, c_b = 0.4 (total 0.5) with bf16/fp16 gradients: leaf l's
    worst contribution ≤ f·c_l, the example's ≤ f·0.5, every released sum finite."""
    with jax.enable_x64(False):
        worst, f = _per_layer_search(dtype_name, clipping, seed=22)
    _check_search(worst, f"per-layer {dtype_name} {clipping}")


EXHAUSTIVE = [(d, c) for d in LOW for c in ("vmap", "ghost")]


@pytest.mark.slow
@pytest.mark.parametrize("dtype_name, clipping", EXHAUSTIVE)
def test_automatic_low_precision_exhaustive_search(dtype_name, clipping):
    """The default search with one example per call (no block zeros in its norm: the tightest
    certified bound) and every mantissa of the dtype, 12 mutation rounds."""
    with jax.enable_x64(False):
        worst, _ = _automatic_search(
            dtype_name, clipping, DEFAULT_GAMMA, seed=31, rows=1, count=1024, rounds=12
        )
    _check_search(worst, f"automatic {dtype_name} {clipping} (exhaustive)")


@pytest.mark.slow
@pytest.mark.parametrize("dtype_name, clipping", EXHAUSTIVE)
def test_per_layer_low_precision_exhaustive_search(dtype_name, clipping):
    with jax.enable_x64(False):
        worst, _ = _per_layer_search(dtype_name, clipping, seed=32, rows=1, count=1024, rounds=12)
    _check_search(worst, f"per-layer {dtype_name} {clipping} (exhaustive)")
