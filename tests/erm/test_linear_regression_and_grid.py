"""Sufficient-statistics linear regression and the exponential mechanism over a hypothesis grid."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from dpjax import ADD_OR_REMOVE_ONE
from dpjax.erm import (
    exponential_mechanism_grid,
    losses,
    noisy_sufficient_statistics_regression,
    objective,
)
from dpjax.erm.hypothesis_grid import grid_score_sensitivity, hypothesis_grid
from dpjax.erm.linear_regression import sufficient_statistics_sensitivity
from dpjax.mechanisms import analytic_gaussian_sigma
from tests.erm.test_solver import sphere_data


def regression_data(n, d, seed):
    X, _ = sphere_data(n, d, seed)
    rng = np.random.default_rng(seed)
    y = np.clip(X @ np.full(d, 0.5) + 0.05 * rng.normal(size=n), -1, 1)
    return X, y


def test_sufficient_statistics_sensitivity_and_sigma():
    assert sufficient_statistics_sensitivity(label_bound=1.0) == pytest.approx(2 * math.sqrt(2))
    assert sufficient_statistics_sensitivity(
        label_bound=2.0, relation=ADD_OR_REMOVE_ONE
    ) == pytest.approx(math.sqrt(5))
    # measured: one record's statistics vector never exceeds √(1 + B²)
    rng = np.random.default_rng(0)
    for _ in range(100):
        x = rng.normal(size=3)
        x /= np.linalg.norm(x)
        v = np.concatenate([np.outer(x, x)[np.triu_indices(3)], x * 1.0])
        assert np.linalg.norm(v) <= math.sqrt(2) + 1e-12
    X, y = regression_data(100, 3, seed=1)
    res = noisy_sufficient_statistics_regression(
        jax.random.key(0), X, y, mu=0.01, epsilon=1.0, delta=1e-5
    )
    ref = analytic_gaussian_sigma(sensitivity=2 * math.sqrt(2), epsilon=1.0, delta=1e-5)
    assert res.noise_scale == pytest.approx(ref)
    assert res.event.noise_multiplier == pytest.approx(ref / (2 * math.sqrt(2)))


def test_sufficient_statistics_regression_is_consistent():
    """With large n the private ridge estimate approaches the exact ridge solution."""
    X, y = regression_data(20000, 2, seed=2)
    mu = 0.01
    exact = np.linalg.solve(X.T @ X / len(y) + mu * np.eye(2), X.T @ y / len(y))
    keys = jax.random.split(jax.random.key(1), 50)
    res = jax.jit(
        jax.vmap(
            lambda k: noisy_sufficient_statistics_regression(
                k, X, y, mu=mu, epsilon=1.0, delta=1e-5
            )
        )
    )(keys)
    err = np.linalg.norm(np.asarray(res.params) - exact, axis=1)
    assert np.median(err) < 0.05
    with pytest.raises(ValueError, match="delta"):
        noisy_sufficient_statistics_regression(keys[0], X, y, mu=mu, epsilon=1.0, delta=0.0)


def test_grid_exponential_mechanism_law_and_bound():
    """Selection frequencies follow softmax(−εJ/(2Δ)) (chi-square), and the excess is bounded."""
    n, radius, res_ = 50, 2.0, 9
    X, y = sphere_data(n, 1, seed=3)  # d = 1: x = ±1
    grid = hypothesis_grid(d=1, radius=radius, resolution=res_)
    assert grid.shape == (9, 1)
    sens = grid_score_sensitivity(loss=losses.logistic, n=n, d=1, radius=radius)
    assert sens == pytest.approx(2 * radius / n)
    J = objective(losses.logistic, 0.0, jnp.asarray(X), jnp.asarray(y))
    values = np.asarray(jax.vmap(J)(grid))
    keys = jax.random.split(jax.random.key(2), 4000)
    out = jax.jit(
        jax.vmap(
            lambda k: exponential_mechanism_grid(
                k, X, y, loss=losses.logistic, epsilon=1.0, radius=radius, resolution=res_
            )
        )
    )(keys)
    idx = np.argmin(np.abs(np.asarray(out.params) - np.asarray(grid).T), axis=1)
    counts = np.bincount(idx, minlength=res_)

    def pvalue(temperature):
        logits = -values / temperature
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        keep = probs * len(keys) >= 5
        expected = probs[keep] / probs[keep].sum() * counts[keep].sum()
        return stats.chisquare(counts[keep], expected).pvalue

    assert pvalue(2 * sens / 1.0) > 1e-4  # temperature 2Δ/ε
    assert pvalue(1.5 * 2 * sens / 1.0) < 1e-4  # a 1.5× wrong temperature is rejected
    excess = np.asarray(jax.vmap(J)(out.params)) - values.min()
    assert excess.mean() <= out.excess_risk_bound
    assert out.event.epsilon == 1.0 and out.event.delta == 0.0


def test_grid_refuses_bad_input():
    X, y = sphere_data(20, 3, seed=4)
    with pytest.raises(ValueError, match="d must be"):
        exponential_mechanism_grid(
            jax.random.key(0), X, y, loss=losses.logistic, epsilon=1.0, radius=1.0
        )
    X2, y2 = sphere_data(20, 2, seed=4)
    with pytest.raises(ValueError, match="epsilon"):
        exponential_mechanism_grid(
            jax.random.key(0), X2, y2, loss=losses.logistic, epsilon=0.0, radius=1.0
        )
    with pytest.raises(ValueError, match="radius"):
        exponential_mechanism_grid(
            jax.random.key(0), X2, y2, loss=losses.squared, epsilon=1.0, radius=1.0
        )
