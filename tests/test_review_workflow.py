"""Adversarial review of the workflow-privacy rewrite (issue 20): attacks on documented paths.

1. ``public_opt_state`` of a state restored as a plain dict (``flax.serialization``'s
   ``msgpack_restore`` / ``to_state_dict``) published the noise key: the next noise draw is
   then regenerated exactly.
2. ``public_opt_state`` of an ``optax.MultiSteps`` / ``optax.apply_every`` state holding a
   noise transform published the NOT yet noised running sum (``acc_grads`` / ``grad_acc``).
3. ``public_opt_state`` passed through objects the tree does not enter (a key inside).
4. A ``PrivateTraining`` that resumed a state (``fit(state=...)``) then accepted a ``fit``
   without state: with the key the run was built with (the documented resume after a
   restart rebuilds the object with the same key) that replays the first run's noise.
"""

import warnings

import flax.serialization
import jax
import jax.numpy as jnp
import optax
import pytest

import dpjax
from dpjax.dp_sgd.transforms import add_gaussian_noise, public_opt_state

DIM = 3


@pytest.fixture
def key():
    return jax.random.key(20)


def dp_adam(key):
    return dpjax.dp_sgd_optimizer(
        optimizer=optax.adam(0.1),
        noise_multiplier=1.0,
        l2_clip_norm=1.0,
        normalizer=10.0,
        key=key,
    )


@pytest.mark.parametrize("restore", ["to_state_dict", "msgpack_restore"])
def test_a_noise_state_restored_as_a_dict_is_never_published(key, restore):
    params = jnp.zeros(DIM)
    tx = dp_adam(key)
    state = tx.init(params)
    if restore == "to_state_dict":
        restored = flax.serialization.to_state_dict(state)
    else:
        restored = flax.serialization.msgpack_restore(flax.serialization.to_bytes(state))
    # the dict holds the noise key data, which fixes every later noise draw
    assert jnp.array_equal(jnp.asarray(restored["0"]["key"]), state[0].key)
    with pytest.raises(ValueError, match="opt_state"):
        public_opt_state(restored)


def multisteps_with_noise(key):
    inner = optax.chain(add_gaussian_noise(1.0, key=key), optax.sgd(0.1))
    return optax.MultiSteps(inner, every_k_schedule=2)


def apply_every_before_noise(key):
    return optax.chain(optax.apply_every(2), add_gaussian_noise(1.0, key=key), optax.sgd(0.1))


@pytest.mark.parametrize("build", [multisteps_with_noise, apply_every_before_noise])
def test_an_un_noised_running_sum_is_never_published(key, build):
    params = jnp.zeros(DIM, jnp.float32)
    tx = build(key)
    secret_sum = jnp.array([0.25, -0.5, 0.75], jnp.float32)  # a clipped sum, before its noise
    with jax.numpy_dtype_promotion("standard"):  # optax's accumulators are not strict-clean
        _, state = tx.update(secret_sum, tx.init(params), params)  # mid-accumulation
    published = public_opt_state(state)
    for leaf in jax.tree.leaves(published):
        if jnp.shape(leaf) == (DIM,):
            assert not jnp.allclose(jnp.asarray(leaf, jnp.float32), secret_sum), published


def test_accumulate_clipped_sums_publishes_neither_part_of_its_running_sum(key):
    # the double-float accumulator keeps a high AND a low part of the un-noised sum: both secret
    grad_fn = dpjax.clipped_grad(lambda w, x: jnp.dot(w, x), l2_clip_norm=1.0)
    tx = dpjax.dp_sgd.accumulate_clipped_sums(
        dpjax.dp_sgd_optimizer(
            optimizer=optax.sgd(0.1),
            noise_multiplier=1.0,
            clipped_grad=grad_fn,
            normalizer=10.0,
            key=key,
        ),
        every_k=4,
    )
    params = jnp.zeros(DIM, jnp.float32)
    # 1 + 2^-30 is not a float32: the accumulator keeps 2^-30 in its low part
    parts = [jnp.array([1.0, 0.5, -0.5], jnp.float32), jnp.array([2.0**-30, 0.0, 0.0], jnp.float32)]
    state = tx.init(params)
    for part in parts:
        _, state = tx.update(part, state, params)
    assert any(jnp.any(leaf != 0) for leaf in jax.tree.leaves(state.clipped_sum_low))
    published = public_opt_state(state)
    names = {str(k) for path, _ in jax.tree_util.tree_flatten_with_path(published)[0] for k in path}
    assert not any("clipped_sum" in n for n in names), names


