"""Bad input to ``make_private`` / ``fit`` / ``continue_from``: a ValueError naming the argument.

Each input here used to give a raw exception (ZeroDivisionError, AttributeError at the first
step, a TypeError from ``jax.grad``), a NaN run, or an error naming the wrong argument.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dpjax
from dpjax._warnings import PrivacyLeakWarning


def build(key=0, **kw):
    args = dict(
        optimizer=optax.sgd(0.1), l2_clip_norm=1.0, dataset_size=100, batch_size=10, steps=3,
        noise_multiplier=1.0, delta=1e-5, key=jax.random.key(key),
    )  # fmt: skip
    return dpjax.make_private(lambda w, ex: jnp.dot(ex, w), **(args | kw))


@pytest.mark.parametrize("sigma", [1e-300, 5e-324, 1e-200])
def test_a_vanishing_noise_multiplier_is_refused_by_name(sigma):
    """σ = 1e-300 raised ZeroDivisionError inside the PLD grid (σ² = 0); at σ ≈ 3e-151 the RDP
    fallback overflowed to ε = 0.0 (a silent, wrong guarantee). Refused below 1e-100."""
    with pytest.raises(ValueError, match="noise_multiplier"):
        build(noise_multiplier=sigma)


def test_tiny_but_accountable_noise_multiplier_is_not_private_not_zero():
    """σ = 1e-100 is accepted as NOT private (warned; ε = inf), never ε = 0."""
    with pytest.warns(PrivacyLeakWarning, match="NOT PRIVATE"):
        p = build(noise_multiplier=1e-100)
    assert p.epsilon(3) == float("inf")


def test_noise_std_overflowing_float32_is_refused():
    """σ·C above float32's largest value made every update NaN, silently."""
    for kw in ({"l2_clip_norm": 1e38, "noise_multiplier": 10.0}, {"l2_clip_norm": 1e300}):
        with pytest.raises(ValueError, match="l2_clip_norm"):
            build(**kw)
    build(l2_clip_norm=3e38)  # σ·C = 3e38 still fits


def test_a_target_epsilon_too_large_for_the_slack_names_target_epsilon():
    """target_epsilon = 699 (< 700, so allowed) leaves no room for the truncation slack; the
    error blamed batch_size."""
    with pytest.raises(ValueError, match="^target_epsilon"):
        build(noise_multiplier=None, target_epsilon=699.0)


def test_continue_from_another_optimizer_is_refused_at_continue_from():
    """An sgd run continued under an adam plan failed with AttributeError ('EmptyState' has no
    'mu') at the first step; now continue_from refuses it, naming both optimizers' states."""
    data = jnp.ones((100, 2))
    _, state, _ = build(0).fit(jnp.zeros(2), data, progress=False)
    for optimizer in (optax.adam(0.1), optax.sgd(0.1, momentum=0.9)):
        adam = build(1, optimizer=optimizer, noise_multiplier=2.0)
        with pytest.raises(ValueError, match="^state .*optimizer") as err:
            adam.continue_from(state)
        assert "ScaleBy" in str(err.value) or "Trace" in str(err.value)
    same_plan_other_optimizer = build(2, optimizer=optax.adam(0.1))
    with pytest.raises(ValueError, match="^state"):
        same_plan_other_optimizer.continue_from(state)
    # the same optimizer continues (another σ: a new phase)
    sgd = build(3, noise_multiplier=2.0)
    w, state2, _ = sgd.fit(jnp.zeros(2), data, state=sgd.continue_from(state), progress=False)
    assert int(state2.step) == 6


def test_continue_from_keeps_momentum_runs_with_nested_params():
    """The structure check compares transformation states, not parameter trees: a momentum run
    (its state holds a parameter-shaped trace) on dict/tuple parameters continues under
    another σ."""
    params = {"a": jnp.zeros(2), "b": (jnp.zeros(()), jnp.zeros(1))}

    def loss(p, ex):
        return jnp.dot(ex, p["a"]) + p["b"][0] + p["b"][1][0]

    args = dict(
        optimizer=optax.sgd(0.1, momentum=0.9), l2_clip_norm=1.0, dataset_size=100,
        batch_size=10, steps=2,
        delta=1e-5,
    )  # fmt: skip
    first = dpjax.make_private(loss, noise_multiplier=1.0, key=jax.random.key(0), **args)
    _, state, _ = first.fit(params, jnp.ones((100, 2)), progress=False)
    second = dpjax.make_private(loss, noise_multiplier=2.0, key=jax.random.key(1), **args)
    second.continue_from(state)


