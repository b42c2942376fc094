"""Tight numerical accounting of noisy releases with dp-accounting: RDP and PLD.

This module answers ε(δ) for a sequence of dpjax events (:mod:`dpjax.events`): the PLD
evaluator and :func:`tight_epsilon`, here; the conversion of events into dp-accounting objects
(:mod:`~dpjax.accounting.conversion`), the padded samplers' truncation slack
(:mod:`~dpjax.accounting.padded_slack`) and the RDP evaluator (:mod:`~dpjax.accounting.renyi`)
are re-exported from their modules. It is the single evaluator that
:func:`dpjax.accounting.dp_sgd_epsilon`, the calibration functions and
:class:`dpjax.accounting.PrivacyAccountant` share.

Which method is tight where:

* **PLD** (privacy loss distributions; Koskela et al. 2020, Doroshenko et al. 2022) is tight up
  to its discretisation: with ``pessimistic_estimate`` (always on here) the reported ε is an
  upper bound that converges to the exact ε as ``value_discretization_interval`` shrinks. The
  default 1e-4 is dp-accounting's; a coarser grid moved ε by 18% in a probe.
  Compositions of Gaussian releases only (Gaussian events, full-batch q = 1 DP-GD, fixed-size
  batches) skip the grid: they are one Gaussian with μ = √(Σμᵢ²), answered by its exact
  profile (:func:`gaussian_epsilon_upper`). Otherwise the grid size is estimated before it is
  built (dp-accounting's own truncation bound on one step's PMF); a grid beyond
  :data:`MAX_PLD_GRID_POINTS` is coarsened with a :class:`PLDGridCoarsenedWarning` (still an
  upper bound) instead of raising ``MemoryError`` after minutes.
* **RDP** (Rényi DP; Mironov 2017, Mironov et al. 2019) is never tighter than PLD: its
  RDP→(ε, δ) conversion loses a factor (median ratio RDP/PLD 1.11–1.14 for DP-SGD). Its ε is
  a minimum over a finite grid of orders α, and the conversion ε ≥ ln(1/δ)/(α − 1) means a
  grid that stops at α = 63 cannot report ε below ≈ 0.1 at δ = 1e-5 (it is then loose, not
  wrong); :data:`DEFAULT_RDP_ORDERS` goes to α = 10⁴. Fractional orders near 1 matter at large
  ε; dp-accounting bounds them by a series that was up to 2.8× looser than numerical
  integration at q = 0.1 and large ε (still a valid bound), and skips orders whose series does
  not converge.

Padded samplers (``PoissonSampledGaussianEvent`` with ``dataset_size``/``max_batch_size``, as
:meth:`dpjax.dp_sgd.PoissonSampler.event` builds them): every evaluator here accounts the exact
Poisson event at δ·(1 − f) and requires the truncation slack (1 + e^ε)·Σ T·p̄
(:func:`truncation_slack`) to fit in f·δ, for the first share f of
:data:`TRUNCATION_DELTA_SHARES` that fits (10⁻³ first: ``make_private``'s), else raises
:class:`TruncationSlackError`.

Neighbouring relations, handled honestly:

* Gaussian and Laplace events carry σ/Δ (b/Δ) with Δ the sensitivity *under the event's own
  relation*, so their privacy loss is a shift by one unit whatever the relation.
* Poisson-subsampled Gaussian events carry σ/C with C the add/remove-one contribution. Under
  replace-one the PLD uses dp-accounting's replace-one mixture pair (shift 2C at q = 1);
  dp-accounting's RDP has no replace-one Poisson analysis, so RDP raises for q < 1 (at q = 1
  the release is a Gaussian with sensitivity 2C, which both methods handle).
* Fixed-batch events (replace-one only; add/remove-one raises): shuffled batches get no
  amplification — a record is in at most one batch per epoch, so by parallel composition within
  an epoch they are ⌈T/⌊n/b⌋⌉ Gaussian releases of sensitivity 2C (valid for every
  permutation, hence for the random one). Independently drawn b-subsets get the
  without-replacement RDP of Wang, Balle and Kasiviswanathan (2019, Theorem 27, base
  sensitivity 2C); their PLD uses the (loose, valid) no-amplification bound of T releases.
* Beware: dp-accounting's own ``PLDAccountant(REPLACE_ONE)`` doubles the sensitivity of a plain
  ``GaussianDpEvent`` while ``RdpAccountant(REPLACE_ONE)`` does not (checked on 0.6.0). dpjax
  never relies on either behaviour for unit-shift events: it builds PLDs itself and tests the
  RDP behaviour it uses.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Sequence

from dp_accounting.pld import common as pld_common
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from scipy import special

from dpjax import _validate
from dpjax import events as ev
from dpjax.accounting import vectorized
from dpjax.accounting.conversion import (
    _DP_RELATION,
    TIGHT_METHODS,
    _common_relation,
    _group,
    fixed_batch_uses,
    to_dp_event,
)
from dpjax.accounting.padded_slack import (
    TRUNCATION_DELTA_SHARES,
    TruncationSlackError,
    _overflow_mass,
    _untruncated,
    _with_truncation_slack,
    truncation_slack,
)
from dpjax.accounting.renyi import DEFAULT_RDP_ORDERS, rdp_curve, rdp_epsilon
from dpjax.relation import ADD_OR_REMOVE_ONE, REPLACE_ONE, NeighbouringRelation, sensitivity_factor

__all__ = [
    "DEFAULT_RDP_ORDERS",
    "DEFAULT_VALUE_DISCRETIZATION_INTERVAL",
    "TIGHT_METHODS",
    "MAX_PLD_GRID_POINTS",
    "MAX_PLD_STEP_POINTS",
    "MAX_VALUE_DISCRETIZATION_INTERVAL",
    "PLDGridCoarsenedWarning",
    "PLDGridTooLargeError",
    "TRUNCATION_DELTA_SHARES",
    "TruncationSlackError",
    "truncation_slack",
    "gaussian_epsilon_upper",
    "pld_grid_points",
    "plan_pld",
    "to_dp_event",
    "rdp_epsilon",
    "pld_epsilon",
    "pld_epsilons_incremental",
    "rdp_curve",
    "tight_epsilon",
]


#: PLD discretisation of the privacy loss (dp-accounting's default; finer is tighter, slower).
DEFAULT_VALUE_DISCRETIZATION_INTERVAL = 1e-4


def _unit_gaussian_mu_squared(event: ev.PrivacyEvent) -> float | None:
    """μ² of the event as a composition of Gaussian releases (Δ/σ = μ each, μ² adding up), or
    None if it is not one (Laplace, subsampled Gaussian with q < 1, generic (ε, δ))."""
    if isinstance(event, ev.GaussianEvent):
        return event.count / event.noise_multiplier**2
    if isinstance(event, ev.PoissonSampledGaussianEvent) and event.sampling_rate == 1.0:
        # Full-batch DP-GD: T Gaussians with sensitivity C (2C under replace-one).
        shift = sensitivity_factor(event.relation)
        return event.count * shift**2 / event.noise_multiplier**2
    if isinstance(event, ev.FixedBatchGaussianEvent):
        to_dp_event(event, method="pld")  # validates the relation
        # No amplification: `fixed_batch_uses` releases, each of sensitivity 2C (replace-one).
        shift = sensitivity_factor(REPLACE_ONE)
        return fixed_batch_uses(event) * shift**2 / event.noise_multiplier**2
    if isinstance(event, ev.BallsInBinsGaussianEvent):
        # No amplification claimed: one release per epoch, sensitivity C (2C replace-one).
        shift = sensitivity_factor(event.relation)
        return event.epochs * shift**2 / event.noise_multiplier**2
    return None


def _gaussian_delta_upper(mu: float, epsilon: float) -> float:
    """An upper bound, valid in floating point, on δ(ε) of the Gaussian mechanism with Δ/σ = μ.

    δ(ε) = Φ(μ/2 − ε/μ) − e^ε Φ(−μ/2 − ε/μ) (Balle & Wang 2018, Theorem 8). Both terms are
    evaluated with relative error far below η (ndtr; exp of a log_ndtr sum whose absolute
    error is a few ulps of its magnitude); rounding the first up and the second down by η
    makes the difference an upper bound even where it cancels.
    """
    a, b = mu / 2.0, epsilon / mu
    first = float(special.ndtr(a - b))
    log_second = epsilon + float(special.log_ndtr(-a - b))
    # Where e^log_second underflows (or log_second is NaN, ε = ∞), the subtracted term is
    # dropped: first alone is an upper bound (and 0·(1 − η) must not turn into NaN).
    second = math.exp(log_second) if log_second > -745.0 else 0.0
    eta = 1e-14 * (4.0 + abs(epsilon) + (abs(log_second) if second > 0.0 else 0.0))
    upper = first * (1.0 + eta) - (second * (1.0 - eta) if second > 0.0 else 0.0)
    if math.isnan(upper):
        return 1.0  # δ ≤ 1 always holds
    return max(upper, 0.0)


def gaussian_epsilon_upper(mu: float, delta: float) -> float:
    """ε(δ) of a composition of Gaussian releases with total Δ/σ = μ, exact up to rounding up.

    Formal guarantees:
        T adaptive Gaussian releases with Δᵢ/σᵢ = μᵢ are together exactly a Gaussian release
        with μ = √(Σμᵢ²) (Dong, Roth, Su 2022, Corollary 3.3, μ-GDP composition), whose privacy
        profile is that of Balle & Wang (2018), Theorem 8. The bisection returns an ε whose
        floating-point-safe δ upper bound (:func:`_gaussian_delta_upper`) is ≤ ``delta``, so the
        result is a valid ε for the exact profile; it exceeds the exact ε by ≤ 1e-12 relative.
        Same relation as the μᵢ (each Δᵢ stated under it).

    Args:
        mu: μ = Δ/σ in (0, inf]; μ = inf (no noise) gives ``inf``.
        delta: δ in [0, 1); δ = 0 gives ``inf``.

    Returns:
        ε ≥ 0, or ``inf``.
    """
    if delta <= 0.0 or not mu < math.inf:
        return math.inf  # μ = ∞ (e.g. Δ/σ overflowing at σ ≲ 1e-154): no noise, not private
    if _gaussian_delta_upper(mu, 0.0) <= delta:
        return 0.0
    lo, hi = 0.0, 1.0
    while _gaussian_delta_upper(mu, hi) > delta:
        lo, hi = hi, 2.0 * hi
        if hi == math.inf:
            return math.inf
    while hi - lo > 1e-13 * hi:
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        lo, hi = (lo, mid) if _gaussian_delta_upper(mu, mid) <= delta else (mid, hi)
    return hi


class PLDGridTooLargeError(ValueError):
    """The PLD of a setting needs more grid points than :data:`MAX_PLD_GRID_POINTS` even at the
    coarsest discretisation :data:`MAX_VALUE_DISCRETIZATION_INTERVAL` (use ``accounting="rdp"``)."""


class PLDGridCoarsenedWarning(UserWarning):
    """The PLD discretisation was coarsened to keep its grid within the limits (the result is
    still a valid, pessimistic upper bound; only looser)."""


#: Most points of one composed PLD (one FFT; ≈ 64 MiB per complex copy), so that a call answers
#: in seconds instead of raising ``MemoryError`` inside dp-accounting.
MAX_PLD_GRID_POINTS = 2**22
#: Most points of one step's PLD before self-composition (building costs ≈ 1 µs a point under
#: add/remove-one, :mod:`~dpjax.accounting.vectorized`, ≈ 10 µs under replace-one; replace-one
#: at σ = 1, q = 0.05 needs 1.4e5).
MAX_PLD_STEP_POINTS = 2**19
#: The coarsest discretisation the automatic coarsening may use.
MAX_VALUE_DISCRETIZATION_INTERVAL = 0.1
_TAIL_MASS_TRUNCATION = 1e-15  # dp-accounting's default for composition


def _gaussian_points(mu: float, vdi: float) -> float:
    """Grid points of dp-accounting's Gaussian PLD with Δ/σ = μ: losses μx − μ²/2 over
    |x| ≲ 10 (mass e^-50 truncated), i.e. ≈ μ(μ + 20)/vdi (checked: 2.05e5 at μ = 1, 1.19e8
    at μ = 100 for vdi = 1e-4); we use μ(μ + 21)/vdi + 3."""
    return mu * (mu + 21.0) / vdi + 3.0


def _step_points(event: ev.PrivacyEvent, vdi: float) -> float:
    """Upper estimate of the grid points of one step's PLD, before building it."""
    if isinstance(event, ev.LaplaceEvent):
        return 2.0 / (event.noise_multiplier * vdi) + 3.0
    # Poisson-subsampled Gaussian, q < 1: the remove-direction loss ln(1 − q + q e^{(2sx − s²)/2σ²})
    # over |x| ≲ 11σ (s = 1, or 2 under replace-one) lies in [ln(1 − q), ln q + (22σs + s²)/2σ²]
    # (measured widths: 5.65 at σ = 1, q = 0.01; 21.5 at σ = 0.5, q = 0.5; 147 at σ = 0.1).
    assert isinstance(event, ev.PoissonSampledGaussianEvent)
    s = sensitivity_factor(event.relation)
    sigma, q = event.noise_multiplier, event.sampling_rate
    top = math.log(q) + (22.0 * sigma * s + s * s) / (2.0 * sigma * sigma)
    return (max(top, 0.0) - math.log1p(-q) + 1.0) / vdi + 3.0


