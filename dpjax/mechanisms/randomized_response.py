"""Randomized response (001_22975d579ade9c52.txt; Warner 1965): the coin protocol and k-ary RR.

Each respondent randomizes their own answer before it leaves their hands (local DP), so the
vector of reports is ε-DP under ``REPLACE_ONE`` (changing one person's answer changes only
their own report) and the frequency estimates are post-processing of it.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from dpjax import _validate
from dpjax._noise import tree_noise_like

__all__ = [
    "COIN_EPSILON",
    "coin_randomized_response",
    "randomized_response",
    "randomized_response_keep_probability",
    "randomized_response_epsilon",
    "randomized_response_frequencies",
]

COIN_EPSILON = math.log(3.0)
"""ε of the coin protocol of 001: P[truthful report] = 3/4, and (3/4)/(1/4) = 3."""


def randomized_response_keep_probability(*, epsilon: float, num_categories: int = 2) -> float:
    r"""Probability that k-ary randomized response reports the true category.

    .. math:: p = \frac{e^\varepsilon}{e^\varepsilon + k - 1},
        \qquad q = \frac{1}{e^\varepsilon + k - 1} \text{ for each other category.}

    This is the calibration of randomized response: its "noise level" is 1 − p.

    Args:
        epsilon: privacy parameter ε > 0.
        num_categories: number k ≥ 2 of possible answers (2 for yes/no).

    Returns:
        p, the probability of a truthful report.

    Formal guarantees:
        p/q = e^ε, so each report is ε-locally-DP (Warner 1965; Kairouz, Oh & Viswanath 2014
        "k-RR"; 001_22975d579ade9c52.txt for k = 2).

    Example:
        >>> round(randomized_response_keep_probability(epsilon=math.log(3.0)), 12)
        0.75
    """
    _validate.epsilon(epsilon)
    k = _num_categories(num_categories)
    # e^ε / (e^ε + k − 1) written as 1 / (1 + (k − 1) e^{−ε}) so it does not overflow.
    return 1.0 / (1.0 + (k - 1) * math.exp(-float(epsilon)))


def randomized_response_epsilon(*, keep_probability: float, num_categories: int = 2) -> float:
    """ε of k-ary randomized response that reports the truth with ``keep_probability``.

    ε = ln(p (k − 1) / (1 − p)); for the coin protocol (p = 3/4, k = 2) this is ln 3.

    Raises:
        ValueError: if p is not in (1/k, 1) (p ≤ 1/k gives no information or ε ≤ 0).
    """
    k = _num_categories(num_categories)
    _validate.in_range("keep_probability", keep_probability, 1.0 / k, 1.0, low_inclusive=False)
    p = float(keep_probability)
    return math.log(p * (k - 1) / (1.0 - p))


def coin_randomized_response(key: jax.Array, value: Any) -> Any:
    """The coin protocol of 001: flip a coin; heads → answer truthfully; tails → flip again.

    Args:
        key: a JAX PRNG key, used once.
        value: true binary answers (bool or integers in {0, 1}), one per respondent; an array
            or a pytree of arrays.

    Returns:
        The reports, with the structure and dtype of ``value``.

    Formal guarantees:
        Each report equals the truth with probability 1/2 + 1/4 = 3/4, so it is
        ε = ln 3 ≈ 1.0986 locally DP (``COIN_EPSILON``; 001_22975d579ade9c52.txt,
        "Example: Randomized Response"); the report vector is ln 3-DP under ``REPLACE_ONE``.
        Its reports have the law of ``randomized_response(epsilon=COIN_EPSILON)``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> coin_randomized_response(jax.random.key(0), jnp.array([True, False])).shape
        (2,)
    """
    first_key, second_key = jax.random.split(key)
    first = tree_noise_like(first_key, value, jax.random.uniform)
    second = tree_noise_like(second_key, value, jax.random.uniform)

    def respond(truth: Any, u1: jax.Array, u2: jax.Array) -> jax.Array:
        truth = jnp.asarray(truth)
        heads = u1 < 0.5
        random_answer = (u2 < 0.5).astype(truth.dtype)
        return jnp.where(heads, truth, random_answer)

    return jax.tree.map(respond, value, first, second)


def randomized_response(
    key: jax.Array, value: Any, *, epsilon: float, num_categories: int = 2
) -> Any:
    """k-ary randomized response: keep the true category w.p. p, else a uniform *other* one.

    Args:
        key: a JAX PRNG key, used once.
        value: true categories, integers in {0, …, k − 1} (bool allowed for k = 2), one per
            respondent: an array or a pytree of arrays. Values outside the range are not
            checked under ``jit``; the output is then meaningless (but still ε-DP).
        epsilon: privacy parameter ε > 0 of each report.
        num_categories: k ≥ 2.

    Returns:
        Reports with the structure and dtype of ``value``.

    Formal guarantees:
        P[report = true] = e^ε/(e^ε + k − 1) and P[report = j] = 1/(e^ε + k − 1) for every other
        j, so each report is ε-locally-DP and the report vector is ε-DP under ``REPLACE_ONE``
        (Warner 1965; 001_22975d579ade9c52.txt for k = 2; Kairouz, Oh & Viswanath 2014 for k-RR).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> y = randomized_response(jax.random.key(0), jnp.array([0, 2, 1]), epsilon=1.0,
        ...                         num_categories=3)
        >>> y.shape
        (3,)
    """
    k = _num_categories(num_categories)
    p = randomized_response_keep_probability(epsilon=epsilon, num_categories=k)
    uniforms = tree_noise_like(key, value, jax.random.uniform)

    def respond(truth: Any, u: jax.Array) -> jax.Array:
        truth = jnp.asarray(truth)
        as_int = truth.astype(jnp.int32)
        # One uniform drives both choices: given u ≥ p, (u − p)/(1 − p) is uniform on [0, 1),
        # and its floor times (k − 1) picks one of the k − 1 other categories uniformly.
        offset = jnp.floor((u - p) / (1.0 - p) * (k - 1)).astype(jnp.int32)
        other = (as_int + 1 + jnp.clip(offset, 0, k - 2)) % k
        return jnp.where(u < p, as_int, other).astype(truth.dtype)

    return jax.tree.map(respond, value, uniforms)


def randomized_response_frequencies(
    reports: jax.Array, *, epsilon: float, num_categories: int = 2
) -> jax.Array:
    r"""Unbiased estimate of the true category frequencies from k-RR reports.

    With observed frequencies :math:`\hat\lambda_j`, :math:`E\hat\lambda_j = p\pi_j + q(1-\pi_j)`,
    hence

    .. math:: \hat\pi_j = \frac{\hat\lambda_j - q}{p - q}.

    Args:
        reports: 1-D array of reports in {0, …, k − 1} (bool allowed for k = 2).
        epsilon: the ε the reports were produced with.
        num_categories: k.

    Returns:
        Array of shape (k,) (floating): unbiased estimates of the true frequencies; they sum
        to 1 but may fall outside [0, 1] (clip or project them if you need a distribution;
        that is post-processing and costs no privacy). For k = 2, entry 1 estimates the
        fraction of "yes".

    Formal guarantees:
        Post-processing of ε-DP reports, so ε-DP under ``REPLACE_ONE``; unbiased because
        E[λ̂] is affine in π with slope p − q > 0 (Warner 1965; Wang et al. 2017, USENIX
        Security, "direct encoding").

    Example:
        >>> import jax, jax.numpy as jnp
        >>> truth = jnp.zeros(1000, dtype=jnp.int32)
        >>> reports = randomized_response(jax.random.key(0), truth, epsilon=2.0)
        >>> randomized_response_frequencies(reports, epsilon=2.0).shape
        (2,)
    """
    k = _num_categories(num_categories)
    p = randomized_response_keep_probability(epsilon=epsilon, num_categories=k)
    q = (1.0 - p) / (k - 1)
    reports = jnp.asarray(reports)
    if reports.ndim != 1:
        _validate.fail("reports", reports.shape, "a 1-D array (one report per respondent)")
    if reports.shape[0] == 0:
        _validate.fail("reports", reports.shape, "non-empty")
    counts = jnp.sum(jax.nn.one_hot(reports.astype(jnp.int32), k), axis=0)
    observed = counts / reports.shape[0]
    return (observed - q) / (p - q)


def _num_categories(num_categories: int) -> int:
    k = _validate.positive_int("num_categories", num_categories)
    if k < 2:
        _validate.fail("num_categories", num_categories, "an integer >= 2")
    return k
