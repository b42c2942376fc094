"""The ERM releases' vmap guard: a vmap over data sets needs one distinct key per data set.

Attack (same class as the mechanisms'): ``jax.vmap(lambda X, y: output_perturbation(key, X,
y, ...))`` over two data sets added ONE noise vector to both minimisers, so their difference
was released noise-free. Every public ERM release ``name(key, X, y, ...)`` is guarded on
``(X, y)``.
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpjax import erm
from dpjax.erm import iterative, losses

KEY = jax.random.key(0)
RELEASES = [
    "exponential_mechanism_grid",
    "noisy_gradient_descent",
    "dp_gd",
    "dp_sgd",
    "laplace_dp_sgd",
    "noisy_sufficient_statistics_regression",
    "objective_perturbation",
    "approximate_objective_perturbation",
    "output_perturbation",
]


def data_sets(count: int = 2, n: int = 20, d: int = 2):
    X = jax.random.normal(jax.random.key(1), (count, n, d))
    X = X / jnp.maximum(jnp.linalg.norm(X, axis=-1, keepdims=True), 1.0)
    y = jnp.sign(jax.random.normal(jax.random.key(2), (count, n)))
    return X, y


def output_perturbation(key, X, y):
    return erm.output_perturbation(
        key, X, y, loss=losses.logistic, mu=0.1, epsilon=1.0, delta=1e-5
    ).params


def test_every_public_erm_release_is_guarded_on_its_data():
    keyed = {
        name
        for name in dir(erm)
        if inspect.isfunction(getattr(erm, name))
        and next(iter(inspect.signature(getattr(erm, name)).parameters), None) == "key"
    }
    assert keyed == set(RELEASES) - {"noisy_gradient_descent"}  # the iterative module's base
    for name in RELEASES:
        release = getattr(erm, name, None) or getattr(iterative, name)
        assert release.__dpjax_guarded_values__ == ("X", "y")


def test_one_key_for_several_data_sets_is_refused():
    X, y = data_sets()
    with pytest.raises(ValueError, match="key must be batched by every jax.vmap that batches X"):
        jax.vmap(lambda a, b: output_perturbation(KEY, a, b))(X, y)


@pytest.mark.slow
def test_distinct_keys_per_data_set_give_distinct_noise():
    X, y = data_sets()
    keys = jax.random.split(KEY, 2)
    released = jax.vmap(output_perturbation)(keys, X, y)
    exact = jax.vmap(lambda a, b: erm.solve(a, b, loss=losses.logistic, mu=0.1).params)(X, y)
    noise = np.asarray(released - exact)
    assert np.all(np.isfinite(noise)) and not np.allclose(noise[0], noise[1])
