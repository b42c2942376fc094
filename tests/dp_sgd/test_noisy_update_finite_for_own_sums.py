"""A DP optimizer never releases a non-finite update because of one record.

``dp_sgd_optimizer`` refuses a ``clipped_grad`` built with ``nan_safe=False``, but the other
documented way to build it, ``l2_clip_norm=C`` ("C given: own sums"), accepts the very same
sums: one record whose gradient is NaN (here sqrt of a negative score) makes the noisy update
NaN in every coordinate, so the record's presence in the batch is certain, while
``event_for`` accounts the step as usual. ``accumulate_clipped_sums`` passes it on too.

No map of the SUM is sound (zeroing a NaN coordinate moves it by the other records' total,
not by ≤ C), so own sums with a non-finite entry are refused before any noise: ValueError
eagerly, a failing host callback under ``jit`` (no update is produced).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dpjax
from dpjax.dp_sgd.optimizers import (
    accumulate_clipped_sums,
    dp_sgd_optimizer,
    laplace_dp_sgd_optimizer,
)
from dpjax.dp_sgd.transforms import add_gaussian_noise


def _loss(w, x):
    return jnp.sqrt(jnp.dot(w, x))  # NaN gradient for a record with w·x < 0


DATA = jnp.array([[1.0, 1.0], [-5.0, 0.0]])  # the second record has a NaN gradient
PARAMS = jnp.ones(2)


def _unsafe_sum():
    grad_fn = dpjax.clipped_grad(_loss, l2_clip_norm=1.0, nan_safe=False)
    clipped_sum, _ = grad_fn(PARAMS, DATA)
    assert not np.all(np.isfinite(np.asarray(clipped_sum)))  # the premise
    return clipped_sum


def _optimizer():
    return dp_sgd_optimizer(
        optimizer=optax.sgd(1.0),
        noise_multiplier=1.0,
        normalizer=2.0,
        key=jax.random.key(0),
        l2_clip_norm=1.0,
    )


@pytest.mark.parametrize("accumulate", [False, True])
def test_noisy_update_of_own_sums_is_finite_or_refused(accumulate):
    tx = _optimizer()
    if accumulate:
        tx = accumulate_clipped_sums(tx, every_k=1)
    try:
        update, _ = tx.update(_unsafe_sum(), tx.init(PARAMS), PARAMS)
    except ValueError:
        return  # refusing the non-finite sum is fine
    assert np.all(np.isfinite(np.asarray(update)))


@pytest.mark.parametrize("accumulate", [False, True])
def test_nonfinite_own_sum_refused_eagerly_before_the_noise(accumulate):
    tx = _optimizer()
    if accumulate:
        tx = accumulate_clipped_sums(tx, every_k=1)
    with pytest.raises(ValueError, match="updates must be finite"):
        tx.update(_unsafe_sum(), tx.init(PARAMS), PARAMS)


@pytest.mark.parametrize(("bad", "accumulate"), [(np.nan, False), (np.inf, True), (-np.inf, False)])
def test_nonfinite_own_sum_under_jit_fails_the_step(bad, accumulate):
    """Under jit no ValueError can be raised at trace time (the sum is unknown): the host
    callback raises it when the step runs, and JAX fails the step, so no update comes out.
    With accumulation the non-finite micro-sum is held (nothing released) and the step that
    would release the total fails."""
    tx = _optimizer()
    if accumulate:
        tx = accumulate_clipped_sums(tx, every_k=2)
    state = tx.init(PARAMS)
    step = jax.jit(lambda s, st: tx.update(s, st, PARAMS))
    finite = jnp.array([0.5, 0.25])
    for _ in range(2 if accumulate else 1):  # one finite release passes
        update, state = step(finite, state)
    assert np.all(np.isfinite(np.asarray(update))) and np.any(np.asarray(update) != 0)
    with pytest.raises(Exception, match="updates must be finite"):
        update, state = step(jnp.array([bad, 0.25]), state)
        if accumulate:
            update, state = step(finite, state)
        np.asarray(update)  # what it did instead: a non-finite update, released


def test_finite_own_sums_are_released_unchanged_by_the_check():
    """The check changes no value: the same key gives the update of the unchecked chain."""
    key, total = jax.random.key(7), jnp.array([0.5, -0.25])
    checked = _optimizer_with_key(key)
    reference = optax.chain(add_gaussian_noise(1.0, key=key), optax.scale(1 / 2.0), optax.sgd(1.0))

    @jax.jit
    def both(s):
        first, _ = checked.update(s, checked.init(PARAMS), PARAMS)
        second, _ = reference.update(s, reference.init(PARAMS), PARAMS)
        return first, second

    first, second = both(total)
    np.testing.assert_array_equal(np.asarray(first), np.asarray(second))
    assert not np.array_equal(np.asarray(first), -np.asarray(total) / 2.0)  # noise was added


def _optimizer_with_key(key):
    return dp_sgd_optimizer(
        optimizer=optax.sgd(1.0), noise_multiplier=1.0, normalizer=2.0, key=key, l2_clip_norm=1.0
    )


@pytest.mark.parametrize("jit", [False, True])
def test_laplace_dp_sgd_refuses_a_nonfinite_gradient(jit):
    """The sibling own-gradient path: Laplace DP-SGD noised a NaN gradient into NaN."""
    tx = laplace_dp_sgd_optimizer(
        l1_sensitivity=1.0, epsilon=1.0, rho=0.5, kappa=1.0, key=jax.random.key(0)
    )
    update = lambda g: tx.update(g, tx.init(PARAMS), PARAMS)[0]  # noqa: E731
    update = jax.jit(update) if jit else update
    assert np.all(np.isfinite(np.asarray(update(jnp.array([0.5, 0.25])))))
    with pytest.raises(Exception, match="updates must be finite"):
        np.asarray(update(jnp.array([np.nan, 0.25])))


def _banded_noise():
    from dpjax.dp_sgd.matrix_factorization.streaming import correlated_noise

    strategy = np.tril(np.ones((4, 4))) - np.tril(np.ones((4, 4)), -2)
    return correlated_noise(strategy, noise_multiplier=1.0, l2_clip_norm=1.0, key=jax.random.key(0))


def _laplace_noise():
    from dpjax.dp_sgd.transforms import add_laplace_dp_sgd_noise

    return add_laplace_dp_sgd_noise(
        l1_sensitivity=1.0, epsilon=1.0, rho=0.5, kappa=1.0, key=jax.random.key(0)
    )


@pytest.mark.parametrize(
    "make",
    [lambda: add_gaussian_noise(1.0, key=jax.random.key(0)), _laplace_noise, _banded_noise],
    ids=["gaussian", "laplace", "correlated"],
)
def test_noise_transforms_refuse_a_nonfinite_sum_eagerly(make):
    """The low-level noise transforms, used directly with own sums, refuse eagerly too."""
    tx = make()
    with pytest.raises(ValueError, match="updates must be finite"):
        tx.update(jnp.array([np.nan, 0.25]), tx.init(PARAMS), PARAMS)
