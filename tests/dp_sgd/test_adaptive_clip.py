"""Adaptive clipping (Andrew, Thakkar, McMahan, Ramaswamy 2021): the budget split of Theorem 1,
the centred count's sensitivity, the quantile tracking, the certified clipping at the CURRENT
C_t on both backends, the plan ledger and the public state.

The function-level tests are fast; the ones that compile a ``make_private`` step are ``slow``
(≈ 10 s of compilation each on 2 shared cores).
"""

from __future__ import annotations

import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dpjax
from dpjax.dp_sgd import (
    AdaptiveClip,
    AdaptiveClipState,
    PaddedBatch,
    PublicNoiseState,
    _plan,
    accounted_noise_multiplier,
    effective_noise_multiplier,
)
from dpjax.dp_sgd.adaptive_clip import (
    centred_unclipped_count,
    init_adaptive_clip,
    next_clip_norm,
)

CONFIG = AdaptiveClip(
    target_quantile=0.5, learning_rate=0.2, count_noise_multiplier=4.0, initial=0.5
)
_count = jax.jit(centred_unclipped_count)


# ----------------------------------------------------------------------------- Theorem 1


def test_effective_noise_multiplier_matches_a_hand_computation():
    # σ = 2, σ_b = 3/2: σ⁻² − (2σ_b)⁻² = 1/4 − 1/9 = 5/36, so σ_Δ = √(36/5)
    assert effective_noise_multiplier(2.0, 1.5) == pytest.approx(math.sqrt(36 / 5), rel=1e-15)
    # σ = 1, σ_b = 5: 1 − 1/100 = 99/100, σ_Δ = √(100/99)
    assert effective_noise_multiplier(1.0, 5.0) == pytest.approx(math.sqrt(100 / 99), rel=1e-15)
    assert effective_noise_multiplier(0.0, 1.0) == 0.0  # not private: no gradient noise either


def test_theorem_1_statement_recovers_the_accounted_sigma():
    """Theorem 1: DP-SGD step with gradient noise σ_Δ and count noise σ_b ≡ noise multiplier
    (σ_Δ⁻² + (2σ_b)⁻²)^(−1/2); the split returns the σ the user gave."""
    for sigma, sigma_b in [(0.7, 0.4), (1.0, 5.0), (3.0, 100.0), (10.0, 5.01)]:
        s_d = effective_noise_multiplier(sigma, sigma_b)
        theorem = (Fraction(s_d) ** -2 + (2 * Fraction(sigma_b)) ** -2) ** -1
        assert math.sqrt(theorem) == pytest.approx(sigma, rel=1e-13)
        assert accounted_noise_multiplier(s_d, sigma_b) == pytest.approx(sigma, rel=1e-13)
        assert s_d > sigma  # the gradient pays for the count


def _joint_privacy_ratio(sum_shift: float, count_shift: float, s_d: float, s_b: float) -> float:
    """‖shift / noise std‖ of the joint release (S′ + N(0, σ_Δ²), c + N(0, σ_b²)): a Gaussian
    mechanism with this sensitivity-to-noise ratio has noise multiplier 1/ratio."""
    return math.hypot(sum_shift / s_d, count_shift / s_b)


def test_the_split_spends_exactly_sigma_on_the_measured_sensitivities():
    """The constants measured from the code (the count moves by 1/2 when a record is added,
    the clipped sum by ≤ 1 in units of C_t) with σ_Δ from the split: the joint release is the
    Gaussian mechanism at exactly σ. Fails with σ_b in place of 2σ_b in the split, and with an
    uncentred count (which moves by 1)."""
    norms = jnp.asarray([0.3, 2.0, jnp.nan, 0.99, 1.0, 7.0], jnp.float64)
    mask = jnp.asarray([True] * 6)
    base = _count(norms, mask, 1.0)
    shifts = set()
    for i in range(6):  # remove record i (zero-out: mask False)
        shifts.add(abs(float(base - _count(norms, mask.at[i].set(False), 1.0))))
    assert shifts == {0.5}
    count_shift = max(shifts)
    for sigma, sigma_b in [(1.0, 2.0), (0.8, 0.5), (5.0, 3.0)]:
        s_d = effective_noise_multiplier(sigma, sigma_b)
        ratio = _joint_privacy_ratio(1.0, count_shift, s_d, sigma_b)
        assert ratio == pytest.approx(1.0 / sigma, rel=1e-12)


