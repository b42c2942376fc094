"""Randomized response (Warner 1965): the coin protocol and k-ary RR, sampled exactly.

Each respondent randomizes their own answer before it leaves their hands (local DP), so the
vector of reports is ε-DP under ``REPLACE_ONE`` (changing one person's answer changes only
their own report) and the frequency estimates are post-processing of it (Dwork & Roth
2014, "Example: Randomized Response").

Sampling is integer-exact: each report is decided by one uniform 32-bit word compared with an
integer threshold, so its law is a known rational law whose ε is at most the claimed ε (float
uniforms compared with p would realise ⌈p·2²³⌉/2²³ in float32: P[lie] = 0 at ε = 17).

Domain rule: categories must be integers in {0, …, k − 1}. A concrete (eager) input outside
the domain — out of range, non-integer, NaN, ±inf — raises ``ValueError``; under ``jit`` /
``vmap`` such an entry is replaced by the public category 0 *before* the randomisation, so
every report is still a k-RR report of some in-domain category and the ε-DP guarantee holds
for every input.
"""

from __future__ import annotations

import decimal
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dpjax import _validate
from dpjax._noise import tree_noise_like
from dpjax.mechanisms._vmap_guard import guarded_release

__all__ = [
    "COIN_EPSILON",
    "RANDOM_WORDS",
    "coin_randomized_response",
    "randomized_response",
    "randomized_response_keep_probability",
    "randomized_response_epsilon",
    "randomized_response_frequencies",
    "randomized_response_other_weight",
]

COIN_EPSILON = math.log(3.0)
"""ε of the coin protocol: P[truthful report] = 3/4, and (3/4)/(1/4) = 3."""

RANDOM_WORDS = 2**32
"""Number of equally likely random words behind each report (one uint32 draw)."""

