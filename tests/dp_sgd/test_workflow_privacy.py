"""Issue 20: privacy across a whole run — what is published, resumed, re-run, or updated.

Each test reproduces one attack of the review on the documented path and checks that it
fails there (and, where the secret checkpoint is the point, that it still works on the
secret object, which is why that object must stay secret):

1. the published state holds no key: the noise-free clipped sum cannot be recovered from it,
   and replaying a step from it does not tell D from D′;
2. a state resumed under another plan is refused, or (``continue_from``) charged the
   composition of both phases — checked against dp-accounting;
3. a second ``fit``/``init`` on one ``PrivateTraining`` is refused (no replayed noise);
7. ``fit`` past the plan refuses before any step when δ no longer holds, warns once otherwise;
8. ``tx.update`` of per-example gradients with ``params`` omitted is refused.
"""

import math
import warnings

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dpjax
from dpjax.dp_sgd import AdaptiveClip, BandMF, _plan
from dpjax.dp_sgd.private import SLACK_FRACTION, PrivateState, PrivateTraining, PublicState
from dpjax.dp_sgd.transforms import (
    NoiseState,
    PublicNoiseState,
    add_gaussian_noise,
    add_laplace_dp_sgd_noise,
    public_opt_state,
)

N, DIM, SIGMA, LR = 200, 64, 1.0, 1.0


def linear_loss(w, ex):
    return ex["x"] @ w  # gradient x: every row has norm > C, so each clipped gradient has norm C


def make_data(key, n=N, dim=DIM):
    x = jax.random.normal(key, (n, dim))
    return {"x": 3.0 * x / jnp.linalg.norm(x, axis=1, keepdims=True)}


def zeroed_out(data, index=0):
    """D′: record ``index`` contributes nothing (the zero-out neighbour of make_private)."""
    return {"x": data["x"].at[index].set(0.0)}


def private_for(key, **kwargs):
    args = dict(
        optimizer=optax.sgd(LR),
        l2_clip_norm=1.0,
        dataset_size=N,
        batch_size=50,
        steps=40,
        noise_multiplier=SIGMA,
        delta=1e-5,
        key=key,
        clipping="vmap",
        accounting="rdp",  # fast at every t (the PLD cross-check asks for "pld")
    )
    args.update(kwargs)
    return dpjax.make_private(linear_loss, **args)


# ----------------------------------------------------------------------------- 1. published


def noise_states_in(published):
    is_noise = lambda x: isinstance(x, NoiseState)  # noqa: E731
    return [s for s in jax.tree.leaves(published, is_leaf=is_noise) if is_noise(s)]


def recover_clipped_sum(published, w1, w2, private):
    """The review's adversary: from what was published at step 1 and the parameters w1, w2,
    estimate the clipped sum S of step 2 (w2 = w1 − LR·(S + σC·Z)/(q·n) under sgd).

    With noise key data in the published object, Z is regenerated exactly; without it the
    best the adversary can do here is Z = 0."""
    noisy_sum = (w1 - w2) * private.expected_batch_size / LR
    found = noise_states_in(published)
    if not found:
        return noisy_sum
    stddev = private.noise_multiplier * private.l2_clip_norm
    replay = add_gaussian_noise(stddev, key=jax.random.key(0))  # update reads the state's key
    noise, _ = replay.update(jnp.zeros_like(w1), found[0], w1)
    return noisy_sum - noise


def true_clipped_sum(private, state, params, data):
    """S of the step taken from ``state`` (the pipeline's pieces, from the secret keys)."""
    _, sample_key, _ = jax.random.split(jax.random.wrap_key_data(state.key), 3)
    batch = private.sampler.sample(sample_key)
    examples = jax.tree.map(lambda v: v[batch.indices], data)
    clipped_sum, _ = private.grad_fn(params, examples, mask=batch.mask)
    return clipped_sum