def _step_key(event: ev.PrivacyEvent, vdi: float) -> tuple:
    """The parameters of one step (count 1) of a Laplace or Poisson-subsampled Gaussian event:
    the cache key of its PLD."""
    if isinstance(event, ev.LaplaceEvent):
        return ("laplace", event.noise_multiplier, 1.0, ADD_OR_REMOVE_ONE, vdi)
    return ("poisson", event.noise_multiplier, event.sampling_rate, event.relation, vdi)


def _step_pld(event: ev.PrivacyEvent, vdi: float) -> pld_lib.PrivacyLossDistribution:
    """One step (count 1) of a Laplace or Poisson-subsampled Gaussian event."""
    return _cached_step_pld(*_step_key(event, vdi))


@functools.lru_cache(maxsize=16)
def _cached_step_pld(
    kind: str, noise_multiplier: float, q: float, relation: NeighbouringRelation, vdi: float
) -> pld_lib.PrivacyLossDistribution:
    """Cached by parameters, not by event: other step counts (as in
    :func:`dpjax.accounting.max_steps`) reuse the step. PLD objects are not mutated by
    ``compose``/``self_compose`` (they return new ones)."""
    if kind == "laplace":
        return pld_lib.from_laplace_mechanism(
            parameter=noise_multiplier, value_discretization_interval=vdi
        )
    return vectorized.gaussian_pld(
        noise_multiplier,
        sampling_prob=q,
        value_discretization_interval=vdi,
        neighboring_relation=_DP_RELATION[relation],
    )


