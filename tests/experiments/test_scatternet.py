"""ScatterNet + linear (Tramèr & Boneh 2021): the feature pipeline, its cache, the private
normalisation's noise scale and the quick mode, on synthetic fixtures (no real data)."""

from __future__ import annotations

import json
import math
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("kymatio")

from experiments import registry, scatternet  # noqa: E402

CHANNELS = 81


def _images(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, 28, 28), dtype=np.uint8)


def test_features_have_the_papers_shape_and_hit_the_cache(tmp_path, monkeypatch):
    """J = 2, L = 8 on 28×28: 81 channels of 7×7; the second call reads the .npy cache."""
    images = _images(3)
    first = scattering = scatternet.scattering_features(images, cache_dir=tmp_path)
    assert scattering.shape == (3, 81, 7, 7) and scattering.dtype == np.float32
    assert len(list(tmp_path.glob("scatter-*.npy"))) == 1

    def no_compute(_images):
        raise AssertionError("computed again: the cache was not used")

    monkeypatch.setattr(scatternet, "compute_scattering", no_compute)
    np.testing.assert_array_equal(scatternet.scattering_features(images, cache_dir=tmp_path), first)
    with pytest.raises(AssertionError, match="cache was not used"):  # other images: other key
        scatternet.scattering_features(_images(3, seed=1), cache_dir=tmp_path)


def test_features_refuse_images_of_another_shape_or_dtype(tmp_path):
    with pytest.raises(ValueError, match="images must be uint8"):
        scatternet.scattering_features(np.zeros((2, 28, 28), np.float32), cache_dir=tmp_path)
    with pytest.raises(ValueError, match="images must be uint8"):
        scatternet.scattering_features(np.zeros((2, 32, 32), np.uint8), cache_dir=tmp_path)


def test_order_zero_channel_is_the_low_pass_mean():
    """A constant image c: channel 0 (the Gaussian low-pass) is c everywhere, the wavelet
    channels are 0 (wavelets have zero mean) — a closed form, independent of kymatio's code."""
    image = np.full((1, 28, 28), 51, np.uint8)  # 0.2 after /255
    features = scatternet.compute_scattering(image)
    np.testing.assert_allclose(features[0, 0], 0.2, atol=1e-5)
    assert np.abs(features[0, 1:]).max() < 1e-5


def test_group_norm_standardises_each_example_and_group():
    x = np.random.default_rng(0).normal(3.0, 2.0, size=(4, 81, 7, 7)).astype(np.float32)
    y = scatternet.group_normalize(x, groups=27).reshape(4, 27, -1)
    np.testing.assert_allclose(y.mean(-1), 0.0, atol=1e-5)
    np.testing.assert_allclose(y.var(-1), 1.0, atol=1e-3)  # var/(var + 1e-5) with var ≈ 4
    with pytest.raises(ValueError, match="groups must divide 81"):
        scatternet.group_normalize(x, groups=10)


def test_public_thresholds_are_those_fixed_in_the_code():
    """The fixed constants are what the data-independent recipe gives (no private data)."""
    mean_t, square_t = scatternet.public_thresholds()
    assert scatternet.STANDARDIZE_THRESHOLDS == pytest.approx((mean_t, square_t), abs=1e-3)