def test_an_object_the_tree_does_not_enter_is_never_published(key):
    class Box:  # not a registered pytree: a leaf whose content is not inspected
        def __init__(self, inner):
            self.inner = inner

    with pytest.raises(ValueError, match="opt_state"):
        public_opt_state({"wrapped": Box(dp_adam(key).init(jnp.zeros(DIM)))})


def test_a_model_layer_named_key_still_publishes(key):
    params = {"attention": {"key": {"kernel": jnp.zeros((2, 2))}, "value": jnp.zeros(2)}}
    published = public_opt_state(dp_adam(key).init(params))
    mu = published[2][0].mu
    assert mu["attention"]["key"]["kernel"].shape == (2, 2)


# ----------------------------------------------------------------------------- 4. replay


def linear_loss(w, ex):
    return ex @ w


def private_for(seed):
    return dpjax.make_private(
        linear_loss,
        optimizer=optax.sgd(1.0),
        l2_clip_norm=1.0,
        dataset_size=100,
        batch_size=20,
        steps=10,
        noise_multiplier=1.0,
        delta=1e-5,
        key=jax.random.key(seed),
        clipping="vmap",
        accounting="rdp",
    )


def test_an_object_that_resumed_a_state_refuses_a_fresh_run(key):
    data = 3.0 * jax.random.normal(key, (100, DIM))
    first = private_for(7)
    _, state, _ = first.fit(jnp.zeros(DIM), data, steps=2, progress=False)
    rebuilt = private_for(7)  # the same script after a restart: same key, resumes the state
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rebuilt.fit(jnp.zeros(DIM), data, state=state, steps=2, progress=False)
    with pytest.raises(ValueError, match="state"):  # a fresh run here would replay `first`
        rebuilt.fit(jnp.zeros(DIM), data, steps=2, progress=False)
    with pytest.raises(ValueError, match="init"):
        rebuilt.init(jnp.zeros(DIM))


# ----------------------------------------------------------------------------- 5. traced step


@pytest.mark.parametrize("which", ["template", "another_plan"])
def test_a_traced_step_never_releases_a_template_or_another_plans_update(key, which):
    """Under the user's own jit the host-side plan check cannot run. A template's key data
    are zeros (public), so its noise is known and the update is a noise-free clipped sum; a
    state of another plan would be charged at its ledger's (weaker) plan."""
    data = 3.0 * jax.random.normal(key, (100, DIM))
    private = private_for(8)
    if which == "template":
        state = private.state_template(jnp.zeros(DIM))
    else:
        other = dpjax.make_private(
            linear_loss,
            optimizer=optax.sgd(1.0),
            l2_clip_norm=1.0,
            dataset_size=100,
            batch_size=20,
            steps=10,
            noise_multiplier=8.0,
            delta=1e-5,
            key=jax.random.key(9),
            clipping="vmap",
            accounting="rdp",
        )
        state = other.init(jnp.zeros(DIM))
    params, state, _ = jax.jit(private.step)(jnp.zeros(DIM), state, data)
    assert int(state.step) == 1
    assert bool(jnp.all(jnp.isnan(params)))


def test_a_traced_step_of_this_plan_is_unchanged(key):
    data = 3.0 * jax.random.normal(key, (100, DIM))
    private = private_for(10)
    state = private.init(jnp.zeros(DIM))
    eager = private.step(jnp.zeros(DIM), state, data)[0]
    traced = jax.jit(private.step)(jnp.zeros(DIM), state, data)[0]
    assert bool(jnp.all(jnp.isfinite(traced))) and jnp.array_equal(eager, traced)


