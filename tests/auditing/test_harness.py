"""The audit harness: independent keys for D and D′, chunking, scores, argument checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dpjax
from dpjax import auditing


def gaussian_noise(k, x):
    return x + jax.random.normal(k, jnp.shape(x), jnp.result_type(float))


def test_d_and_dprime_runs_use_independent_keys():
    # With common random numbers the scores on D′ would be those on D shifted by 1e-3: perfect
    # separation and a huge epsilon. Independent keys: the shift is invisible.
    r = auditing.audit(gaussian_noise, 0.0, 1e-3, key=jax.random.key(1), trials=20_000)
    assert r.epsilon_lb < 0.1


def test_run_trials_is_reproducible_and_chunking_does_not_change_results():
    key = jax.random.key(2)
    a = auditing.run_trials(gaussian_noise, 0.0, key=key, trials=1000)
    b = auditing.run_trials(gaussian_noise, 0.0, key=key, trials=1000, chunk_size=300)
    np.testing.assert_array_equal(a, b)
    c = auditing.run_trials(gaussian_noise, 0.0, key=jax.random.key(3), trials=1000)
    assert not np.any(a == c)
    assert a.shape == (1000,) and a.dtype == np.float64
    assert abs(a.std() - 1.0) < 5 * 1.0 / np.sqrt(2 * 1000)  # 5 standard errors of the sd


def test_mechanism_that_needs_concrete_data_still_runs():
    def needs_concrete(k, x):
        return float(x) + jax.random.normal(k, (), jnp.result_type(float))

    s = auditing.run_trials(needs_concrete, 0.0, key=jax.random.key(4), trials=64)
    assert s.shape == (64,)


def test_repetitions_are_independent_and_summarised():
    r = auditing.audit_repeated(
        gaussian_noise, 0.0, 1.0, key=jax.random.key(5), trials=4000, repetitions=4,
        estimator="gdp", delta=1e-5, claimed_epsilon=5.0, assume_gaussian_tradeoff=True,
    )  # fmt: skip
    assert len(set(r.epsilons)) == 4
    s = r.summary()
    assert s["repetitions"] == 4 and s["exceed_count"] == 0 and s["method"] == "gdp"
    assert s["ratio"] == pytest.approx(r.epsilon_lb / 5.0)
    assert 0.6 < s["mu_lb_median"] <= 1.0  # the pair is exactly 1-GDP
    assert r.is_heuristic and "Gaussian" in s["conditional_on"]


def test_vector_output_needs_a_score():
    with pytest.raises(ValueError, match="score"):
        auditing.run_trials(gaussian_noise, jnp.zeros(3), key=jax.random.key(6), trials=8)
    s = auditing.run_trials(
        gaussian_noise, jnp.zeros(3), key=jax.random.key(6), trials=8, score=lambda y: y[0]
    )
    assert s.shape == (8,)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(trials=0), "trials"),
        (dict(trials=10, estimator="best"), "estimator"),
        (dict(trials=10, repetitions=0), "repetitions"),
        (dict(trials=10, claimed_epsilon=-1.0), "claimed_epsilon"),
        (dict(trials=10, estimator="gdp", delta=1e-5), "assume_gaussian_tradeoff"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        auditing.audit_repeated(gaussian_noise, 0.0, 1.0, key=jax.random.key(0), **kwargs)


def test_concrete_data_fallback_with_several_chunks():
    def needs_concrete(k, x):
        return float(x) + jax.random.normal(k, (), jnp.result_type(float))

    a = auditing.run_trials(needs_concrete, 2.0, key=jax.random.key(8), trials=100, chunk_size=30)
    b = auditing.run_trials(gaussian_noise, 2.0, key=jax.random.key(8), trials=100)
    np.testing.assert_allclose(a, b)  # same keys, same noise, same result


def laplace_1dp(k, x):
    return dpjax.mechanisms.laplace(k, x, sensitivity=1.0, epsilon=1.0)


def test_gdp_audit_of_laplace_needs_the_assumption_and_is_labelled():
    # issue 13 finding 9: the exact 1-DP Laplace mechanism audited with the GDP estimator gave
    # ε_LB ≈ 4.45 > 1 at δ = 1e-5, a false alarm. Without the stated assumption it is refused.
    run = dict(key=jax.random.key(9), trials=20_000, delta=1e-5, claimed_epsilon=1.0)
    with pytest.raises(ValueError, match="assume_gaussian_tradeoff must be True"):
        auditing.audit(laplace_1dp, 0.0, 1.0, estimator="gdp", **run)
    r = auditing.audit(laplace_1dp, 0.0, 1.0, estimator="gdp", assume_gaussian_tradeoff=True, **run)
    assert r.is_heuristic and r.summary()["conditional_on"] is not None
    assert r.exceed_count == 1  # the (false) assumption makes the heuristic exceed ε = 1
    d = auditing.audit(laplace_1dp, 0.0, 1.0, **run)  # the assumption-free estimator
    assert not d.is_heuristic and d.summary()["conditional_on"] is None and d.exceed_count == 0


def test_mechanism_with_data_dependent_privacy_parameter_falls_back_to_concrete_data():
    # the traced privacy parameter is refused inside the vmapped run (TracedParameterError);
    # the harness then closes over the concrete data, as for any mechanism needing it
    def eps_from_data(k, x):
        return dpjax.mechanisms.laplace(k, 0.0, sensitivity=1.0, epsilon=x)

    s = auditing.run_trials(eps_from_data, 2.0, key=jax.random.key(10), trials=64)
    assert s.shape == (64,) and np.all(np.isfinite(s))
