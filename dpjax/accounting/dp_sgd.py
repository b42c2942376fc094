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
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from dpjax import _validate
from dpjax._warnings import PrivacyLeakWarning
from dpjax.accounting import tight
from dpjax.accounting.tight import (
    DEFAULT_VALUE_DISCRETIZATION_INTERVAL,
    PLDGridCoarsenedWarning,
    PLDGridTooLargeError,
    tight_epsilon,
)
from dpjax.events import PoissonSampledGaussianEvent
from dpjax.relation import ADD_OR_REMOVE_ONE, NeighbouringRelation, as_relation

__all__ = [
    "BRACKET_GRIDS",
    "dp_sgd_epsilon",
    "cached_dp_sgd_epsilon",
    "calibrate_noise_multiplier",
    "max_steps",
    "warn_if_delta_reveals_records",
]

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
        The Poisson-subsampled Gaussian mechanism composed T times (Abadi et al. 2016;
        Balle, Barthe, Gaboardi 2018), accounted by dp-accounting's
        PLD (``accounting="pld"``, tight up to discretisation; Koskela et al. 2020, Doroshenko et
        al. 2022) or RDP (``accounting="rdp"``, never tighter; Mironov 2017). At q = 1 ``"pld"`` is
        the exact Gaussian profile (Balle & Wang 2018, Theorem 8) of one release with σ/√T.
        Where the PLD grid would be too large the discretisation is coarsened with a warning
        (still an upper bound; see :func:`dpjax.accounting.tight.pld_epsilon`). ``relation``:

        * ``ADD_OR_REMOVE_ONE`` (default, as in dp-accounting and Opacus): neighbours add or
          remove one record; one record moves the clipped sum by at most C.
        * ``REPLACE_ONE`` (the textbook convention): one record replaced; the sum moves by up
          to 2C — the accountant accounts for this itself, pass σ/C unchanged. Only
          ``accounting="pld"`` supports it for q < 1 (RDP raises).

        See :mod:`dpjax.accounting.tight` for which method is tight where.

        ``noise_multiplier = 0`` (clipping only, no noise) is not private: ε = inf.

    Args:
        noise_multiplier: σ/C in [0, inf), C the clip norm (0: ε = inf).
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
    noise_multiplier = _validate.non_negative("noise_multiplier", noise_multiplier)
    sampling_rate = _validate.probability("sampling_rate", sampling_rate)
    steps = _validate.positive_int("steps", steps)
    delta = _validate.delta("delta", delta)
    accounting = _accounting(accounting, method)
    if noise_multiplier == 0.0:  # the clip-only baseline: no finite ε is claimed
        return math.inf
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
    if accounting is not None:
        return _validate.one_of("accounting", accounting, tight.TIGHT_METHODS)
    if method is not None:
        return _validate.one_of("method", method, tight.TIGHT_METHODS)
    return "pld"


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
    dataset_size: int | None = None,
) -> float:
    """The smallest σ/C (to relative tolerance ``rtol``) with ``dp_sgd_epsilon`` ≤ target.

    A bracketed root search in log σ (secant steps with the Illinois safeguard) on ε(σ), which
    decreases in σ. With ``accounting="pld"`` the bracket is found on coarser PLD grids
    (:data:`BRACKET_GRIDS`: 10⁻², then 10⁻³, each a valid pessimistic upper bound, 10–100×
    cheaper) and the returned σ is then evaluated ONCE at ``value_discretization_interval``
    (if that evaluation is above the target — rare; e.g. a grid coarsened for size — the root
    is solved on that grid). A σ whose PLD grid cannot be
    built (:class:`~dpjax.accounting.tight.PLDGridTooLargeError`, only at tiny σ) counts as
    "ε above target", which can only make the returned σ larger (never invalid). Results are
    cached per argument set, so building the same plan twice calibrates once.

    Formal guarantees:
        Those of :func:`dp_sgd_epsilon` at the returned σ: its ε at the requested
        ``value_discretization_interval`` (or by RDP) was evaluated ≤ ``target_epsilon``.
        Tightness (not privacy): σ/(1 + rtol) evaluated above the target on the last bracketing
        grid (10⁻³ for PLD at the default grid; its ε differs from the 10⁻⁴ one by ~10⁻⁴
        relative in our probes), so σ is within ``rtol`` of the smallest up to that grid error.

    Args:
        target_epsilon: ε in (0, inf).
        delta: δ in (0, 1).
        sampling_rate: q in (0, 1].
        steps: T, a positive integer.
        accounting: ``"pld"`` (default) or ``"rdp"``.
        relation: the neighbouring relation (see :func:`dp_sgd_epsilon`).
        rtol: relative width of the final bracket, in (0, 1).
        value_discretization_interval: PLD grid of the returned value's check.
        orders: RDP orders.
        method: the former name of ``accounting`` (still accepted; give one of the two).
        dataset_size: n, if known: δ ≥ 1/n then warns (:class:`dpjax.PrivacyLeakWarning`).

    Returns:
        The noise multiplier σ/C.

    Raises:
        ValueError: a bad argument, or a target not reachable with σ/C ≤ 1e8.

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
    if dataset_size is not None:
        n = _validate.positive_int("dataset_size", dataset_size)
        warn_if_delta_reveals_records(delta, n, "calibrate_noise_multiplier")
    vdi = _validate.real("value_discretization_interval", value_discretization_interval)
    return _calibrate(
        target_epsilon,
        delta,
        sampling_rate,
        steps,
        accounting,
        as_relation(relation),
        rtol,
        vdi,
        None if orders is None else tuple(float(a) for a in orders),
        _grid_limits(),
    )


#: Coarser PLD grids on which :func:`calibrate_noise_multiplier` brackets σ before its one
#: evaluation at the requested grid (only those coarser than it are used).
BRACKET_GRIDS = (1e-2, 1e-3)
_SIGMA_MIN, _SIGMA_MAX = 1e-3, 1e8


def warn_if_delta_reveals_records(delta: float, dataset_size: int, where: str) -> None:
    """Warn (:class:`dpjax.PrivacyLeakWarning`) when δ ≥ 1/n.

    An (ε, δ) guarantee with δ ≥ 1/n is met by releasing one random record in the clear
    (each record has chance 1/n ≤ δ): it protects nobody. δ ≪ 1/n is the usual requirement
    (Dwork & Roth 2014, §2.3).
    """
    if delta * dataset_size >= 1.0:
        warnings.warn(
            f"{where}: delta={delta:g} ≥ 1/n with n = dataset_size = {dataset_size}: such a δ "
            "permits releasing a whole record (choose δ well below 1/n, e.g. 1/n²)",
            PrivacyLeakWarning,
            stacklevel=3,
        )


def _grid_limits() -> tuple[int, int]:
    """The PLD grid limits in force (part of every cache key: they change the result)."""
    return tight.MAX_PLD_GRID_POINTS, tight.MAX_PLD_STEP_POINTS


@functools.lru_cache(maxsize=512)
def _epsilon_cached(
    sigma: float,
    q: float,
    steps: int,
    delta: float,
    accounting: str,
    relation: NeighbouringRelation,
    vdi: float,
    orders: tuple[float, ...] | None,
    limits: tuple[int, int],
) -> float:
    """:func:`dp_sgd_epsilon` of validated arguments, cached (a pure function of them and of
    the grid ``limits``); a warning inside is issued on the first call only."""
    del limits  # a cache key only
    return dp_sgd_epsilon(
        noise_multiplier=sigma,
        sampling_rate=q,
        steps=steps,
        delta=delta,
        accounting=accounting,
        relation=relation,
        value_discretization_interval=vdi,
        orders=orders,
    )


def cached_dp_sgd_epsilon(
    *,
    noise_multiplier: float,
    sampling_rate: float,
    steps: int,
    delta: float,
    accounting: str = "pld",
    relation: NeighbouringRelation | str = ADD_OR_REMOVE_ONE,
    value_discretization_interval: float = DEFAULT_VALUE_DISCRETIZATION_INTERVAL,
) -> float:
    """:func:`dp_sgd_epsilon` through a cache shared with :func:`calibrate_noise_multiplier`
    (``make_private`` reads ε of its calibrated σ from it without recomputing)."""
    return _epsilon_cached(
        _validate.non_negative("noise_multiplier", noise_multiplier),
        _validate.probability("sampling_rate", sampling_rate),
        _validate.positive_int("steps", steps),
        _validate.delta("delta", delta),
        _accounting(accounting, None),
        as_relation(relation),
        _validate.real("value_discretization_interval", value_discretization_interval),
        None,
        _grid_limits(),
    )


def _log_excess(
    target: float, evaluate: Callable[[float], float], quiet: bool
) -> Callable[[float], tuple[float, float]]:
    """x = ln σ ↦ (σ, ln ε(σ) − ln target), +inf where the PLD grid cannot be built."""

    def f(x: float) -> tuple[float, float]:
        sigma = math.exp(x)
        with warnings.catch_warnings():
            if quiet:
                warnings.simplefilter("ignore", PLDGridCoarsenedWarning)
            try:
                eps = evaluate(sigma)
            except PLDGridTooLargeError:
                eps = math.inf
        if eps <= 0.0:
            return sigma, -math.inf
        return sigma, math.log(eps) - math.log(target)

    return f


def _bracket(f, x0: float, slope: float, width: float) -> tuple[tuple | None, tuple]:
    """Points lo = (x, σ, f > 0) and hi = (x, σ, f ≤ 0) around the root of decreasing f, from
    x0 by secant predictions (``slope`` ≈ df/dx, updated) overshooting by width/2; the step
    doubles on every miss (at most ×16 at once). lo is None when f ≤ 0 even at σ = 10⁻³."""
    lo = hi = prev = None
    x, grow, cap = x0, 1.0, math.log(16.0)
    for _ in range(200):
        sigma, fx = f(x)
        if fx > 0.0:
            lo = (x, sigma, fx) if lo is None or x > lo[0] else lo
        else:
            hi = (x, sigma, fx) if hi is None or x < hi[0] else hi
        if lo is not None and hi is not None:
            return lo, hi
        if hi is None and x > math.log(_SIGMA_MAX):
            raise OverflowError
        if lo is None and x < math.log(_SIGMA_MIN):
            return None, hi  # private even at tiny σ: no lower end needed
        if prev is not None and math.isfinite(fx) and math.isfinite(prev[1]) and x != prev[0]:
            measured = (fx - prev[1]) / (x - prev[0])
            slope = measured if measured < 0.0 else slope
        if math.isfinite(fx):
            step = -fx / slope
            step = grow * (step + math.copysign(width / 2.0, step))
            grow *= 2.0
        else:
            step = cap if fx > 0.0 else -cap
        prev = (x, fx)
        x += min(max(step, -cap), cap)
    raise OverflowError  # pragma: no cover


def _illinois(f, lo: tuple, hi: tuple, width: float) -> tuple[tuple, tuple]:
    """Shrink the bracket [lo, hi] of decreasing f to width ≤ ``width`` in x (Illinois)."""
    f_lo, f_hi, kept = lo[2], hi[2], None
    for _ in range(200):
        gap = hi[0] - lo[0]
        if gap <= width:
            break
        margin = min(width / 2.0, gap / 4.0)
        if math.isfinite(f_lo) and math.isfinite(f_hi) and f_lo != f_hi:
            x = hi[0] - f_hi * gap / (f_hi - f_lo)
        else:
            x = 0.5 * (lo[0] + hi[0])
        x = min(max(x, lo[0] + margin), hi[0] - margin)
        sigma, fx = f(x)
        if fx > 0.0:
            lo, f_lo = (x, sigma, fx), fx
            f_hi = f_hi / 2.0 if kept == "hi" else f_hi
            kept = "hi"
        else:
            hi, f_hi = (x, sigma, fx), fx
            f_lo = f_lo / 2.0 if kept == "lo" else f_lo
            kept = "lo"
    return lo, hi


def _slope(lo: tuple | None, hi: tuple) -> float:
    """df/dx between two bracket points (−1 if it cannot be read)."""
    if lo is None or not (math.isfinite(lo[2]) and math.isfinite(hi[2])) or hi[0] == lo[0]:
        return -1.0
    s = (hi[2] - lo[2]) / (hi[0] - lo[0])
    return s if s < 0.0 else -1.0


def _two_point_bracket(f, x0: float, slope: float, width: float) -> float | None:
    """Near the root (a finer grid after a coarser one): x0 = the coarser grid's upper end,
    usually ≤ target here too. Predict the root r by the secant slope, evaluate r − width/2;
    if that is above the target, return min(x0, r + width/2), the upper end of a bracket of
    width ``width`` (two evaluations instead of four). None: not this easy case."""
    _, f0 = f(x0)
    if not (f0 <= 0.0 and math.isfinite(f0)):
        return None
    root = x0 - f0 / slope
    _, f1 = f(root - width / 2.0)
    return min(x0, root + width / 2.0) if f1 > 0.0 else None


@functools.lru_cache(maxsize=128)
def _calibrate(
    target: float,
    delta: float,
    q: float,
    steps: int,
    accounting: str,
    relation: NeighbouringRelation,
    rtol: float,
    vdi: float,
    orders: tuple[float, ...] | None,
    limits: tuple[int, int],
) -> float:
    """:func:`calibrate_noise_multiplier` of validated arguments (cached)."""
    del limits  # a cache key only

    def at(grid: float) -> Callable[[float], float]:
        return lambda sigma: _epsilon_cached(
            sigma, q, steps, delta, accounting, relation, grid, orders, _grid_limits()
        )

    grids = [g for g in BRACKET_GRIDS if g > vdi] if accounting == "pld" else []
    width = math.log1p(rtol)
    # Start near the moments-accountant scale σ ≈ q√(2T ln(1/δ))/ε (Abadi et al. 2016,
    # Theorem 1), so that no evaluation runs at a needlessly small σ (slow, huge ε).
    # Twice that: the calibrated σ was 1.6–3.5× the formula in probes, and evaluations below
    # the root (small σ, wide grids) are the expensive ones.
    guess = 2.0 * q * math.sqrt(2.0 * steps * math.log(1.0 / delta)) / target
    x, slope = math.log(min(max(guess, 0.05), _SIGMA_MAX)), -1.0
    lo = hi = None
    for i, grid in enumerate(grids or [vdi]):
        f = _log_excess(target, at(grid), quiet=bool(grids))
        if i > 0 and i == len(grids) - 1:
            shortcut = _two_point_bracket(f, x, slope, width)
            if shortcut is not None:  # lo above target here, hi one rtol up: check it below
                x = shortcut
                break
        try:
            lo, hi = _bracket(f, x, slope, width)
        except OverflowError:
            _validate.fail("target_epsilon", target, f"reachable with σ/C ≤ {_SIGMA_MAX:g}")
        if lo is not None:
            lo, hi = _illinois(f, lo, hi, width)
        x, slope = hi[0], _slope(lo, hi)
    if not grids:
        return hi[1]
    # The value at full precision: one evaluation at the requested grid. Where it is above the
    # target (rare; e.g. the requested grid had to be coarsened for size), solve on that grid.
    final = _log_excess(target, at(vdi), quiet=False)
    sigma, fx = final(x)
    if fx <= 0.0:
        return sigma
    try:
        lo, hi = _bracket(final, x, slope, width)
    except OverflowError:
        _validate.fail("target_epsilon", target, f"reachable with σ/C ≤ {_SIGMA_MAX:g}")
    return _illinois(final, lo, hi, width)[1][1]


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
