"""The exponential mechanism and report-noisy-max over a finite candidate set.

Both select an index from a vector of scores u(D, q) whose sensitivity
Δ = max_q max_{D~D'} |u(D, q) − u(D', q)| is taken under the caller's neighbouring relation
(Dwork & Roth 2014, "the exponential mechanism" and "report noisy-max"; Bassily, Smith, Thakurta
2014, "the exponential mechanism for ML").
The exponential mechanism is sampled with the Gumbel-max trick:
argmax_q (εu_q/(2Δ) + G_q), G_q iid standard Gumbel, has law softmax(εu/(2Δ)).

Non-finite scores: a score with bounded sensitivity cannot be NaN or ±inf, so a concrete
(eager) score array with such an entry raises ``ValueError``. Under ``jit``/``vmap`` every row
is first mapped by a fixed rule — NaN → the row's lowest finite score, ±inf → clipped to the
row's finite range, a row without finite score → all zeros — which is the identity on finite
rows; an argmax over NaN or +inf (a data-dependent, deterministic pick) never happens.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dpjax import _random, _validate
from dpjax._noise import (
    check_scale_representable,
    exact_in,
    exact_sum_with_noise,
    float_dtype_of,
    scale_rounded_up,
    tree_noise_like,
)
from dpjax._random import noise_dtype
from dpjax.mechanisms._nonfinite import refuse_nonfinite, sanitise_scores
from dpjax.mechanisms._vmap_guard import guarded_release

__all__ = [
    "exponential_mechanism",
    "exponential_mechanism_scale",
    "exponential_mechanism_probabilities",
    "exponential_mechanism_utility_bound",
    "exponential_mechanism_expected_gap_bound",
    "report_noisy_max",
    "report_noisy_max_scale",
]


def exponential_mechanism_scale(
    *, sensitivity: float, epsilon: float, monotonic: bool = False
) -> float:
    r"""Temperature of the exponential mechanism: :math:`2\Delta/\varepsilon` (Δ/ε if monotonic).

    P[Q = q] ∝ exp(u_q / scale); equivalently the scale of the Gumbel noise added to the scores.

    Args:
        sensitivity: score sensitivity Δ > 0 under the caller's neighbouring relation.
        epsilon: ε > 0.
        monotonic: True when, for every pair of neighbours, all scores move in the same
            direction (e.g. counts under add/remove-one); then Δ/ε suffices
            (McSherry & Talwar 2007; Dwork & Roth 2014, remark after Thm 3.10).

    Returns:
        The temperature 2Δ/ε (or Δ/ε).

    Example:
        >>> exponential_mechanism_scale(sensitivity=1.0, epsilon=0.5)
        4.0
    """
    _validate.positive("sensitivity", sensitivity)
    _validate.epsilon("epsilon", epsilon)
    factor = 1.0 if monotonic else 2.0
    return factor * float(sensitivity) / float(epsilon)


def _check_scores(scores: Any) -> Any:
    """The scores, checked, and NOT rounded: a concrete host array (float64, wide integers)
    stays in numpy so that :func:`_noisy_scores` adds the noise to the exact values; integer
    scores keep their dtype (finite by construction); float scores get the non-finite rule."""
    host = not isinstance(scores, jax.Array) and _validate.is_concrete(scores)
    scores = np.asarray(scores) if host else jnp.asarray(scores)
    if scores.ndim == 0 or scores.shape[-1] == 0:
        _validate.fail("scores", scores.shape, "an array with a non-empty last axis (candidates)")
    if scores.dtype == np.bool_:
        scores = scores.astype(np.int32) if host else scores.astype(jnp.int32)
    if not np.issubdtype(scores.dtype, np.floating) and scores.dtype.name != "bfloat16":
        return scores  # integers: finite, cast exactly (or clamped) with the noise
    refuse_nonfinite("scores", scores)
    if host and not exact_in(scores.dtype, noise_dtype(float_dtype_of(scores))):
        return scores  # concrete and finite (refused otherwise): sanitising is the identity
    return sanitise_scores(jnp.asarray(scores))


_NOISE_REACH = 46.0  # > 65·ln 2 = 45.05, the largest |noise| of _random.gumbel / exponential


def _noisy_scores(key: jax.Array, scores: jax.Array, sampler, scale: float) -> jax.Array:
    """u + T·Z in the wide dtype of the noise (at least float32), NOT cast back to u's dtype.

    Z is drawn by ``sampler`` (:func:`dpjax._random.gumbel` / :func:`~dpjax._random.exponential`,
    64 random bits) in ``noise_dtype(u.dtype)``: bfloat16 / float16 scores get float32 noise
    (16-bit noise takes 128 / 1024 values in [−4.5, 4.8] / [−2.3, 6.9]: a candidate a few
    temperatures below the best was never selected) and the argmax is taken on the float32 sum
    (a 16-bit sum ties often, and ties go to the lowest index).
    """
    noise = tree_noise_like(key, jnp.zeros(np.shape(scores), float_dtype_of(scores)), sampler)
    check_scale_representable(scale, noise.dtype)
    if not scale * _NOISE_REACH <= float(jnp.finfo(noise.dtype).max):
        _validate.fail(
            "sensitivity / epsilon",
            scale,
            f"a temperature T with T·{_NOISE_REACH} finite in {jnp.dtype(noise.dtype).name}",
        )
    # float64 / wide-integer scores are never rounded to float32 first (neighbouring scores 1
    # apart became 4 apart: ln-ratio 3.6 at ε = 2). Concrete ones are summed with the noise in
    # float64 on the host and the argmax is taken THERE: only the index is private (the noisy
    # vector is not), so a rounding between the sum and the argmax would not be
    # post-processing.
    if isinstance(scores, np.ndarray) and not exact_in(scores.dtype, noise.dtype):
        w = scale_rounded_up(scale, noise.dtype) * noise  # T·Z, T never rounded below
        if _validate.is_concrete(w):
            return scores.astype(np.float64) + np.asarray(w, np.float64)
    return exact_sum_with_noise(scores, noise, scale, out_dtype=noise.dtype)


def _argmax(noisy: Any) -> jax.Array:
    """The released index: numpy's argmax of a host float64 sum, else JAX's."""
    if isinstance(noisy, np.ndarray):
        return jnp.asarray(np.argmax(noisy, axis=-1).astype(np.int32))
    return jnp.argmax(noisy, axis=-1)


@guarded_release("scores")
def exponential_mechanism(
    key: jax.Array,
    scores: jax.Array,
    *,
    sensitivity: float,
    epsilon: float,
    monotonic: bool = False,
) -> jax.Array:
    r"""Select a candidate index q with probability ∝ exp(εu_q/(2Δ)) (Gumbel-max trick).

    Args:
        key: a JAX PRNG key, used once.
        scores: u(D, ·), shape (..., d); candidates along the last axis (d ≥ 1). Leading
            axes are independent selections. Non-finite entries: ``ValueError`` when
            concrete, the module's fixed rule under ``jit``.
        sensitivity: score sensitivity Δ > 0 (the same Δ for every candidate).
        epsilon: ε > 0.
        monotonic: see ``exponential_mechanism_scale``.

    Returns:
        Integer index array of shape ``scores.shape[:-1]``.

    Formal guarantees:
        ε-DP under the relation Δ holds for (Dwork & Roth 2014, Theorem 3.10
        (exponential mechanism); McSherry & Talwar 2007, Thm 6), for every input: the
        non-finite rule is applied before the scores are used. Utility: Dwork & Roth 2014,
        Theorem 3.11, see ``exponential_mechanism_utility_bound``. The Gumbel-max identity
        P[argmax_q(u_q/T + G_q) = q] = softmax(u/T)_q is exact (Gumbel 1954; Yellott 1977) in
        real arithmetic. As the code runs: the Gumbel noise is drawn from 64 random bits in
        at least float32 (16-bit scores included, :func:`dpjax._random.gumbel`) and added and
        compared in that dtype; its range is [−3.81, 45.05] (float32 and float64), so a
        candidate whose score is more than T·48.86 below the best is never selected although
        its ideal probability is positive, below e^{−48.86} = 6e-22 per such candidate (a δ
        floor; pure ε = ∞ only for pairs straddling that gap). (``jax.random.gumbel`` had
        [−4.47, 15.94] in float32, a floor of 1.4e-9, and 1024 values in [−2.27, 6.93] for
        float16 scores.) Scores are never rounded before the noise: float64 or wide-integer
        scores are added to the noise in float64 on the host (concrete) or clamped 1-Lipschitz
        into float32's exact range (traced integers), then rounded once
        (:func:`dpjax._noise.exact_sum_with_noise`).
        Under ``jax.vmap``: each row of a vmap that batches ``key`` with distinct keys is its own
        release with this guarantee (account for every row); a vmap of ``scores`` with one key for
        all rows raises ``ValueError``, and repeated keys in the batch raise eagerly and void the
        release under ``jit`` (the index dtype's minimum): rows that share a key share one noise
        draw and would release their differences noise-free.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> i = exponential_mechanism(jax.random.key(0), jnp.array([15.0, 20.0, 25.0]),
        ...                           sensitivity=1.0, epsilon=1.0)
        >>> i.shape
        ()
    """
    scale = exponential_mechanism_scale(
        sensitivity=sensitivity, epsilon=epsilon, monotonic=monotonic
    )
    scores = _check_scores(scores)
    # argmax(u/T + G) = argmax(u + T·G), with G from 64 random bits in at least float32.
    return _argmax(_noisy_scores(key, scores, _random.gumbel, scale))


def exponential_mechanism_probabilities(
    scores: jax.Array, *, sensitivity: float, epsilon: float, monotonic: bool = False
) -> jax.Array:
    """The selection probabilities softmax(εũ/(2Δ)) of ``exponential_mechanism``.

    ũ is ``scores`` after the non-finite rule (a concrete non-finite score raises).
    """
    scale = exponential_mechanism_scale(
        sensitivity=sensitivity, epsilon=epsilon, monotonic=monotonic
    )
    return jax.nn.softmax(_check_scores(scores) / scale, axis=-1)


def exponential_mechanism_utility_bound(
    *, sensitivity: float, epsilon: float, num_candidates: int, t: float
) -> float:
    r"""Utility lemma: P[u(Q) < u* − 2Δ(ln d + t)/ε] ≤ e^{−t}; returns 2Δ(ln d + t)/ε.

    Args:
        sensitivity: score sensitivity Δ.
        epsilon: ε > 0.
        num_candidates: d, the size of the candidate set.
        t: t > 0; the bound fails with probability at most e^{−t}.

    Returns:
        The utility gap ψ_t = 2Δ(ln d + t)/ε.

    Formal guarantees:
        Dwork & Roth 2014, Theorem 3.11 (finite candidate set of size d); McSherry &
        Talwar 2007; Dwork & Roth 2014, Thm 3.11.
    """
    _validate.positive("sensitivity", sensitivity)
    _validate.epsilon("epsilon", epsilon)
    d = _validate.positive_int("num_candidates", num_candidates)
    _validate.positive("t", t)
    return 2.0 * float(sensitivity) * (math.log(d) + float(t)) / float(epsilon)


def exponential_mechanism_expected_gap_bound(
    *, sensitivity: float, epsilon: float, num_candidates: int
) -> float:
    r"""Bound on the expected utility loss: :math:`u^* - E[u(Q)] \le 2\Delta\ln d/\varepsilon`.

    This is the expectation statement of the utility lemma (which holds for every t ≥ 0, so also
    at t = 0). Proof: the exponential mechanism p maximises (ε/(2Δ))E_p[u] + H(p) (Gibbs
    variational principle), so (ε/(2Δ))(u* − E_p[u]) ≤ H(p) − H(δ_{q*}) ≤ ln d.

    Formal guarantees:
        Dwork & Roth 2014, Theorem 3.11; Gibbs variational principle (e.g. Dwork & Roth
        2014, Thm 3.11 gives the tail form).
    """
    _validate.positive("sensitivity", sensitivity)
    _validate.epsilon("epsilon", epsilon)
    d = _validate.positive_int("num_candidates", num_candidates)
    return 2.0 * float(sensitivity) * math.log(d) / float(epsilon)


def report_noisy_max_scale(*, sensitivity: float, epsilon: float) -> float:
    """Scale 2Δ/ε (rate ε/(2Δ)) of the exponential noise of report-noisy-max.

    Example:
        >>> report_noisy_max_scale(sensitivity=1.0, epsilon=2.0)
        1.0
    """
    _validate.positive("sensitivity", sensitivity)
    _validate.epsilon("epsilon", epsilon)
    return 2.0 * float(sensitivity) / float(epsilon)


@guarded_release("scores")
def report_noisy_max(
    key: jax.Array, scores: jax.Array, *, sensitivity: float, epsilon: float
) -> jax.Array:
    """Return argmax_q (u_q + Z_q) with Z_q iid exponential of rate ε/(2Δ).

    Args:
        key: a JAX PRNG key, used once.
        scores: u(D, ·), shape (..., d), candidates along the last axis. Non-finite entries:
            ``ValueError`` when concrete, the module's fixed rule under ``jit``.
        sensitivity: score sensitivity Δ > 0 under the caller's neighbouring relation.
        epsilon: ε > 0.

    Returns:
        Integer index array of shape ``scores.shape[:-1]``.

    Formal guarantees:
        ε-DP for every input, the non-finite rule applied first (Dwork & Roth 2014,
        "report noisy-max"; Ding, Kifer, Wang et al. 2021, "The permute-and-flip mechanism is
        identical to report-noisy-max with exponential noise", which also shows it is never
        worse in expected utility than the exponential mechanism). Its law is that of
        permute-and-flip, not softmax (``dpjax.auditing.exact.report_noisy_max_law``). Only
        the index is released, never the noisy maximum itself. As the code runs: the
        exponential noise is drawn from 64 random bits in at least float32 (16-bit scores
        included, :func:`dpjax._random.exponential`) and added and compared in that dtype; its
        range is [2.7e-20, 45.05], so a candidate more than T·45.05 below the best is never
        selected (ideal probability ≤ ½e^{−45.05} = 1.4e-20 per such candidate: a δ floor).
        (``jax.random.exponential`` reached 15.94 in float32, a floor of 5.9e-8, and 4.84
        with 128 values for bfloat16 scores.)
        Under ``jax.vmap``: each row of a vmap that batches ``key`` with distinct keys is its own
        release with this guarantee (account for every row); a vmap of ``scores`` with one key for
        all rows raises ``ValueError``, and repeated keys in the batch raise eagerly and void the
        release under ``jit`` (the index dtype's minimum): rows that share a key share one noise
        draw and would release their differences noise-free.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> int(report_noisy_max(jax.random.key(0), jnp.array([0.0, 100.0]),
        ...                      sensitivity=1.0, epsilon=1.0))
        1
    """
    scale = report_noisy_max_scale(sensitivity=sensitivity, epsilon=epsilon)
    return _argmax(_noisy_scores(key, _check_scores(scores), _random.exponential, scale))