_MAX_CATEGORIES = 2**30  # truth + 1 + offset must stay inside int32


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
        "k-RR"; Dwork & Roth 2014, randomized response, for k = 2). The sampler
        realises this law to within 2⁻³² per category (``randomized_response_other_weight``).

    Example:
        >>> round(randomized_response_keep_probability(epsilon=math.log(3.0)), 12)
        0.75
    """
    _validate.epsilon("epsilon", epsilon)
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


def randomized_response_other_weight(*, epsilon: float, num_categories: int = 2) -> int:
    r"""m: how many of the 2³² random words map to each *other* category (integer-exact k-RR).

    .. math:: m = \left\lceil \frac{2^{32}}{e^\varepsilon + k - 1} \right\rceil,
        \qquad P[\text{report} = j \ne \text{truth}] = \frac{m}{2^{32}},
        \qquad P[\text{truth}] = \frac{2^{32} - (k-1)m}{2^{32}}.

    Computed with 60-digit decimal arithmetic, so m is the exact ceiling.

    Args:
        epsilon: the claimed ε > 0.
        num_categories: k ≥ 2.

    Returns:
        The integer m ≥ 1.

    Raises:
        ValueError: if ε is so small (≲ k²/2³²) that even m = ⌊2³²/k⌋ gives a ratio above
            e^ε, or if k > 2³⁰.

    Formal guarantees:
        The realised law has ε_real = ln((2³² − (k − 1)m)/m) with 0 ≤ ε_real ≤ ε: m ≥
        2³²/(e^ε + k − 1) gives the upper bound, k·m ≤ 2³² the lower one. ε_real < ε only by
        the resolution of 32 bits (relative ~(e^ε + k)/2³²); ε_real is never infinite (m ≥ 1).
        For ε ≳ 22.2, m = 1 and ε_real = ln(2³² − k + 1) ≈ 22.18: the reports are a little
        noisier than asked, never less private.

    Example:
        >>> randomized_response_other_weight(epsilon=math.log(3.0))  # 2^32 / 4, exactly
        1073741824
    """
    _validate.epsilon("epsilon", epsilon)
    k = _num_categories(num_categories)
    if float(epsilon) > 40.0:  # 2^32/(e^ε + k − 1) < 1: one word per other category
        m = 1
    else:
        with decimal.localcontext() as ctx:
            ctx.prec = 60
            ratio = decimal.Decimal(float(epsilon)).exp()
            exact = decimal.Decimal(RANDOM_WORDS) / (ratio + (k - 1))
            m = max(1, int(exact.to_integral_value(rounding=decimal.ROUND_CEILING)))
    if k * m > RANDOM_WORDS:
        _validate.fail(
            "epsilon",
            epsilon,
            f"large enough to be realised with 32-bit randomness for k = {k} "
            "(the truth must stay at least as likely as each other category)",
        )
    return m


def _random_words(key: jax.Array, value: Any) -> Any:
    """One uniform uint32 word per entry of every leaf (one fresh subkey per leaf)."""
    return tree_noise_like(key, value, lambda k, shape, _: jax.random.bits(k, shape, jnp.uint32))


def _check_category_dtype(leaf: Any, k: int) -> None:
    dtype = jnp.result_type(leaf)
    if dtype == jnp.bool_ and k > 2:
        _validate.fail("value", f"a bool array with num_categories={k}", "integers (bool: k = 2)")
    if jnp.issubdtype(dtype, jnp.integer) and jnp.iinfo(dtype).max < k - 1:
        _validate.fail("value", f"dtype {dtype}", f"an integer dtype that holds {k - 1}")


def _in_domain(truth: Any, k: int, xp: Any = jnp) -> Any:
    """Mask of entries that are integers in {0, …, k − 1} (False for NaN and ±inf).

    ``xp`` is ``jnp`` (traced values) or ``numpy`` (the eager check of a concrete value).
    """
    if truth.dtype == xp.bool_:
        return xp.ones(truth.shape, bool)
    ok = (truth >= 0) & (truth <= k - 1)
    if xp.issubdtype(truth.dtype, xp.inexact):
        ok = ok & (truth == xp.floor(truth))
    return ok


def _categories(name: str, leaf: Any, k: int) -> jax.Array:
    """The domain rule: ValueError for concrete out-of-domain entries, else map them to 0."""
    _check_category_dtype(leaf, k)
    if _validate.is_concrete(leaf):  # numpy: also correct while an outer jit traces
        values = np.asarray(leaf).ravel()
        ok = _in_domain(values, k, np)
        if not np.all(ok):
            _validate.fail(
                name, f"an array containing {values[~ok][0].item()!r}", f"integers in [0, {k - 1}]"
            )
    truth = jnp.asarray(leaf)
    ok = _in_domain(truth, k)
    return jnp.where(ok, truth, jnp.zeros((), truth.dtype)).astype(jnp.int32)


def _respond(category: jax.Array, words: jax.Array, *, other_weight: int, k: int) -> jax.Array:
    """k-RR from one uint32 word: lie iff w < (k − 1)m, to truth + 1 + (w mod (k − 1))."""
    lie = words < jnp.uint32((k - 1) * other_weight)
    offset = (words % jnp.uint32(k - 1)).astype(jnp.int32)
    return jnp.where(lie, (category + 1 + offset) % k, category)


@guarded_release("value")
def coin_randomized_response(key: jax.Array, value: Any) -> Any:
    """The coin protocol: flip a coin; heads → answer truthfully; tails → flip again.

    Args:
        key: a JAX PRNG key, used once.
        value: true binary answers (bool or integers in {0, 1}), one per respondent; an array
            or a pytree of arrays. Out-of-domain entries: ``ValueError`` when concrete, the
            public answer 0 under ``jit`` (see the module docstring).

    Returns:
        The reports, with the structure and dtype of ``value``.

    Formal guarantees:
        The two coins are two bits of one uniform 32-bit word, so each report equals the truth
        with probability exactly 1/2 + 1/4 = 3/4: ε = ln 3 ≈ 1.0986 locally DP
        (``COIN_EPSILON``; Dwork & Roth 2014, "Example: Randomized Response"); the
        report vector is ln 3-DP under ``REPLACE_ONE``, for every input. Its reports have the
        law of ``randomized_response(epsilon=COIN_EPSILON)``.
        Under ``jax.vmap``: each row of a vmap that batches ``key`` with distinct keys is its own
        release with this guarantee (account for every row); a vmap of ``value`` with one key for
        all rows raises ``ValueError``, and repeated keys in the batch raise eagerly and void the
        release under ``jit`` (the dtype's minimum, or maximum if unsigned; bool: False): rows that
        share a key share one noise draw and would release their differences noise-free.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> coin_randomized_response(jax.random.key(0), jnp.array([True, False])).shape
        (2,)
    """
    words = _random_words(key, value)

    def respond(truth: Any, w: jax.Array) -> jax.Array:
        answer = _categories("value", truth, 2)
        heads = (w & jnp.uint32(1)) == jnp.uint32(1)
        second = ((w >> jnp.uint32(1)) & jnp.uint32(1)).astype(jnp.int32)
        return jnp.where(heads, answer, second).astype(jnp.asarray(truth).dtype)

    return jax.tree.map(respond, value, words)


@guarded_release("value")
def randomized_response(
    key: jax.Array, value: Any, *, epsilon: float, num_categories: int = 2
) -> Any:
    """k-ary randomized response: keep the true category w.p. p, else a uniform *other* one.

    Args:
        key: a JAX PRNG key, used once.
        value: true categories, integers in {0, …, k − 1} (bool allowed for k = 2), one per
            respondent: an array or a pytree of arrays. Out-of-domain entries (out of range,
            non-integer, NaN, ±inf) raise ``ValueError`` when concrete and are replaced by the
            public category 0 under ``jit`` (module docstring).
        epsilon: privacy parameter ε > 0 of each report.
        num_categories: k ≥ 2 (at most 2³⁰).

    Returns:
        Reports with the structure and dtype of ``value``.

    Formal guarantees:
        Each report is drawn from one uniform 32-bit word w: it is a lie iff w < (k − 1)m,
        m = ``randomized_response_other_weight(epsilon, k)``, and then names the category
        truth + 1 + (w mod (k − 1)) (mod k). So P[report = j] = m/2³² for every j ≠ truth and
        P[report = truth] = 1 − (k − 1)m/2³², whose ratio is ≤ e^ε: each report is
        ε-locally-DP (exactly, not only in real arithmetic) and the report vector is ε-DP under
        ``REPLACE_ONE``, for every input (Warner 1965; Dwork & Roth 2014 for
        k = 2; Kairouz, Oh & Viswanath 2014 for k-RR). The realised law differs from the
        ideal p = e^ε/(e^ε + k − 1) by less than 2⁻³² per category.
        Under ``jax.vmap``: each row of a vmap that batches ``key`` with distinct keys is its own
        release with this guarantee (account for every row); a vmap of ``value`` with one key for
        all rows raises ``ValueError``, and repeated keys in the batch raise eagerly and void the
        release under ``jit`` (the dtype's minimum, or maximum if unsigned; bool: False): rows that
        share a key share one noise draw and would release their differences noise-free.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> y = randomized_response(jax.random.key(0), jnp.array([0, 2, 1]), epsilon=1.0,
        ...                         num_categories=3)
        >>> y.shape
        (3,)
    """
    k = _num_categories(num_categories)
    m = randomized_response_other_weight(epsilon=epsilon, num_categories=k)
    words = _random_words(key, value)

    def respond(truth: Any, w: jax.Array) -> jax.Array:
        category = _categories("value", truth, k)
        report = _respond(category, w, other_weight=m, k=k)
        return report.astype(jnp.asarray(truth).dtype)

    return jax.tree.map(respond, value, words)


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
    if not 2 <= k <= _MAX_CATEGORIES:
        _validate.fail("num_categories", num_categories, f"an integer in [2, {_MAX_CATEGORIES}]")
    return k