def test_private_standardize_has_the_gaussian_noise_scale_of_its_sensitivity():
    """Released mean = (Σ clipped m_i + N(0, (σ τ)²))/n, the noise drawn by
    dpjax.mechanisms.gaussian from a JAX key: over R keys the sample sd of one channel is
    σ τ / n within a chi-square band; half or double that scale is rejected."""
    features = np.random.default_rng(1).uniform(0, 5, size=(8, 81, 7, 7))  # norms ≫ τ: clipped
    sigma, tau, n, draws = 2.0, (0.5, 0.25), 8, 8
    means = np.array([
        scatternet.private_standardize(features, key=key, noise_multiplier=sigma,
                                       thresholds=tau, dataset_size=n)[0]
        for key in jax.random.split(jax.random.key(2), draws)
    ])  # fmt: skip
    # the 81 channels' noises are i.i.d.: pool their sample variances (81·(R − 1) dof)
    dof = CHANNELS * (draws - 1)
    sd = math.sqrt(((means - means.mean(0)) ** 2).sum() / dof)
    expected = sigma * tau[0] / n
    band = 4 * math.sqrt(1 / (2 * dof))  # 4 standard errors of a sample sd, relative
    assert abs(sd / expected - 1) < band
    assert abs(sd / (2 * expected) - 1) > band
    assert abs(sd / (0.5 * expected) - 1) > band
    # clipping: the noiseless centre is the sum of rows of norm τ, so ‖mean‖ ≤ τ up to noise
    noise_norm = math.sqrt(81) * expected / math.sqrt(draws)  # of the averaged noise
    assert np.linalg.norm(means.mean(0)) <= tau[0] + 5 * noise_norm


def test_private_standardize_noise_comes_from_the_jax_key_and_is_accounted_at_its_sigma():
    """The standardisation's randomness is the JAX key's alone (same key, same release; a NumPy
    generator is refused), and the event it returns carries the σ the mechanism calibrated,
    checked against the closed-form analytic Gaussian (Balle & Wang 2018) at σ = 8."""
    from dpjax.events import GaussianEvent
    from dpjax.mechanisms import gaussian_sigma

    features = np.random.default_rng(1).uniform(0, 1, size=(6, 81, 7, 7))
    args = dict(noise_multiplier=8.0, thresholds=(0.536, 0.252), dataset_size=6)
    first = scatternet.private_standardize(features, key=jax.random.key(5), **args)
    again = scatternet.private_standardize(features, key=jax.random.key(5), **args)
    other = scatternet.private_standardize(features, key=jax.random.key(6), **args)
    np.testing.assert_array_equal(first[0], again[0])
    assert not np.allclose(first[0], other[0])
    (event,) = first[2]
    assert event == GaussianEvent(noise_multiplier=8.0, count=2, relation="add_or_remove_one")
    epsilon, delta = scatternet.release_budget_share(8.0)
    assert gaussian_sigma(sensitivity=0.252, epsilon=epsilon, delta=delta) == pytest.approx(
        8.0 * 0.252, rel=1e-9
    )
    with pytest.raises(ValueError, match="key"):
        scatternet.private_standardize(features, key=np.random.default_rng(0), **args)


def test_reported_epsilon_composes_the_normalisation_with_dp_sgd():
    """ε of the run = PLD composition of the two σ = 8 add/remove releases with DP-SGD, as
    dp-accounting computes it directly; larger than DP-SGD's alone."""
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    from dpjax.events import GaussianEvent, PoissonSampledGaussianEvent

    q, sigma, steps, delta = 0.05, 3.04, 20, 1e-5
    sgd = PoissonSampledGaussianEvent(
        noise_multiplier=sigma, sampling_rate=q, count=steps, relation="add_or_remove_one"
    )
    norm = [GaussianEvent(noise_multiplier=8.0, count=2, relation="add_or_remove_one")]
    total = scatternet.total_epsilon(norm, sgd, delta, dp_sgd_epsilon=float("nan"))
    reference = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    reference.compose(dp_accounting.GaussianDpEvent(8.0), 2)
    reference.compose(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps
    )
    alone = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    alone.compose(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps
    )
    assert total == pytest.approx(reference.get_epsilon(delta), rel=0.02)
    assert total > alone.get_epsilon(delta) * 1.02
    assert scatternet.total_epsilon([], sgd, delta, dp_sgd_epsilon=0.7) == 0.7


def _synthetic(n_train: int, n_test: int) -> dict:
    """Scattering-shaped features whose channel 0 encodes the label (learnable, linear)."""
    rng = np.random.default_rng(0)

    def part(n):
        y = rng.integers(0, 10, size=n).astype(np.uint8)
        f = rng.uniform(0, 0.1, size=(n, 81, 7, 7)).astype(np.float32)
        f[np.arange(n), 1 + y] += 0.5
        return f, y

    ftr, ytr = part(n_train)
    fte, yte = part(n_test)
    return dict(ftr=ftr, ytr=ytr, fte=fte, yte=yte)


