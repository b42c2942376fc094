"""dpjax.make_private: the one-call DP-SGD path, its micro-batches, nnx/linen dropout, progress."""

import subprocess
import sys
import textwrap
import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import dpjax
from dpjax.accounting import dp_sgd_epsilon
from dpjax.dp_sgd import PaddedBatch, PoissonSampler, make_private, nnx_loss, poisson_schedule
from dpjax.dp_sgd.private import SLACK_FRACTION

N, DIM = 120, 3
MOMENTUM = optax.sgd(0.5, momentum=0.9)


def linear_data(key, n=N):
    x = jax.random.normal(key, (n, DIM))
    return {"x": x, "y": x @ jnp.array([1.0, -2.0, 0.5])}


def square_loss(w, ex):
    return 0.5 * (ex["x"] @ w - ex["y"]) ** 2


def dropout_square_loss(w, ex, rng):
    keep = jax.random.bernoulli(rng, 0.5, (DIM,))
    return 0.5 * ((ex["x"] * keep.astype(ex["x"].dtype)) @ w - ex["y"]) ** 2


def private_for(loss_fn=square_loss, **kwargs):
    args = dict(
        optimizer=optax.sgd(0.5),
        l2_clip_norm=1.0,
        dataset_size=N,
        batch_size=12,
        steps=5,
        noise_multiplier=1.0,
        delta=1e-5,
        key=jax.random.key(7),
        clipping="vmap",
    )
    args.update(kwargs)
    return make_private(loss_fn, **args)


def fresh_state(private, params):
    """The initial state of ``private`` again. These tests compare runs from ONE compiled
    object bit for bit, so they replay its keys on purpose; ``init`` refuses a second run on
    one object (tests/dp_sgd/test_workflow_privacy.py), so they read the initial state directly."""
    return private._fresh_state(params)


@pytest.fixture(scope="module")
def linear_private():
    """One compiled square-loss run (T = 50 planned), shared: each test starts from step 0."""
    return private_for(steps=50)


@pytest.fixture(scope="module")
def dropout_private():
    """One compiled run whose loss takes a per-example dropout key."""
    return private_for(dropout_square_loss)


# ----------------------------------------------------------------------------- schedule


def test_poisson_schedule_epochs_to_rate_and_steps():
    assert poisson_schedule(1000, 100, 3) == (0.1, 30)
    assert poisson_schedule(1000, 300, 2.5) == (0.3, 9)  # ⌈8.33⌉
    assert poisson_schedule(10, 10, 0.01) == (1.0, 1)
    private = private_for(steps=None, epochs=2)
    assert private.steps == 20 and private.sampling_rate == 0.1


# ----------------------------------------------------------------------------- sampler split


