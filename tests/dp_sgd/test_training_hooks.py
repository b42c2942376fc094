"""fit's hooks: public evaluation, checkpoints (secret and public files), logging, early
stopping, the progress-bar fallback, and the history whose ε is accounted only when read.

Each privacy refusal has its test: an evaluation not declared public, an early stop on a
training (private) metric or on a metric no public evaluation produced, and the plan's ε
reported as the guarantee of a run stopped early.
"""

import csv
import math
import os
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import serialization

from dpjax.dp_sgd import (
    Callback,
    Checkpoint,
    CSVLogger,
    EarlyStopping,
    Evaluate,
    PrivateTraining,
    make_private,
    restore_checkpoint,
)

N, DIM, STEPS = 40, 2, 6


def _data():
    x = jax.random.normal(jax.random.key(3), (N, DIM))
    return {"x": x, "y": x @ jnp.array([1.0, -1.0])}


def _loss(w, ex):
    return 0.5 * (ex["x"] @ w - ex["y"]) ** 2


def _private(seed=0, steps=STEPS):
    return make_private(
        _loss,
        optimizer=optax.sgd(0.2),
        l2_clip_norm=1.0,
        dataset_size=N,
        batch_size=8,
        steps=steps,
        noise_multiplier=1.0,
        delta=1e-5,
        key=jax.random.key(seed),
        clipping="vmap",
    )


PUBLIC = _data()  # stands for a public validation set in these tests


def _public_eval(w):
    return {"val_loss": float(jnp.mean(jax.vmap(_loss, (None, 0))(w, PUBLIC)))}


# ---- the history: ε only when read


def test_history_accounts_epsilon_only_when_read(monkeypatch):
    private = _private()
    calls = []
    original = PrivateTraining._epsilon_uncached

    def counting(self, t, delta):
        calls.append(t)
        return original(self, t, delta)

    monkeypatch.setattr(PrivateTraining, "_epsilon_uncached", counting)
    _, state, history = private.fit(jnp.zeros(DIM), _data(), progress=False, log_every=1)
    assert calls == [STEPS]  # the room check of the whole run only, none per record
    assert history["step"] == list(range(1, STEPS + 1)) and len(history["loss"]) == STEPS
    eps = history["epsilon"]
    assert sorted(calls) == list(range(1, STEPS + 1))  # each point once, the end cached
    assert eps == sorted(eps) and eps[-1] == private.epsilon(state)
    assert eps[0] == private.epsilon(1)
    assert set(history) == {"step", "loss", "epsilon"}


# ---- evaluation: public data only


def test_evaluation_on_data_not_declared_public_is_refused():
    with pytest.raises(ValueError, match="eval_data_is_public"):
        Evaluate(_public_eval, every=2)
    with pytest.raises(ValueError, match="eval_data_is_public"):
        Evaluate(_public_eval, every=2, eval_data_is_public="yes")


def test_evaluation_every_k_steps_gets_the_parameters_only():
    seen = []

    def eval_fn(*args):
        seen.append(args)
        return _public_eval(*args)

    private = _private()
    w, _, history = private.fit(
        jnp.zeros(DIM),
        _data(),
        progress=False,
        callbacks=[Evaluate(eval_fn, every=4, eval_data_is_public=True)],
    )
    assert history["eval_step"] == [4, STEPS]  # every 4 steps and after the last
    assert all(len(args) == 1 for args in seen)  # params only: never the secret state
    np.testing.assert_array_equal(seen[-1][0], w)
    assert history["val_loss"][-1] == _public_eval(w)["val_loss"]


# ---- early stopping


def test_early_stopping_on_a_training_metric_is_refused():
    for metric in ("loss", "batch_size", "num_clipped", "num_nonfinite"):
        with pytest.raises(ValueError, match="monitor"):
            EarlyStopping(metric)


def test_early_stopping_on_a_metric_no_public_evaluation_produced_is_refused():
    private = _private()
    hooks = [
        EarlyStopping("accuracy"),
        Evaluate(_public_eval, every=2, eval_data_is_public=True),
    ]
    with pytest.raises(ValueError, match="public evaluation metrics"):
        private.fit(jnp.zeros(DIM), _data(), progress=False, callbacks=hooks)


def test_early_stop_reports_the_plans_epsilon_as_the_guarantee():
    """A stopping time read from the parameters is post-processing of the FULL plan: the run
    stops at step 4 (val_loss rises by construction), and the guarantee recorded is ε(T)."""
    values = iter([1.0, 2.0, 3.0])
    private = _private()
    _, state, history = private.fit(
        jnp.zeros(DIM),
        _data(),
        progress=False,
        callbacks=[  # the stopper first: fit runs the evaluations before it anyway
            EarlyStopping("score", patience=1),
            Evaluate(lambda w: {"score": next(values)}, every=2, eval_data_is_public=True),
        ],
    )
    assert int(state.step) == 4 and history["eval_step"] == [2, 4]
    assert "did not improve" in history["stopped_early"]
    assert history["epsilon_guarantee"] == private.epsilon(STEPS)
    assert history["epsilon_guarantee"] > private.epsilon(state)