def test_normalisation_spends_budget_only_for_the_private_standardisation():
    """MNIST's standardisation releases two add/remove-one Gaussian sums (σ = 8) that the
    accountant must compose; Fashion-MNIST's GroupNorm is per example and spends nothing."""
    from dpjax.events import GaussianEvent

    data = _synthetic(40, 10)
    flat, events = scatternet.prepare("mnist", data, key=jax.random.key(0))
    assert flat["xtr"].shape == (40, 3969) and flat["xte"].shape == (10, 3969)
    assert events == [GaussianEvent(noise_multiplier=8.0, count=2, relation="add_or_remove_one")]
    flat, events = scatternet.prepare("fashion-mnist", data, key=jax.random.key(0))
    assert events == [] and flat["xtr"].dtype == np.float32


@pytest.mark.slow
def test_quick_mode_runs_on_a_synthetic_fixture(tmp_path, monkeypatch):
    """The quick scale end to end (private standardisation + DP-SGD + report); its ε composes
    the normalisation's two Gaussian releases with DP-SGD (so it is larger). Slow: ~10 s of
    CPU in a fresh process, mostly XLA compilation and three PLD evaluations (20 steps
    instead of 100 cost as much) (the cheap default test above guards the accounting claim)."""
    monkeypatch.setattr(scatternet, "load", lambda *_: _synthetic(1200, 300))
    start = time.process_time()
    summary = scatternet.run(tmp_path)
    assert time.process_time() - start < 30.0
    (mnist,) = summary["runs"]
    assert "NOT the published protocol" in summary["report_md"]
    assert mnist["steps"] == 100 and mnist["batch_size"] == round(4096 * 1200 / 60000)
    assert mnist["epsilon"] > mnist["epsilon_dp_sgd"] > 0
    assert mnist["test_accuracy"] > 0.5  # chance is 0.1
    saved = json.loads((tmp_path / "scatternet.json").read_text())
    assert saved["size"] == "quick" and saved["runs"][0]["dataset"] == "mnist"