def test_micro_batches_keep_each_record_exactly_once(key):
    sampler = PoissonSampler(dataset_size=500, sampling_rate=0.1)
    batch = sampler.sample(key)
    micro = batch.micro_batches(7)
    k = -(-sampler.max_batch_size // 7)
    assert micro.indices.shape == micro.mask.shape == (k, 7)
    selected = np.asarray(batch.indices)[np.asarray(batch.mask)]
    chosen = np.asarray(micro.indices)[np.asarray(micro.mask)]
    assert len(selected) > 30
    assert len(np.unique(chosen)) == len(chosen)  # no record in two micro-batches
    assert sorted(chosen.tolist()) == sorted(selected.tolist())  # the union is the batch
    with pytest.raises(ValueError, match="physical_batch_size"):
        batch.micro_batches(0)


def test_micro_batches_pad_with_masked_slots():
    batch = PaddedBatch(jnp.array([5, 3, 0], jnp.int32), jnp.array([True, True, False]))
    micro = batch.micro_batches(2)
    assert micro.indices.tolist() == [[5, 3], [0, 0]]
    assert micro.mask.tolist() == [[True, True], [False, False]]


# ----------------------------------------------------------------------------- the update


def hand_built_step(private, params, key, data, loss_fn, steps):
    """The pieces wired by hand: sampler → gather → clipped_grad(mask) → dp_sgd_optimizer."""
    noise_key, train_key = jax.random.split(key)
    grad_fn = dpjax.clipped_grad(loss_fn, l2_clip_norm=1.0, backend="vmap")
    if loss_fn is dropout_square_loss:
        loss_fn_used = lambda w, e, kd: loss_fn(w, e, jax.random.wrap_key_data(kd))  # noqa: E731
        grad_fn = dpjax.clipped_grad(loss_fn_used, l2_clip_norm=1.0, backend="vmap")
    tx = dpjax.dp_sgd_optimizer(
        optimizer=optax.sgd(0.5),
        noise_multiplier=private.noise_multiplier,
        l2_clip_norm=1.0,
        normalizer=private.sampler.expected_batch_size,
        key=noise_key,
    )

    @jax.jit  # one compile for the steps (eager, each op compiled alone: ~3x the CPU)
    def one_step(params, opt_state, train_key):
        train_key, sample_key, dropout_key = jax.random.split(train_key, 3)
        batch = private.sampler.sample(sample_key)
        ex = jax.tree.map(lambda v: v[batch.indices], data)
        extra = ()
        if loss_fn is dropout_square_loss:
            fold = jax.vmap(lambda i: jax.random.key_data(jax.random.fold_in(dropout_key, i)))
            extra = (fold(batch.indices),)
        clipped_sum, _ = grad_fn(params, ex, *extra, mask=batch.mask)
        updates, opt_state = tx.update(clipped_sum, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, train_key

    opt_state = tx.init(params)
    for _ in range(steps):
        params, opt_state, train_key = one_step(params, opt_state, train_key)
    return params


@pytest.mark.parametrize(
    ("loss_fn", "fixture"),
    [(square_loss, "linear_private"), (dropout_square_loss, "dropout_private")],
)
def test_update_equals_the_hand_built_pipeline(key, loss_fn, fixture, request):
    data = linear_data(key)
    private = request.getfixturevalue(fixture)
    params, state = jnp.zeros(DIM), fresh_state(private, jnp.zeros(DIM))
    for _ in range(3):
        params, state, metrics = private.step(params, state, data)
    expected = hand_built_step(private, jnp.zeros(DIM), jax.random.key(7), data, loss_fn, 3)
    np.testing.assert_allclose(params, expected, rtol=1e-12, atol=1e-14)
    assert int(state.step) == 3 and 0 < int(metrics["batch_size"]) <= private.max_batch_size


def test_micro_batch_split_equals_the_unsplit_update(key, dropout_private):
    data = linear_data(key)
    whole = dropout_private
    split = private_for(dropout_square_loss, physical_batch_size=5)
    assert split.physical_batch_size == 5 and whole.physical_batch_size is None
    p1, s1, p2, s2 = jnp.zeros(DIM), fresh_state(whole, jnp.zeros(DIM)), jnp.zeros(DIM), None
    s2 = split.init(p2)
    for _ in range(3):
        p1, s1, m1 = whole.step(p1, s1, data)
        p2, s2, m2 = split.step(p2, s2, data)
    np.testing.assert_allclose(p2, p1, rtol=1e-12, atol=1e-14)
    assert int(m1["batch_size"]) == int(m2["batch_size"])
    np.testing.assert_allclose(m2["loss"], m1["loss"], rtol=1e-12)
    assert split.epsilon(s2) == whole.epsilon(s1)  # one Poisson batch per step: same ε


def test_padding_never_counts_example_zero():
    # example 0 has a huge gradient; every other example has gradient 0. Padding slots hold
    # index 0, so a forgotten mask would add clip(g_0) once per padding slot.
    x = jnp.zeros((N, DIM)).at[0].set(1e3)
    data = {"x": x, "y": jnp.zeros(N)}
    loss_fn = lambda w, ex: jnp.sum(ex["x"] * w)  # noqa: E731
    private = private_for(
        loss_fn, noise_multiplier=0.3, steps=40, optimizer=optax.sgd(1.0), accounting="rdp"
    )
    params, state = jnp.zeros(DIM), fresh_state(private, jnp.zeros(DIM))
    # one clipped example plus noise σC per coordinate (6σ√DIM bounds its norm), ÷ q·n; a
    # forgotten mask would add ~max_batch_size − batch_size ≈ 25 more clipped copies
    bound = (1.0 + 6 * 0.3 * np.sqrt(DIM)) / private.expected_batch_size
    assert private.max_batch_size - private.expected_batch_size > 10
    seen_padding = False
    for _ in range(40):
        new, state, metrics = private.step(params, state, data)
        step_norm = float(jnp.linalg.norm(new - params))
        assert step_norm <= bound
        seen_padding |= int(metrics["batch_size"]) < private.max_batch_size
        params = new
    assert seen_padding


# ----------------------------------------------------------------------------- accounting


def test_epsilon_is_dp_sgd_epsilon_for_t_steps_and_includes_the_slack(key, linear_private):
    private = linear_private
    data = linear_data(key)
    params, state = jnp.zeros(DIM), fresh_state(private, jnp.zeros(DIM))
    assert private.epsilon(state) == 0.0
    for _ in range(7):
        params, state, _ = private.step(params, state, data)
    eps = private.epsilon(state)
    expected = dp_sgd_epsilon(
        noise_multiplier=1.0,
        sampling_rate=private.sampling_rate,
        steps=7,
        delta=1e-5 * (1 - SLACK_FRACTION),
    )
    assert eps == expected
    assert private.epsilon(7) == eps
    # the truncation slack of the whole planned run fits in the δ set aside for it
    eps_planned = private.epsilon(50)
    assert private.sampler.delta_slack(50, eps_planned) <= SLACK_FRACTION * 1e-5
    assert private.event().count == 50 and private.event().sampling_rate == private.sampling_rate
    history = private.epsilon_history(state, num_points=3)
    assert [t for t, _ in history] == [2, 5, 7] and history[-1][1] == eps


def test_target_epsilon_is_calibrated_and_cross_checked():
    dp_accounting = pytest.importorskip("dp_accounting")
    private = private_for(noise_multiplier=None, target_epsilon=2.0, steps=30)
    eps = private.epsilon(30)
    assert 2.0 * 0.98 <= eps <= 2.0
    q, sigma = private.sampling_rate, private.noise_multiplier
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), 30
    )
    accountant = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    reference = accountant.compose(event).get_epsilon(1e-5 * (1 - SLACK_FRACTION))
    assert eps == pytest.approx(reference, rel=1e-3)