@functools.lru_cache(maxsize=64)
def _convolve_bounds(step_key: tuple, count: int) -> tuple[tuple[int, int], ...]:
    """dp-accounting's truncation bounds (``common.compute_self_convolve_bounds``, a Chernoff
    bound) of ``count`` self-convolutions of each direction's dense PMF of one step: computed
    once, for the grid-size check and for the self-composition."""
    step = _cached_step_pld(*step_key)
    pmfs = (step._pmf_remove, step._pmf_add)  # noqa: SLF001 (no public accessor)
    first = pld_common.compute_self_convolve_bounds(
        pmfs[0].to_dense_pmf()._probs,  # noqa: SLF001
        count,
        _TAIL_MASS_TRUNCATION,
    )
    if pmfs[1] is pmfs[0]:
        return first, first
    second = pld_common.compute_self_convolve_bounds(
        pmfs[1].to_dense_pmf()._probs,  # noqa: SLF001
        count,
        _TAIL_MASS_TRUNCATION,
    )
    return first, second


def _composed_points(event: ev.PrivacyEvent, vdi: float) -> int:
    """Grid points dp-accounting's ``self_compose(event.count)`` of one step will allocate: its
    own Chernoff truncation bound on each direction's PMF."""
    key = _step_key(event, vdi)
    if event.count == 1:
        step = _cached_step_pld(*key)
        pmfs = (step._pmf_remove, step._pmf_add)  # noqa: SLF001 (no public accessor)
        return max(p.size for p in pmfs)
    return max(hi - lo + 1 for lo, hi in _convolve_bounds(key, event.count))