def test_public_state_holds_no_key_data(key):
    private = private_for(jax.random.key(1))
    data = make_data(key)
    w, state, _ = private.fit(jnp.zeros(DIM), data, steps=2, progress=False)
    public = private.public_state(state)
    assert isinstance(public, PublicState) and int(public.step) == 2
    secrets = [np.asarray(state.key), *(np.asarray(s.key) for s in noise_states_in(state))]
    assert len(secrets) == 2
    for leaf in jax.tree.leaves(public):
        arr = np.asarray(leaf)
        assert not jnp.issubdtype(jnp.asarray(leaf).dtype, jax.dtypes.prng_key)
        for secret in secrets:  # no secret key's bytes anywhere in the published object
            assert secret.tobytes() not in arr.tobytes()
    uint32 = [leaf for leaf in jax.tree.leaves(public) if np.asarray(leaf).dtype == np.uint32]
    assert len(uint32) == 1 and uint32[0] is public.plan  # the only words: the public plan
    assert _plan.read_ledger(public.plan, 2) == [(private._plan, 2)]
    assert not noise_states_in(public)
    assert isinstance(public.opt_state[0], PublicNoiseState)
    assert public.epsilon == private.epsilon(state) and public.delta == 1e-5
    assert private.epsilon(public) == public.epsilon  # ε can be recomputed from it
    with pytest.raises(ValueError, match="state"):  # nothing steps from it
        private.step(w, public, data)


def test_noise_free_clipped_sum_is_recovered_from_the_secret_state_only(key):
    private = private_for(jax.random.key(2))
    data = make_data(key)
    w0 = jnp.zeros(DIM)
    w1, state1, _ = private.fit(w0, data, steps=1, progress=False)
    w2, _, _ = private.step(w1, state1, data)
    truth = true_clipped_sum(private, state1, w1, data)
    noise_norm_scale = SIGMA * private.l2_clip_norm * np.sqrt(DIM)  # E‖σC·Z‖ ≈ σC√d
    # the secret checkpoint gives the sum away (why it must never be published) ...
    from_secret = recover_clipped_sum(state1, w1, w2, private)
    assert float(jnp.linalg.norm(from_secret - truth)) < 1e-6 * private.l2_clip_norm
    # ... the published form does not: the error is the noise itself. ‖Z‖² ~ χ²(64), and
    # P[χ²(64) < 16] < 1e-10, so the bound fails only if the noise is missing.
    from_public = recover_clipped_sum(private.public_state(state1), w1, w2, private)
    assert float(jnp.linalg.norm(from_public - truth)) > 0.5 * noise_norm_scale


def rebuild(public, guess):
    """The adversary's PrivateState from a PublicState: missing key data guessed."""
    opt = jax.tree.map(
        lambda s: NoiseState(key=guess, count=s.count) if isinstance(s, PublicNoiseState) else s,
        public.opt_state,
        is_leaf=lambda s: isinstance(s, PublicNoiseState),
    )
    return PrivateState(step=public.step, key=guess, opt_state=opt, plan=public.plan)


def replay_guesses(private, run_data, data, other, steps, publish):
    """For each step of a run on ``run_data``: does the replay test say "D"?

    Test: w_{t+1} == step(w_t, s_t, D) ≠ step(w_t, s_t, D′), with s_t the published object
    (made into a state by the adversary when it is a PublicState)."""
    guesses = []
    w, state = jnp.zeros(DIM), private._fresh_state(jnp.zeros(DIM))
    for _ in range(steps):
        w_next, next_state, _ = private.step(w, state, run_data)
        published = publish(state)
        if isinstance(published, PublicState):
            published = rebuild(published, jnp.zeros(2, jnp.uint32))
        on_d, _, _ = private.step(w, published, data)
        on_other, _, _ = private.step(w, published, other)
        guesses.append(bool(jnp.array_equal(w_next, on_d) and not jnp.array_equal(on_d, on_other)))
        w, state = w_next, next_state
    return np.asarray(guesses)


def test_replaying_a_step_tells_d_from_d_prime_only_with_the_secret_state(key):
    data = make_data(key)
    other = zeroed_out(data)
    on_d = private_for(jax.random.key(3))
    on_other = private_for(jax.random.key(4))  # a separate run (own keys) on D′
    steps = 40  # q = 0.25: record 0 is in ≈ 10 of the batches (P[fewer than 3] < 1e-3)

    def secret(s):
        return s

    tpr = replay_guesses(on_d, data, data, other, steps, secret).mean()
    fpr = replay_guesses(on_other, other, data, other, steps, secret).mean()
    # TPR ≈ q at FPR = 0: impossible under (ε, δ = 1e-5)-DP, so the secret state is no output
    assert fpr == 0.0 and tpr >= 3 / steps
    tpr = replay_guesses(on_d, data, data, other, steps, on_d.public_state).mean()
    fpr = replay_guesses(on_other, other, data, other, steps, on_other.public_state).mean()
    assert tpr == 0.0 and fpr == 0.0