def test_steps_beyond_the_plan_are_counted_with_a_warning(linear_private):
    with pytest.warns(UserWarning, match="beyond the planned"):
        assert linear_private.epsilon(51) > linear_private.epsilon(50)


def test_state_round_trips_through_flax_serialization(key, dropout_private):
    from flax import serialization

    data = linear_data(key)
    private = dropout_private
    params, state = jnp.zeros(DIM), fresh_state(private, jnp.zeros(DIM))
    params, state, _ = private.step(params, state, data)
    template = private.state_template(jnp.zeros(DIM))
    restored = serialization.from_bytes(template, serialization.to_bytes(state))
    a, _, _ = private.step(params, state, data)
    b, _, _ = private.step(params, restored, data)
    np.testing.assert_array_equal(a, b)
    c, _, _ = private.step(params, fresh_state(private, jnp.zeros(DIM)), data)
    assert not np.array_equal(a, c)  # a fresh init would replay keys already used
    with pytest.raises(ValueError, match="state.plan"):  # the template itself never trains
        private.step(params, template, data)


# ----------------------------------------------------------------------------- models


class NnxDropoutMLP(nnx.Module):
    def __init__(self, rngs):
        self.l1 = nnx.Linear(DIM, 16, rngs=rngs)
        self.drop = nnx.Dropout(0.3, rngs=rngs)
        self.l2 = nnx.Linear(16, 2, rngs=rngs)

    def __call__(self, x):
        return self.l2(self.drop(jnp.tanh(self.l1(x))))


def classification_data(key, n=N):
    x = jax.random.normal(key, (n, DIM), dtype=jnp.float32)  # flax params are float32
    return {"x": x, "y": (x[:, 0] + x[:, 1] > 0).astype(jnp.int32)}


def cross_entropy(logits, y):
    return optax.softmax_cross_entropy_with_integer_labels(logits, y)


def test_nnx_dropout_masks_differ_across_examples_and_steps():
    model = NnxDropoutMLP(nnx.Rngs(0))
    loss_fn, params = nnx_loss(model, lambda m, ex: jnp.sum(m(ex) ** 2))
    x = jnp.ones(DIM, jnp.float32)
    k = jax.random.key(3)
    outs = [float(loss_fn(params, x, jax.random.fold_in(k, i))) for i in range(4)]
    assert len(set(outs)) == 4
    assert float(loss_fn(params, x, jax.random.fold_in(k, 0))) == outs[0]  # keyed, not stateful
    # under make_private: per-example keys fold the step's key with the dataset index
    private = private_for(loss_fn=lambda p, ex, rng: loss_fn(p, ex["x"], rng))
    state = private.init(params)
    keys = []
    for _ in range(2):
        step_key = jax.random.wrap_key_data(state.key)
        _, _, dropout_key = jax.random.split(step_key, 3)
        keys += [jax.random.key_data(jax.random.fold_in(dropout_key, i)).tolist() for i in (1, 2)]
        state = state._replace(
            step=state.step + 1, key=jax.random.key_data(jax.random.split(step_key, 3)[0])
        )
    assert len({tuple(kd) for kd in keys}) == 4