def _grid_overload(events: Sequence[ev.PrivacyEvent], vdi: float) -> tuple[float, float]:
    """(estimated points of the composed PLD, overload relative to the limits; > 1: too large).

    Builds one step of each subsampled event (cached) to apply dp-accounting's own truncation
    bound; composes nothing.
    """
    mu_sq = [m for m in map(_unit_gaussian_mu_squared, events) if m is not None]
    others = [e for e in events if _unit_gaussian_mu_squared(e) is None]
    for e in others:
        if not isinstance(e, ev.LaplaceEvent | ev.PoissonSampledGaussianEvent):
            to_dp_event(e, method="pld")  # raises with the reason
    mu = math.sqrt(math.fsum(mu_sq)) if mu_sq else 0.0
    overload = _gaussian_points(mu, vdi) / MAX_PLD_GRID_POINTS if mu_sq else 0.0
    for e in others:
        overload = max(overload, _step_points(e, vdi) / MAX_PLD_STEP_POINTS)
    if overload > 1.0:
        return overload * MAX_PLD_GRID_POINTS, overload
    total = math.fsum(_composed_points(e, vdi) for e in others)
    if mu_sq:
        total += _gaussian_points(mu, vdi)
    return total, total / MAX_PLD_GRID_POINTS


def _self_composed(event: ev.PrivacyEvent, count: int, vdi: float):
    """``count`` self-compositions of one step of ``event`` (dp-accounting's
    ``self_compose``; dense steps reuse the truncation bounds of the grid-size check)."""
    key = _step_key(event, vdi)
    step = _cached_step_pld(*key)
    if count == 1:
        return step
    if vectorized.is_dense(step):
        return vectorized.self_compose(
            step, count, _TAIL_MASS_TRUNCATION, _convolve_bounds(key, count)
        )
    return _dense_if_huge(step, count).self_compose(
        count, tail_mass_truncation=_TAIL_MASS_TRUNCATION
    )