def test_public_opt_state_of_the_pieces_path(key):
    sampler = dpjax.PoissonSampler(dataset_size=N, sampling_rate=0.25)
    grad_fn = dpjax.clipped_grad(linear_loss, l2_clip_norm=1.0)
    tx = dpjax.dp_sgd_optimizer(
        optimizer=optax.sgd(0.1, momentum=0.9),
        clipped_grad=grad_fn,
        noise_multiplier=SIGMA,
        normalizer=sampler.expected_batch_size,
        key=jax.random.key(5),
    )
    params = jnp.zeros(DIM)
    state = tx.init(params)
    clipped_sum, _ = grad_fn(params, make_data(key))
    _, state = tx.update(clipped_sum, state, params)
    public = public_opt_state(state)
    assert not noise_states_in(public)
    assert all(np.asarray(x).dtype != np.uint32 for x in jax.tree.leaves(public))
    assert dpjax.dp_sgd.noise_releases(public) == 1
    assert dpjax.dp_sgd.event_for(tx, sampler=sampler, state=public).count == 1
    np.testing.assert_array_equal(public[2][0].trace, state[2][0].trace)  # moments kept
    accumulated = dpjax.accumulate_clipped_sums(tx, every_k=2)
    _, mid = accumulated.update(clipped_sum, accumulated.init(params), params)
    assert float(jnp.linalg.norm(mid.clipped_sum)) > 0  # noise-free until the k-th micro-batch
    public_mid = public_opt_state(mid)
    assert public_mid.clipped_sum is None and not noise_states_in(public_mid)
    assert dpjax.dp_sgd.noise_releases(public_mid) == 0
    with_optax_noise = optax.chain(tx, optax.add_noise(0.1, 0.5, key=jax.random.key(6)))
    with pytest.raises(ValueError, match="opt_state"):  # another key would be published
        public_opt_state(with_optax_noise.init(params))


# ----------------------------------------------------------------------------- 2. resume


@pytest.mark.parametrize(
    "change",
    [
        {"noise_multiplier": 1.5},
        {"batch_size": 40},
        {"l2_clip_norm": 2.0},
        {"dataset_size": N + 1},
    ],
    ids=["sigma", "q", "C", "n"],
)
def test_a_state_is_refused_under_another_plan(key, change):
    base = private_for(jax.random.key(7), steps=5)
    data = make_data(key)
    _, state, _ = base.fit(jnp.zeros(DIM), data, steps=2, progress=False)
    other = private_for(jax.random.key(8), steps=5, **change)
    other_data = make_data(key, n=other.sampler.dataset_size)
    with pytest.raises(ValueError, match="continue_from"):
        other.step(jnp.zeros(DIM), state, other_data)
    with pytest.raises(ValueError, match="continue_from"):
        other.fit(jnp.zeros(DIM), other_data, state=state, progress=False)
    # ε of the state is read from its own ledger, whichever object is asked
    assert other.epsilon(state) == pytest.approx(base.epsilon(state), rel=1e-12)


def dp_accounting_epsilon(phases, delta):
    """ε of Poisson-subsampled Gaussian phases [(q, σ, T)] composed, by dp-accounting's PLD."""
    dp_accounting = pytest.importorskip("dp_accounting")
    accountant = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    for q, sigma, steps in phases:
        sampled = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
        accountant.compose(dp_accounting.SelfComposedDpEvent(sampled, steps))
    return accountant.get_epsilon(delta)


def run_two_phases(key, first_kw, second_kw, n=1000, dim=3, steps=(200, 200)):
    data = make_data(key, n=n, dim=dim)
    common = dict(dataset_size=n, accounting="pld")
    first = private_for(jax.random.key(9), **common, **first_kw)
    second = private_for(jax.random.key(10), **common, **second_kw)
    w, state, _ = first.fit(
        jnp.zeros(dim), data, steps=steps[0], log_every=steps[0], progress=False
    )
    with pytest.raises(ValueError, match="continue_from"):
        second.fit(w, data, state=state, progress=False)
    state = second.continue_from(state)
    w, state, history = second.fit(
        w, data, state=state, steps=steps[1], log_every=steps[1], progress=False
    )
    assert int(state.step) == sum(steps)
    assert [t for _, t in _plan.read_ledger(state.plan, sum(steps))] == list(steps)
    eps = second.epsilon(state)
    assert first.epsilon(state) == eps  # the ledger is self-describing
    assert history["epsilon"][-1] == eps and second.public_state(state).epsilon == eps
    return first, second, eps


