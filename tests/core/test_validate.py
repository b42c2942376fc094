import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy import stats

import dpjax
from dpjax import _validate
from dpjax import mechanisms as M
from dpjax.relation import ADD_OR_REMOVE_ONE, REPLACE_ONE, as_relation


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, "x", None])
def test_epsilon_rejects(bad):
    with pytest.raises(ValueError, match="epsilon must be in \\(0, inf\\)"):
        _validate.epsilon("epsilon", bad)


@pytest.mark.parametrize("bad", [-0.1, 1.0, 2.0, math.nan])
def test_delta_rejects(bad):
    with pytest.raises(ValueError, match="delta must be in \\[0.0, 1.0\\)"):
        _validate.delta("delta", bad)


def test_accepts_good_values():
    assert _validate.epsilon("epsilon", 0.5) == 0.5
    assert _validate.delta("delta", 0.0) == 0.0
    assert _validate.positive_int("steps", 3) == 3
    assert _validate.probability("q", 1.0) == 1.0


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "3"])
def test_positive_int_rejects(bad):
    with pytest.raises(ValueError, match="steps must be a positive integer"):
        _validate.positive_int("steps", bad)


def test_message_names_value():
    with pytest.raises(ValueError, match="got -3"):
        _validate.positive("sensitivity", -3)


def test_relation_parsing():
    assert as_relation("replace_one") is REPLACE_ONE
    assert as_relation(ADD_OR_REMOVE_ONE) is ADD_OR_REMOVE_ONE
    with pytest.raises(ValueError, match="relation must be one of"):
        as_relation("swap")


# --- issue 13 finding 8 / issue 12 finding 10: coercion of privacy parameters at the boundary ---

_REAL_CHECKS = [
    lambda v: _validate.epsilon("epsilon", v),
    lambda v: _validate.delta("epsilon", v),
    lambda v: _validate.positive("epsilon", v),
    lambda v: _validate.non_negative("epsilon", v),
    lambda v: _validate.in_range("epsilon", v, 0.0, 2.0),
    lambda v: _validate.probability("epsilon", v),
    lambda v: _validate.positive_int("epsilon", v),
]


@pytest.mark.parametrize("check", _REAL_CHECKS)
@pytest.mark.parametrize("bad", [True, False, np.bool_(True), "1", "0.5", b"1", [1.0], None, 1j])
def test_bool_str_and_non_numbers_refused_by_name(check, bad):
    # epsilon=True and epsilon="1" used to be accepted (returned unchanged) as 1.0
    with pytest.raises(ValueError, match="^epsilon must be .*; got "):
        check(bad)


@pytest.mark.parametrize("check", _REAL_CHECKS)
def test_multi_element_and_bool_arrays_refused(check):
    for bad in (np.array([0.5]), jnp.ones(2) * 0.5, np.array(True), jnp.array(True)):
        with pytest.raises(ValueError, match="^epsilon must be"):
            check(bad)


@pytest.mark.parametrize(
    "value",
    [
        np.float32(0.1),
        np.float64(0.1),
        np.float16(0.1),
        np.array(0.1, dtype=np.float32),
        jnp.asarray(0.1, dtype=jnp.float32),
        jnp.asarray(0.1, dtype=jnp.bfloat16),
        0.1,
    ],
)
def test_real_helpers_return_python_floats(value):
    # 12.10: a float32 sampling rate must be a Python float before any arithmetic
    expected = float(np.asarray(value, dtype=np.float64)) if not hasattr(value, "device") else None
    for out in (
        _validate.epsilon("epsilon", value),
        _validate.delta("delta", value),
        _validate.probability("sampling_rate", value),
        _validate.positive("sigma", value),
        _validate.non_negative("sigma", value),
        _validate.in_range("rho", value, 0.0, 1.0),
    ):
        assert type(out) is float
        if expected is not None:
            assert out == expected  # exact: float32 → float64 is exact
        assert out == pytest.approx(0.1, rel=1e-2)


def test_int_beyond_float64_refused_not_overflowing():
    with pytest.raises(ValueError, match="epsilon must be in \\(0, inf\\)"):
        _validate.epsilon("epsilon", 10**400)


def test_positive_int_coerces_numpy_and_0d_arrays():
    for value in (3, 3.0, np.int32(3), np.int64(3), np.float32(3.0), np.array(3), jnp.array(3)):
        out = _validate.positive_int("steps", value)
        assert type(out) is int and out == 3
    for bad in (np.float32(2.5), math.inf, math.nan, np.array([3])):
        with pytest.raises(ValueError, match="steps must be a positive integer"):
            _validate.positive_int("steps", bad)


def test_one_of_refuses_bool_for_int_and_returns_the_choice():
    assert _validate.one_of("noise", np.str_("laplace"), ("laplace", "gaussian")) == "laplace"
    assert type(_validate.one_of("noise", np.str_("laplace"), ("laplace",))) is str
    with pytest.raises(ValueError, match="k must be one of"):
        _validate.one_of("k", True, (1, 2))