def _dense_if_huge(
    step: pld_lib.PrivacyLossDistribution, count: int
) -> pld_lib.PrivacyLossDistribution:
    """``step`` with dense PMFs where dp-accounting would compute ``size ** count`` exactly.

    A small (sparse, ≤ 1000 points) PMF decides sparse-or-dense by the Python integer
    ``size ** count``: at count = 10⁹ that integer has billions of digits and the call ran for
    minutes. Where that number exceeds 1000, dp-accounting converts to dense anyway; doing it
    first gives the same result without the big integer.
    """
    pmfs = (step._pmf_remove, step._pmf_add)  # noqa: SLF001 (no public accessor)
    huge = any(
        isinstance(p, pld_pmf.SparsePLDPmf)
        and p.size > 1
        and count * math.log(p.size) > math.log(1e3)
        for p in pmfs
    )
    if not huge:
        return step
    symmetric = step._symmetric  # noqa: SLF001
    remove = pmfs[0].to_dense_pmf()
    return pld_lib.PrivacyLossDistribution(remove, None if symmetric else pmfs[1].to_dense_pmf())


def _compose_plds(
    events: Sequence[ev.PrivacyEvent], vdi: float
) -> list[pld_lib.PrivacyLossDistribution]:
    """The events' PLDs at ``vdi``: one self-composition per subsampled/Laplace event and one
    Gaussian PLD for all Gaussian-type events (exact: μ² adds up)."""
    mu_sq = [m for m in map(_unit_gaussian_mu_squared, events) if m is not None]
    composed = [
        _self_composed(e, e.count, vdi) for e in events if _unit_gaussian_mu_squared(e) is None
    ]
    if mu_sq:
        composed.append(
            vectorized.gaussian_pld(
                1.0 / math.sqrt(math.fsum(mu_sq)), value_discretization_interval=vdi
            )
        )
    return composed


