"""Privacy filters and odometers: budgets that hold when parameters are chosen adaptively.

Composition theorems are stated for a sequence of mechanisms whose privacy parameters are fixed
before the data are touched. When σ, q, the clip norm or the number of steps are chosen from
earlier noisy releases (adaptive clipping, early stopping on a noisy validation metric,
hyperparameter tuning, "train a bit more"), the cost of release t is itself a random variable,
and the theorems do not apply as stated (Rogers, Roth, Ullman, Vadhan 2016, "Privacy odometers
and filters: pay-as-you-go composition", https://arxiv.org/abs/1605.08294, who define the two
objects below). Two objects handle this "fully adaptive" composition:

* :class:`PrivacyFilter` — a budget fixed in advance. Every release is charged BEFORE it happens
  (:meth:`~PrivacyFilter.try_spend` / :meth:`~PrivacyFilter.spend`); a release that would push
  the running total past the budget is refused and must not happen. The whole interaction is
  then private at the budget, whatever the analyst's adaptive choices.
* :class:`PrivacyOdometer` — no budget: it reports, after every release, an ε that bounds the
  privacy loss of the releases so far, simultaneously for every time (so the analyst may stop
  whenever the running ε looks too large).

Currencies. RDP at fixed orders (:meth:`PrivacyFilter.renyi`,
:meth:`PrivacyFilter.renyi_for_epsilon`; Feldman & Zrnic 2021), zCDP
(:meth:`PrivacyFilter.zcdp`) and (ε, δ) by basic composition (:meth:`PrivacyFilter.basic`).
There is deliberately no PLD filter: the tight PLD/f-DP composition of
:func:`~dpjax.accounting.pld_epsilon` is NOT valid when the mechanisms' parameters are chosen
adaptively — stopping when the composed PLD reaches a target curve is not a valid filter in
general (Tran, Koskela, Räisä, Honkela 2026, "f-differential privacy filters: validity and
approximate solutions", https://arxiv.org/abs/2602.06756; Regehr et al. 2026,
https://arxiv.org/abs/2602.15815). RDP and zCDP add up under fully adaptive composition, which
is why the filters here use them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from dpjax import _validate
from dpjax import events as ev
from dpjax.accounting.accountant import _dp_profile, _zcdp_rho
from dpjax.accounting.renyi import rdp_curve, rdp_to_epsilon
from dpjax.accounting.zcdp import zcdp_epsilon

__all__ = ["BudgetExhaustedError", "PrivacyFilter", "PrivacyOdometer", "FILTER_KINDS"]

#: The currencies of :class:`PrivacyFilter`.
FILTER_KINDS = ("renyi", "zcdp", "basic")


class BudgetExhaustedError(RuntimeError):
    """A release was refused by a :class:`PrivacyFilter`: its cost would exceed the budget.

    Nothing was charged and the release must not happen.
    """


def _check_orders(orders: Any) -> tuple[float, ...]:
    values = np.atleast_1d(np.asarray(orders, dtype=np.float64))
    if values.ndim != 1 or values.size == 0 or not np.all(np.isfinite(values)):
        _validate.fail("orders", orders, "a non-empty sequence of finite RDP orders α > 1.01")
    if np.any(values <= 1.01) or len(np.unique(values)) != values.size:
        _validate.fail(
            "orders",
            orders,
            "distinct RDP orders α > 1.01 (the conversion to (ε, δ) is unstable at α ≤ 1.01)",
        )
    return tuple(float(a) for a in values)


def _check_open_delta(delta: Any) -> float:
    return _validate.in_range("delta", delta, 0.0, 1.0, low_inclusive=False)


def _cost_vector(name: str, cost: Any, size: int) -> tuple[float, ...]:
    """A raw cost in the filter's currency: finite or +inf, ≥ 0, one value per coordinate."""
    values = np.atleast_1d(np.asarray(cost, dtype=np.float64))
    if values.shape != (size,) or np.any(np.isnan(values)) or np.any(values < 0):
        _validate.fail(name, cost, f"{size} non-negative cost value(s) (a NaN is refused)")
    return tuple(float(v) for v in values)