def test_centred_count_is_exact_and_padding_counts_nothing():
    norms = jnp.asarray([0.5, 1.5, 0.1, jnp.inf, 3.0], jnp.float32)
    mask = jnp.asarray([True, True, True, True, False])
    # real rows: unclipped 0.5, 0.1 (+1/2 each); clipped 1.5, inf (−1/2 each); padding: 0
    assert float(_count(norms, mask, 1.0)) == 0.0
    assert float(_count(norms, mask, 2.0)) == 1.0
    assert _count(norms, mask, 1.0).dtype == jnp.float32


# ----------------------------------------------------------------------------- the update


QN = 40.0  # public expected batch size of the update tests


@jax.jit
def _updates(keys: jax.Array, count: jax.Array):
    """(C_{t+1}, b̃, count of the noise state) of one update from C_0 for each key (vmap)."""

    def one(k):
        state = init_adaptive_clip(CONFIG, key=k)
        new, fraction = next_clip_norm(CONFIG, state, count, expected_batch_size=QN)
        return new.clip_norm, fraction, new.count_noise.count, new.count_noise.key

    return jax.vmap(one)(keys)


def test_update_normalises_by_the_public_expected_batch_size():
    """Same keys, counts c1 and c2: b̃ differs by (c2 − c1)/(q·n) — the realised batch size is
    not an input — and log C moves by −η(b̃ − γ)."""
    keys = jax.random.split(jax.random.key(11), 4000)  # the shape of the next test: one compile
    c1, f1, n1, k1 = _updates(keys, jnp.float32(-3.5))
    c2, f2, _, _ = _updates(keys, jnp.float32(6.5))
    np.testing.assert_allclose(np.asarray(f2 - f1), 10.0 / QN, rtol=1e-5)
    for c, f in [(c1, f1), (c2, f2)]:
        moved = np.log(np.asarray(c, np.float64)) - math.log(CONFIG.initial)
        expected = -CONFIG.learning_rate * (np.asarray(f, np.float64) - 0.5)
        np.testing.assert_allclose(moved, expected, atol=1e-6)
    assert np.all(np.asarray(n1) == 1)
    assert not np.array_equal(np.asarray(k1[0]), np.asarray(jax.random.key_data(keys[0])))


def test_count_noise_has_the_stated_scale():
    """b̃·q·n − c over fresh keys has std σ_b (a wrong scale, e.g. σ_b/2 or 2σ_b, fails)."""
    n = 4000
    _, fraction, _, _ = _updates(jax.random.split(jax.random.key(11), n), jnp.float32(0.0))
    z = (np.asarray(fraction, np.float64) - 0.5) * QN
    # the sample std of n normals has relative sd ≈ 1/√(2n) = 1.1 %: 5 sds
    assert abs(z.std() / CONFIG.count_noise_multiplier - 1.0) < 5 / math.sqrt(2 * n)
    assert abs(z.mean()) < 5 * CONFIG.count_noise_multiplier / math.sqrt(n)


@jax.jit
def _track(gammas: jax.Array, low: float, high: float) -> jax.Array:
    """log C_t, 500 steps of B = 256 norms drawn log-uniform in [low, high], one run per γ."""
    batch = 256

    def run(gamma, key):
        config = CONFIG._replace(target_quantile=gamma, count_noise_multiplier=batch / 20)
        state = init_adaptive_clip(CONFIG._replace(initial=0.5), key=key)

        def step(state, k):
            logs = jax.random.uniform(k, (batch,), jnp.float32, jnp.log(low), jnp.log(high))
            norms = jnp.exp(logs) / state.clip_norm
            c = centred_unclipped_count(norms, jnp.ones(batch, bool), 1.0)
            state, _ = next_clip_norm(config, state, c, expected_batch_size=float(batch))
            return state, jnp.log(state.clip_norm)

        return jax.lax.scan(step, state, jax.random.split(jax.random.key(6), 500))[1]

    # one count-noise key per run: a vmap over runs batches the noise state too (vmap guard)
    return jax.vmap(run)(gammas, jax.random.split(jax.random.key(5), gammas.shape[0]))


def test_clip_norm_tracks_the_target_quantile():
    """Log-uniform norms on [a, b]: the γ-quantile is a·(b/a)^γ. Near it, x = log C follows
    x' − x* = (1 − η/L)(x − x*) − η·e with L = log(b/a) and e the noise of b̃ (variance
    γ(1−γ)/B + (σ_b/B)²), so x has stationary sd ≈ √(ηL/2)·sd(e) and autocorrelation time
    L/η; the mean of the last 200 steps has sd ≈ sd(x)·√(2L/(η·200)). Tolerance: 6 sds; the
    two targets (γ = 0.5, 0.9) are 0.4·L apart, far beyond it (a wrong quantile fails)."""
    a, b, batch, eta = 0.5, 50.0, 256, CONFIG.learning_rate
    gammas = (0.5, 0.9)
    logs = np.asarray(_track(jnp.asarray(gammas, jnp.float32), a, b), np.float64)
    L = math.log(b / a)
    for gamma, run in zip(gammas, logs, strict=True):
        sd_e = math.sqrt(gamma * (1 - gamma) / batch + (1 / 20) ** 2)
        sd_mean = math.sqrt(eta * L / 2) * sd_e * math.sqrt(2 * L / (eta * 200))
        assert abs(run[-200:].mean() - (math.log(a) + gamma * L)) < 6 * sd_mean
        assert 0.4 * L > 20 * sd_mean


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("target_quantile", 0.0),
        ("target_quantile", 1.0),
        ("target_quantile", math.nan),
        ("learning_rate", 0.0),
        ("learning_rate", -1.0),
        ("count_noise_multiplier", 0.0),
        ("initial", -0.5),
        ("initial", math.inf),
    ],
)
def test_bad_config_raises_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        CONFIG._replace(**{field: value}).validated()


def test_count_noise_at_most_half_sigma_is_refused():
    with pytest.raises(ValueError, match=r"count_noise_multiplier.*noise_multiplier/2"):
        effective_noise_multiplier(2.0, 1.0)
    with pytest.raises(ValueError, match="count_noise_multiplier"):
        effective_noise_multiplier(2.0, 0.99)
    with pytest.raises(ValueError, match="count_noise_multiplier"):
        dpjax.make_private(
            lambda w, ex: jnp.sum(ex * w),
            optimizer=optax.sgd(0.1),
            l2_clip_norm=CONFIG._replace(count_noise_multiplier=0.5),
            dataset_size=100,
            batch_size=10,
            steps=3,
            noise_multiplier=1.0,
            delta=1e-5,
            key=jax.random.key(0),
        )


# ----------------------------------------------------------------------------- the ledger


def _plan_of(**changes) -> _plan.Plan:
    base = dict(
        noise_multiplier=1.0,
        sampling_rate=0.1,
        l2_clip_norm=0.5,
        normalizer=10.0,
        dataset_size=100,
        max_batch_size=30,
        relation=dpjax.ADD_OR_REMOVE_ONE,
        target_quantile=0.5,
        learning_rate=0.2,
        count_noise_multiplier=4.0,
    )
    return _plan.Plan(**{**base, **changes})


def test_ledger_records_the_adaptive_config_exactly():
    plan = _plan_of(target_quantile=0.1 + 0.2, learning_rate=1 / 3)
    assert _plan.current_plan(_plan.ledger_row(plan, 0)[None, :]) == plan
    fixed = _plan_of(target_quantile=0.0, learning_rate=0.0, count_noise_multiplier=0.0)
    assert _plan.current_plan(_plan.ledger_row(fixed, 0)[None, :]) == fixed
    rows = {
        tuple(_plan.ledger_row(p, 0))
        for p in [plan, fixed, _plan_of(learning_rate=0.3), _plan_of(count_noise_multiplier=4.5)]
    }
    assert len(rows) == 4
    assert "γ=0.3" in plan.describe() and "C=0.5" in fixed.describe()


# ----------------------------------------------------------------------------- make_private


def _private(config, *, clipping="vmap", key=0, sigma=1.0, n=48, steps=4, batch_size=12, **kw):
    loss = lambda w, ex: 0.5 * jnp.sum((ex["x"] @ w - ex["y"]) ** 2)  # noqa: E731
    return dpjax.make_private(
        loss,
        optimizer=optax.sgd(0.1),
        l2_clip_norm=config,
        dataset_size=n,
        batch_size=batch_size,
        steps=steps,
        noise_multiplier=sigma,
        delta=1e-5,
        key=jax.random.key(key),
        clipping=clipping,
        **kw,
    )


def _data(n=48):
    x = jax.random.normal(jax.random.key(1), (n, 3), jnp.float32)
    y = x @ jnp.asarray([1.0, -2.0, 0.5], jnp.float32) + 3.0
    x = x.at[0].set(jnp.asarray([1e20, -1e20, 3e19], jnp.float32))  # huge gradient
    x = x.at[1].set(jnp.asarray([jnp.nan, 0.0, 1.0], jnp.float32))  # NaN gradient
    x = x.at[2:6].set(jnp.asarray([30.0, 30.0, 30.0], jnp.float32))  # four aligned, large
    return {"x": x, "y": y}