def _choose_vdi(events: Sequence[ev.PrivacyEvent], vdi: float) -> float:
    """The discretisation to use for ``events``: ``vdi``, or coarser (with a warning) when the
    grid would exceed the limits.

    Raises:
        PLDGridTooLargeError: if even ``MAX_VALUE_DISCRETIZATION_INTERVAL`` does not fit.
    """
    used = vdi
    for _ in range(6):
        _, overload = _grid_overload(events, used)
        if overload <= 1.0:
            if used != vdi:
                warnings.warn(
                    f"PLD accounting at value_discretization_interval={vdi:g} needs a grid "
                    f"beyond {MAX_PLD_GRID_POINTS} points (steps beyond {MAX_PLD_STEP_POINTS}); "
                    f"coarsened it to {used:.3g}: the ε is still a valid (pessimistic) upper "
                    "bound, only looser; compare accounting='rdp'",
                    PLDGridCoarsenedWarning,
                    stacklevel=4,
                )
            return used
        if used >= MAX_VALUE_DISCRETIZATION_INTERVAL:
            break
        used = min(used * overload * 1.1, MAX_VALUE_DISCRETIZATION_INTERVAL)
    raise PLDGridTooLargeError(
        f"PLD accounting of {list(events)!r} needs a grid beyond {MAX_PLD_GRID_POINTS} points "
        f"even at value_discretization_interval={MAX_VALUE_DISCRETIZATION_INTERVAL} (very small "
        "noise multiplier or very many steps at a large sampling rate); use accounting='rdp'"
    )


def plan_pld(events: Sequence[ev.PrivacyEvent], vdi: float) -> tuple[float, list]:
    """The discretisation to use and the events' (composed) PLDs, within the grid limits.

    Identical events are joined first (composition is commutative). Starts at ``vdi``; if the
    estimated grid exceeds :data:`MAX_PLD_STEP_POINTS` per step or :data:`MAX_PLD_GRID_POINTS`
    composed, coarsens the discretisation in proportion (pessimistic PLDs at any discretisation
    are valid upper bounds) and warns with :class:`PLDGridCoarsenedWarning`.

    Raises:
        PLDGridTooLargeError: if even ``MAX_VALUE_DISCRETIZATION_INTERVAL`` does not fit.
    """
    events = _group(events)
    used = _choose_vdi(events, vdi)
    return used, _compose_plds(events, used)


def pld_grid_points(events: Sequence[ev.PrivacyEvent], vdi: float) -> float:
    """Estimated grid points of the composed PLD of ``events`` at discretisation ``vdi``.

    Builds one step of each subsampled event to apply dp-accounting's own truncation bound.
    When a per-step estimate already exceeds :data:`MAX_PLD_STEP_POINTS`, returns that
    overload in units of :data:`MAX_PLD_GRID_POINTS` (so any value above
    ``MAX_PLD_GRID_POINTS`` means "does not fit").
    """
    return _grid_overload(_group(events), vdi)[0]


def _check_vdi(value_discretization_interval: float) -> float:
    vdi = _validate.real("value_discretization_interval", value_discretization_interval)
    _validate.in_range(
        "value_discretization_interval", vdi, 0.0, 1e-2, low_inclusive=False, high_inclusive=True
    )
    return vdi


