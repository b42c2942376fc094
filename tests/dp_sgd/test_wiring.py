"""σ and C stated once, the padding mask that cannot be forgotten, optax.MultiSteps refused.

Each test fails on the code before issue 14 (part B): ``dp_sgd_optimizer`` took C on its own
and accepted any value, ``ClippedGrad`` had no ``batch=`` path, ``optax.MultiSteps`` around a
DP-SGD optimizer was accepted, ``event_for`` did not exist.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy import stats

import dpjax
from dpjax.dp_sgd import PaddedBatch, event_for, noise_releases
from dpjax.dp_sgd.samplers import realised_sampling_rate
from dpjax.events import PoissonSampledGaussianEvent
from tests.helpers import assert_distribution


def linear_loss(w, x, y):
    """Per-example loss with gradient (w·x − y)·x: at w = 0 the gradient is −y·x."""
    return 0.5 * (jnp.dot(w, x) - y) ** 2


def reference_clipped_sum(X, Y, rows, C):
    """Σ_{i in rows} clip_C(−y_i x_i) in float64 NumPy (the gradient at w = 0)."""
    total = np.zeros(X.shape[1])
    for i in rows:
        g = -Y[i] * X[i]
        total += g * min(1.0, C / np.linalg.norm(g))
    return total


# ----------------------------------------------------------------------------- C stated once


def test_clip_norm_different_from_the_clipped_grad_is_refused(key):
    """The issue's footgun: clipped_grad(C=10), dp_sgd_optimizer(C=1) — the real σ was 0.1."""
    grad_fn = dpjax.clipped_grad(linear_loss, l2_clip_norm=10.0)
    with pytest.raises(ValueError, match="l2_clip_norm must be the clip norm of clipped_grad"):
        dpjax.dp_sgd_optimizer(
            optimizer=optax.sgd(1.0),
            clipped_grad=grad_fn,
            l2_clip_norm=1.0,
            noise_multiplier=1.0,
            normalizer=1.0,
            key=key,
        )


def test_neither_clipped_grad_nor_clip_norm_is_refused(key):
    with pytest.raises(ValueError, match="clipped_grad must be"):
        dpjax.dp_sgd_optimizer(
            optimizer=optax.sgd(1.0), noise_multiplier=1.0, normalizer=1.0, key=key
        )
    with pytest.raises(ValueError, match="clipped_grad must be"):
        dpjax.dp_sgd_optimizer(
            optimizer=optax.sgd(1.0),
            clipped_grad=lambda p, x: p,
            noise_multiplier=1.0,
            normalizer=1.0,
            key=key,
        )


def test_noise_scale_is_sigma_times_the_clipped_grad_bound(key):
    """C read from the per-layer grad_fn: sqrt(3² + 4²) = 5, so the noise std is σ·5."""
    params = {"w": jnp.zeros(20_000), "b": jnp.zeros(())}
    grad_fn = dpjax.clipped_grad(
        lambda p, x: jnp.dot(p["w"], x) + p["b"],
        l2_clip_norm={"w": 3.0, "b": 4.0},
        per_layer=True,
    )
    sigma = 0.5
    tx = dpjax.dp_sgd_optimizer(
        optimizer=optax.identity(),
        clipped_grad=grad_fn,
        noise_multiplier=sigma,
        normalizer=1.0,
        key=key,
    )
    assert (tx.l2_clip_norm, tx.noise_multiplier) == (5.0, sigma)
    zeros = jax.tree.map(jnp.zeros_like, params)
    noisy, _ = tx.update(zeros, tx.init(params), params)
    std = sigma * 5.0
    assert_distribution(
        np.asarray(noisy["w"]),
        lambda x: stats.norm.cdf(x, scale=std),
        wrong_cdfs=[lambda x: stats.norm.cdf(x, scale=sigma * 3.0)],
    )


# ----------------------------------------------------------------------------- σ stated once


