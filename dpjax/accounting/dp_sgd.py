"""DP-SGD / DP-GD accounting and calibration: ε of T steps, the smallest σ, the largest T.

Evaluation and calibration share one code path: both call
:func:`dpjax.accounting.tight.tight_epsilon` on the same event, and calibration returns the
end of its bisection bracket that evaluates to ε ≤ target. So a calibrated noise multiplier
always evaluates (with the same method and settings) to at most the target ε.

Full-batch DP-GD (``sampling_rate = 1``) with ``accounting="pld"`` uses the exact Gaussian profile
(T releases with σ are one release with σ/√T), which answers in milliseconds at any T. Privacy
parameters are coerced to Python floats/ints at this boundary (NumPy scalars and 0-d arrays
accepted; bool, str and JAX tracers refused by name).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

from dpjax import _validate
from dpjax.accounting.tight import (
    DEFAULT_VALUE_DISCRETIZATION_INTERVAL,
    PLDGridTooLargeError,
    tight_epsilon,
)
from dpjax.events import PoissonSampledGaussianEvent
from dpjax.relation import ADD_OR_REMOVE_ONE, NeighbouringRelation

__all__ = ["dp_sgd_epsilon", "calibrate_noise_multiplier", "max_steps"]

_MAX_STEPS_CAP = 10**8


def dp_sgd_epsilon(
    *,
    noise_multiplier: float,
    sampling_rate: float,
    steps: int,
    delta: float,
    accounting: str | None = None,
    relation: NeighbouringRelation | str = ADD_OR_REMOVE_ONE,
    value_discretization_interval: float = DEFAULT_VALUE_DISCRETIZATION_INTERVAL,
    orders: Sequence[float] | None = None,
    method: str | None = None,
) -> float:
    """ε after T steps of DP-SGD: Poisson sampling at rate q, clipped sum + N(0, (σC)²).

    ``sampling_rate = 1`` is full-batch DP-GD (each step a Gaussian mechanism).

    Formal guarantees:
        The Poisson-subsampled Gaussian mechanism composed T times (Abadi et al. 2016; lecture
        on ML under DP, DP-SGD and amplification by subsampling), accounted by dp-accounting's
        PLD (``accounting="pld"``, tight up to discretisation; Koskela et al. 2020, Doroshenko et
        al. 2022) or RDP (``accounting="rdp"``, never tighter; Mironov 2017). At q = 1 ``"pld"`` is
        the exact Gaussian profile (Balle & Wang 2018, Theorem 8) of one release with σ/√T.
        Where the PLD grid would be too large the discretisation is coarsened with a warning
        (still an upper bound; see :func:`dpjax.accounting.tight.pld_epsilon`). ``relation``:

        * ``ADD_OR_REMOVE_ONE`` (default, as in dp-accounting and Opacus): neighbours add or
          remove one record; one record moves the clipped sum by at most C.
        * ``REPLACE_ONE`` (the lectures' convention): one record replaced; the sum moves by up
          to 2C — the accountant accounts for this itself, pass σ/C unchanged. Only
          ``accounting="pld"`` supports it for q < 1 (RDP raises).

        See :mod:`dpjax.accounting.tight` for which method is tight where.

    Args:
        noise_multiplier: σ/C in (0, inf), C the clip norm.
        sampling_rate: q in (0, 1].
        steps: T, a positive integer (noisy releases, not micro-batches).
        delta: δ in [0, 1).
        accounting: ``"pld"`` (default) or ``"rdp"``.
        relation: the neighbouring relation of the guarantee.
        value_discretization_interval: PLD grid (default 1e-4).
        orders: RDP orders (default :data:`dpjax.accounting.DEFAULT_RDP_ORDERS`).
        method: the former name of ``accounting`` (still accepted; give one of the two).

    Returns:
        ε.

    Example:
        >>> eps = dp_sgd_epsilon(noise_multiplier=1.0, sampling_rate=0.01, steps=1000, delta=1e-5)
        >>> round(eps, 2)
        1.83
    """
    noise_multiplier = _validate.positive("noise_multiplier", noise_multiplier)
    sampling_rate = _validate.probability("sampling_rate", sampling_rate)
    steps = _validate.positive_int("steps", steps)
    delta = _validate.delta("delta", delta)
    accounting = _accounting(accounting, method)
    event = PoissonSampledGaussianEvent(
        noise_multiplier=noise_multiplier,
        sampling_rate=sampling_rate,
        count=steps,
        relation=relation,
    )
    return tight_epsilon(
        [event],
        delta,
        method=accounting,
        value_discretization_interval=value_discretization_interval,
        orders=orders,
    )


def _accounting(accounting: str | None, method: str | None) -> str:
    """The accounting method from the new keyword ``accounting`` or the former ``method``."""
    if accounting is not None and method is not None and accounting != method:
        _validate.fail(
            "method", method, f"omitted (it is the former name of accounting={accounting!r})"
        )
    chosen = accounting if accounting is not None else method
    return "pld" if chosen is None else chosen


def _epsilon_or_inf(**kwargs: Any) -> float:
    """:func:`dp_sgd_epsilon`, or inf where the PLD grid is too large (read as over budget)."""
    try:
        return dp_sgd_epsilon(**kwargs)
    except PLDGridTooLargeError:
        return math.inf


def calibrate_noise_multiplier(
    *,
    target_epsilon: float,
    delta: float,
    sampling_rate: float,
    steps: int,
    accounting: str | None = None,
    relation: NeighbouringRelation | str = ADD_OR_REMOVE_ONE,
    rtol: float = 1e-3,
    value_discretization_interval: float = DEFAULT_VALUE_DISCRETIZATION_INTERVAL,
    orders: Sequence[float] | None = None,
    method: str | None = None,
) -> float:
    """The smallest σ/C (to relative tolerance ``rtol``) with ``dp_sgd_epsilon`` ≤ target.

    Bisection in log σ on :func:`dp_sgd_epsilon` with the same arguments; the returned value is
    the bracket end whose ε was evaluated ≤ ``target_epsilon``. A σ whose PLD grid cannot be
    built (:class:`~dpjax.accounting.tight.PLDGridTooLargeError`, only at tiny σ) counts as
    "ε above target", which can only make the returned σ larger (never invalid).

    Formal guarantees:
        Those of :func:`dp_sgd_epsilon` at the returned σ (ε ≤ ``target_epsilon`` by
        construction; ε decreases in σ).

    Args:
        target_epsilon: ε in (0, inf).
        delta: δ in (0, 1).
        sampling_rate: q in (0, 1].
        steps: T, a positive integer.
        accounting: ``"pld"`` (default) or ``"rdp"``.
        relation: the neighbouring relation (see :func:`dp_sgd_epsilon`).
        rtol: relative width of the final bracket, in (0, 1).
        value_discretization_interval: PLD grid.
        orders: RDP orders.
        method: the former name of ``accounting`` (still accepted; give one of the two).

    Returns:
        The noise multiplier σ/C.

    Example:
        >>> s = calibrate_noise_multiplier(target_epsilon=1.0, delta=1e-5, sampling_rate=1.0,
        ...                                steps=10)
        >>> round(s, 1)
        11.8
    """
    target_epsilon = _validate.epsilon("target_epsilon", target_epsilon)
    delta = _validate.in_range("delta", delta, 0.0, 1.0, low_inclusive=False)
    rtol = _validate.in_range("rtol", rtol, 0.0, 1.0, low_inclusive=False)
    sampling_rate = _validate.probability("sampling_rate", sampling_rate)
    steps = _validate.positive_int("steps", steps)
    accounting = _accounting(accounting, method)

    @functools.cache
    def eps(sigma: float) -> float:
        return _epsilon_or_inf(
            noise_multiplier=sigma,
            sampling_rate=sampling_rate,
            steps=steps,
            delta=delta,
            accounting=accounting,
            relation=relation,
            value_discretization_interval=value_discretization_interval,
            orders=orders,
        )

    # Start near the moments-accountant scale σ ≈ q√(2T ln(1/δ))/ε (Abadi et al. 2016,
    # Theorem 1), so that no evaluation runs at a needlessly small σ (slow, huge ε).
    guess = sampling_rate * math.sqrt(2.0 * steps * math.log(1.0 / delta)) / target_epsilon
    hi = lo = max(guess, 0.05)
    if eps(hi) > target_epsilon:
        while eps(hi) > target_epsilon:
            lo, hi = hi, 1.5 * hi
            if hi > 1e8:
                _validate.fail("target_epsilon", target_epsilon, "reachable with σ/C ≤ 1e8")
    else:
        lo = hi / 1.5
        while eps(lo) <= target_epsilon:
            hi, lo = lo, lo / 1.5
            if lo < 1e-3:
                return hi
    while hi / lo - 1.0 > rtol:
        mid = math.sqrt(lo * hi)
        if eps(mid) <= target_epsilon:
            hi = mid
        else:
            lo = mid
    return hi


def max_steps(
    *,
    noise_multiplier: float,
    target_epsilon: float,
    delta: float,
    sampling_rate: float,
    accounting: str | None = None,
    relation: NeighbouringRelation | str = ADD_OR_REMOVE_ONE,
    value_discretization_interval: float = DEFAULT_VALUE_DISCRETIZATION_INTERVAL,
    orders: Sequence[float] | None = None,
    method: str | None = None,
) -> int:
    """The largest number of steps T with ``dp_sgd_epsilon`` ≤ target at a given σ/C.

    Doubling then integer bisection on :func:`dp_sgd_epsilon` (ε increases in T). A T whose PLD
    grid cannot be built counts as "ε above target" (the result stays valid). At q = 1 the
    exact Gaussian profile makes each evaluation take microseconds.

    Formal guarantees:
        Those of :func:`dp_sgd_epsilon` at the returned T (ε ≤ ``target_epsilon`` was evaluated
        for it, with the same method and settings).

    Args:
        noise_multiplier: σ/C in (0, inf).
        target_epsilon: ε in (0, inf).
        delta: δ in (0, 1).
        sampling_rate: q in (0, 1].
        accounting: ``"pld"`` (default) or ``"rdp"``.
        relation: the neighbouring relation (see :func:`dp_sgd_epsilon`).
        value_discretization_interval: PLD grid.
        orders: RDP orders.
        method: the former name of ``accounting`` (still accepted; give one of the two).

    Returns:
        T ≥ 0 (0 if even one step exceeds the target).

    Example:
        >>> max_steps(noise_multiplier=4.0, target_epsilon=1.0, delta=1e-5, sampling_rate=1.0)
        1
    """
    noise_multiplier = _validate.positive("noise_multiplier", noise_multiplier)
    target_epsilon = _validate.epsilon("target_epsilon", target_epsilon)
    delta = _validate.in_range("delta", delta, 0.0, 1.0, low_inclusive=False)
    sampling_rate = _validate.probability("sampling_rate", sampling_rate)
    accounting = _accounting(accounting, method)

    def ok(steps: int) -> bool:
        eps = _epsilon_or_inf(
            noise_multiplier=noise_multiplier,
            sampling_rate=sampling_rate,
            steps=steps,
            delta=delta,
            accounting=accounting,
            relation=relation,
            value_discretization_interval=value_discretization_interval,
            orders=orders,
        )
        return eps <= target_epsilon

    if not ok(1):
        return 0
    lo, hi = 1, 2
    while ok(hi):
        lo, hi = hi, 2 * hi
        if hi > _MAX_STEPS_CAP:
            return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo
