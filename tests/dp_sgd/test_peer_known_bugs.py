"""Privacy bugs found in peer libraries, as dpjax regression tests.

Each test pins the invariant that the peer library broke and, inside the test, re-runs its
own check on a variant of dpjax with the peer's mistake patched in (``monkeypatch``), which the
check must reject: so each test is shown to be able to fail.

* google-deepmind/jax_privacy #234 / #288: gradient-accumulation steps counted as micro-batches
  in one place and as optimizer updates in another.
* google-deepmind/jax_privacy #383: noise calibrated for the clipped SUM added to the MEAN.
* meta-pytorch/opacus #819 (and #571): normalising by a data-dependent batch size.
* meta-pytorch/opacus #813: the sampling rate read from the wrong length (ε off 45 000×).
* meta-pytorch/opacus #792: (fast/ghost) clipping ignoring masked tokens.

References are independent of the code under test: dp-accounting for ε, closed forms for the
noise scale, ``jax.vmap(jax.grad)`` for per-example norms.
"""

import dataclasses
import math
import warnings

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dpjax
from dpjax import dp_sgd
from dpjax._warnings import PrivacyLeakWarning
from dpjax.dp_sgd import ghost, optimizers, private, samplers
from dpjax.dp_sgd.samplers import realised_sampling_rate
from dpjax.dp_sgd.training import ledger, loop

# ----------------------------------------------------------------------------- shared checks


def zero_gradient_loss(w, ex):
    """A loss whose gradient is exactly 0: every parameter change is the noise alone."""
    return 0.0 * jnp.sum(w * ex)


def dp_accounting_epsilon(sigma: float, q: float, count: int, delta: float) -> float:
    """ε of ``count`` Poisson-subsampled Gaussian releases, by dp-accounting's PLD."""
    accountant = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
    accountant.compose(event, count)
    return accountant.get_epsilon(delta)


def assert_std(samples: np.ndarray, expected: float, z: float = 6.0) -> None:
    """The root mean square of zero-mean Gaussian ``samples`` is ``expected`` within z standard
    errors (the relative standard error of an RMS of n Gaussian values is 1/sqrt(2n))."""
    samples = np.asarray(samples, np.float64).ravel()
    rms = math.sqrt(float(np.mean(samples**2)))
    tolerance = z / math.sqrt(2 * samples.size)
    assert abs(rms / expected - 1.0) <= tolerance, (rms, expected, tolerance)


# ------------------------------------------------------------------------- jax_privacy #234/#288


def observed_noise_draws(params_trace: list[np.ndarray], one_draw_std: float) -> int:
    """The noise draws a run made, measured from its parameters alone: the number of updates
    (steps whose parameters changed) times the draws per update, read from the variance of each
    update (k independent draws of std s sum to std s·sqrt(k); k is rounded)."""
    draws = 0
    for before, after in zip(params_trace, params_trace[1:], strict=False):
        delta = np.asarray(after, np.float64) - np.asarray(before, np.float64)
        if np.any(delta != 0.0):
            rms = math.sqrt(float(np.mean(delta**2)))
            draws += round((rms / one_draw_std) ** 2)
    return draws


def check_steps_charged_equal_noise_releases(build, steps, micro_batches):
    """The ε a make_private run with micro-batches reports equals dp-accounting's ε for the noise
    releases its parameters show (one per logical batch), not for one per micro-batch."""
    p = build()
    assert p.physical_batch_size is not None
    w = jnp.zeros(2000, jnp.float32)
    state = p.init(w)
    trace = [np.asarray(w)]
    for _ in range(steps):
        w, state, _ = p.step(w, state, jnp.ones((p.sampler.dataset_size, 2000), jnp.float32))
        trace.append(np.asarray(w))
    lr, one_draw = 1.0, p.noise_multiplier * p.l2_clip_norm / p.expected_batch_size
    releases = observed_noise_draws(trace, lr * one_draw)
    assert releases == steps == int(state.step)
    assert dp_sgd.noise_releases(state.opt_state) == releases
    accounted = p.delta * (1.0 - private.SLACK_FRACTION)
    expected = dp_accounting_epsilon(p.noise_multiplier, p.sampling_rate, releases, accounted)
    charged_per_micro_batch = dp_accounting_epsilon(
        p.noise_multiplier, p.sampling_rate, micro_batches * releases, accounted
    )
    assert charged_per_micro_batch > 1.3 * expected  # the two units are far apart here
    assert p.epsilon(state) == pytest.approx(expected, rel=0.01)


def test_make_private_charges_one_step_per_noise_release_not_per_micro_batch(monkeypatch):
    """jax_privacy #234 / #288: with gradient accumulation the accountant counted optimizer
    updates while the budget check (and the docs) counted micro-batches, so the same effective
    batch was calibrated to σ 7.69 or 3.92 and a run could be charged for the wrong number of
    releases. dpjax: the steps charged are the noise releases its parameters show (one per
    logical batch, whatever ``physical_batch_size``), σ calibrated at a target ε does not depend
    on ``physical_batch_size``, and ``fit`` runs the planned number of updates. The negative
    check charges micro-batches (the peer's unit mix-up) and must be rejected."""
    steps, n, b = 4, 200, 20

    def build(key=0, physical=8, **kw):
        kw = {"noise_multiplier": 1.0} | kw
        return dpjax.make_private(
            zero_gradient_loss, optimizer=optax.sgd(1.0), l2_clip_norm=1.0, dataset_size=n,
            batch_size=b, steps=steps, delta=1e-5, key=jax.random.key(key),
            physical_batch_size=physical, **kw,
        )  # fmt: skip

    k = -(-build().max_batch_size // 8)  # micro-batches per logical batch
    assert k >= 4
    with monkeypatch.context() as m:  # the peer's mistake: charge every micro-batch
        m.setattr(ledger.Plan, "accounted_steps", lambda self, t: k * t)
        with pytest.raises(AssertionError):
            check_steps_charged_equal_noise_releases(lambda: build(key=1), steps, k)
    check_steps_charged_equal_noise_releases(build, steps, k)

    sigmas = {
        build(key=2, physical=p, noise_multiplier=None, target_epsilon=2.0).noise_multiplier
        for p in (None, 4, 8)
    }
    assert len(sigmas) == 1
    p = build(key=3)
    w, state, _ = p.fit(jnp.zeros(3), jnp.ones((n, 3)), progress=False)
    assert int(state.step) == steps == dp_sgd.noise_releases(state.opt_state)


def check_event_counts_noise_releases(tx, sampler, every_k, calls, d=4000):
    """Run ``calls`` micro-batch updates of zero clipped sums; the event's count must be the
    number of noise releases observed (non-zero updates), and each release ONE draw."""
    state = tx.init(jnp.zeros(d, jnp.float32))
    update_fn = jax.jit(tx.update)  # one compiled program for every call (eager dispatch is slow)
    observed = 0
    for _ in range(calls):
        update, state = update_fn(jnp.zeros(d, jnp.float32), state)
        if np.any(np.asarray(update) != 0.0):
            observed += 1
            assert_std(np.asarray(update), tx.noise_multiplier * tx.l2_clip_norm / tx.normalizer)
    assert observed == calls // every_k
    assert dp_sgd.event_for(tx, sampler=sampler, state=state).count == observed


def test_accumulate_clipped_sums_event_counts_logical_batches(monkeypatch):
    """jax_privacy #234 / #288 at the optax level: with ``accumulate_clipped_sums(every_k=4)``
    the event read from the state counts the noise releases (one per logical batch: 3 for 12
    micro-batch calls), each a single draw of σ·C/normaliser. The negative check counts the
    micro-batches (the peer's unit) and must be rejected."""
    sampler = dpjax.PoissonSampler(dataset_size=400, sampling_rate=0.1)
    inner = dpjax.dp_sgd_optimizer(
        optimizer=optax.sgd(1.0), noise_multiplier=1.2, l2_clip_norm=0.5,
        normalizer=sampler.expected_batch_size, key=jax.random.key(0),
    )  # fmt: skip
    tx = dpjax.accumulate_clipped_sums(inner, every_k=4)
    real = optimizers.noise_releases
    with monkeypatch.context() as m:
        m.setattr(optimizers, "noise_releases", lambda s: 4 * real(s))
        with pytest.raises(AssertionError):
            check_event_counts_noise_releases(tx, sampler, every_k=4, calls=12)
    check_event_counts_noise_releases(tx, sampler, every_k=4, calls=12)


# ----------------------------------------------------------------------------- jax_privacy #383


def released_noise(build, d=20_000):
    """One make_private step on a zero-gradient loss with sgd(1): the parameter change is minus
    the released noise; returns (noise, public normaliser, σ·C)."""
    p = build()
    w = jnp.zeros(d, jnp.float32)
    w1, _, _ = p.step(w, p.init(w), jnp.ones((p.sampler.dataset_size, d), jnp.float32))
    return -np.asarray(w1, np.float64), p.expected_batch_size, p.noise_multiplier * p.l2_clip_norm


def check_mean_noise_scale(noise, normaliser, sum_std):
    """The released MEAN's noise has std σ·C/B, and neither σ·C (the sum's noise on the mean)
    nor σ·C/B² (the mean's noise divided again) passes the same test."""
    assert_std(noise, sum_std / normaliser)
    for wrong in (sum_std, sum_std / normaliser**2):
        with pytest.raises(AssertionError):
            assert_std(noise, wrong)


def test_make_private_adds_sum_noise_before_dividing_by_the_public_normaliser(monkeypatch):
    """jax_privacy #383: ``jax_api_example`` calibrated the noise to the clipped SUM's
    sensitivity (σ·C) and added it to the MEAN (sum / B), over-noising by B (and the opposite
    slip, noise for the mean divided again, under-noises by B). dpjax: the released update's
    noise std is σ·C/(q·n), measured on 20 000 coordinates (tolerance 6 standard errors of the
    RMS, 3 %), and σ·C and σ·C/B² are rejected by the same test. The negative check patches in
    the peer's mistake (the sum's noise added after the division) and must be rejected."""

    def build(key=0):
        return dpjax.make_private(
            zero_gradient_loss, optimizer=optax.sgd(1.0), l2_clip_norm=0.7, dataset_size=160,
            batch_size=16, steps=2, noise_multiplier=1.3, delta=1e-5, key=jax.random.key(key),
        )  # fmt: skip

    real = loop._gaussian_noise_at_runtime_stddev  # the plain step's noise (σ·C an argument)

    def over_noised(s, key):  # noise σ·C on the mean: σ·C·B before the ÷ B
        tx = real(s * 16.0, key=key)

        def update(u, state, params=None, *, noise_stddev, **extra):
            return tx.update(u, state, params, noise_stddev=noise_stddev * 16.0)

        return optax.GradientTransformationExtraArgs(tx.init, update)

    with monkeypatch.context() as m:
        m.setattr(loop, "_gaussian_noise_at_runtime_stddev", over_noised)
        with pytest.raises(AssertionError):
            check_mean_noise_scale(*released_noise(lambda: build(1)))
    noise, normaliser, sum_std = released_noise(build)
    assert normaliser == pytest.approx(16.0, rel=1e-12)
    check_mean_noise_scale(noise, normaliser, sum_std)


def test_dp_sgd_optimizer_noise_is_sum_noise_over_normaliser():
    """jax_privacy #383 at the optax level: ``dp_sgd_optimizer`` adds N(0, (σC)²) to the SUM and
    then divides by the public normaliser, so the update's noise std is σC/B; the peer's order
    (divide, then add the sum's noise), built from the same dpjax parts, fails the check."""
    sigma, clip, b, d = 0.9, 2.0, 25.0, 20_000
    zeros = jnp.zeros(d, jnp.float32)
    tx = dpjax.dp_sgd_optimizer(
        optimizer=optax.sgd(1.0), noise_multiplier=sigma, l2_clip_norm=clip, normalizer=b,
        key=jax.random.key(3),
    )  # fmt: skip
    update, _ = tx.update(zeros, tx.init(zeros), zeros)
    check_mean_noise_scale(-np.asarray(update), b, sigma * clip)
    peer = optax.chain(
        dpjax.normalize_by(b), dpjax.add_gaussian_noise(sigma * clip, key=jax.random.key(3))
    )
    update, _ = peer.update(zeros, peer.init(zeros), zeros)
    with pytest.raises(AssertionError):
        check_mean_noise_scale(np.asarray(update), b, sigma * clip)


# ----------------------------------------------------------------------------- opacus #819


def updates_and_sizes(p, steps=12, d=3):
    """(realised batch size, parameter change) of ``steps`` σ = 0 steps of sgd(1) on a loss
    whose every per-example gradient is the same vector g (‖g‖ = 0.5 < C: never clipped)."""
    g = np.full(d, 0.5 / math.sqrt(d))
    w = jnp.zeros(d, jnp.float64)
    data = jnp.tile(jnp.asarray(g), (p.sampler.dataset_size, 1))
    state = p.init(w)
    out = []
    for _ in range(steps):
        w1, state, metrics = p.step(w, state, data)
        out.append((int(metrics["batch_size"]), np.asarray(w1 - w, np.float64)))
        w = w1
    return out, g


def check_public_normaliser(p, steps=12):
    """Every update is −(realised size)·g / B with ONE B for all steps, B = q·n (public)."""
    pairs, g = updates_and_sizes(p, steps)
    sizes = {size for size, _ in pairs}
    assert len(sizes - {0}) >= 2, sizes  # realised sizes differ between steps
    for size, change in pairs:
        np.testing.assert_allclose(-change * p.sampling_rate * p.sampler.dataset_size, size * g,
                                   rtol=1e-12, atol=1e-15)  # fmt: skip


def test_make_private_normalises_by_a_public_constant_not_the_realised_batch(monkeypatch):
    """Opacus #819 (and #571): normalising by a data-dependent batch size (the realised size, or
    a floor of it) is not the mechanism the subsampled-Gaussian accountant analyses, and leaks
    more than the reported ε (ε ≈ 2.5 audited against 1.2 claimed). dpjax: with σ = 0 (exact
    updates), steps whose Poisson batches have different realised sizes are divided by the
    same constant q·n — the update is proportional to the realised size. The negative check
    divides by the realised size (patched into the step) and must be rejected."""

    def build(key=0):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PrivacyLeakWarning)  # σ = 0: exact, NOT private
            return dpjax.make_private(
                lambda w, ex: jnp.dot(w, ex), optimizer=optax.sgd(1.0), l2_clip_norm=1.0,
                dataset_size=60, batch_size=6, steps=12, noise_multiplier=0.0, delta=1e-5,
                key=jax.random.key(key),
            )  # fmt: skip

    real = private.PrivateTraining._clipped_part

    def realised_size_normaliser(self, params, data, batch, key, clip):
        total, stats = real(self, params, data, batch, key, clip)
        size = jnp.maximum(jnp.sum(batch.mask), 1).astype(jnp.float64)
        scale = self.expected_batch_size / size  # ÷ q·n afterwards: ÷ the realised size
        return jax.tree.map(lambda x: x * scale.astype(x.dtype), total), stats

    with monkeypatch.context() as m:
        m.setattr(private.PrivateTraining, "_clipped_part", realised_size_normaliser)
        with pytest.raises(AssertionError):
            check_public_normaliser(build(1))
    check_public_normaliser(build())


def test_normaliser_is_the_expected_batch_not_its_floor():
    """Opacus #819: a floor of the expected batch size (7 for q·n = 7.5) is not the public q·n
    the event's rate implies. dpjax's sampler states q·n exactly (7.5 here) as its normaliser
    and ``event_for`` warns when the optimizer divides by anything else, e.g. the floor."""
    sampler = dpjax.PoissonSampler(dataset_size=60, sampling_rate=0.125)
    assert sampler.expected_batch_size == 7.5
    grad_fn = dpjax.clipped_grad(lambda w, x: jnp.dot(w, x), l2_clip_norm=1.0)

    def tx(normalizer):
        return dpjax.dp_sgd_optimizer(
            optimizer=optax.sgd(1.0), clipped_grad=grad_fn, noise_multiplier=1.0,
            normalizer=normalizer, key=jax.random.key(0),
        )  # fmt: skip

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dp_sgd.event_for(tx(sampler.expected_batch_size), sampler=sampler, steps=10)
    with pytest.warns(UserWarning, match="normalizer"):
        dp_sgd.event_for(tx(math.floor(sampler.expected_batch_size)), sampler=sampler, steps=10)


# ----------------------------------------------------------------------------- opacus #813


def empirical_rate(sampler, draws=400):
    """(mean inclusion rate over ``draws`` batches, every row drawn at least once, max index)."""
    keys = jax.random.split(jax.random.key(11), draws)
    batches = jax.jit(jax.vmap(sampler.sample))(keys)
    mask = np.asarray(batches.mask)
    idx = np.asarray(batches.indices)[mask]
    n = sampler.dataset_size
    return mask.sum() / (draws * n), len(np.unique(idx)) == n, int(idx.max())


def check_accounted_rate_is_sampled_rate(p, draws=400):
    """The q that ε is computed at (the plan's, the event's) is the rate at which the sampler
    includes each of the n rows of ``data``: equal to the sampler's realised q exactly, and to
    the empirical inclusion rate within 6 binomial standard errors."""
    q = p.sampler.sampling_rate
    assert p.sampling_rate == q == p.event().sampling_rate
    assert q == realised_sampling_rate(p.expected_batch_size / p.sampler.dataset_size)
    rate, covers_all, top = empirical_rate(p.sampler, draws)
    n = p.sampler.dataset_size
    se = math.sqrt(q * (1 - q) / (draws * n))
    assert abs(rate - p.event().sampling_rate) <= 6 * se, (rate, p.event().sampling_rate, se)
    assert covers_all and top == n - 1


def test_accounted_sampling_rate_is_the_rate_of_the_data_actually_sampled(monkeypatch):
    """Opacus #813: with a ``WeightedRandomSampler`` the rate was read from ``len(sampler)`` (128)
    instead of the data set (100 000): q off 45 000×, ε silently wrong. dpjax: the accounted q
    (plan, event) is the sampler's q = b/n over the n rows ``data`` has, checked against the
    empirical inclusion rate of 400 batches (and every row reachable); ``step``/``fit`` refuse
    data whose leaves disagree with ``dataset_size`` (a wrong n, or one leaf of another
    length). The negative check reads the rate from another length (the padded batch) and must
    be rejected."""

    def build(key=0, n=300):
        return dpjax.make_private(
            lambda w, ex: jnp.dot(w, ex["x"]) * ex["y"], optimizer=optax.sgd(0.1),
            l2_clip_norm=1.0, dataset_size=n, batch_size=15, steps=3, noise_multiplier=1.0,
            delta=1e-5, key=jax.random.key(key),
        )  # fmt: skip

    real = samplers.PoissonSampler.event

    def rate_from_wrong_length(self, *, noise_multiplier, steps, **kw):
        event = real(self, noise_multiplier=noise_multiplier, steps=steps, **kw)
        wrong = self.expected_batch_size / self.max_batch_size  # b / len(padded batch)
        return dataclasses.replace(event, sampling_rate=wrong)

    with monkeypatch.context() as m:
        m.setattr(samplers.PoissonSampler, "event", rate_from_wrong_length)
        with pytest.raises(AssertionError):
            check_accounted_rate_is_sampled_rate(build(1))
    p = build()
    check_accounted_rate_is_sampled_rate(p)

    w, x = jnp.zeros(2), jnp.ones((300, 2))
    for data in (
        {"x": x, "y": jnp.ones(299)},  # one leaf of another length
        {"x": jnp.ones((3000, 2)), "y": jnp.ones(3000)},  # dataset_size 10× too small
        {"x": x[:30], "y": jnp.ones(30)},  # a subset of the data
    ):
        with pytest.raises(ValueError, match="data"):
            build(2).fit(w, data, progress=False)


# ----------------------------------------------------------------------------- opacus #792

V, D, K, T = 13, 4, 3, 6


def token_params(key):
    ke, kw = jax.random.split(key)
    return {
        "E": jax.random.normal(ke, (V, D), jnp.float64),
        "W": jax.random.normal(kw, (D, K), jnp.float64),
    }


def masked_token_loss(params, tokens, token_mask, labels):
    """Mean cross-entropy over the UNMASKED tokens of one sequence (a per-token model: an
    embedding lookup, then a dense layer applied at each of the T positions)."""
    logits = jnp.tanh(params["E"][tokens]) @ params["W"]  # (T, K)
    picked = jnp.take_along_axis(logits, labels[:, None], axis=1)[:, 0]
    per_token = jax.nn.logsumexp(logits, axis=1) - picked
    weights = token_mask.astype(per_token.dtype)
    return jnp.sum(weights * per_token) / jnp.maximum(jnp.sum(weights), 1.0)


def all_token_mean_loss(params, tokens, token_mask, labels):
    """Opacus #792's reduction: the mean over ALL T positions, masked ones included."""
    logits = jnp.tanh(params["E"][tokens]) @ params["W"]
    picked = jnp.take_along_axis(logits, labels[:, None], axis=1)[:, 0]
    return jnp.mean(jax.nn.logsumexp(logits, axis=1) - picked)


def token_batch(key, b=8):
    kt, kl, km = jax.random.split(key, 3)
    tokens = jax.random.randint(kt, (b, T), 0, V)
    labels = jax.random.randint(kl, (b, T), 0, K)
    lengths = jax.random.randint(km, (b,), 2, T)  # 2..T-1 real tokens, the rest padding
    token_mask = jnp.arange(T)[None, :] < lengths[:, None]
    return tokens, token_mask, labels


def vmap_norms(loss, params, batch):
    grads = jax.vmap(jax.grad(loss), in_axes=(None, 0, 0, 0))(params, *batch)
    flat = [np.asarray(g, np.float64).reshape(g.shape[0], -1) for g in jax.tree.leaves(grads)]
    return np.linalg.norm(np.concatenate(flat, axis=1), axis=1)


def check_masked_tokens_change_nothing(loss, mask=None, clip=0.5):
    """Under ghost clipping: re-drawing the ids and labels of every masked token (and, with an
    example mask, every token of the masked examples) leaves the clipped sum and the norms
    bit-for-bit unchanged, and the norms equal vmap per-example gradient norms."""
    params = token_params(jax.random.key(0))
    tokens, token_mask, labels = token_batch(jax.random.key(1))
    assert ghost.supports(loss, params, tokens, token_mask, labels)
    grad_fn = dpjax.clipped_grad(loss, l2_clip_norm=clip, backend="ghost")
    total, info = grad_fn(params, tokens, token_mask, labels, mask=mask)
    redraw = ~token_mask if mask is None else ~token_mask | ~mask[:, None]
    other_tokens = jnp.where(redraw, (tokens + 5) % V, tokens)
    other_labels = jnp.where(redraw, (labels + 1) % K, labels)
    total2, info2 = grad_fn(params, other_tokens, token_mask, other_labels, mask=mask)
    for a, b in zip(jax.tree.leaves(total), jax.tree.leaves(total2), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(info.per_example_norms), info2.per_example_norms)
    reference = vmap_norms(loss, params, (tokens, token_mask, labels))
    if mask is not None:
        reference = np.where(np.asarray(mask), reference, 0.0)
    np.testing.assert_allclose(np.asarray(info.per_example_norms), reference, rtol=1e-9)
    assert np.sum(reference > clip) >= 2 and np.sum((reference > 0) & (reference < clip)) >= 1


def test_ghost_clipping_ignores_masked_tokens(monkeypatch):
    """Opacus #792: fast (ghost) gradient clipping reduced each example's loss by a mean over
    ALL positions, ignoring ``ignore_index``, so masked tokens entered every example's gradient
    and norm. dpjax's ghost path differentiates the user's own per-example loss: re-drawing a
    masked token's id (and label) changes neither the clipped sum nor any norm, and the ghost
    norms equal ``vmap(grad)`` norms on the masked sequence model (embedding + per-token
    dense). Masked EXAMPLES (``mask=False``, the sampler's padding) contribute nothing either.
    Negative checks: the peer's all-position mean, and a ghost path that drops the example mask
    (patched), must each be rejected."""
    check_masked_tokens_change_nothing(masked_token_loss)
    with pytest.raises(AssertionError):
        check_masked_tokens_change_nothing(all_token_mean_loss)

    example_mask = jnp.array([True, True, False, True, True, False, True, True])
    check_masked_tokens_change_nothing(masked_token_loss, mask=example_mask)
    real = ghost._ghost_jitted

    def ignoring_example_mask(loss_fn, nan_safe, params, batch, clip, keep, *rest):
        return real(loss_fn, nan_safe, params, batch, clip, jnp.ones_like(keep), *rest)

    with monkeypatch.context() as m:
        m.setattr(ghost, "_ghost_jitted", ignoring_example_mask)
        with pytest.raises(AssertionError):
            check_masked_tokens_change_nothing(masked_token_loss, mask=example_mask)


def test_make_private_with_ghost_clipping_ignores_masked_tokens():
    """Opacus #792 end to end: two data sets that differ only in masked tokens give identical
    ``make_private(clipping="ghost")`` runs (same key), and differ once an unmasked token
    differs (the check can fail)."""
    n = 24
    tokens, token_mask, labels = token_batch(jax.random.key(2), b=n)
    params = token_params(jax.random.key(3))

    def run(toks):
        p = dpjax.make_private(
            lambda prm, ex: masked_token_loss(prm, ex["t"], ex["m"], ex["y"]),
            optimizer=optax.sgd(0.5), l2_clip_norm=0.5, dataset_size=n, batch_size=8, steps=2,
            noise_multiplier=1.0, delta=1e-5, key=jax.random.key(4), clipping="ghost",
        )  # fmt: skip
        data = {"t": toks, "m": token_mask, "y": labels}
        w, _, _ = p.fit(params, data, progress=False)
        return np.concatenate([np.asarray(x).ravel() for x in jax.tree.leaves(w)])

    base = run(tokens)
    np.testing.assert_array_equal(base, run(jnp.where(token_mask, tokens, (tokens + 7) % V)))
    assert not np.array_equal(base, run(jnp.where(token_mask, (tokens + 7) % V, tokens)))
