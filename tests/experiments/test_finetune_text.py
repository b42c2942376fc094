"""The text half of the fine-tuning experiment: synthetic chains, the transformer's modes, and a
tiny private fine-tuning run whose frozen weights must come back bit for bit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpjax.dp_sgd import finetune as ft
from experiments import finetune_text as text


def test_private_chain_shifts_exactly_the_stated_rows_and_samples_follow_their_chain():
    public, private = text.chains()
    for chain in (public, private):
        np.testing.assert_allclose(chain.sum(1), 1.0, rtol=1e-12)
        assert ((chain > 0).sum(1) == text.SUCCESSORS).all()
    assert int(np.sum(np.any(public != private, axis=1))) == text.SHIFTED_ROWS
    rng = np.random.default_rng(0)
    for chain in (public, private):
        seqs = text.sample(chain, 300, rng)
        assert seqs.shape == (300, text.SEQ + 1) and seqs.dtype == np.int32
        assert (chain[seqs[:, :-1], seqs[:, 1:]] > 0).all()  # only allowed transitions
    # the empirical transition frequencies of one row match its probabilities (rejects a
    # sampler off by one successor): 4000 × 16 transitions, ≈ 2000 from each token
    seqs = text.sample(public, 4000, np.random.default_rng(1))
    a = int(np.argmax(np.bincount(seqs[:, :-1].ravel(), minlength=text.VOCAB)))
    nxt = seqs[:, 1:][seqs[:, :-1] == a]
    freq = np.bincount(nxt, minlength=text.VOCAB) / nxt.size
    se = np.sqrt(public[a] * (1 - public[a]) / nxt.size)
    assert (np.abs(freq - public[a]) <= 5 * se + 1e-12).all()


def test_data_split_is_disjoint_and_public_corpus_comes_from_the_public_chain():
    data = text.load_data(0)
    public_chain, private_chain = text.chains()
    assert data["x_train"].shape == (text.N_PRIVATE_TRAIN, text.SEQ)
    assert data["x_test"].shape == (text.N_PRIVATE_TEST, text.SEQ)
    np.testing.assert_array_equal(data["x_train"][:, 1:], data["y_train"][:, :-1])
    assert (public_chain[data["x_public"], data["y_public"]] > 0).all()
    assert (private_chain[data["x_train"], data["y_train"]] > 0).all()
    # the public corpus uses transitions the private chain does not have (it is shifted)
    assert (private_chain[data["x_public"], data["y_public"]] == 0).any()
    assert 1 / text.SUCCESSORS < data["bayes_accuracy"] < 1


def test_every_mode_trains_the_stated_coordinates():
    """d per mode from the architecture's formulas (shapes only: nothing is compiled)."""
    public = jax.eval_shape(text.init_transformer, jax.random.key(0))
    w, v, m, r = text.WIDTH, text.VOCAB, text.MLP, text.RANK
    expected = {
        "full": ft.num_params(public),
        "lora": (w * r + r * 3 * w) + (w * r + r * w) + (w * r + r * m) + (m * r + r * w),
        "bias": 3 * w + w + m + w + 3 * w + v,  # qkv, out, up, down, 3 layer norms, head
        "last_layer": w * v + v,
    }
    assert expected["full"] == (v + text.SEQ) * w + (w * 3 * w + 3 * w) + (w * w + w) + (
        w * m + m) + (m * w + w) + 3 * 2 * w + (w * v + v)  # fmt: skip
    for mode, d in expected.items():
        trainable, frozen = jax.eval_shape(
            lambda p, mode=mode: text.mode_parameters(mode, p, None)[:2], public
        )
        assert ft.num_params(trainable) == d, mode
        assert ft.num_params(trainable) + ft.num_params(frozen) == ft.num_params(public) + (
            d if mode == "lora" else 0)  # fmt: skip
    with pytest.raises(ValueError, match="mode"):
        text.mode_parameters("head_only", public, None)


@pytest.mark.slow  # tens of seconds of CPU: one compile of the DP-SGD scan per mode
def test_tiny_run_moves_every_trainable_coordinate_and_no_frozen_bit():
    """LoRA starts at the public model; after private fine-tuning the model differs from its
    start in exactly the d trainable coordinates (each got noise), and every frozen weight is
    bit-identical."""
    modes = ("lora", "bias", "last_layer")
    with jax.numpy_dtype_promotion("standard"):  # as the vision run's test: x64 step counters
        out = text.evaluate("tiny", modes=modes)
    trainable, frozen, _ = text.mode_parameters("lora", out["public"], None)
    tokens = jnp.arange(text.SEQ, dtype=jnp.int32) % text.VOCAB
    for name in text.LORA_LAYERS:
        assert not np.any(np.asarray(trainable["block"][name]["lora_b"]))  # B = 0 at the start
    forward = jax.jit(text.logits)  # two compiled programs: equal up to float32 rounding
    np.testing.assert_allclose(forward(ft.combine(trainable, frozen), tokens),
                               forward(out["public"], tokens), rtol=1e-5, atol=1e-5)  # fmt: skip
    for mode in modes:
        start_trainable, start_frozen, _ = text.mode_parameters(mode, out["public"], None)
        start = ft.combine(start_trainable, start_frozen)
        trainable_paths = {p for p, _ in jax.tree_util.tree_leaves_with_path(start_trainable)}
        trained, frozen = out["trained"][mode]
        for run in range(text.SIZES["tiny"]["seeds"]):
            after = ft.combine(jax.tree.map(lambda a, i=run: a[i], trained), frozen)
            moved = 0
            for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(after),
                                    jax.tree.leaves(start), strict=True):  # fmt: skip
                if path in trainable_paths:
                    assert np.all(np.asarray(a) != np.asarray(b)), (mode, path)
                    moved += np.size(a)
                else:
                    assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), (mode, path)
            assert moved == ft.num_params(start_trainable)
    rows = out["rows"]
    assert [r["mode"] for r in rows] == list(modes)
    assert all(r["epsilon"] <= 1.0 + 1e-9 and 0 <= r["accuracy_mean"] <= 1 for r in rows)
    assert rows[0]["d"] == ft.num_params(text.mode_parameters("lora", out["public"], None)[0])