def test_accounted_as_dp_sgd_at_sigma():
    """ε of the adaptive run equals make_private(noise_multiplier=σ) with a fixed C, exactly
    (the count's share is inside σ, Theorem 1), and so does its event."""
    adaptive = _private(CONFIG, steps=30, accounting="rdp")
    fixed = _private(1.0, steps=30, accounting="rdp")
    assert adaptive.event() == fixed.event()
    assert adaptive.epsilon(30) == fixed.epsilon(30)
    assert adaptive.noise_multiplier == 1.0
    assert adaptive.max_batch_size == fixed.max_batch_size


@pytest.mark.slow
@pytest.mark.parametrize("clipping", ["vmap", "ghost"])
def test_every_example_and_the_released_sum_are_bounded_by_the_current_clip_norm(clipping):
    """After a few steps (C_t ≠ C_0): every example's contribution, as the step computes and
    scales it, is ≤ C_t(1 + 1e-6); removing one record (same batch, zero-out) moves the
    noise-free released sum by ≤ C_t(1 + 1e-6) and the centred count by exactly 1/2."""
    data = _data()
    private = _private(CONFIG, clipping=clipping)
    w = jnp.zeros(3, jnp.float32)
    state = private.init(w)
    for _ in range(3):
        w, state, _ = private.step(w, state, data)
    c_t = private.clip_norm(state)
    assert c_t != CONFIG.initial and math.isfinite(c_t)
    clip = state.opt_state[0].clip_norm
    rows = 16
    indices = jnp.arange(rows, dtype=jnp.int32)
    dropout = jax.random.key(9)

    def released(mask):
        s, stats = private._clipped_part(w, data, PaddedBatch(indices, mask), dropout, clip)
        return np.asarray(s, np.float64) * c_t, float(stats[4])

    loss = lambda w, ex: 0.5 * jnp.sum((ex["x"] @ w - ex["y"]) ** 2)  # noqa: E731
    w64 = np.asarray(w, np.float64)
    for i in range(rows):  # one example alone: clipped at C_t (not C_0), and ≤ C_t(1 + 1e-6)
        alone, _ = released(jnp.zeros(rows, bool).at[i].set(True))
        assert np.linalg.norm(alone) <= c_t * (1 + 1e-6)
        ex = {k: np.asarray(v[i], np.float64) for k, v in data.items()}
        g = np.asarray(jax.grad(loss)(jnp.asarray(w64), ex), np.float64)
        g32 = jax.grad(loss)(w, {k: v[i] for k, v in data.items()})  # what the step sees
        if np.all(np.isfinite(np.asarray(g32))):
            expected = g * min(1.0, c_t / np.linalg.norm(g))
            np.testing.assert_allclose(alone, expected, rtol=1e-3, atol=1e-6 * c_t)
    full, count = released(jnp.ones(rows, bool))
    for i in range(rows):  # add/remove record i
        without, count_i = released(jnp.ones(rows, bool).at[i].set(False))
        assert np.linalg.norm(full - without) <= c_t * (1 + 1e-6)
        assert abs(count - count_i) == 0.5


@pytest.mark.slow
def test_each_step_clips_at_the_clip_norm_in_its_state():
    """The step's clipped count is the number of finite per-example gradients of its batch
    (float64, at the step's parameters) above the C_t held in the state before the step —
    not C_0 — and C_t moves between steps. The batch is redrawn from the state's key as the
    step draws it (``key → (next, sample, dropout)``)."""
    x = 0.4 * jax.random.normal(jax.random.key(2), (48, 3), jnp.float32)
    data = {"x": x, "y": jnp.ones(48, jnp.float32)}  # norms ≈ 0.4·χ₃: around C_0 = 0.5
    private = _private(CONFIG._replace(learning_rate=1.0), batch_size=24, steps=5)
    loss = lambda w, ex: 0.5 * jnp.sum((ex["x"] @ w - ex["y"]) ** 2)  # noqa: E731
    per_example = jax.vmap(jax.grad(loss), in_axes=(None, 0))
    w = jnp.zeros(3, jnp.float32)
    state = private.init(w)
    seen, discriminating = [], 0
    for _ in range(5):
        c_t = private.clip_norm(state)
        seen.append(c_t)
        sample_key = jax.random.split(jax.random.wrap_key_data(state.key), 3)[1]
        batch = private.sampler.sample(sample_key)
        rows = np.asarray(batch.indices)[np.asarray(batch.mask)]
        part = jax.tree.map(lambda x: x[rows], data)
        # float32, as the step computes it: the loss ÷ C_t (a gradient within a factor C_t of
        # float32's overflow is non-finite there, and dropped)
        scaled = jax.vmap(jax.grad(lambda w, ex: loss(w, ex) / jnp.float32(c_t)), (None, 0))
        g32 = np.asarray(scaled(w, part))
        g = np.asarray(per_example(w.astype(jnp.float64), jax.tree.map(np.float64, part)))
        finite = np.all(np.isfinite(g32), axis=1)
        norms = np.linalg.norm(g[finite], axis=1)
        assert np.all(np.abs(norms - c_t) > 1e-4 * c_t)  # no borderline example
        w, state, metrics = private.step(w, state, data)
        assert int(metrics["batch_size"]) == len(rows)
        assert int(metrics["num_nonfinite"]) == int(np.sum(~finite))
        assert int(metrics["num_clipped"]) == int(np.sum(norms > c_t))
        discriminating += int(np.sum(norms > c_t) != np.sum(norms > CONFIG.initial))
    assert len(set(seen)) == 5
    assert discriminating >= 2  # clipping at C_0 instead would have been caught