def test_resume_under_another_plan_is_the_tight_composition_when_the_slack_fits(key):
    """Both phases planned for 100 steps at σ = 1, q = 0.05; C changes at step 50."""
    plan = dict(batch_size=50, noise_multiplier=1.0, steps=100)
    first, second, eps = run_two_phases(key, plan, dict(plan, l2_clip_norm=2.0), steps=(50, 50))
    q = first.sampling_rate
    reference = dp_accounting_epsilon([(q, 1.0, 50), (q, 1.0, 50)], 1e-5 * (1 - SLACK_FRACTION))
    assert eps == pytest.approx(reference, rel=1e-3)
    assert eps == pytest.approx(first.epsilon(100), rel=1e-9)  # = one plan run for 100 steps


@pytest.mark.parametrize(
    "steps", [(50, 50), pytest.param((200, 200), marks=pytest.mark.slow)], ids=["50+50", "review"]
)
def test_resume_under_another_plan_is_never_charged_the_new_plan_alone(key, steps):
    """The review's numbers: 200 steps at σ = 0.8, q = 0.05, then 200 at σ = 4, q = 0.01 were
    reported as ε = 0.166; the composition is ≈ 7.705. The second phase's cap was sized for
    its own ε (0.11), so its truncation slack does not fit at the composed ε: the reported
    bound is the basic composition of the two phases, each at δ(1 − 4·10⁻³)/2."""
    first, second, eps = run_two_phases(
        key,
        dict(batch_size=50, noise_multiplier=0.8, steps=steps[0]),
        dict(batch_size=10, noise_multiplier=4.0, steps=steps[1]),
        steps=steps,
    )
    p1 = (first.sampling_rate, 0.8, steps[0])
    p2 = (second.sampling_rate, 4.0, steps[1])
    tight = dp_accounting_epsilon([p1, p2], 1e-5 * (1 - SLACK_FRACTION))
    share = 1e-5 * (1 - 4 * SLACK_FRACTION) / 2
    basic = dp_accounting_epsilon([p1], share) + dp_accounting_epsilon([p2], share)
    assert tight < eps  # never below the truth
    assert eps == pytest.approx(basic, rel=1e-3)
    alone = second.epsilon(steps[1])  # what the old code reported for the resumed state
    assert alone < 0.2 < 3.0 < tight
    if steps == (200, 200):
        assert 7.6 < tight < 7.8 < eps < 8.4


def test_continue_from_the_same_plan_changes_nothing_and_templates_never_train(key):
    private = private_for(jax.random.key(11), steps=5)
    data = make_data(key)
    template = private.state_template(jnp.zeros(DIM))
    with pytest.raises(ValueError, match="state.plan"):
        private.epsilon(template)
    _, state, _ = private.fit(jnp.zeros(DIM), data, steps=1, progress=False)
    twin = private_for(jax.random.key(12), steps=5)
    assert twin.continue_from(state) is state  # same plan: no new phase
    with pytest.raises(ValueError, match="continue_from"):  # it ran: no second run
        twin.init(jnp.zeros(DIM))


# ----------------------------------------------------------------------------- 3. re-run


def test_second_fit_or_init_without_the_state_is_refused(key):
    private = private_for(jax.random.key(13), steps=6)
    data = make_data(key)
    w0 = jnp.zeros(DIM)
    w1, s1, _ = private.fit(w0, data, steps=3, progress=False)
    with pytest.raises(ValueError, match="state"):
        private.fit(w1, data, progress=False)  # the review's attack: a replay of run 1
    with pytest.raises(ValueError, match="init"):
        private.init(w0)
    w2, s2, _ = private.fit(w1, data, state=s1, progress=False)  # the rest of the plan
    assert int(s2.step) == 6
    # continued, not replayed: the second-difference w2 − 2w1 + w0 is not noise-free
    assert float(jnp.linalg.norm(w2 - 2 * w1 + w0)) > 0.1


# ----------------------------------------------------------------------------- 7. past the plan