def test_missing_data_gives_a_skipped_section_with_the_hint(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DPJAX_DATA", str(tmp_path / "empty"))
    summary = scatternet.run(tmp_path / "out")
    assert summary["verdict"].startswith("SKIPPED")
    assert "make data" in summary["report_md"]
    assert "SKIPPED" in capsys.readouterr().err


def test_the_full_protocol_is_the_papers():
    """40 epochs of ⌊60 000/b⌋ steps at the README's batch, lr, σ; C = 0.1, momentum 0.9."""
    assert scatternet.plan("mnist", 60_000, None) == dict(batch_size=4096, steps=560)
    assert scatternet.plan("fashion-mnist", 60_000, None) == dict(batch_size=8192, steps=280)
    assert scatternet.HYPER["mnist"]["noise_multiplier"] == 3.04
    assert scatternet.HYPER["fashion-mnist"]["noise_multiplier"] == 4.05
    assert scatternet.HYPER["fashion-mnist"]["groups"] == 27
    assert "scatternet" in registry.ORDER


class _Reached(Exception):
    pass


def _make_private_kwargs(monkeypatch, clip_rule: str) -> dict:
    """The keyword arguments train_once hands to dpjax.make_private (stopped there)."""
    import dpjax

    seen = {}

    def record(loss, **kwargs):
        seen.update(kwargs)
        raise _Reached

    def cheap_prepare(dataset, data, *, key):  # the normalisation is tested above
        x = np.zeros((40, 3969), np.float32)
        y = np.zeros(40, np.int32)
        return dict(xtr=x, ytr=y, xte=x[:10], yte=y[:10]), []

    monkeypatch.setattr(scatternet, "prepare", cheap_prepare)
    monkeypatch.setattr(dpjax, "make_private", record)
    with pytest.raises(_Reached):
        scatternet.train_once("mnist", _synthetic(40, 10), steps=3, seed=0, clip_rule=clip_rule)
    return seen


def test_automatic_clipping_reaches_make_private_with_r_gamma_and_rescaled_lr(monkeypatch):
    """--clip-rule automatic: make_private gets clip_rule="automatic", R = 1, γ = 0.01; the
    step lr·R equals the flat run's lr·C (8·0.1 = 0.8); σ, batch, steps, δ unchanged."""
    flat = _make_private_kwargs(monkeypatch, "flat")
    auto = _make_private_kwargs(monkeypatch, "automatic")
    assert "clip_rule" not in flat and flat["l2_clip_norm"] == 0.1
    assert auto["clip_rule"] == "automatic" and auto["gamma"] == 0.01
    assert auto["l2_clip_norm"] == 1.0
    hyper = scatternet.hyperparameters("mnist", "automatic")
    assert hyper["learning_rate"] * hyper["l2_clip_norm"] == pytest.approx(8.0 * 0.1)
    same = ("dataset_size", "batch_size", "steps", "noise_multiplier", "delta")
    assert {k: auto[k] for k in same} == {k: flat[k] for k in same}
    with pytest.raises(ValueError, match="clip_rule"):
        scatternet.hyperparameters("mnist", "flatt")


def test_automatic_clipping_spends_the_flat_runs_epsilon():
    """The full MNIST protocol under both rules: the same add/remove-one Poisson-Gaussian
    event (sensitivity C = 0.1 or R = 1 is absorbed in the noise σ·C or σ·R), so the same ε."""
    import optax

    import dpjax

    events = []
    for rule in scatternet.CLIP_RULES:
        hyper = scatternet.hyperparameters("mnist", rule)
        extra = dict(clip_rule=rule, gamma=hyper["gamma"]) if rule == "automatic" else {}
        schedule = scatternet.plan("mnist", 60_000, None)
        private = dpjax.make_private(
            scatternet.example_loss, optimizer=optax.sgd(hyper["learning_rate"]),
            l2_clip_norm=hyper["l2_clip_norm"], dataset_size=60_000,
            batch_size=schedule["batch_size"], steps=schedule["steps"],
            noise_multiplier=hyper["noise_multiplier"], delta=1e-5, key=jax.random.key(0),
            **extra,
        )  # fmt: skip
        events.append(private.event(schedule["steps"]))
    assert events[0] == events[1]
    assert events[0].noise_multiplier == 3.04 and events[0].count == 560
    assert str(events[0].relation.value) == "add_or_remove_one"


def test_trace_epochs_hands_fit_an_evaluation_every_epoch(monkeypatch):
    """Cheap twin of the slow test below: with trace_epochs, fit gets one Evaluate callback
    every ⌊n/b⌋ steps (n = 40, b = round(8192·40/60 000) = 5: every 8), none without."""
    import dpjax

    seen = []

    class _Private:
        def fit(self, params, data, *, callbacks, **_):
            seen.append(callbacks)
            raise _Reached

    def tiny_prepare(dataset, data, *, key):
        x, y = np.zeros((50, 5), np.float32), np.zeros(50, np.int32)
        return dict(xtr=x[:40], ytr=y[:40], xte=x[40:], yte=y[40:]), []

    monkeypatch.setattr(scatternet, "prepare", tiny_prepare)
    monkeypatch.setattr(dpjax, "make_private", lambda loss, **kwargs: _Private())
    for trace in (True, False):
        with pytest.raises(_Reached):
            scatternet.train_once("fashion-mnist", {}, steps=24, seed=0, trace_epochs=trace)
    (evaluate,), none = seen
    assert isinstance(evaluate, dpjax.dp_sgd.Evaluate) and none == []
    assert evaluate.every == 8


@pytest.mark.slow
def test_trace_epochs_records_the_test_accuracy_of_each_epoch_and_keeps_the_last(monkeypatch):
    """--trace-epochs: one test accuracy per epoch of ⌊n/b⌋ steps (n = 40, b = round(8192·40/
    60 000) = 5: 8 steps an epoch, 24 steps = 3 epochs); the reported accuracy is the last."""
    rng = np.random.default_rng(0)

    def tiny_prepare(dataset, data, *, key):
        y = rng.integers(0, 10, 50).astype(np.int32)
        x = (np.eye(10, 5)[y] + 0.1 * rng.normal(size=(50, 5))).astype(np.float32)
        return dict(xtr=x[:40], ytr=y[:40], xte=x[40:], yte=y[40:]), []

    monkeypatch.setattr(scatternet, "prepare", tiny_prepare)
    run = scatternet.train_once("fashion-mnist", {}, steps=24, seed=0, trace_epochs=True)
    assert run["batch_size"] == 5 and run["steps"] == 24
    trace = run["test_accuracy_by_epoch"]
    assert len(trace) == 3 and trace[-1] == run["test_accuracy"]
    plain = scatternet.train_once("fashion-mnist", {}, steps=24, seed=0)
    assert "test_accuracy_by_epoch" not in plain


def test_the_cnn_head_is_the_papers_scatternet_cnn():
    """ScatterNet + CNN (their ``models.py`` ``MNIST_CNN`` on 81 channels): conv 81 → 16 3×3
    stride 2, conv 16 → 32 3×3, linear 512 → 32 → 10; torch's init bounds U(±1/√fan_in); their
    README's batch, lr and σ, C = 0.1, momentum 0.9, the linear rows' normalisations."""
    params = scatternet.init_cnn(jax.random.key(0))
    fan_in = {"conv1": 9 * 81, "conv2": 9 * 16, "fc1": 512, "fc2": 32}
    shapes = {"conv1": (3, 3, 81, 16), "conv2": (3, 3, 16, 32), "fc1": (512, 32), "fc2": (32, 10)}
    for name, layer in params.items():
        assert layer["w"].shape == shapes[name] and layer["b"].shape == shapes[name][-1:]
        bound = 1.0 / np.sqrt(fan_in[name])
        for leaf in (layer["w"], layer["b"]):  # ≥ 320 weights reach 0.9·bound (P ≥ 1 − 0.9^320)
            low = 0.9 * bound if leaf.size >= 100 else 0.0
            assert low < float(jnp.max(jnp.abs(leaf))) <= bound, name
    assert scatternet.cnn_logits(params, jnp.ones((5, 3969), jnp.float32)).shape == (5, 10)
    assert scatternet.plan("mnist", 60_000, None, "cnn") == dict(batch_size=1024, steps=22 * 58)
    assert scatternet.plan("fashion-mnist", 60_000, None, "cnn") == dict(
        batch_size=2048, steps=1160
    )
    mnist = scatternet.hyperparameters("mnist", head="cnn")
    assert (mnist["learning_rate"], mnist["noise_multiplier"], mnist["norm"]) == (
        1.0, 1.35, "standardize")  # fmt: skip
    fashion = scatternet.hyperparameters("fashion-mnist", head="cnn")
    assert (fashion["learning_rate"], fashion["noise_multiplier"], fashion["groups"]) == (
        4.0,
        2.15,
        27,
    )
    assert (mnist["epochs"], fashion["epochs"]) == (22, 40)  # see HYPER_CNN: ε ≤ 3 by their RDP
    for hyper in (mnist, fashion):
        assert (hyper["l2_clip_norm"], hyper["momentum"]) == (0.1, 0.9)
    with pytest.raises(ValueError, match="head"):
        scatternet.hyperparameters("mnist", head="mlp")


def test_the_cnn_heads_example_loss_is_its_batch_logits_cross_entropy():
    """make_private differentiates the one-example loss: it must be the model's own logits."""
    import optax

    params = scatternet.init_cnn(jax.random.key(1))
    x = jax.random.normal(jax.random.key(2), (4, 3969), jnp.float32)
    y = jnp.array([0, 3, 9, 3], jnp.int32)
    batch = optax.softmax_cross_entropy_with_integer_labels(scatternet.cnn_logits(params, x), y)
    one = jax.vmap(scatternet.example_loss_cnn, in_axes=(None, 0))(params, {"x": x, "y": y})
    np.testing.assert_allclose(np.asarray(one), np.asarray(batch), rtol=1e-5)