def test_event_reads_sigma_from_the_optimizer_and_steps_from_the_state(key):
    sampler = dpjax.PoissonSampler(dataset_size=200, sampling_rate=0.05)
    grad_fn = dpjax.clipped_grad(linear_loss, l2_clip_norm=1.0)
    tx = dpjax.dp_sgd_optimizer(
        optimizer=optax.sgd(0.1),
        clipped_grad=grad_fn,
        noise_multiplier=1.3,
        normalizer=sampler.expected_batch_size,
        key=key,
    )
    params = jnp.zeros(2)
    state = tx.init(params)
    update = jax.jit(tx.update)
    for _ in range(3):
        _, state = update(jnp.ones(2), state, params)
    expected = PoissonSampledGaussianEvent(
        noise_multiplier=1.3,
        sampling_rate=0.05,
        count=3,
        dataset_size=200,  # the padded sampler's cap travels with the event (truncation slack)
        max_batch_size=sampler.max_batch_size,
    )
    assert event_for(tx, sampler=sampler, state=state) == expected
    assert event_for(tx, sampler=sampler, steps=3) == expected
    assert noise_releases(state) == 3


def test_event_of_accumulated_sums_counts_logical_batches(key):
    sampler = dpjax.PoissonSampler(dataset_size=200, sampling_rate=0.05)
    inner = dpjax.dp_sgd_optimizer(
        optimizer=optax.sgd(0.1),
        clipped_grad=dpjax.clipped_grad(linear_loss, l2_clip_norm=1.0),
        noise_multiplier=0.9,
        normalizer=sampler.expected_batch_size,
        key=key,
    )
    tx = dpjax.accumulate_clipped_sums(inner, every_k=4)
    params = jnp.zeros(2)
    state = tx.init(params)
    update = jax.jit(tx.update)
    for _ in range(8):  # 8 micro-batches = 2 releases
        _, state = update(jnp.ones(2), state, params)
    assert event_for(tx, sampler=sampler, state=state).count == 2


def test_event_for_refuses_what_it_cannot_read(key):
    sampler = dpjax.PoissonSampler(dataset_size=200, sampling_rate=0.05)
    tx = dpjax.dp_sgd_optimizer(
        optimizer=optax.sgd(0.1),
        clipped_grad=dpjax.clipped_grad(linear_loss, l2_clip_norm=1.0),
        noise_multiplier=1.0,
        normalizer=10.0,
        key=key,
    )
    with pytest.raises(ValueError, match="optimizer must be"):
        event_for(optax.sgd(0.1), sampler=sampler, steps=3)
    with pytest.raises(ValueError, match="steps must be"):
        event_for(tx, sampler=sampler, steps=3, state=tx.init(jnp.zeros(2)))
    with pytest.raises(ValueError, match="state must be"):
        event_for(tx, sampler=sampler, state=tx.init(jnp.zeros(2)))  # no release yet


# ----------------------------------------------------------------------------- the padding mask


@pytest.fixture
def dataset(key):
    kx, ky = jax.random.split(key)
    X = jax.random.normal(kx, (40, 3))
    Y = jax.random.normal(ky, (40,)) + 2.0
    return X, Y


def test_padded_batch_path_counts_each_selected_example_once(key, dataset):
    """The issue's footgun: x[b.indices] without mask counts example 0 once per padding slot.

    Through ``batch=`` the sum is the reference sum over the selected examples only.
    """
    X, Y = dataset
    sampler = dpjax.PoissonSampler(dataset_size=40, sampling_rate=0.1)
    padded = sampler.sample(key)
    mask = np.asarray(padded.mask)
    selected = np.asarray(padded.indices)[mask]
    assert (~mask).sum() >= 1 and 0 not in selected  # padding present; example 0 not drawn
    grad_fn = dpjax.clipped_grad(linear_loss, l2_clip_norm=1.0)
    w = jnp.zeros(3)
    s, info = grad_fn(w, X, Y, batch=padded)
    expected = reference_clipped_sum(np.asarray(X), np.asarray(Y), selected, 1.0)
    np.testing.assert_allclose(np.asarray(s), expected, rtol=1e-12, atol=1e-12)
    norms = np.abs(np.asarray(Y)[selected]) * np.linalg.norm(np.asarray(X)[selected], axis=1)
    assert int(info.num_clipped) == int(np.sum(norms > 1.0))
    # the raw gather without mask is what the documented path avoids: it adds example 0
    raw, _ = grad_fn(w, X[padded.indices], Y[padded.indices])
    assert not np.allclose(np.asarray(raw), expected)
    # jitted, as in a training step
    s_jit, _ = jax.jit(lambda w, b: grad_fn(w, X, Y, batch=b))(w, padded)
    np.testing.assert_allclose(np.asarray(s_jit), expected, rtol=1e-12, atol=1e-12)


