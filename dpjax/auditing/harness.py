"""Run a mechanism many times on D and D′ with independent keys and bound ε from below.

The harness is the only place where audit trials are generated, so that the rules of
 hold for every audit: the mechanism is called through its public API, the
D runs and the D′ runs use **independent** keys (never common random numbers: reusing a key
across D and D′ makes them trivially distinguishable, an audit bug rather than a privacy bug),
and trials are batched with ``jax.vmap`` under ``jax.jit`` in fixed-size chunks.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dpjax import _validate
from dpjax.auditing import estimators

__all__ = ["AuditResult", "run_trials", "audit", "audit_repeated"]

Mechanism = Callable[[jax.Array, Any], Any]
Score = Callable[[Any], jax.Array]

_ESTIMATORS = ("direct", "gdp")


@dataclasses.dataclass(frozen=True)
class AuditResult:
    """Lower bounds from ``repetitions`` independent audits of one mechanism.

    Attributes:
        claimed_epsilon: the ε the mechanism claims (None if not given).
        bounds: one :class:`~dpjax.auditing.estimators.EpsilonLowerBound` per repetition.
        trials: runs per data set in each repetition.
    """

    claimed_epsilon: float | None
    bounds: tuple[estimators.EpsilonLowerBound, ...]
    trials: int

    @property
    def epsilons(self) -> np.ndarray:
        """ε_LB of every repetition."""
        return np.array([b.epsilon for b in self.bounds])

    @property
    def epsilon_lb(self) -> float:
        """Median ε_LB over the repetitions (the single bound when there is one)."""
        return float(np.median(self.epsilons))

    @property
    def ratio(self) -> float:
        """Tightness: median ε_LB / claimed ε."""
        return self.epsilon_lb / float(self.claimed_epsilon)

    @property
    def exceed_count(self) -> int:
        """How many repetitions have ε_LB > claimed ε (a violation was detected)."""
        return int(np.sum(self.epsilons > float(self.claimed_epsilon)))

    def summary(self) -> dict:
        """A JSON-ready dict: claimed ε, median/min/max ε_LB, ratio, violations."""
        eps = self.epsilons
        first = self.bounds[0]
        return {
            "claimed_epsilon": self.claimed_epsilon,
            "delta": first.delta,
            "method": first.method,
            "confidence": first.confidence,
            "trials_per_dataset": self.trials,
            "repetitions": len(self.bounds),
            "epsilon_lb_median": float(np.median(eps)),
            "epsilon_lb_min": float(eps.min()),
            "epsilon_lb_max": float(eps.max()),
            "ratio": None if self.claimed_epsilon is None else self.ratio,
            "exceed_count": None if self.claimed_epsilon is None else self.exceed_count,
            "mu_lb_median": None
            if first.mu is None
            else float(np.median([b.mu for b in self.bounds])),
            "conditional_on": first.conditional_on,
        }

    @property
    def is_heuristic(self) -> bool:
        """True when the bounds hold only under an assumption the caller stated (GDP)."""
        return any(b.is_heuristic for b in self.bounds)


def _scalar_score(output: Any) -> jax.Array:
    leaves = jax.tree.leaves(output)
    if len(leaves) != 1 or jnp.size(leaves[0]) != 1:
        raise ValueError(
            "score must be given for a mechanism whose output is not a single scalar; "
            f"got an output with leaf shapes {[jnp.shape(x) for x in leaves]}"
        )
    return jnp.reshape(leaves[0], ())


def run_trials(
    mechanism: Mechanism,
    data: Any,
    *,
    key: jax.Array,
    trials: int,
    score: Score | None = None,
    chunk_size: int = 65536,
) -> np.ndarray:
    """Scores of ``trials`` independent runs ``score(mechanism(k_i, data))``.

    Args:
        mechanism: ``mechanism(key, data) -> output``, calling the dpjax API under audit.
        data: the data set. It is passed to the jitted, vmapped run as an unbatched traced
            argument (so D and D′ share one compilation); a mechanism that needs concrete
            data is run with ``data`` closed over instead.
        key: a PRNG key; split into ``trials`` independent keys.
        trials: number of runs (> 0).
        score: maps one output to a scalar (large = evidence for D′). Defaults to the
            output itself, which must then be a scalar.
        chunk_size: runs per ``jax.vmap`` batch (bounds memory).

    Returns:
        A float64 NumPy array of shape ``(trials,)``.
    """
    trials = _validate.positive_int("trials", trials)
    chunk_size = min(_validate.positive_int("chunk_size", chunk_size), trials)
    score = _scalar_score if score is None else score
    keys = jax.random.split(key, trials)
    pad = (-trials) % chunk_size
    if pad:
        keys = jnp.concatenate([keys, jax.random.split(jax.random.fold_in(key, 1), pad)])
    try:  # data as a traced argument: one compilation serves D and D′
        batched, arg = _batched_runs(mechanism, score), data
        first = batched(keys[:chunk_size], arg)
    except (jax.errors.JAXTypeError, _validate.TracedParameterError):  # needs concrete data
        batched = jax.jit(jax.vmap(lambda k, _: _run_once(mechanism, score, k, data), (0, None)))
        arg = None
        first = batched(keys[:chunk_size], arg)
    chunks = [first] + [
        batched(keys[i : i + chunk_size], arg) for i in range(chunk_size, keys.shape[0], chunk_size)
    ]
    return np.concatenate([np.asarray(c, dtype=np.float64) for c in chunks])[:trials]


def _run_once(mechanism: Mechanism, score: Score, key: jax.Array, data: Any) -> jax.Array:
    return jnp.asarray(score(mechanism(key, data)))


@functools.lru_cache(maxsize=32)
def _batched_runs(mechanism: Mechanism, score: Score):
    """``jit(vmap over keys)`` of one run, data unbatched; cached so D and D′ share it."""
    return jax.jit(jax.vmap(functools.partial(_run_once, mechanism, score), (0, None)))


def _bound(scores_d, scores_dprime, estimator: str, delta: float, confidence: float):
    if estimator == "gdp":  # the caller stated the assumption (checked in audit_repeated)
        return estimators.gdp_epsilon_lower_bound(
            scores_d,
            scores_dprime,
            delta=delta,
            confidence=confidence,
            assume_gaussian_tradeoff=True,
        )
    return estimators.direct_epsilon_lower_bound(
        scores_d, scores_dprime, delta=delta, confidence=confidence
    )


def audit_repeated(
    mechanism: Mechanism,
    data_d: Any,
    data_dprime: Any,
    *,
    key: jax.Array,
    trials: int,
    repetitions: int = 1,
    score: Score | None = None,
    estimator: str = "direct",
    delta: float = 0.0,
    confidence: float = 0.95,
    claimed_epsilon: float | None = None,
    chunk_size: int = 65536,
    assume_gaussian_tradeoff: bool = False,
) -> AuditResult:
    """Audit ``mechanism`` on the neighbours (D, D′) ``repetitions`` times independently.

    All ``repetitions × trials`` runs on D and on D′ are generated in one vmapped batch per
    data set with independent keys (D and D′ keys come from different halves of a split),
    then partitioned into repetitions, each bounded on its own.

    Args:
        mechanism: ``mechanism(key, data) -> output`` through the public dpjax API.
        data_d: D.
        data_dprime: D′, a neighbour of D under the relation the mechanism protects.
        key: root key of the audit.
        trials: runs per data set per repetition (the estimator uses half of them to choose
            the threshold and the other half for the bound).
        repetitions: number of independent audits (the mutant rule uses 20).
        score: output → scalar, large = evidence for D′ (default: the scalar output).
        estimator: ``"direct"`` (no assumption) or ``"gdp"`` (a heuristic that assumes a
            Gaussian trade-off curve; needs ``assume_gaussian_tradeoff=True``).
        delta: δ of the claim (``"gdp"`` needs δ in (0, 1)).
        confidence: confidence of each bound.
        claimed_epsilon: the ε the mechanism claims (for ``ratio``/``exceed_count``).
        chunk_size: runs per vmapped batch.
        assume_gaussian_tradeoff: required ``True`` with ``estimator="gdp"``: the caller states
            that the mechanism's trade-off curve between D and D′ is Gaussian (Nasr et al.
            2023); the bounds are then recorded as conditional on it (``is_heuristic``).
            Ignored by ``"direct"``.

    Returns:
        An :class:`AuditResult`.

    Formal guarantees:
        Each repetition's bound is a valid (1 − confidence)-level lower bound on the ε of
        ``mechanism`` between D and D′ (see the estimators); repetitions are independent, so
        for a correct mechanism the number of exceedances is dominated by
        Binomial(repetitions, 1 − confidence). With ``estimator="gdp"`` all of this holds only
        if the stated Gaussian trade-off assumption does; otherwise the bounds are heuristics
        and a correct non-Gaussian mechanism can exceed its claim.

    Example:
        >>> import jax, dpjax
        >>> mech = lambda k, x: dpjax.mechanisms.laplace(k, x, sensitivity=1.0, epsilon=1.0)
        >>> r = audit_repeated(mech, 0.0, 1.0, key=jax.random.key(0), trials=10_000,
        ...                    claimed_epsilon=1.0)
        >>> 0.5 < r.epsilon_lb <= 1.0
        True
    """
    trials = _validate.positive_int("trials", trials)
    repetitions = _validate.positive_int("repetitions", repetitions)
    estimator = _validate.one_of("estimator", estimator, _ESTIMATORS)
    if estimator == "gdp":
        estimators.check_gaussian_tradeoff_assumed(assume_gaussian_tradeoff)
    if claimed_epsilon is not None:
        claimed_epsilon = _validate.epsilon("claimed_epsilon", claimed_epsilon)
    key_d, key_dprime = jax.random.split(key)
    total = trials * repetitions
    run = dict(trials=total, score=score, chunk_size=chunk_size)
    s_d = run_trials(mechanism, data_d, key=key_d, **run).reshape(repetitions, trials)
    s_dp = run_trials(mechanism, data_dprime, key=key_dprime, **run).reshape(repetitions, trials)
    bounds = tuple(
        _bound(s_d[i], s_dp[i], estimator, delta, confidence) for i in range(repetitions)
    )
    return AuditResult(claimed_epsilon=claimed_epsilon, bounds=bounds, trials=trials)


def audit(mechanism: Mechanism, data_d: Any, data_dprime: Any, **kwargs) -> AuditResult:
    """One audit: ``audit_repeated`` with ``repetitions=1`` (same arguments)."""
    kwargs.setdefault("repetitions", 1)
    return audit_repeated(mechanism, data_d, data_dprime, **kwargs)