@pytest.mark.slow  # ~22 s; nnx + dropout also runs in tests/dp_sgd/test_flax_models.py (default)
def test_nnx_mlp_with_dropout_trains_under_make_private(key):
    data = classification_data(key)
    model = NnxDropoutMLP(nnx.Rngs(0))
    loss_fn, params = nnx_loss(model, lambda m, ex: cross_entropy(m(ex["x"]), ex["y"]))

    def eval_loss(p):
        nnx.update(model, p)
        model.eval()
        value = float(jnp.mean(cross_entropy(model(data["x"]), data["y"])))
        model.train()
        return value

    before = eval_loss(params)
    private = private_for(
        loss_fn,
        optimizer=optax.sgd(0.5, momentum=0.9),
        batch_size=30,
        steps=40,
        noise_multiplier=0.5,
    )
    params, state, history = private.fit(params, data, progress=False)
    assert int(state.step) == 40 and history["epsilon"][-1] == private.epsilon(state)
    assert eval_loss(params) < 0.7 * before


class LinenDropoutMLP(nn.Module):
    @nn.compact
    def __call__(self, x, *, train):
        x = nn.Dropout(0.3, deterministic=not train)(jnp.tanh(nn.Dense(16)(x)))
        return nn.Dense(2)(x)


def test_linen_model_with_dropout_trains(key):
    data = classification_data(key)
    model = LinenDropoutMLP()
    params = model.init(jax.random.key(0), jnp.zeros(DIM, jnp.float32), train=False)["params"]

    def loss_fn(p, ex, rng):
        logits = model.apply({"params": p}, ex["x"], train=True, rngs={"dropout": rng})
        return cross_entropy(logits, ex["y"])

    def eval_loss(p):
        logits = model.apply({"params": p}, data["x"], train=False)
        return float(jnp.mean(cross_entropy(logits, data["y"])))

    before = eval_loss(params)
    private = private_for(
        loss_fn,
        optimizer=optax.sgd(0.5, momentum=0.9),
        batch_size=30,
        steps=40,
        noise_multiplier=0.5,
        accounting="rdp",
    )
    # one ε refresh (log_every = steps) of the RDP accountant: the default 20 refreshes were
    # 20 PLD compositions at σ = 0.5, ~3/4 of this test's CPU, and it checks training, not ε
    params, _, _ = private.fit(params, data, progress=False, log_every=40)
    assert eval_loss(params) < 0.7 * before


def test_data_may_be_a_tuple_or_a_dict_and_auto_clipping_works(key, linear_private):
    data = linear_data(key)
    tuple_loss = lambda w, ex: 0.5 * (ex[0] @ w - ex[1]) ** 2  # noqa: E731
    a = private_for(tuple_loss, clipping="auto", steps=50)
    b = linear_private
    pa, sa, _ = a.step(jnp.zeros(DIM), fresh_state(a, jnp.zeros(DIM)), (data["x"], data["y"]))
    pb, sb, _ = b.step(jnp.zeros(DIM), fresh_state(b, jnp.zeros(DIM)), data)
    np.testing.assert_allclose(pa, pb, rtol=1e-9, atol=1e-12)


# ----------------------------------------------------------------------------- progress


def test_fit_shows_a_progress_bar_with_loss_and_epsilon(key, capsys, linear_private):
    pytest.importorskip("tqdm")
    state = fresh_state(linear_private, jnp.zeros(DIM))
    linear_private.fit(
        jnp.zeros(DIM), linear_data(key), state=state, steps=4, progress=True, log_every=2
    )
    err = capsys.readouterr().err
    assert "loss=" in err and "epsilon=" in err and "4/4" in err