def test_integer_params_are_refused_by_name():
    """Integer parameters raised a TypeError from inside jax.grad."""
    with pytest.raises(ValueError, match="^params"):
        build(0).fit(jnp.zeros(2, jnp.int32), jnp.ones((100, 2)), progress=False)
    p = build(1)
    with pytest.raises(ValueError, match="^params"):
        p.step({"w": jnp.zeros(2), "n": jnp.zeros((), jnp.int32)}, p.init(jnp.zeros(2)), None)


@pytest.mark.parametrize(
    ("kw", "name"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": 101}, "batch_size"),
        ({"dataset_size": -5}, "dataset_size"),
        ({"steps": 0}, "steps"),
        ({"steps": None, "epochs": float("nan")}, "epochs"),
        ({"steps": None, "epochs": 0.0}, "epochs"),
        ({"noise_multiplier": None, "target_epsilon": float("nan")}, "target_epsilon"),
        ({"noise_multiplier": None, "target_epsilon": float("inf")}, "target_epsilon"),
        ({"l2_clip_norm": 0.0}, "l2_clip_norm"),
        ({"l2_clip_norm": float("nan")}, "l2_clip_norm"),
        ({"l2_clip_norm": -1.0}, "l2_clip_norm"),
        ({"delta": 1.0}, "delta"),
        ({"physical_batch_size": 0}, "physical_batch_size"),
    ],
)
def test_out_of_range_arguments_name_themselves(kw, name):
    """The probes of this round that already held (kept as regression tests)."""
    with pytest.raises(ValueError, match=f"^{name}"):
        build(**kw)


def test_delta_at_least_one_over_n_warns():
    with pytest.warns(PrivacyLeakWarning):
        build(delta=0.02)


def test_fit_refuses_non_positive_steps_by_name():
    p = build()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for steps in (0, -1, 1.5):
            with pytest.raises(ValueError, match="^steps"):
                p.fit(jnp.zeros(2), jnp.ones((100, 2)), steps=steps, progress=False)
    assert np.isfinite(p.epsilon(3))


@pytest.mark.parametrize(
    "wrapper", ["masked", pytest.param("multi_transform", marks=pytest.mark.slow)]
)
def test_continue_from_keeps_masked_optimizers(wrapper):
    """``optax.multi_transform`` / ``optax.masked`` inside make_private (the advertised way to
    freeze parameters) hold ``MaskedNode`` placeholders in parameter-shaped trees: they are not
    transformation states, so continuing such a run under another σ is not refused."""
    params = {"a": jnp.zeros(2, jnp.float32), "b": jnp.zeros((), jnp.float32)}

    def labels(p):
        return {"a": "sgd", "b": "frozen"} if isinstance(p, dict) else "sgd"

    def optimizer():
        inner = optax.sgd(0.1, momentum=0.9)
        if wrapper == "multi_transform":
            return optax.multi_transform({"sgd": inner, "frozen": optax.set_to_zero()}, labels)
        return optax.masked(inner, lambda p: jax.tree.map(lambda lab: lab == "sgd", labels(p)))

    def make(sigma, key):
        return dpjax.make_private(
            lambda p, ex: jnp.dot(ex, p["a"]) + p["b"], optimizer=optimizer(), l2_clip_norm=1.0,
            dataset_size=100, batch_size=10, steps=2, noise_multiplier=sigma, delta=1e-5,
            key=jax.random.key(key),
        )  # fmt: skip

    data = jnp.ones((100, 2), jnp.float32)
    _, state, _ = make(1.0, 0).fit(params, data, progress=False)
    second = make(2.0, 1)
    _, state, _ = second.fit(params, data, state=second.continue_from(state), progress=False)
    assert int(state.step) == 4