# ---- checkpoints: the secret state and the public one beside it


def test_checkpoints_hold_the_secret_state_apart_from_the_public_one(tmp_path):
    private = _private()
    data = _data()
    w, state, _ = private.fit(
        jnp.zeros(DIM), data, progress=False, checkpoint_every=4, checkpoint_dir=tmp_path
    )
    names = sorted(os.listdir(tmp_path))
    assert names == [
        "step_00000004.SECRET-state.msgpack",
        "step_00000004.public.msgpack",
        f"step_{STEPS:08d}.SECRET-state.msgpack",
        f"step_{STEPS:08d}.public.msgpack",
    ]
    secret = tmp_path / f"step_{STEPS:08d}.SECRET-state.msgpack"
    assert os.stat(secret).st_mode & 0o077 == 0  # owner only
    restored_w, restored = restore_checkpoint(secret, private, jnp.zeros(DIM))
    np.testing.assert_array_equal(restored_w, w)
    np.testing.assert_array_equal(restored.key, state.key)  # the key data: secret
    blob = (tmp_path / names[3]).read_bytes()
    public = serialization.msgpack_restore(blob)
    assert set(public) == {"params", "public_state"}
    for key_data in (state.key, state.opt_state[0].key):  # sampling and noise keys
        raw = np.asarray(key_data).tobytes()
        assert raw in secret.read_bytes() and raw not in blob
    assert public["public_state"]["epsilon"] == private.epsilon(state)
    # the middle checkpoint resumes the run: its remaining steps continue the key streams
    w4, s4 = restore_checkpoint(tmp_path / names[0], private, jnp.zeros(DIM))
    w_end, s_end, _ = private.fit(w4, data, state=s4, progress=False)
    np.testing.assert_array_equal(w_end, w)
    np.testing.assert_array_equal(s_end.key, state.key)


def test_checkpoint_every_needs_a_directory():
    with pytest.raises(ValueError, match="checkpoint_dir"):
        _private().fit(jnp.zeros(DIM), _data(), progress=False, checkpoint_every=2)


# ---- logging


def test_log_to_csv_and_to_a_callable(tmp_path):
    path = tmp_path / "run.csv"
    private = _private()
    _, state, _ = private.fit(
        jnp.zeros(DIM),
        _data(),
        progress=False,
        log_every=3,
        log_to=path,
        callbacks=[Evaluate(_public_eval, every=3, eval_data_is_public=True)],
    )
    rows = list(csv.DictReader(path.open()))
    assert [int(r["step"]) for r in rows] == [3, STEPS]
    assert list(rows[0]) == ["step", "loss", "epsilon", "val_loss"]
    assert float(rows[-1]["epsilon"]) == pytest.approx(private.epsilon(state), rel=1e-12)
    assert all(math.isfinite(float(r["loss"])) for r in rows)

    # a column that first appears at a later row (an evaluation every 3 steps, a row a step)
    dense = tmp_path / "dense.csv"
    _private(seed=2).fit(
        jnp.zeros(DIM),
        _data(),
        progress=False,
        callbacks=[
            CSVLogger(dense, every=1, epsilon=False),
            Evaluate(_public_eval, every=3, eval_data_is_public=True),
        ],
    )
    rows = list(csv.DictReader(dense.open()))
    assert [int(r["step"]) for r in rows] == list(range(1, STEPS + 1))
    assert [r["val_loss"] != "" for r in rows] == [False, False, True, False, False, True]

    written = []
    logger = CSVLogger(lambda step, values: written.append((step, values)), every=2)
    _private(seed=1).fit(jnp.zeros(DIM), _data(), progress=False, callbacks=[logger])
    assert [s for s, _ in written] == [2, 4, 6] and set(written[0][1]) == {"loss", "epsilon"}


def test_callbacks_must_be_callback_instances():
    with pytest.raises(ValueError, match="callbacks"):
        _private().fit(jnp.zeros(DIM), _data(), progress=False, callbacks=[print])


def test_a_custom_callback_sees_each_step_and_can_stop():
    class StopAtThree(Callback):
        def __init__(self):
            self.steps = []

        def on_step_end(self, run):
            self.steps.append(run.step)
            if run.step == 3:
                run.stop("enough")

    hook = StopAtThree()
    _, state, history = _private().fit(jnp.zeros(DIM), _data(), progress=False, callbacks=[hook])
    assert hook.steps == [1, 2, 3] and int(state.step) == 3
    assert history["step"][-1] == 3 and history["stopped_early"] == "enough"


# ---- the progress bar without tqdm


def test_progress_without_tqdm_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm raises ImportError
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _private().fit(jnp.zeros(DIM), _data(), progress=True)
    assert any("tqdm" in str(w.message) for w in caught)


def test_checkpoint_callback_writes_on_its_period(tmp_path):
    hook = Checkpoint(tmp_path / "ck", every=5)
    _private().fit(jnp.zeros(DIM), _data(), progress=False, callbacks=[hook])
    assert [p.name for p, _ in hook.written] == [
        "step_00000005.SECRET-state.msgpack",
        f"step_{STEPS:08d}.SECRET-state.msgpack",
    ]