@pytest.mark.slow
def test_resume_public_state_and_foreign_plans():
    """C_t is in the state and published; another γ, a fixed-C plan, or a traced foreign
    ledger is refused (or voided) at resume."""
    data = _data()
    private = _private(CONFIG)
    w = jnp.zeros(3, jnp.float32)
    state = private.init(w)
    w, state, _ = private.step(w, state, data)
    public = private.public_state(state)
    assert isinstance(public.opt_state[0], AdaptiveClipState)
    assert isinstance(public.opt_state[0].count_noise, PublicNoiseState)
    assert private.clip_norm(public) == private.clip_norm(state) != CONFIG.initial
    assert not any(
        leaf.dtype == jnp.uint32 for leaf in jax.tree.leaves(public.opt_state)
    )  # no key data
    other = _private(CONFIG._replace(target_quantile=0.6), key=1)
    with pytest.raises(ValueError, match="another plan"):
        other.step(w, state, data)
    continued = other.continue_from(state)
    assert _plan.current_plan(continued.plan).target_quantile == 0.6
    with pytest.raises(ValueError, match="adaptive clipping"):
        _private(0.5, key=2).continue_from(state)
    # a traced state of another adaptive plan: the step releases NaN, not a wrong-plan update
    third = _private(CONFIG._replace(learning_rate=0.3), key=3)
    out = jax.jit(lambda s: third.step(w, s, data)[0])(state)
    assert bool(jnp.all(jnp.isnan(out)))


# ------------------------------------------------------------------------------------------------
# the adaptive clip's count noise under a vmap over per-example counts.
#
# ``next_clip_norm`` is public (the pieces path). ``jax.vmap(next_clip_norm, in_axes=(None,
# None, 0))`` over per-example centred counts draws ONE count noise (the state is not batched)
# and adds it to every row: the differences of the released fractions are the rows' exact count
# differences. The noise transforms refuse this (vmap guard); the count release must too.
# ------------------------------------------------------------------------------------------------

VMAP_CONFIG = AdaptiveClip(
    target_quantile=0.5, learning_rate=0.2, count_noise_multiplier=10.0, initial=1.0
)


def _release(state, count):
    return next_clip_norm(VMAP_CONFIG, state, count, expected_batch_size=8.0)[1]


def test_a_vmap_over_per_example_counts_with_one_state_is_refused():
    """Catches a vmap over per-example counts sharing one adaptive-clip state (one noise draw)."""
    state = init_adaptive_clip(VMAP_CONFIG, key=jax.random.key(0))
    counts = jnp.array([0.5, -0.5, 0.5], jnp.float32)
    with pytest.raises(ValueError, match="updates"):
        jax.vmap(_release, in_axes=(None, 0))(state, counts)


@pytest.mark.slow
def test_one_release_and_a_vmap_over_runs_still_work():
    """Catches the adaptive-clip vmap guard refusing legitimate single and per-run releases."""
    state = init_adaptive_clip(VMAP_CONFIG, key=jax.random.key(0))
    one = _release(state, jnp.float32(0.5))
    assert bool(jnp.isfinite(one))
    keys = jax.random.split(jax.random.key(1), 3)
    states = jax.vmap(lambda k: init_adaptive_clip(VMAP_CONFIG, key=k))(keys)
    runs = jax.vmap(_release)(states, jnp.array([0.5, 0.5, 0.5], jnp.float32))
    assert bool(jnp.all(jnp.isfinite(runs))) and len(set(runs.tolist())) == 3