def test_fit_past_what_delta_holds_is_refused_before_any_step(key, monkeypatch):
    # this plan's cap (sized for the planned 6 steps) holds the truncation slack of 28 steps at
    # δ, paid from at most half of δ (accounting.tight.TRUNCATION_DELTA_SHARES), not of 29:
    # running past the plan soon leaves δ
    private = private_for(jax.random.key(14), steps=6)
    data = make_data(key)
    calls = []
    original = PrivateTraining.step

    def counting(self, *args):
        calls.append(1)
        return original(self, *args)

    monkeypatch.setattr(PrivateTraining, "step", counting)
    with pytest.raises(ValueError, match="before any step ran"):
        private.fit(jnp.zeros(DIM), data, steps=10**7, progress=False)
    assert not calls
    # a run past the plan where δ still holds: ONE warning, not one per refresh
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, state, history = private.fit(jnp.zeros(DIM), data, steps=7, log_every=1)
    past = [w for w in caught if "beyond the planned" in str(w.message)]
    assert len(past) == 1 and len(calls) == 7 and len(history["epsilon"]) == 7
    assert int(state.step) == 7
    with pytest.raises(ValueError, match="before any step ran"):  # the 29th would leave δ
        private.fit(jnp.zeros(DIM), data, state=state, steps=22, progress=False)
    assert private.epsilon(28) < math.inf
    with pytest.raises(ValueError, match="truncation slack"):
        private.epsilon(29)
    assert len(calls) == 7


# ----------------------------------------------------------------------------- 8. params omitted


def per_example_rows(key, rows=8):
    return 5.0 * jax.random.normal(key, (rows, DIM))  # unclipped, one row per example


@pytest.mark.parametrize("kind", ["dp_sgd_optimizer", "accumulated", "gaussian", "laplace"])
def test_update_with_params_omitted_refuses_per_example_gradients(key, kind):
    k = jax.random.key(15)
    if kind == "gaussian":
        tx = add_gaussian_noise(1.0, key=k)
    elif kind == "laplace":
        tx = add_laplace_dp_sgd_noise(l1_sensitivity=1.0, epsilon=1.0, rho=0.5, kappa=0.0, key=k)
    else:
        tx = dpjax.dp_sgd_optimizer(
            optimizer=optax.sgd(1.0), noise_multiplier=1.0, l2_clip_norm=1.0, normalizer=8.0, key=k
        )
        if kind == "accumulated":
            tx = dpjax.accumulate_clipped_sums(tx, every_k=1)
    params = jnp.zeros(DIM)
    state = tx.init(params)
    with pytest.raises(ValueError, match="updates"):
        tx.update(per_example_rows(key), state)  # params omitted
    with pytest.raises(ValueError, match="updates"):
        jax.jit(tx.update)(per_example_rows(key), state)
    out, _ = tx.update(jnp.ones(DIM), state)  # a sum shaped like the params given to init
    assert out.shape == (DIM,)


def test_update_with_params_omitted_and_no_init_is_refused(key):
    tx = add_gaussian_noise(1.0, key=jax.random.key(16))
    state = NoiseState(key=jax.random.key_data(jax.random.key(17)), count=jnp.zeros([], jnp.int32))
    with pytest.raises(ValueError, match="params"):
        tx.update(jnp.ones(DIM), state)
    out, _ = tx.update(jnp.ones(DIM), state, jnp.zeros(DIM))
    assert out.shape == (DIM,)


# ------------------------------------------------------------------------------------------------
# regression guards (they pass on main) for the traced path of the new plans.
#
# ``step`` inside the caller's own ``jax.jit`` cannot raise on a state of another plan; it must
# return NaN instead. The ledger words that identify the new plans (BandMF's strategy digest,
# adaptive clipping's config, the user grouping's fingerprint) are compared there too.
# ------------------------------------------------------------------------------------------------

N_GUARD_ROWS = 300


def _loss(w, x):
    return 0.5 * jnp.sum((x @ w - 1.0) ** 2)


def _make(**overrides):
    kwargs = dict(
        optimizer=optax.sgd(0.1),
        l2_clip_norm=1.0,
        dataset_size=N_GUARD_ROWS,
        batch_size=5,
        steps=6,
        noise_multiplier=1.0,
        delta=1e-5,
        key=jax.random.key(0),
    )
    kwargs.update(overrides)
    return dpjax.make_private(_loss, **kwargs)