def test_padded_batch_misuse_is_refused(key, dataset):
    X, Y = dataset
    padded = dpjax.PoissonSampler(dataset_size=40, sampling_rate=0.1).sample(key)
    grad_fn = dpjax.clipped_grad(linear_loss, l2_clip_norm=1.0)
    w = jnp.zeros(3)
    with pytest.raises(ValueError, match="batch must be passed by keyword"):
        grad_fn(w, padded, X, Y)
    with pytest.raises(ValueError, match="mask must be None when batch is passed"):
        grad_fn(w, X, Y, batch=padded, mask=padded.mask)
    with pytest.raises(ValueError, match="batch must be a dpjax.dp_sgd.PaddedBatch"):
        grad_fn(w, X, Y, batch=padded.indices)
    # a sampler over more rows than the data passed: a real index beyond the data is refused
    big = PaddedBatch(jnp.array([3, 45, 0]), jnp.array([True, True, False]))
    with pytest.raises(ValueError, match=r"batch.indices must be in \[0, 40\)"):
        grad_fn(w, X, Y, batch=big)


@pytest.mark.slow  # default-run budget; CI runs it in make test-slow
def test_data_parallel_accepts_the_padded_batch(key, dataset):
    X, Y = dataset
    padded = dpjax.PoissonSampler(dataset_size=40, sampling_rate=0.2).sample(key)
    grad_fn = dpjax.clipped_grad(linear_loss, l2_clip_norm=1.0, backend="vmap")
    single, _ = grad_fn(jnp.zeros(3), X, Y, batch=padded)
    sharded, _ = dpjax.data_parallel(grad_fn)(jnp.zeros(3), X, Y, batch=padded)
    np.testing.assert_allclose(np.asarray(sharded), np.asarray(single), rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- MultiSteps


def _private_optimizers(key):
    k1, k2, k3 = jax.random.split(key, 3)
    grad_fn = dpjax.clipped_grad(linear_loss, l2_clip_norm=1.0)
    dp = dpjax.dp_sgd_optimizer(
        optimizer=optax.sgd(0.1),
        clipped_grad=grad_fn,
        noise_multiplier=1.0,
        normalizer=8.0,
        key=k1,
    )
    accumulated = dpjax.accumulate_clipped_sums(
        dpjax.dp_sgd_optimizer(
            optimizer=optax.sgd(0.1),
            clipped_grad=grad_fn,
            noise_multiplier=1.0,
            normalizer=8.0,
            key=k2,
        ),
        every_k=2,
    )
    laplace = dpjax.laplace_dp_sgd_optimizer(
        l1_sensitivity=1.0, epsilon=1.0, rho=0.5, kappa=0.8, key=k3
    )
    return {"dp_sgd": dp, "accumulated": accumulated, "laplace": laplace}


@pytest.mark.parametrize("name", ["dp_sgd", "accumulated", "laplace"])
@pytest.mark.parametrize("jit", [False, True])
def test_multisteps_around_a_private_optimizer_is_refused(key, name, jit):
    wrapped = optax.MultiSteps(_private_optimizers(key)[name], every_k_schedule=4)
    init = jax.jit(wrapped.init) if jit else wrapped.init
    with pytest.raises(ValueError, match="accumulate_clipped_sums"):
        init(jnp.zeros(2))


def test_multisteps_update_is_refused_too(key):
    """A state built elsewhere does not let MultiSteps.update through either."""
    tx = _private_optimizers(key)["dp_sgd"]
    plain = optax.MultiSteps(optax.sgd(0.1), every_k_schedule=2).init(jnp.zeros(2))
    state = plain._replace(inner_opt_state=tx.init(jnp.zeros(2)))  # tx.init outside MultiSteps
    wrapped = optax.MultiSteps(tx, every_k_schedule=2)
    with pytest.raises(ValueError, match="accumulate_clipped_sums"):
        wrapped.update(jnp.ones(2), state, jnp.zeros(2))


def test_plain_optax_chains_around_the_optimizer_still_work(key):
    tx = optax.chain(_private_optimizers(key)["dp_sgd"], optax.scale(1.0))
    params = jnp.zeros(2)
    u, _ = tx.update(jnp.ones(2), tx.init(params), params)
    assert u.shape == (2,)


# ----------------------------------------------------------------------------- ERM from the parts


@pytest.mark.slow  # compiles a DP-SGD run (~20 s on a loaded 2-core machine)
def test_erm_dp_sgd_records_the_rate_the_sampler_realises(key):
    """Below 2⁻¹² the Poisson sampler realises ⌊q·2⁶⁴⌋/2⁶⁴ ≤ q; the event must say so."""
    from dpjax.erm import dp_sgd, losses
    from tests.erm.test_solver import sphere_data

    q = 1e-4
    assert realised_sampling_rate(q) < q
    X, y = sphere_data(50, 2, seed=3)
    res = dp_sgd(
        key,
        X,
        y,
        loss=losses.logistic,
        epsilon=1.0,
        delta=1e-5,
        radius=1.0,
        sampling_rate=q,
        steps=3,
        dataset_size=50,
        accounting="rdp",
    )
    assert res.event.sampling_rate == realised_sampling_rate(q)
    assert res.sensitivity == 1.0  # grad_fn.sensitivity(add/remove-one) = C = L = 1


# ------------------------------------------------------------------------------------------------
# the DP-SGD training API: each test pins a violation found
# in review and fails without its fix.
# ------------------------------------------------------------------------------------------------


def _two_leaf_setup():
    loss = lambda w, x: jnp.dot(w["a"], x) + jnp.dot(w["b"], x)  # noqa: E731
    grad_fn = dpjax.clipped_grad(loss, l2_clip_norm=1.0)
    params = {"a": jnp.zeros(3), "b": jnp.zeros(3)}
    return grad_fn, params


def _dp(grad_fn, key):
    return dpjax.dp_sgd_optimizer(
        optimizer=optax.sgd(1.0),
        clipped_grad=grad_fn,
        noise_multiplier=1.0,
        normalizer=1.0,
        key=key,
    )


@pytest.mark.parametrize("wrapper", ["multi_transform", "masked"])
def test_masked_dp_optimizer_is_refused(key, wrapper):
    # optax.multi_transform({"dp": dp_tx, "free": sgd}) / optax.masked(dp_tx, mask) pass the
    # leaves the DP optimizer does not see straight through: before the fix leaf "b" was updated
    # by EXACTLY −(clipped sum) (no noise) while event_for(dp_tx, state=...) still accounted the
    # run as DP-SGD with σ = 1.
    """Catches optax.masked / multi_transform hiding leaves from the DP optimizer's noise."""
    grad_fn, params = _two_leaf_setup()
    dp = _dp(grad_fn, key)
    if wrapper == "multi_transform":
        tx = optax.multi_transform({"dp": dp, "free": optax.sgd(1.0)}, {"a": "dp", "b": "free"})
    else:
        tx = optax.masked(dp, {"a": True, "b": False})
    with pytest.raises(ValueError, match="optax.masked or optax.multi_transform"):
        tx.init(params)


def test_masked_update_is_refused_even_with_a_handmade_state(key):
    # init bypassed (state built from the unwrapped optimizer): update refuses too.
    """Catches masked updates passing the DP optimizer via a handmade state."""
    grad_fn, params = _two_leaf_setup()
    dp = _dp(grad_fn, key)
    clipped_sum, _ = grad_fn(params, jnp.ones((4, 3)))
    masked_sum = {"a": clipped_sum["a"], "b": optax.MaskedNode()}
    masked_params = {"a": params["a"], "b": optax.MaskedNode()}
    state = jax.tree.map(lambda x: x, dp.init({"a": params["a"]}))
    with pytest.raises(ValueError, match="optax.masked or optax.multi_transform"):
        dp.update(masked_sum, state, masked_params)


def test_per_leaf_optimizer_inside_the_dp_optimizer_still_works(key):
    # The supported spelling: the per-leaf choice is post-processing of the noisy sum, every
    # leaf is noised (both leaves move by noise, not by the exact clipped sum).
    """Catches the mask refusal also refusing a per-leaf optimizer inside the DP optimizer."""
    grad_fn, params = _two_leaf_setup()
    inner = optax.multi_transform(
        {"fast": optax.sgd(1.0), "slow": optax.sgd(0.5)}, {"a": "fast", "b": "slow"}
    )
    tx = dpjax.dp_sgd_optimizer(
        optimizer=inner, clipped_grad=grad_fn, noise_multiplier=1.0, normalizer=1.0, key=key
    )
    state = tx.init(params)
    clipped_sum, _ = grad_fn(params, jnp.ones((4, 3)))
    updates, state = tx.update(clipped_sum, state, params)
    assert noise_releases(state) == 1
    exact_b = -0.5 * np.asarray(clipped_sum["b"])
    assert not np.allclose(np.asarray(updates["b"]), exact_b)  # noise reached leaf "b"
    sampler = dpjax.PoissonSampler(dataset_size=100, sampling_rate=0.1)
    assert event_for(tx, sampler=sampler, state=state).count == 1


# ----------------------------------------------------------------------------- stated once


def test_dp_optimizer_sigma_is_read_only(key):
    # Before the fix ``tx.noise_multiplier = 5.0`` (the Opacus idiom for changing σ) was
    # accepted: the noise kept σ = 1 while event_for reported σ = 5 (ε under-stated).
    """Catches the DP optimizer's noise multiplier being mutable after accounting."""
    grad_fn = dpjax.clipped_grad(lambda w, x: jnp.dot(w, x), l2_clip_norm=1.0)
    tx = dpjax.dp_sgd_optimizer(
        optimizer=optax.sgd(1.0),
        clipped_grad=grad_fn,
        noise_multiplier=1.0,
        normalizer=1.0,
        key=key,
    )
    for name in ("noise_multiplier", "l2_clip_norm", "normalizer"):
        with pytest.raises(AttributeError, match="read-only"):
            setattr(tx, name, 5.0)
    sampler = dpjax.PoissonSampler(dataset_size=100, sampling_rate=0.1)
    assert event_for(tx, sampler=sampler, steps=3).noise_multiplier == 1.0


def test_clip_norm_of_clipped_grad_is_read_only():
    # Before the fix ``grad_fn.l2_clip_norm = 10`` (before the first call) made it clip at 10
    # while sensitivity() and every optimizer built from it still said C = 1: noise 10x short.
    """Catches clipped_grad's clip norm being mutable after construction."""
    grad_fn = dpjax.clipped_grad(lambda w, x: jnp.dot(w, x), l2_clip_norm=1.0)
    for name in ("l2_clip_norm", "l2_norm_bound", "per_layer", "loss_fn"):
        with pytest.raises(AttributeError, match="read-only"):
            setattr(grad_fn, name, 10.0)
    clipped_sum, _ = grad_fn(jnp.zeros(3), 100.0 * jnp.ones((1, 3)))
    assert float(jnp.linalg.norm(clipped_sum)) <= 1.0 + 1e-6  # still clips at C = 1


def test_data_parallel_clip_norm_is_read_only():
    # Before the fix ``dp_fn.grad_fn = clipped_grad(..., l2_clip_norm=10)`` clipped at 10
    # while dp_fn.l2_norm_bound (what dp_sgd_optimizer scales its noise by) stayed 1.
    """Catches data_parallel's clip norm or grad_fn being mutable after construction."""
    loss = lambda w, x: jnp.dot(w, x)  # noqa: E731
    dp_fn = dpjax.data_parallel(dpjax.clipped_grad(loss, l2_clip_norm=1.0))
    for name, value in [
        ("grad_fn", dpjax.clipped_grad(loss, l2_clip_norm=10.0)),
        ("l2_norm_bound", 10.0),
    ]:
        with pytest.raises(AttributeError, match="read-only"):
            setattr(dp_fn, name, value)
    assert dp_fn.sensitivity() == 1.0


def test_poisson_sampler_rate_is_read_only(key):
    # Before the fix ``sampler.sampling_rate = 0.001`` changed the accounted rate while
    # sample() kept drawing at the old threshold (rate 0.5): ε under-stated.
    """Catches the Poisson sampler's rate being mutable after construction (events would lie)."""
    sampler = dpjax.PoissonSampler(dataset_size=100, sampling_rate=0.5)
    for name in ("sampling_rate", "threshold", "max_batch_size", "dataset_size"):
        with pytest.raises(AttributeError, match="read-only"):
            setattr(sampler, name, 1)
    assert sampler.event(noise_multiplier=1.0, steps=1).sampling_rate == 0.5


def test_private_training_parameters_are_read_only(key):
    # Before the fix ``private.noise_multiplier = 50`` made epsilon(state) report the ε of
    # σ = 50 for steps whose noise was drawn with the original σ.
    """Catches make_private's sigma / C / rate being mutable after accounting."""
    private = dpjax.make_private(
        lambda w, ex: jnp.sum(w * ex),
        optimizer=optax.sgd(0.1),
        l2_clip_norm=1.0,
        dataset_size=100,
        batch_size=10,
        steps=5,
        noise_multiplier=1.0,
        delta=1e-5,
        key=key,
    )
    before = private.epsilon(5)
    for name in ("noise_multiplier", "sampling_rate", "steps", "l2_clip_norm", "delta"):
        with pytest.raises(AttributeError, match="read-only"):
            setattr(private, name, 50.0)
    assert private.epsilon(5) == before


# ----------------------------------------------------------------------------- gather path


def _repeat_batch():
    from dpjax.dp_sgd.samplers import PaddedBatch

    x = jnp.array([[3.0, 4.0], [0.0, 1.0], [6.0, 8.0]])
    # record 2 in two real slots (a batch drawn WITH replacement), record 1 once, one padding
    batch = PaddedBatch(jnp.array([2, 1, 2, 0], jnp.int32), jnp.array([1, 1, 1, 0], bool))
    return x, batch


def test_repeated_index_in_a_concrete_batch_is_refused():
    # Before the fix record 2 was gathered twice: the sum moved by 2C when it was present,
    # while grad_fn.sensitivity() (what the noise is scaled by) said C.
    """Catches a concrete batch naming one index twice (that row would count twice)."""
    grad_fn = dpjax.clipped_grad(lambda w, x: jnp.dot(w, x), l2_clip_norm=1.0)
    x, batch = _repeat_batch()
    with pytest.raises(ValueError, match="batch.indices"):
        grad_fn(jnp.zeros(2), x, batch=batch)


def test_repeated_index_in_a_traced_batch_counts_once():
    # Under jit the repeat cannot raise: it is masked, so record 2 contributes once (norm C).
    """Catches a traced batch with a repeated index counting that row twice."""
    grad_fn = dpjax.clipped_grad(lambda w, x: jnp.dot(w, x), l2_clip_norm=1.0)
    x, batch = _repeat_batch()
    with_2, _ = jax.jit(lambda b: grad_fn(jnp.zeros(2), x, batch=b))(batch)
    # independent reference: record 2 clipped once (g = (6, 8), ‖g‖ = 10 → (0.6, 0.8)) + record 1
    np.testing.assert_allclose(np.asarray(with_2), [0.6, 1.8], rtol=1e-6)


# ----------------------------------------------------------------------------- nnx


def test_nnx_loss_refuses_batch_norm_in_training_mode():
    # Before the fix the per-example loss ran BatchNorm on ONE example: output exactly 0, loss
    # 0 and gradient 0 through it for every example — training silently learnt nothing.
    """Catches BatchNorm in training mode (it mixes examples) accepted by nnx_loss."""
    nnx = pytest.importorskip("flax.nnx")
    model = nnx.Sequential(nnx.Linear(3, 2, rngs=nnx.Rngs(0)), nnx.BatchNorm(2, rngs=nnx.Rngs(1)))
    with pytest.raises(ValueError, match="BatchNorm"):
        dpjax.dp_sgd.nnx_loss(model, lambda m, ex: jnp.sum(m(ex) ** 2))
    model.eval()  # running averages (constants here): an affine map, accepted
    loss_fn, params = dpjax.dp_sgd.nnx_loss(model, lambda m, ex: jnp.sum(m(ex) ** 2))
    x = jnp.array([1.0, 2.0, 3.0], jnp.float32)
    assert float(loss_fn(params, x, jax.random.key(0))) > 0.0