# ----------------------------------------------------------------------------- 6. restore


def test_a_ledger_cut_by_a_template_restore_is_refused(key, tmp_path):
    """orbax refuses a 2-phase checkpoint restored into ``state_template`` (one ledger row)
    and its error says to set ``strict=False``; that restore kept the first phase only, so
    ε charged the σ = 0.6 steps at σ = 4 (0.72 reported, 12.5 true)."""
    ocp = pytest.importorskip("orbax.checkpoint")
    data = 3.0 * jax.random.normal(key, (100, DIM))
    strong = private_for(2)  # σ = 1
    weak = dpjax.make_private(
        linear_loss,
        optimizer=optax.sgd(1.0),
        l2_clip_norm=1.0,
        dataset_size=100,
        batch_size=20,
        steps=10,
        noise_multiplier=0.6,
        delta=1e-5,
        key=jax.random.key(3),
        clipping="vmap",
        accounting="rdp",
    )
    w, state, _ = strong.fit(jnp.zeros(DIM), data, steps=5, progress=False)
    state = weak.continue_from(state)
    w, state, _ = weak.fit(w, data, state=state, steps=5, progress=False)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp_path / "run", state)
    checkpointer.wait_until_finished()
    template = weak.state_template(jnp.zeros(DIM))
    restored = checkpointer.restore(tmp_path / "run", template, strict=False)
    assert restored.plan.shape[0] == 1  # orbax cut the ledger to the template's one row
    with pytest.raises(ValueError, match="state.plan"):
        weak.epsilon(restored)
    with pytest.raises(ValueError, match="state.plan"):
        weak.continue_from(restored)
    with pytest.raises(ValueError, match="state.plan"):
        weak.public_state(restored)


def test_a_traced_step_of_a_continued_state_is_unchanged(key):
    """The void check of a traced step ignores the ledger's row count and phase start."""
    data = 3.0 * jax.random.normal(key, (100, DIM))
    w, state, _ = private_for(11).fit(jnp.zeros(DIM), data, steps=2, progress=False)
    weak = dpjax.make_private(
        linear_loss,
        optimizer=optax.sgd(1.0),
        l2_clip_norm=1.0,
        dataset_size=100,
        batch_size=20,
        steps=10,
        noise_multiplier=0.6,
        delta=1e-5,
        key=jax.random.key(12),
        clipping="vmap",
        accounting="rdp",
    )
    state = weak.continue_from(state)
    eager = weak.step(w, state, data)[0]
    traced = jax.jit(weak.step)(w, state, data)[0]
    assert bool(jnp.all(jnp.isfinite(traced))) and jnp.array_equal(eager, traced)


# ----------------------------------------------------------------------------- 7. open


# Was open (review); fixed: the noise transforms refuse updates batched by a vmap that their
# state is not batched by (the test failed before the fix: DID NOT RAISE).
def test_a_vmapped_update_never_noises_per_example_rows(key):
    """``jax.vmap(tx.update, in_axes=(0, None, None))`` over per-example gradients passes the
    shape check (inside vmap each row is shaped like params) and adds ONE noise draw (the
    state is not batched) to every unclipped row: the rows' differences are noise-free."""
    params = jnp.zeros(DIM, jnp.float32)
    rows = jnp.array([[5.0, 0.0, 0.0], [0.0, 7.0, 0.0]], jnp.float32)  # unclipped
    noise_only = dpjax.dp_sgd_optimizer(
        optimizer=optax.sgd(1.0),
        noise_multiplier=1.0,
        l2_clip_norm=1.0,
        normalizer=1.0,
        key=key,
    )
    with pytest.raises(ValueError, match="updates"):
        jax.vmap(noise_only.update, in_axes=(0, None, None))(rows, noise_only.init(params), params)