_PHRASE = "privacy parameters are public constants: pass a Python number, not a traced value"


@pytest.mark.parametrize("check", _REAL_CHECKS + [lambda v: _validate.one_of("epsilon", v, (1,))])
def test_traced_privacy_parameters_refused_by_name(check):
    def run(v):
        check(v)
        return v

    with pytest.raises(_validate.TracedParameterError, match="^epsilon must be") as info:
        jax.jit(run)(0.5)
    assert _PHRASE in str(info.value)
    assert isinstance(info.value, TypeError)


def test_dpsgd_with_traced_negative_noise_multiplier_is_refused():
    # used to build a transform with σ = −1 (validation skipped for tracers) and run
    def step(sigma):
        tx = dpjax.dp_sgd_optimizer(
            optimizer=optax.sgd(0.1),
            noise_multiplier=sigma,
            l2_clip_norm=1.0,
            normalizer=1.0,
            key=jax.random.key(0),
        )
        params = jnp.zeros(2)
        return tx.update(jnp.ones(2), tx.init(params), params)[0]

    with pytest.raises(TypeError, match="noise_multiplier must be .*public constants"):
        jax.jit(step)(-1.0)


def test_laplace_and_output_perturbation_with_traced_epsilon_name_it():
    # used to fail with an unexplained ConcretizationTypeError
    lap = jax.jit(
        lambda e: dpjax.mechanisms.laplace(jax.random.key(0), 0.0, sensitivity=1.0, epsilon=e)
    )
    with pytest.raises(TypeError, match=f"^epsilon must be .*{_PHRASE}"):
        jax.jit(lap)(1.0)
    X = jnp.eye(4, 2) * 0.5
    y = jnp.array([1.0, -1.0, 1.0, -1.0])

    def op(e):
        return dpjax.erm.output_perturbation(
            jax.random.key(0), X, y, loss=dpjax.erm.losses.logistic, mu=0.1, epsilon=e, delta=1e-5
        ).params

    with pytest.raises(TypeError, match=f"epsilon must be .*{_PHRASE}"):
        jax.jit(op)(1.0)


def test_string_noise_multiplier_refused_before_accounting():
    # noise_multiplier="1" passed validation and failed inside dp-accounting
    with pytest.raises(ValueError, match="^noise_multiplier must be in \\[0, inf\\); got '1'"):
        dpjax.accounting.dp_sgd_epsilon(
            noise_multiplier="1", sampling_rate=0.01, steps=10, delta=1e-5
        )


def _exact_gaussian_delta(ratio: float, eps: float) -> float:
    """Balle & Wang 2018, Thm 8, with Δ = 1 and σ = ratio, by scipy (independent code)."""
    return stats.norm.cdf(0.5 / ratio - eps * ratio) - math.exp(eps) * stats.norm.cdf(
        -0.5 / ratio - eps * ratio
    )


@pytest.mark.parametrize("sensitivity", [1e-300, 1e-160, 1e-100, 1e250])
@pytest.mark.parametrize("calibration", ["analytic", "classic"])
def test_gaussian_sigma_at_extreme_sensitivities(sensitivity, calibration):
    # gaussian(sensitivity=1e-300) used to fail with "sigma must be in (0, inf); got 0.0": the
    # bisection's geometric mean sqrt(lo * hi) underflowed to 0 for σ below ~1e-154.
    eps, delta = 0.5, 1e-5
    sigma = M.gaussian_sigma(
        sensitivity=sensitivity, epsilon=eps, delta=delta, calibration=calibration
    )
    ratio = sigma / sensitivity
    assert _exact_gaussian_delta(ratio * (1 - 1e-12), eps) <= delta * (1 + 1e-9)
    if calibration == "classic":
        assert ratio == pytest.approx(math.sqrt(2 * math.log(1.25 / delta)) / eps, rel=1e-14)
    else:  # the smallest σ: at 0.99·σ the exact δ(ε) exceeds δ
        assert _exact_gaussian_delta(0.99 * ratio, eps) > delta
    y = M.gaussian(jax.random.key(0), jnp.zeros(()), sensitivity=sensitivity, epsilon=eps,
                   delta=delta, calibration=calibration)  # fmt: skip
    assert jnp.isfinite(y) and y != 0.0


@pytest.mark.parametrize("sensitivity", [5e-324, 1e-309, 1e308])
@pytest.mark.parametrize("calibration", ["analytic", "classic"])
def test_gaussian_sigma_out_of_float_range_blames_sensitivity(sensitivity, calibration):
    # σ = ratio·Δ would be subnormal/zero (almost no noise) or infinite: name Δ and its range
    with pytest.raises(ValueError, match="^sensitivity must be in \\[.*, .*\\] for epsilon=0.5"):
        M.gaussian_sigma(sensitivity=sensitivity, epsilon=0.5, delta=1e-5, calibration=calibration)
