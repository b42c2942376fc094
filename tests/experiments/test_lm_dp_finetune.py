"""DP fine-tuning of the Llama (experiments.lm.finetune): padded tokens contribute nothing,
the modes train what they say, user-level accounting is per character."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dpjax
from dpjax.dp_sgd import finetune as ft
from experiments.lm import finetune as lmft
from experiments.lm import model
from tests.experiments.test_lm_forward import SMALL, synthetic_params, to_flax

SEQ = 8


def padded_data(seed=0, n=32):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(3, SMALL.vocab, size=(n, SEQ + 1)).astype(np.int32)
    lengths = rng.integers(2, SEQ + 1, size=n)  # real tokens per row (2 .. 8): every row padded
    mask = np.zeros((n, SEQ), np.float32)
    for i, m in enumerate(lengths):
        tokens[i, m:] = 2  # pad id
        mask[i, : m - 1] = 1.0
    return tokens, mask


def dp_updates(mode, mask, *token_arrays, window: bool):
    """One DP-SGD update (ghost clipping) per token array, from ONE state: the same batch and
    noise for each, so any difference comes from the data."""
    params = jax.tree.map(jnp.asarray, to_flax(SMALL, synthetic_params(SMALL)))
    lower, upper = model.split_params(params, 1) if window else (None, params)
    net = lmft.window_model(SMALL, 1) if window else model.Llama(SMALL)
    trainable, frozen = lmft.mode_parts(mode, upper, rank=2, last_blocks=1,
                                        key=jax.random.key(3))  # fmt: skip
    loss = ft.trainable_loss(lmft.example_loss_fn(net), frozen)
    private = dpjax.make_private(
        loss, optimizer=optax.sgd(0.1), l2_clip_norm=1.0, dataset_size=len(mask),
        batch_size=6, delta=1e-5, key=jax.random.key(11), steps=1, noise_multiplier=1.0,
        clipping="ghost",
    )  # fmt: skip
    state = private.init(trainable)
    updates = []
    for tokens in token_arrays:
        x = tokens[:, :-1]
        if window:  # block 0 frozen and run once; the window is block 1 + final norm + head
            x = lmft.lower_hidden_states(SMALL, lower, x, batch=len(tokens))
        data = {"x": jnp.asarray(x), "y": jnp.asarray(tokens[:, 1:]), "mask": jnp.asarray(mask)}
        updates.append(jax.tree.leaves(private.step(trainable, state, data)[0]))
    return updates


@pytest.mark.parametrize(
    "mode, window", [("lora", True), pytest.param("full", False, marks=pytest.mark.slow)]
)
def test_changing_a_padded_tokens_id_changes_no_dp_update(mode, window):
    tokens, mask = padded_data()
    padded = np.concatenate([np.zeros((len(mask), 1), bool), mask == 0], axis=1)
    changed = np.where(padded, (tokens * 7 + 5) % SMALL.vocab, tokens)  # every padded id
    assert (changed != tokens).sum() > 50
    real = tokens.copy()
    real[:, 0] = (real[:, 0] + 1) % SMALL.vocab  # REAL tokens: the update moves (teeth)
    before, after, moved = dp_updates(mode, mask, tokens, changed, real, window=window)
    for a, b in zip(before, after, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert any(not np.array_equal(a, b) for a, b in zip(before, moved, strict=True))


def test_windows_pad_the_last_chunk_and_mask_only_real_targets():
    tokens, masks = lmft.windows(list(range(10, 23)), 4, pad_id=2)  # 13 ids: 5 + 5 + 3
    assert tokens == [[10, 11, 12, 13, 14], [15, 16, 17, 18, 19], [20, 21, 22, 2, 2]]
    assert masks == [[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0]]
    lmft.check_suffix_padding(np.asarray(masks))
    with pytest.raises(ValueError, match="suffix"):
        lmft.check_suffix_padding(np.array([[1.0, 0.0, 1.0]]))


def test_modes_select_their_parameters():
    params = to_flax(SMALL, synthetic_params(SMALL))
    _, upper = model.split_params(params, 1)
    d = {}
    for mode in lmft.MODES:
        trainable, _ = lmft.mode_parts(mode, upper, rank=2, last_blocks=1, key=jax.random.key(0))
        d[mode] = ft.num_params(trainable)
    w, m, hd = SMALL.width, SMALL.mlp, SMALL.head_dim
    kv = SMALL.n_kv_heads * hd
    lora = 2 * ((w + w) + (w + kv) * 2 + (w + w) + 2 * (w + m) + (m + w))
    block = w * w * 2 + 2 * w * kv + 3 * w * m + 2 * w
    assert d == {"lora": lora, "norm": 3 * w, "last_blocks": block,
                 "full": block + w}  # fmt: skip


def test_user_level_run_is_accounted_per_character():
    """The user-level run samples CHARACTERS (q = b_u/U) and its ε is dp-accounting's for the
    subsampled Gaussian over users; the example-level run beside it samples windows."""
    import dp_accounting

    from experiments import finetune_lm

    params = to_flax(SMALL, synthetic_params(SMALL))
    _, upper = model.split_params(params, 1)
    _, frozen = lmft.mode_parts("lora", upper, rank=2, last_blocks=1, key=jax.random.key(0))
    users = np.repeat(np.arange(40), 3)  # 40 characters, 3 windows each: n = 120
    spec = dict(batch=12, steps=5)
    net = lmft.window_model(SMALL, 1)
    user = finetune_lm.make_private_run(net, frozen, 120, epsilon=3.0, spec=spec, lr=1e-3,
                                        seed=0, user_ids=users)  # fmt: skip
    example = finetune_lm.make_private_run(net, frozen, 120, epsilon=3.0, spec=spec, lr=1e-3,
                                           seed=0)  # fmt: skip
    assert user.privacy_unit == "user" and user.num_users == 40
    assert user.sampling_rate == pytest.approx(4 / 40)  # b_u = 12 * 40 / 120 = 4 characters
    assert example.sampling_rate == pytest.approx(12 / 120)
    assert getattr(example, "privacy_unit", "example") != "user"
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(
            user.sampling_rate, dp_accounting.GaussianDpEvent(user.noise_multiplier)
        ),
        5,
    )
    pld = dp_accounting.pld.PLDAccountant().compose(event)
    assert pld.get_epsilon(finetune_lm.DELTA) == pytest.approx(3.0, abs=0.05)


def test_scanned_lower_blocks_match_the_unrolled_model():
    with jax.enable_x64(False):
        params = jax.tree.map(jnp.asarray, to_flax(SMALL, synthetic_params(SMALL)))
        n_lower = SMALL.n_blocks - 1
        lower, _ = model.split_params(params, n_lower)
        tokens = np.random.default_rng(0).integers(0, SMALL.vocab, (3, 7)).astype(np.int32)
        scanned = lmft.lower_hidden_states(SMALL, lower, tokens, batch=2)  # a padded batch
        net = model.LowerBlocks(SMALL, n_lower)
        unrolled = np.stack([np.asarray(net.apply({"params": lower}, t)) for t in tokens])
        assert scanned.shape == unrolled.shape
        np.testing.assert_allclose(scanned, unrolled, rtol=1e-5, atol=1e-5)
