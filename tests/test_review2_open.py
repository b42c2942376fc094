"""Review 2: open findings on the new release paths (strict xfails, each with its fix).

Each test is the attack; it fails on main today (hence ``xfail(strict=True)``), and passes once
the fix described in its reason lands.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dpjax.accounting import PrivacyAccountant
from dpjax.dp_sgd import BandMF, make_private
from dpjax.events import PoissonSampledGaussianEvent

N = 300


def _linear(w, x):
    return x @ w


@pytest.mark.xfail(
    strict=True,
    reason="open (review2): BandMF's parts are ROW INDICES mod b, so the data's row order is "
    "part of the plan; a run resumed on the same records in another order lets a record "
    "participate in adjacent steps (b-separation, hence the ⌈T/b⌉-round accounting of "
    "Choquette-Choo et al. 2023 Thm 4, broken). Fix: record a keyed digest of the data's row "
    "order in the secret state (keyed by the run's key, never in the public ledger) and "
    "refuse other data in step/fit; at least document it in BandMF and make_private.",
)
def test_bandmf_resumed_on_reordered_rows_is_refused():
    private = make_private(
        _linear,
        optimizer=optax.sgd(0.1),
        l2_clip_norm=1.0,
        dataset_size=N,
        batch_size=5,
        steps=6,
        noise_multiplier=1.0,
        delta=1e-5,
        key=jax.random.key(0),
        noise=BandMF(bands=2),
    )
    data = jnp.asarray(np.random.default_rng(0).normal(size=(N, 2)), jnp.float32)
    w = jnp.zeros(2, jnp.float32)
    state = private.init(w)
    w, state, _ = private.step(w, state, data)  # step 0: part 0 = even rows, record 0 there
    swapped = data.at[jnp.array([0, 1])].set(data[jnp.array([1, 0])])  # record 0 now odd
    with pytest.raises(ValueError, match="data"):
        private.step(w, state, swapped)  # step 1 samples part 1: record 0 again, 1 step apart


@pytest.mark.xfail(
    strict=True,
    reason="open (review2): a user-level run's event() is a PoissonSampledGaussianEvent tagged "
    "add_or_remove_one exactly like an example-level one, so a PrivacyAccountant composes the "
    "two into one ε that holds for neither unit: as a user-level claim the example-level "
    "run only gives group privacy (kε); as an example-level claim removing one row of a user "
    "with more rows than the cap k shifts which rows are kept (its vector moves by up to 2C). "
    "Fix: a privacy-unit field on the events (example / user + grouping fingerprint) that the "
    "accountant refuses to mix.",
)
def test_user_level_event_does_not_compose_with_example_level_events():
    ids = np.repeat(np.arange(N // 3), 3)
    private = make_private(
        _linear,
        optimizer=optax.sgd(0.1),
        l2_clip_norm=1.0,
        dataset_size=N,
        batch_size=5,
        steps=10,
        noise_multiplier=1.0,
        delta=1e-5,
        key=jax.random.key(0),
        user_ids=ids,
    )
    example_level = PoissonSampledGaussianEvent(noise_multiplier=1.0, sampling_rate=0.01, count=10)
    with pytest.raises(ValueError):
        PrivacyAccountant([private.event(), example_level]).epsilon(1e-5)