class PrivacyFilter:
    """A privacy budget that refuses any release whose cost would exceed it.

    Build one with :meth:`renyi`, :meth:`renyi_for_epsilon`, :meth:`zcdp` or :meth:`basic`.
    Charge each release BEFORE it happens: :meth:`try_spend` returns False (and charges
    nothing) when the release would exceed the budget; :meth:`spend` raises
    :class:`BudgetExhaustedError` instead. A refused release must not happen. A cost is a
    dpjax privacy event (:mod:`dpjax.events`: its cost in the filter's currency is computed
    here) or a raw cost in that currency (RDP values at :attr:`orders`, ρ, or a pair (ε, δ)).

    The running totals are kept EXACTLY (sums of the floats as rationals): a release is
    accepted only if the exact total stays ≤ the budget at every coordinate, so rounding can
    never let a release through past the budget. A refusal depends only on the costs (public,
    chosen from earlier releases), so the analyst may go on with a cheaper release.

    Attributes:
        kind: "renyi", "zcdp" or "basic".
        orders: the RDP orders α (kind "renyi"; empty otherwise).
        budget: the budget per coordinate (RDP at each order; (ρ,); (ε, δ)).
        delta: δ of the guarantee :attr:`epsilon` reports.

    Formal guarantees:
        Let A_1, A_2, … be released one after another, A_t chosen (with its privacy parameters)
        as any function of A_1..A_{t−1}, and let every release be charged before it happens,
        a refused one not happening. Neighbouring relation: that of the costs charged (each
        event's own; dpjax's DP-SGD events are add/remove-one).

        * ``renyi``: A_t is (α, ρ_t(α))-RDP at every order α of :attr:`orders`; the filter keeps
          Σ_t ρ_t(α) ≤ B(α) at EVERY order, surely. By the Rényi filter theorem (Feldman &
          Zrnic 2021, "Individual privacy accounting via a Rényi filter", Theorem 3.1,
          https://arxiv.org/abs/2008.11193), applied at each order, the whole interaction is
          (α, B(α))-RDP for every α, and hence (ε, δ)-DP with ε the minimum over α of the
          conversion of Canonne, Kamath & Steinke 2020 (https://arxiv.org/abs/2004.00603,
          Proposition 12), as :func:`~dpjax.accounting.renyi.rdp_to_epsilon` evaluates it. The
          order set and B are fixed in advance (never chosen from the releases).
        * ``zcdp``: A_t is ρ_t-zCDP, i.e. (α, αρ_t)-RDP for every α > 1; the filter keeps
          Σ ρ_t ≤ ρ, i.e. Σ αρ_t ≤ αρ at every order at once, so by the same theorem at every
          α the interaction is ρ-zCDP; ε(δ) is :func:`~dpjax.accounting.zcdp_epsilon`'s
          conversion.
        * ``basic``: A_t is (ε_t, δ_t)-DP; the filter keeps Σ ε_t ≤ ε and Σ δ_t ≤ δ; the
          interaction is (ε, δ)-DP: basic composition is a valid privacy filter (Rogers, Roth,
          Ullman, Vadhan 2016, https://arxiv.org/abs/1605.08294, their definition of a valid
          privacy filter in Section 3; basic composition is its simplest instance).

        The guarantee is (:attr:`epsilon`, :attr:`delta_total`): δ plus any δ reserved by
        releases whose costs leave an additive term out (:meth:`reserve_delta`; a padded
        sampler's truncation slack, coupled to the untruncated run whose RDP was charged).
        What it covers: every release charged to this filter, before it happened. NOT covered:
        a release not charged (an evaluation on private data, a metric of a private batch),
        a release charged after it happened, a cost understated by the caller, the filter's
        state lost or reset between releases (the budget then restarts: keep one filter for
        the whole life of the data set's budget; save :meth:`state_dict` with every checkpoint
        and restore it with :meth:`from_state_dict`). The reported ε depends on the BUDGET, not
        on what was spent: when the costs are chosen adaptively, the spent total is not itself
        a guarantee (use :class:`PrivacyOdometer` for a running ε). Tight PLD composition is
        not valid under adaptive parameters (module docstring), so none is offered here.

    Example:
        >>> from dpjax.accounting import PrivacyFilter, PoissonSampledGaussianEvent
        >>> f = PrivacyFilter.renyi_for_epsilon(epsilon=2.0, delta=1e-5, order=12.0)
        >>> step = PoissonSampledGaussianEvent(noise_multiplier=2.0, sampling_rate=0.05)
        >>> taken = 0
        >>> while f.try_spend(step):  # charge BEFORE each release; False: do not release
        ...     taken += 1
        >>> taken, round(f.epsilon, 6), f.max_releases(step)
        (251, 2.0, 0)
    """

    def __init__(self, *, kind: str, budget: Sequence[float], delta: float, orders=()):
        """Use :meth:`renyi`, :meth:`renyi_for_epsilon`, :meth:`zcdp` or :meth:`basic`."""
        self.kind = _validate.one_of("kind", kind, FILTER_KINDS)
        self.orders = _check_orders(orders) if kind == "renyi" else ()
        self.budget = tuple(float(b) for b in budget)
        self.delta = (
            _validate.delta("delta", delta) if kind == "basic" else _check_open_delta(delta)
        )
        sizes = {"renyi": len(self.orders), "zcdp": 1, "basic": 2}
        positive = self.budget[:1] if kind == "basic" else self.budget
        if (
            len(self.budget) != sizes[kind]
            or not all(0 < b < math.inf for b in positive)
            or (kind == "basic" and self.budget[1] != self.delta)
        ):
            _validate.fail("budget", budget, f"{sizes[kind]} finite budget value(s) > 0")
        self._budget_exact = tuple(Fraction(b) for b in self.budget)
        self._spent = [Fraction(0)] * len(self.budget)
        self._releases = 0
        self._refused = 0
        self._reserved = Fraction(0)

    # ---- constructors

    @classmethod
    def renyi(cls, *, orders: Any, budget: Any, delta: float) -> PrivacyFilter:
        """An RDP filter: Σ ρ_t(α) ≤ B(α) kept at every order α of ``orders``.

        Args:
            orders: RDP orders α > 1.01 (one or more, distinct).
            budget: B(α) > 0, one value per order (or one value for one order). E.g. the
                RDP curve of a planned run (``rdp_curve(events, orders=orders)[1]``): every
                adaptive run whose steps are each at most as costly at every order fits.
            delta: δ in (0, 1) of the reported ε.

        Raises:
            ValueError: a bad order, a non-positive or non-finite budget, δ outside (0, 1).
        """
        grid = _check_orders(orders)
        values = np.atleast_1d(np.asarray(budget, dtype=np.float64))
        if values.shape != (len(grid),) or not np.all(np.isfinite(values)) or np.any(values <= 0):
            _validate.fail("budget", budget, f"{len(grid)} finite RDP budget(s) > 0, one per order")
        return cls(kind="renyi", budget=values, delta=_check_open_delta(delta), orders=grid)

    @classmethod
    def renyi_for_epsilon(cls, *, epsilon: float, delta: float, order: float) -> PrivacyFilter:
        """An RDP filter at one order α whose guarantee is (ε, δ)-DP (Feldman & Zrnic 2021).

        The budget B(α) is the largest RDP value whose conversion (Canonne, Kamath & Steinke
        2020, Proposition 12: ε = B + log(1 − 1/α) − log(δα)/(α − 1)) is ≤ ``epsilon``. Choose
        α in advance (e.g. the order at which the planned, non-adaptive run reaches its ε:
        ``dp_accounting.rdp.compute_epsilon`` returns it); a badly chosen α wastes budget but
        never breaks the guarantee.

        Args:
            epsilon: ε > 0 of the guarantee.
            delta: δ in (0, 1).
            order: α > 1.01.

        Raises:
            ValueError: ε ≤ 0, δ outside (0, 1), α ≤ 1.01, or an ε smaller than the
                conversion's own cost at α and δ (B would be ≤ 0).
        """
        eps = _validate.epsilon("epsilon", epsilon)
        delta = _check_open_delta(delta)
        (alpha,) = _check_orders([order])
        bound = eps - math.log1p(-1.0 / alpha) + math.log(delta * alpha) / (alpha - 1.0)
        while bound > 0 and rdp_to_epsilon([alpha], [bound], delta) > eps:
            bound = math.nextafter(bound, 0.0)  # the conversion, evaluated, stays ≤ ε
        if not bound > 0:
            _validate.fail(
                "epsilon",
                epsilon,
                f"> {eps - bound:.6g}: at order={alpha:g} and delta={delta:g} the RDP→(ε, δ) "
                "conversion alone costs that much (choose a larger order)",
            )
        return cls(kind="renyi", budget=[bound], delta=delta, orders=(alpha,))

    @classmethod
    def zcdp(cls, *, rho: float, delta: float) -> PrivacyFilter:
        """A zCDP filter: Σ ρ_t ≤ ρ (every release ρ_t-zCDP; see "Formal guarantees").

        Costs of events: Gaussian releases ρ = Δ²/(2σ²)·count; pure ε-DP releases ε²/2
        (Bun & Steinke 2016, Proposition 1.4). A Poisson-subsampled Gaussian with q < 1 has no
        useful zCDP bound and is refused: use a :meth:`renyi` filter for DP-SGD.

        Args:
            rho: ρ > 0.
            delta: δ in (0, 1) of the reported ε.

        Raises:
            ValueError: ρ ≤ 0 or not finite; δ outside (0, 1).
        """
        rho = _validate.positive("rho", rho)
        return cls(kind="zcdp", budget=[rho], delta=_check_open_delta(delta))

    @classmethod
    def basic(cls, *, epsilon: float, delta: float) -> PrivacyFilter:
        """An (ε, δ) filter by basic composition: Σ ε_t ≤ ε and Σ δ_t ≤ δ.

        Always valid, loose for many releases (ε grows linearly). Costs: (ε_t, δ_t) pairs, or
        events with a fixed (ε, δ) (:class:`~dpjax.events.EpsilonDeltaEvent`, Laplace).

        Args:
            epsilon: ε > 0.
            delta: δ in [0, 1) (0: pure ε-DP).

        Raises:
            ValueError: ε ≤ 0 or not finite; δ outside [0, 1).
        """
        eps = _validate.epsilon("epsilon", epsilon)
        return cls(kind="basic", budget=[eps, _validate.delta("delta", delta)], delta=delta)

    # ---- costs and spending

    def cost(self, release: Any) -> tuple[float, ...]:
        """The cost of ``release`` in this filter's currency (one value per coordinate).

        Args:
            release: a dpjax :class:`~dpjax.events.PrivacyEvent` (``count`` releases), or a
                raw cost: RDP values at :attr:`orders` ("renyi"), ρ ("zcdp"), (ε, δ) ("basic").

        Raises:
            ValueError: a raw cost of the wrong length, negative or NaN; an event this
                currency has no bound for.
        """
        if not isinstance(release, ev.PrivacyEvent):
            return _cost_vector("cost", release, len(self.budget))
        if self.kind == "renyi":
            _, curve = rdp_curve([release], orders=self.orders)
            # NaN: a failed evaluation, read as +inf (refused); a negative value (rounding of
            # a divergence that is ≥ 0) as 0
            return tuple(math.inf if math.isnan(v) else max(float(v), 0.0) for v in curve)
        if self.kind == "zcdp":
            rho = _zcdp_rho(release)
            if rho is None:
                _validate.fail(
                    "cost",
                    release,
                    "an event with a zCDP bound (Gaussian, full-batch, pure ε-DP); a "
                    "subsampled Gaussian has none useful here: use PrivacyFilter.renyi",
                )
            return (float(rho),)
        profile = _dp_profile(release)
        if profile is None:
            _validate.fail(
                "cost",
                release,
                "an event with a fixed (ε, δ) (EpsilonDeltaEvent, Laplace); for a Gaussian "
                "release pass its (ε, δ) pair, or use PrivacyFilter.renyi/zcdp",
            )
        return (
            math.fsum(c * e for e, _, c in profile),
            math.fsum(c * d for _, d, c in profile),
        )

    def fits(self, release: Any) -> bool:
        """Whether ``release`` would be accepted now (nothing is charged)."""
        return self._after(self.cost(release)) is not None

    def _after(self, cost: tuple[float, ...]) -> list[Fraction] | None:
        if any(math.isinf(c) for c in cost):
            return None
        totals = [s + Fraction(c) for s, c in zip(self._spent, cost, strict=True)]
        if all(t <= b for t, b in zip(totals, self._budget_exact, strict=True)):
            return totals
        return None

    def try_spend(self, release: Any) -> bool:
        """Charge ``release`` if it fits the budget and return True; else charge nothing and
        return False (the release must then not happen)."""
        totals = self._after(self.cost(release))
        if totals is None:
            self._refused += 1
            return False
        self._spent = totals
        self._releases += 1
        return True

    def spend(self, release: Any) -> None:
        """Charge ``release``, or raise :class:`BudgetExhaustedError` (nothing charged).

        Raises:
            BudgetExhaustedError: the release would exceed the budget; it must not happen.
        """
        cost = self.cost(release)
        if not self.try_spend(cost):
            raise BudgetExhaustedError(
                f"the release's cost {self._describe(cost)} would bring the spent "
                f"{self._describe(self.spent)} past the budget {self._describe(self.budget)} "
                f"(guarantee ε={self.epsilon:.6g} at δ={self.delta_total:.3g}); it was "
                "refused and nothing was charged"
            )

    def max_releases(self, release: Any) -> int:
        """How many more copies of ``release`` fit the remaining budget (exactly)."""
        cost = self.cost(release)
        counts = []
        for c, s, b in zip(cost, self._spent, self._budget_exact, strict=True):
            if math.isinf(c):
                return 0
            if c > 0:
                counts.append(int((b - s) / Fraction(c)))
        return min(counts) if counts else math.inf  # type: ignore[return-value]

    def reserve_delta(self, amount: float) -> None:
        """Add ``amount`` ≥ 0 to the δ of the guarantee (:attr:`delta_total`): an additive δ
        owed by releases charged here that their costs do not include, e.g. the truncation
        slack of a padded Poisson sampler (:func:`~dpjax.make_private` with ``budget=``
        reserves its bound here, once per object)."""
        amount = _validate.non_negative("amount", amount)
        self._reserved += Fraction(amount)

    # ---- checkpoints

    def state_dict(self) -> dict[str, Any]:
        """The filter as JSON-ready data, spent totals exact (``"p/q"`` strings).

        Save it with every checkpoint and restore it with :meth:`from_state_dict` when a run
        restarts: a new filter would start from a full budget and the guarantee would not
        cover the releases made before the restart.
        """
        return {
            "kind": self.kind,
            "orders": list(self.orders),
            "budget": list(self.budget),
            "delta": self.delta,
            "spent": [str(s) for s in self._spent],
            "reserved": str(self._reserved),
            "releases": self._releases,
            "refused": self._refused,
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> PrivacyFilter:
        """The filter saved by :meth:`state_dict`, with its spent totals and reserved δ.

        Raises:
            ValueError: a malformed ``state`` (a spent total or reserved δ negative or not a
                rational, a spent total past the budget, a bad budget or kind).
        """
        try:
            out = cls(
                kind=state["kind"],
                budget=state["budget"],
                delta=state["delta"],
                orders=state["orders"],
            )
            spent = [Fraction(s) for s in state["spent"]]
            reserved = Fraction(state["reserved"])
            releases, refused = int(state["releases"]), int(state["refused"])
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as err:
            _validate.fail("state", state, f"a PrivacyFilter.state_dict() ({err})")
        if (
            len(spent) != len(out.budget)
            or any(not 0 <= s <= b for s, b in zip(spent, out._budget_exact, strict=True))
            or reserved < 0
            or releases < 0
            or refused < 0
        ):
            _validate.fail("state", state, "spent totals in [0, budget] and a reserved δ ≥ 0")
        out._spent, out._reserved = spent, reserved
        out._releases, out._refused = releases, refused
        return out

    # ---- reports

    @property
    def delta_total(self) -> float:
        """δ of the guarantee of everything charged: :attr:`delta` plus the reserved δ
        (rounded up)."""
        return _round_up(Fraction(self.delta) + self._reserved)

    @property
    def spent(self) -> tuple[float, ...]:
        """The running total per coordinate (rounded up to a float: never below the exact)."""
        return tuple(_round_up(s) for s in self._spent)

    @property
    def remaining(self) -> tuple[float, ...]:
        """Budget minus spent, per coordinate (rounded down)."""
        return tuple(
            _round_down(b - s) for b, s in zip(self._budget_exact, self._spent, strict=True)
        )

    @property
    def releases(self) -> int:
        """The number of accepted releases."""
        return self._releases

    @property
    def refused(self) -> int:
        """The number of refused releases."""
        return self._refused

    @property
    def epsilon(self) -> float:
        """ε of the guarantee at :attr:`delta` (from the BUDGET: it holds whatever the
        adaptive choices; see "Formal guarantees")."""
        if self.kind == "renyi":
            return rdp_to_epsilon(self.orders, self.budget, self.delta)
        if self.kind == "zcdp":
            return zcdp_epsilon(rho=self.budget[0], delta=self.delta)
        return self.budget[0]

    def _describe(self, values: Sequence[float]) -> str:
        if self.kind == "renyi":
            body = ", ".join(f"α={a:g}: {v:.6g}" for a, v in zip(self.orders, values, strict=True))
            return f"RDP {{{body}}}"
        if self.kind == "zcdp":
            return f"ρ={values[0]:.6g}"
        return f"(ε={values[0]:.6g}, δ={values[1]:.6g})"

    def __repr__(self) -> str:
        return (
            f"PrivacyFilter({self.kind}, budget {self._describe(self.budget)}, "
            f"spent {self._describe(self.spent)}, releases={self._releases}, "
            f"epsilon={self.epsilon:.6g}, delta={self.delta:g})"
        )


def _round_up(x: Fraction) -> float:
    f = float(x)
    return math.nextafter(f, math.inf) if Fraction(f) < x else f


def _round_down(x: Fraction) -> float:
    f = float(x)
    return math.nextafter(f, -math.inf) if Fraction(f) > x else f


class PrivacyOdometer:
    """A running ε of adaptively chosen releases, valid at every time simultaneously.

    Record each release (:meth:`record`: nothing is refused); :attr:`epsilon` bounds the
    privacy loss of everything recorded so far. With k orders α_j and running RDP totals
    S_t(α_j):

        ε_t = min_j [ S_t(α_j) + log(k/δ)/(α_j − 1) ]   (0 before the first release).

    Args:
        delta: δ in (0, 1), shared by all times.
        orders: the RDP orders (fixed in advance; default: 2, 3, 4, 6, 8, 12, 16, 24, 32,
            48, 64, 128, 256). More orders cost log k in ε.

    Formal guarantees:
        Let A_t be (α, ρ_t(α))-RDP with ρ_t chosen from A_1..A_{t−1}, and L_t the privacy loss
        of the first t releases on neighbouring D, D′ (add/remove-one for dpjax's DP-SGD
        events). At each order α, M_t = exp((α − 1)(L_t − S_t(α))) is a non-negative
        supermartingale under the run on D with M_0 = 1, because
        E[exp((α − 1)ℓ_t) | A_1..A_{t−1}] = exp((α − 1)D_α) ≤ exp((α − 1)ρ_t(α)) (the
        supermartingale behind the Rényi filter: Feldman & Zrnic 2021,
        https://arxiv.org/abs/2008.11193; Whitehouse, Ramdas, Rogers, Wu 2023, "Fully adaptive
        composition in differential privacy", https://arxiv.org/abs/2203.05481). Ville's
        inequality (Ville 1939: P(sup_t M_t ≥ 1/x) ≤ x) at x = δ/k, and a union bound over the
        k orders, give P(∃t: L_t > ε_t) ≤ δ: the reported ε_t bound the privacy loss at all
        times at once — a valid privacy odometer in the sense of Rogers, Roth, Ullman, Vadhan
        2016 (https://arxiv.org/abs/1605.08294). The conversion is the Markov-type
        log(1/δ)/(α − 1) (Mironov 2017, Proposition 3), not the sharper one of the filters:
        the time-uniform bound costs that, plus log k for the orders. Covers every recorded
        release (record BEFORE releasing); a release not recorded is not covered.

    Example:
        >>> from dpjax.accounting import PrivacyOdometer, GaussianEvent
        >>> odo = PrivacyOdometer(delta=1e-5)
        >>> odo.record(GaussianEvent(noise_multiplier=10.0, count=4))
        >>> round(odo.epsilon, 4)
        1.0921
    """

    DEFAULT_ORDERS = (2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0, 128.0, 256.0)

    def __init__(self, *, delta: float, orders: Sequence[float] | None = None):
        self.delta = _check_open_delta(delta)
        self.orders = _check_orders(self.DEFAULT_ORDERS if orders is None else orders)
        self._spent = np.zeros(len(self.orders), dtype=np.float64)
        self._releases = 0
        self.history: list[float] = []

    def record(self, release: Any) -> None:
        """Add ``release`` (a dpjax event, or its RDP values at :attr:`orders`) to the total.

        The total is rounded upward (each addition to the next float up), so it never falls
        below the exact sum.
        """
        if isinstance(release, ev.PrivacyEvent):
            _, curve = rdp_curve([release], orders=self.orders)
            # NaN (a failed evaluation) as +inf; a negative value (the rounding of a
            # divergence that is ≥ 0) as 0, as the filter does: never a credit
            cost = np.where(np.isnan(curve), np.inf, np.maximum(curve, 0.0))
        else:
            cost = np.asarray(_cost_vector("release", release, len(self.orders)))
        total = self._spent + cost
        self._spent = np.nextafter(total, np.inf)
        self._releases += 1
        self.history.append(self.epsilon)

    @property
    def spent(self) -> tuple[float, ...]:
        """The running RDP total at each order (an upper bound of the exact sum)."""
        return tuple(float(s) for s in self._spent)

    @property
    def releases(self) -> int:
        return self._releases

    @property
    def epsilon(self) -> float:
        """ε_t of the releases so far (valid simultaneously over t; 0 before any)."""
        if self._releases == 0:
            return 0.0
        alphas = np.asarray(self.orders)
        share = math.log(len(self.orders) / self.delta)
        return math.nextafter(float(np.min(self._spent + share / (alphas - 1.0))), math.inf)

    def __repr__(self) -> str:
        return (
            f"PrivacyOdometer(releases={self._releases}, epsilon={self.epsilon:.6g}, "
            f"delta={self.delta:g}, orders={len(self.orders)})"
        )
