"""Attacks on the noise transforms through ``jax.vmap`` (review finding: vmap hides the
per-example axis), and the legitimate vmaps that must keep working.

Inside ``jax.vmap(tx.update, in_axes=(0, None, None))`` every row of per-example gradients is
shaped like params and the unbatched state draws ONE noise vector for all rows: the rows'
differences are then noise-free. Each attack below got noise-free differences before the fix
(checked against the previous transforms: no ValueError, identical noise on every row).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dpjax.dp_sgd import BandMF
from dpjax.dp_sgd.transforms import add_gaussian_noise, add_laplace_dp_sgd_noise

ROWS = jnp.array([[5.0, 0.0, 0.0], [0.0, 7.0, 0.0]], jnp.float32)  # unclipped rows
PARAMS = jnp.zeros(3, jnp.float32)


def _transforms():
    key = jax.random.key(3)
    laplace = dict(l1_sensitivity=1.0, epsilon=1.0, rho=0.5, kappa=0.5)
    band = BandMF(bands=2).resolve(dataset_size=10, batch_size=2, steps=4)
    return {
        "gaussian": add_gaussian_noise(1.0, key=key),
        "laplace": add_laplace_dp_sgd_noise(**laplace, key=key),
        "band_mf": band.transform(1.0, 1.0, key=key),
    }


@pytest.mark.parametrize("name", ["gaussian", "laplace", "band_mf"])
def test_per_example_rows_under_vmap_jit_and_scan_are_refused(name):
    tx = _transforms()[name]
    state = tx.init(PARAMS)
    update = lambda u, s: tx.update(u, s, PARAMS)[0]  # noqa: E731

    def scanned(u, s):  # a jitted scan of two updates, vmapped from outside
        body = lambda st, _: (tx.update(u, st, PARAMS)[1], None)  # noqa: E731
        return jax.lax.scan(body, s, None, length=2)[0]

    for attack in (
        jax.vmap(update, in_axes=(0, None)),
        jax.vmap(jax.jit(update), in_axes=(0, None)),  # the vmap is outside the jit
        jax.jit(jax.vmap(update, in_axes=(0, None))),
        jax.vmap(jax.jit(scanned), in_axes=(0, None)),
    ):
        with pytest.raises(ValueError, match="updates must be"):
            attack(ROWS, state)


def test_an_outer_vmap_over_runs_does_not_excuse_an_inner_vmap_over_rows():
    tx = add_gaussian_noise(1.0, key=jax.random.key(4))
    keys = jax.random.split(jax.random.key(5), 2)
    states = jax.vmap(lambda k: tx.init(PARAMS)._replace(key=jax.random.key_data(k)))(keys)
    inner = jax.vmap(lambda u, s: tx.update(u, s, PARAMS)[0], in_axes=(0, None))
    with pytest.raises(ValueError, match="updates"):
        jax.vmap(inner, in_axes=(None, 0))(ROWS, states)


def test_a_batch_of_one_broadcast_state_is_refused():
    """Rows with states broadcast from ONE state share the key: the same attack (eagerly a
    ValueError; under jit NaN rows, checked in the next test's compiled program)."""
    tx = add_gaussian_noise(1.0, key=jax.random.key(6))
    same = jax.tree.map(lambda x: jnp.stack([x, x]), tx.init(PARAMS))
    with pytest.raises(ValueError, match="state must be"):
        jax.vmap(lambda u, s: tx.update(u, s, PARAMS)[0])(ROWS, same)


def test_vmap_over_runs_jit_grad_and_unbatched_updates_are_unchanged():
    """Legitimate uses (one compiled program): a vmap over runs (distinct keys) gives each
    run's own update bit for bit (``lax.map`` runs them one by one); grad through the
    update (a vmap over states with unbatched updates: tests/test_review_noise_keys.py).
    And under jit, rows whose states repeat a key come out NaN."""
    tx = add_gaussian_noise(1.0, key=jax.random.key(7))
    keys = jax.random.split(jax.random.key(8), 2)
    states = jax.vmap(lambda k: tx.init(PARAMS)._replace(key=jax.random.key_data(k)))(keys)
    update = lambda u, s: tx.update(u, s, PARAMS)[0]  # noqa: E731

    same = jax.tree.map(lambda x: jnp.stack([x[0], x[0]]), states)

    @jax.jit
    def uses(rows, states, same):
        one_by_one = jax.lax.map(lambda a: update(*a), (rows, states))
        grads = jax.vmap(jax.grad(lambda u, s: jnp.sum(update(u, s))))(rows, states)
        voided = jax.vmap(update)(rows, same)
        return jax.vmap(update)(rows, states), one_by_one, grads, voided

    batched, one_by_one, grads, voided = uses(ROWS, states, same)
    assert np.all(np.isnan(np.asarray(voided)))
    np.testing.assert_array_equal(np.asarray(batched), np.asarray(one_by_one))
    assert not np.any(np.asarray(batched[0] - ROWS[0] == batched[1] - ROWS[1]))  # own noise
    np.testing.assert_array_equal(np.asarray(grads), np.ones((2, 3), np.float32))


def test_a_chained_optimizer_is_guarded_too():
    """The guard sits in the noise transform, so any chain holding it refuses the attack."""
    tx = optax.chain(add_gaussian_noise(1.0, key=jax.random.key(9)), optax.sgd(0.1))
    state = tx.init(PARAMS)
    with pytest.raises(ValueError, match="updates"):
        jax.vmap(tx.update, in_axes=(0, None, None))(ROWS, state, PARAMS)