def _epsilon_of(plds: Sequence[pld_lib.PrivacyLossDistribution], delta: float) -> float:
    total = plds[0]
    for p in plds[1:]:
        total = total.compose(p, tail_mass_truncation=_TAIL_MASS_TRUNCATION)
    return float(total.get_epsilon_for_delta(delta))


def pld_epsilon(
    events: Sequence[ev.PrivacyEvent],
    delta: float,
    *,
    value_discretization_interval: float = DEFAULT_VALUE_DISCRETIZATION_INTERVAL,
) -> float:
    """ε(δ) of the composition of ``events`` by dp-accounting's privacy loss distributions.

    Formal guarantees:
        PLD composition (Koskela, Jälkö, Honkela 2020; Doroshenko, Ghazi, Kamath, Kumar,
        Manurangsi 2022, "connect the dots", pessimistic rounding): an upper bound on the exact
        ε(δ) that tightens as ``value_discretization_interval`` shrinks. For the
        Poisson-subsampled Gaussian under add/remove-one it uses both the add and the remove
        direction; under replace-one the mixture pair (1−q)N(0)+qN(±C).

        Identical events anywhere in ``events`` are joined into one of summed count before
        composing (composition is commutative): a thousand one-step records cost one
        self-composition, not a thousand compositions.

        Where every event is a Gaussian release (Gaussian events, full-batch q = 1 DP-GD,
        fixed-size batches without amplification) the composition is exactly one Gaussian with
        μ = √(Σμᵢ²), and its exact profile is used instead of a grid
        (:func:`gaussian_epsilon_upper`): tighter, and milliseconds where a PLD grid at large μ
        took seconds or ran out of memory.

        Grid limits: if the grid would exceed :data:`MAX_PLD_GRID_POINTS` (composed) or
        :data:`MAX_PLD_STEP_POINTS` (one step), the discretisation is coarsened in proportion,
        with a :class:`PLDGridCoarsenedWarning` (still a valid upper bound), or
        :class:`PLDGridTooLargeError` (a ValueError) is raised beyond
        :data:`MAX_VALUE_DISCRETIZATION_INTERVAL`.

    Args:
        events: dpjax events, all under one relation.
        delta: δ in [0, 1).
        value_discretization_interval: PLD grid in (0, 1e-2]; default 1e-4.

    Returns:
        ε.

    Raises:
        ValueError: invalid arguments, an event PLD does not apply to, a grid too large
            (:class:`PLDGridTooLargeError`), or a padded sampler's truncation slack that fits
            in no share of δ (:class:`TruncationSlackError`; see the module docstring).
    """
    delta = _validate.real("delta", delta)
    _validate.delta("delta", delta)
    vdi = _check_vdi(value_discretization_interval)
    _common_relation(events)

    def evaluate(plain: Sequence[ev.PrivacyEvent], d: float) -> float:
        mu_sq = [_unit_gaussian_mu_squared(e) for e in plain]
        if all(m is not None for m in mu_sq):
            return gaussian_epsilon_upper(math.sqrt(math.fsum(mu_sq)), d)
        _, plds = plan_pld(plain, vdi)
        return _epsilon_of(plds, d)

    return _with_truncation_slack(events, delta, evaluate)