_TWO_BANDS = np.tril(np.ones((6, 6))) - np.tril(np.ones((6, 6)), -2)
_PAIRS = {
    "bandmf_strategy": (
        dict(noise=BandMF(bands=2)),
        dict(noise=BandMF(bands=2, strategy=_TWO_BANDS)),  # same b, same shapes, other C
    ),
    "adaptive_quantile": (
        dict(l2_clip_norm=AdaptiveClip(0.5, 0.2, 5.0, 1.0)),
        dict(l2_clip_norm=AdaptiveClip(0.6, 0.2, 5.0, 1.0)),
    ),
    "user_grouping": (  # same U = 100 and k = 3, other partition of the rows
        dict(user_ids=np.repeat(np.arange(100), 3)),
        dict(user_ids=np.tile(np.arange(100), 3)),
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(_PAIRS))
def test_traced_step_of_another_new_plan_returns_nan(name):
    """Catches a jitted step of one plan accepting the state of another plan (it must give NaN)."""
    first, other = (_make(**kw) for kw in _PAIRS[name])
    data = jnp.asarray(np.random.default_rng(0).normal(size=(N_GUARD_ROWS, 2)), jnp.float32)
    w = jnp.zeros(2, jnp.float32)
    w, state, _ = first.step(w, first.init(w), data)
    same, _, _ = jax.jit(first.step)(w, state, data)
    assert bool(jnp.all(jnp.isfinite(same)))  # the guard does not void its own plan
    w2, _, _ = jax.jit(other.step)(w, state, data)
    assert bool(jnp.all(jnp.isnan(w2)))


# ------------------------------------------------------------------------------------------------
# the workflow-privacy rewrite: attacks on documented paths.
#
# 1. ``public_opt_state`` of a state restored as a plain dict (``flax.serialization``'s
#    ``msgpack_restore`` / ``to_state_dict``) published the noise key: the next noise draw is
#    then regenerated exactly.
# 2. ``public_opt_state`` of an ``optax.MultiSteps`` / ``optax.apply_every`` state holding a
#    noise transform published the NOT yet noised running sum (``acc_grads`` / ``grad_acc``).
# 3. ``public_opt_state`` passed through objects the tree does not enter (a key inside).
# 4. A ``PrivateTraining`` that resumed a state (``fit(state=...)``) then accepted a ``fit``
#    without state: with the key the run was built with (the documented resume after a
#    restart rebuilds the object with the same key) that replays the first run's noise.
# ------------------------------------------------------------------------------------------------

ATTACK_DIM = 3


@pytest.fixture
def attack_key():
    return jax.random.key(20)


def dp_adam(attack_key):
    return dpjax.dp_sgd_optimizer(
        optimizer=optax.adam(0.1),
        noise_multiplier=1.0,
        l2_clip_norm=1.0,
        normalizer=10.0,
        key=attack_key,
    )


@pytest.mark.parametrize("restore", ["to_state_dict", "msgpack_restore"])
def test_a_noise_state_restored_as_a_dict_is_never_published(attack_key, restore):
    """Catches public_opt_state publishing a noise state restored as a plain dict."""
    params = jnp.zeros(ATTACK_DIM)
    tx = dp_adam(attack_key)
    state = tx.init(params)
    if restore == "to_state_dict":
        restored = flax.serialization.to_state_dict(state)
    else:
        restored = flax.serialization.msgpack_restore(flax.serialization.to_bytes(state))
    # the dict holds the noise key data, which fixes every later noise draw
    assert jnp.array_equal(jnp.asarray(restored["0"]["key"]), state[0].key)
    with pytest.raises(ValueError, match="opt_state"):
        public_opt_state(restored)


def multisteps_with_noise(attack_key):
    inner = optax.chain(add_gaussian_noise(1.0, key=attack_key), optax.sgd(0.1))
    return optax.MultiSteps(inner, every_k_schedule=2)


def apply_every_before_noise(attack_key):
    return optax.chain(
        optax.apply_every(2), add_gaussian_noise(1.0, key=attack_key), optax.sgd(0.1)
    )


@pytest.mark.parametrize("build", [multisteps_with_noise, apply_every_before_noise])
def test_an_un_noised_running_sum_is_never_published(attack_key, build):
    """Catches public_opt_state publishing an accumulator's un-noised running sum."""
    params = jnp.zeros(ATTACK_DIM, jnp.float32)
    tx = build(attack_key)
    secret_sum = jnp.array([0.25, -0.5, 0.75], jnp.float32)  # a clipped sum, before its noise
    with jax.numpy_dtype_promotion("standard"):  # optax's accumulators are not strict-clean
        _, state = tx.update(secret_sum, tx.init(params), params)  # mid-accumulation
    published = public_opt_state(state)
    for leaf in jax.tree.leaves(published):
        if jnp.shape(leaf) == (ATTACK_DIM,):
            assert not jnp.allclose(jnp.asarray(leaf, jnp.float32), secret_sum), published


def test_accumulate_clipped_sums_publishes_neither_part_of_its_running_sum(attack_key):
    # the double-float accumulator keeps a high AND a low part of the un-noised sum: both secret
    """Catches accumulate_clipped_sums publishing part of its un-noised running sum."""
    grad_fn = dpjax.clipped_grad(lambda w, x: jnp.dot(w, x), l2_clip_norm=1.0)
    tx = dpjax.dp_sgd.accumulate_clipped_sums(
        dpjax.dp_sgd_optimizer(
            optimizer=optax.sgd(0.1),
            noise_multiplier=1.0,
            clipped_grad=grad_fn,
            normalizer=10.0,
            key=attack_key,
        ),
        every_k=4,
    )
    params = jnp.zeros(ATTACK_DIM, jnp.float32)
    # 1 + 2^-30 is not a float32: the accumulator keeps 2^-30 in its low part
    parts = [jnp.array([1.0, 0.5, -0.5], jnp.float32), jnp.array([2.0**-30, 0.0, 0.0], jnp.float32)]
    state = tx.init(params)
    for part in parts:
        _, state = tx.update(part, state, params)
    assert any(jnp.any(leaf != 0) for leaf in jax.tree.leaves(state.clipped_sum_low))
    published = public_opt_state(state)
    names = {str(k) for path, _ in jax.tree_util.tree_flatten_with_path(published)[0] for k in path}
    assert not any("clipped_sum" in n for n in names), names


def test_an_object_the_tree_does_not_enter_is_never_published(attack_key):
    """Catches public_opt_state publishing an opaque leaf that may hide a secret state."""

    class Box:  # not a registered pytree: a leaf whose content is not inspected
        def __init__(self, inner):
            self.inner = inner

    with pytest.raises(ValueError, match="opt_state"):
        public_opt_state({"wrapped": Box(dp_adam(attack_key).init(jnp.zeros(ATTACK_DIM)))})


def test_a_model_layer_named_key_still_publishes(attack_key):
    """Catches a model layer named 'key' being mistaken for a secret key and withheld."""
    params = {"attention": {"key": {"kernel": jnp.zeros((2, 2))}, "value": jnp.zeros(2)}}
    published = public_opt_state(dp_adam(attack_key).init(params))
    mu = published[2][0].mu
    assert mu["attention"]["key"]["kernel"].shape == (2, 2)


# ----------------------------------------------------------------------------- 4. replay


def attack_linear_loss(w, ex):
    return ex @ w


def attack_private_for(seed):
    return dpjax.make_private(
        attack_linear_loss,
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


def test_an_object_that_resumed_a_state_refuses_a_fresh_run(attack_key):
    """Catches an object that resumed a state starting a fresh run with the same key."""
    data = 3.0 * jax.random.normal(attack_key, (100, ATTACK_DIM))
    first = attack_private_for(7)
    _, state, _ = first.fit(jnp.zeros(ATTACK_DIM), data, steps=2, progress=False)
    rebuilt = attack_private_for(7)  # the same script after a restart: same key, resumes the state
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rebuilt.fit(jnp.zeros(ATTACK_DIM), data, state=state, steps=2, progress=False)
    with pytest.raises(ValueError, match="state"):  # a fresh run here would replay `first`
        rebuilt.fit(jnp.zeros(ATTACK_DIM), data, steps=2, progress=False)
    with pytest.raises(ValueError, match="init"):
        rebuilt.init(jnp.zeros(ATTACK_DIM))


# ----------------------------------------------------------------------------- 5. traced step


@pytest.mark.parametrize("which", ["template", "another_plan"])
def test_a_traced_step_never_releases_a_template_or_another_plans_update(attack_key, which):
    """Under the user's own jit the host-side plan check cannot run. A template's key data
    are zeros (public), so its noise is known and the update is a noise-free clipped sum; a
    state of another plan would be charged at its ledger's (weaker) plan."""
    data = 3.0 * jax.random.normal(attack_key, (100, ATTACK_DIM))
    private = attack_private_for(8)
    if which == "template":
        state = private.state_template(jnp.zeros(ATTACK_DIM))
    else:
        other = dpjax.make_private(
            attack_linear_loss,
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
        state = other.init(jnp.zeros(ATTACK_DIM))
    params, state, _ = jax.jit(private.step)(jnp.zeros(ATTACK_DIM), state, data)
    assert int(state.step) == 1
    assert bool(jnp.all(jnp.isnan(params)))


def test_a_traced_step_of_this_plan_is_unchanged(attack_key):
    """Catches the workflow guards changing the result of a jitted step of the plan's own state."""
    data = 3.0 * jax.random.normal(attack_key, (100, ATTACK_DIM))
    private = attack_private_for(10)
    state = private.init(jnp.zeros(ATTACK_DIM))
    eager = private.step(jnp.zeros(ATTACK_DIM), state, data)[0]
    traced = jax.jit(private.step)(jnp.zeros(ATTACK_DIM), state, data)[0]
    assert bool(jnp.all(jnp.isfinite(traced))) and jnp.array_equal(eager, traced)


# ----------------------------------------------------------------------------- 6. restore


def test_a_ledger_cut_by_a_template_restore_is_refused(attack_key, tmp_path):
    """orbax refuses a 2-phase checkpoint restored into ``state_template`` (one ledger row)
    and its error says to set ``strict=False``; that restore kept the first phase only, so
    ε charged the σ = 0.6 steps at σ = 4 (0.72 reported, 12.5 true)."""
    ocp = pytest.importorskip("orbax.checkpoint")
    data = 3.0 * jax.random.normal(attack_key, (100, ATTACK_DIM))
    strong = attack_private_for(2)  # σ = 1
    weak = dpjax.make_private(
        attack_linear_loss,
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
    w, state, _ = strong.fit(jnp.zeros(ATTACK_DIM), data, steps=5, progress=False)
    state = weak.continue_from(state)
    w, state, _ = weak.fit(w, data, state=state, steps=5, progress=False)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp_path / "run", state)
    checkpointer.wait_until_finished()
    template = weak.state_template(jnp.zeros(ATTACK_DIM))
    restored = checkpointer.restore(tmp_path / "run", template, strict=False)
    assert restored.plan.shape[0] == 1  # orbax cut the ledger to the template's one row
    with pytest.raises(ValueError, match="state.plan"):
        weak.epsilon(restored)
    with pytest.raises(ValueError, match="state.plan"):
        weak.continue_from(restored)
    with pytest.raises(ValueError, match="state.plan"):
        weak.public_state(restored)


def test_a_traced_step_of_a_continued_state_is_unchanged(attack_key):
    """The void check of a traced step ignores the ledger's row count and phase start."""
    data = 3.0 * jax.random.normal(attack_key, (100, ATTACK_DIM))
    w, state, _ = attack_private_for(11).fit(jnp.zeros(ATTACK_DIM), data, steps=2, progress=False)
    weak = dpjax.make_private(
        attack_linear_loss,
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
def test_a_vmapped_update_never_noises_per_example_rows(attack_key):
    """``jax.vmap(tx.update, in_axes=(0, None, None))`` over per-example gradients passes the
    shape check (inside vmap each row is shaped like params) and adds ONE noise draw (the
    state is not batched) to every unclipped row: the rows' differences are noise-free."""
    params = jnp.zeros(ATTACK_DIM, jnp.float32)
    rows = jnp.array([[5.0, 0.0, 0.0], [0.0, 7.0, 0.0]], jnp.float32)  # unclipped
    noise_only = dpjax.dp_sgd_optimizer(
        optimizer=optax.sgd(1.0),
        noise_multiplier=1.0,
        l2_clip_norm=1.0,
        normalizer=1.0,
        key=attack_key,
    )
    with pytest.raises(ValueError, match="updates"):
        jax.vmap(noise_only.update, in_axes=(0, None, None))(rows, noise_only.init(params), params)