def test_fit_runs_silently_without_tqdm(key, capsys, monkeypatch, linear_private):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm raises ImportError
    data = linear_data(key)
    state = fresh_state(linear_private, jnp.zeros(DIM))
    _, state, history = linear_private.fit(
        jnp.zeros(DIM), data, state=state, steps=2, progress=True
    )
    assert int(state.step) == 2 and history["step"][-1] == 2
    assert capsys.readouterr().err == ""


def test_fit_with_x64_off_in_float32():
    code = textwrap.dedent(
        """
        import jax, jax.numpy as jnp, optax, dpjax
        x = jax.random.normal(jax.random.key(1), (50, 2), dtype=jnp.float32)
        loss = lambda w, ex: 0.5 * (ex[0] @ w - ex[1]) ** 2
        p = dpjax.make_private(loss, optimizer=optax.sgd(0.1), l2_clip_norm=1.0, dataset_size=50,
            batch_size=10, steps=3, noise_multiplier=1.0, delta=1e-5, key=jax.random.key(0),
            physical_batch_size=4)
        w, state, _ = p.fit(jnp.zeros(2, jnp.float32), (x, x[:, 0]), progress=False)
        assert w.dtype == jnp.float32 and int(state.step) == 3, (w.dtype, state.step)
        print("ok")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"l2_clip_norm": 0.0}, "l2_clip_norm"),
        ({"dataset_size": 0}, "dataset_size"),
        ({"batch_size": N + 1}, "batch_size"),
        ({"batch_size": 0}, "batch_size"),
        ({"delta": 0.0}, "delta"),
        ({"delta": 1.0}, "delta"),
        ({"epochs": 1.0}, "epochs"),  # both epochs and steps
        ({"steps": None}, "epochs"),  # neither
        ({"steps": 0}, "steps"),
        ({"steps": None, "epochs": -1.0}, "epochs"),
        ({"target_epsilon": 1.0}, "noise_multiplier"),  # both
        ({"noise_multiplier": None}, "noise_multiplier"),  # neither
        ({"noise_multiplier": -1.0}, "noise_multiplier"),
        ({"noise_multiplier": None, "target_epsilon": 0.0}, "target_epsilon"),
        # σ whose ε ≥ 700 is no longer refused: NOT PRIVATE, warned
        # (tests/accounting/test_sigma_and_delta.py)
        ({"clipping": "fast"}, "clipping"),
        ({"accounting": "moments"}, "accounting"),
        ({"physical_batch_size": 0}, "physical_batch_size"),
        ({"optimizer": "sgd"}, "optimizer"),
        ({"batch_size": N}, "batch_size"),  # q = 1: the padded cap cannot hold an add-one
    ],
)
def test_bad_input_raises_value_error_naming_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        private_for(**kwargs)


def test_bad_key_and_bad_data_are_refused(key, linear_private):
    with pytest.raises(TypeError, match="key"):
        private_for(key=None)
    with pytest.raises(TypeError, match="key"):
        private_for(key=0)
    private = linear_private
    state = fresh_state(private, jnp.zeros(DIM))
    with pytest.raises(ValueError, match="data"):
        private.step(jnp.zeros(DIM), state, {"x": jnp.zeros((N - 1, DIM)), "y": jnp.zeros(N)})
    with pytest.raises(ValueError, match="delta"):
        private.epsilon(state, delta=0.0)
    with pytest.raises(ValueError, match="state.step"):
        private.epsilon(-1)
    assert private.epsilon(np.int64(3)) == private.epsilon(3) > 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert private.epsilon(state) == 0.0


# ------------------------------------------------------------------------------------------------
# Issue 25's papercuts: each test attacks one fix and fails on the code before it.
# ------------------------------------------------------------------------------------------------


def test_make_private_with_clipped_grad_form_names_both_conventions():
    """Catches an opaque error when clipped_grad's loss form is given to make_private."""
    n = 200
    data = (jnp.ones((n, 2)), jnp.ones(n))
    private = dpjax.make_private(
        lambda w, x, y: jnp.dot(w, x) - y,  # clipped_grad's form given to make_private
        optimizer=optax.sgd(0.1),
        l2_clip_norm=1.0,
        dataset_size=n,
        batch_size=20,
        steps=1,
        noise_multiplier=1.0,
        delta=1e-5,
        key=jax.random.key(0),
    )
    with pytest.raises(ValueError, match=r"make_private calls loss_fn\(params, example"):
        private.fit(jnp.zeros(2), data, progress=False)