def pld_epsilons_incremental(
    blocks: Sequence[Sequence[ev.PrivacyEvent]],
    delta: float,
    *,
    value_discretization_interval: float = DEFAULT_VALUE_DISCRETIZATION_INTERVAL,
) -> list[float]:
    """ε(δ) after each of successive blocks of events, composing each block once.

    The k-th value is the PLD ε(δ) of ``blocks[0] + ... + blocks[k]``. The composed PLD of the
    blocks so far is kept and only the new block is composed onto it, so a history of K
    checkpoints costs K block compositions instead of K compositions from scratch.

    Formal guarantees:
        The same PLD composition as :func:`pld_epsilon` (pessimistic, an upper bound on the
        exact ε(δ)) in another order of compositions: each value is a valid upper bound; it
        may differ from :func:`pld_epsilon` of the same prefix by the discretisation error
        (≈ 1e-9 relative for DP-SGD at the default grid). The discretisation is chosen once,
        for the largest prefix (coarsened with a warning as in :func:`pld_epsilon`).

    Args:
        blocks: non-empty sequences of dpjax events, all under one relation.
        delta: δ in [0, 1).
        value_discretization_interval: PLD grid in (0, 1e-2]; default 1e-4.

    Returns:
        One ε per block.
    """
    delta = _validate.real("delta", delta)
    _validate.delta("delta", delta)
    vdi = _check_vdi(value_discretization_interval)
    everything = [e for block in blocks for e in block]
    _common_relation(everything)
    if any(not block for block in blocks):
        _validate.fail("blocks", blocks, "non-empty sequences of privacy events")
    if _overflow_mass(everything) == 0.0:
        return _pld_incremental_plain(blocks, delta, vdi)
    # Padded samplers: the first share of δ for the slack, prefix by prefix; a prefix whose
    # slack does not fit in it is evaluated alone (pld_epsilon tries the larger shares).
    share = TRUNCATION_DELTA_SHARES[0]
    plain = [_untruncated(block) for block in blocks]
    values = _pld_incremental_plain(plain, delta * (1.0 - share), vdi)
    out, prefix = [], []
    for block, eps in zip(blocks, values, strict=True):
        prefix.extend(block)
        if truncation_slack(eps, _overflow_mass(prefix)) > share * delta:
            eps = pld_epsilon(prefix, delta, value_discretization_interval=vdi)
        out.append(eps)
    return out


def _pld_incremental_plain(
    blocks: Sequence[Sequence[ev.PrivacyEvent]], delta: float, vdi: float
) -> list[float]:
    """:func:`pld_epsilons_incremental` of blocks without padded samplers (validated)."""
    everything = [e for block in blocks for e in block]
    if all(_unit_gaussian_mu_squared(e) is not None for e in everything):
        used = vdi
    else:
        used = _choose_vdi(_group(everything), vdi)
    running, mu_sq, out = None, [], []
    pieces: dict[ev.PrivacyEvent, pld_lib.PrivacyLossDistribution] = {}  # equal blocks: reuse
    for block in blocks:
        for e in _group(block):
            m = _unit_gaussian_mu_squared(e)
            if m is not None:
                mu_sq.append(m)
                continue
            if e not in pieces:
                pieces[e] = _self_composed(e, e.count, used)
            p = pieces[e]
            running = (
                p
                if running is None
                else running.compose(p, tail_mass_truncation=_TAIL_MASS_TRUNCATION)
            )
        mu = math.sqrt(math.fsum(mu_sq)) if mu_sq else 0.0
        if running is None:
            out.append(gaussian_epsilon_upper(mu, delta))
            continue
        plds = [running]
        if mu_sq:
            plds.append(vectorized.gaussian_pld(1.0 / mu, value_discretization_interval=used))
        out.append(_epsilon_of(plds, delta))
    return out


def tight_epsilon(
    events: Sequence[ev.PrivacyEvent],
    delta: float,
    *,
    method: str = "pld",
    value_discretization_interval: float = DEFAULT_VALUE_DISCRETIZATION_INTERVAL,
    orders: Sequence[float] | None = None,
) -> float:
    """ε(δ) of ``events`` by ``method`` in {"pld", "rdp"} (see :func:`pld_epsilon`,
    :func:`rdp_epsilon`).

    Args:
        events: dpjax events, all under one relation.
        delta: δ in [0, 1).
        method: ``"pld"`` (tight) or ``"rdp"``.
        value_discretization_interval: PLD grid (PLD only).
        orders: RDP orders (RDP only).

    Returns:
        ε.
    """
    _validate.one_of("method", method, TIGHT_METHODS)
    if method == "pld":
        return pld_epsilon(
            events, delta, value_discretization_interval=value_discretization_interval
        )
    return rdp_epsilon(events, delta, orders=orders)
