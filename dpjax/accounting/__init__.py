"""Privacy accounting: composition theorems, tight DP-SGD accounting, calibration.

Closed forms (host-side floats): :func:`basic_composition`, :func:`parallel_composition`,
:func:`advanced_composition` (and its per-step corollary), :func:`optimal_composition_epsilon`
(Kairouz–Oh–Viswanath), :func:`group_privacy`, :func:`convert_relation` (add/remove-one →
replace-one), :func:`amplification_by_subsampling`, zCDP (:func:`gaussian_zcdp_rho`,
:func:`zcdp_compose`, :func:`zcdp_epsilon`, :func:`zcdp_gaussian_sigma`), the textbook DP-GD noise
recipes (:func:`dpgd_sigma_advanced`, :func:`dpgd_sigma_zcdp`).

f-DP (:mod:`dpjax.accounting.fdp`): exact μ-GDP conversions :func:`gdp_epsilon` and
:func:`gdp_delta`, the CLT approximation :func:`gdp_mu_clt_approximation` (alias
:func:`gdp_mu`; an approximation, not a guarantee) and :func:`tradeoff_curve` from a PLD.
Sampling with replacement: :func:`with_replacement_epsilon`.

Tight accounting through dp-accounting (RDP and PLD): :func:`dp_sgd_epsilon`,
:func:`calibrate_noise_multiplier`, :func:`max_steps`, :func:`to_dp_event`, and the
:class:`PrivacyAccountant` over the events of :mod:`dpjax.events`.

Fully adaptive composition (parameters chosen from earlier releases): :class:`PrivacyFilter`
(a budget that refuses a release that would exceed it; RDP, zCDP or basic (ε, δ)) and
:class:`PrivacyOdometer` (a running ε valid at all times), :mod:`dpjax.accounting.filters`.
"""

from dpjax.accounting.accountant import METHODS, PrivacyAccountant
from dpjax.accounting.composition import (
    advanced_composition,
    advanced_composition_heterogeneous,
    advanced_composition_step_epsilon,
    basic_composition,
    convert_relation,
    group_privacy,
    parallel_composition,
)
from dpjax.accounting.dp_sgd import calibrate_noise_multiplier, dp_sgd_epsilon, max_steps
from dpjax.accounting.fdp import (
    gdp_delta,
    gdp_epsilon,
    gdp_mu,
    gdp_mu_clt_approximation,
    gdp_tradeoff,
    tradeoff_curve,
)
from dpjax.accounting.filters import (
    FILTER_KINDS,
    BudgetExhaustedError,
    PrivacyFilter,
    PrivacyOdometer,
)
from dpjax.accounting.monte_carlo import MonteCarloEpsilon, monte_carlo_epsilon
from dpjax.accounting.optimal import optimal_composition_delta, optimal_composition_epsilon
from dpjax.accounting.recipes import (
    advanced_composition_step_budget,
    dpgd_sigma_advanced,
    dpgd_sigma_zcdp,
)
from dpjax.accounting.subsampling import SAMPLING_RELATIONS, amplification_by_subsampling
from dpjax.accounting.tight import (
    DEFAULT_RDP_ORDERS,
    DEFAULT_VALUE_DISCRETIZATION_INTERVAL,
    PLDGridCoarsenedWarning,
    PLDGridTooLargeError,
    TruncationSlackError,
    gaussian_epsilon_upper,
    pld_epsilon,
    rdp_epsilon,
    tight_epsilon,
    to_dp_event,
    truncation_slack,
)
from dpjax.accounting.truncation import noise_truncation_delta
from dpjax.accounting.with_replacement import with_replacement_delta, with_replacement_epsilon
from dpjax.accounting.zcdp import (
    gaussian_zcdp_rho,
    zcdp_compose,
    zcdp_epsilon,
    zcdp_epsilon_bun_steinke,
    zcdp_epsilon_cks,
    zcdp_gaussian_sigma,
    zcdp_rho_for_epsilon,
)
from dpjax.events import (
    EpsilonDeltaEvent,
    FixedBatchGaussianEvent,
    GaussianEvent,
    LaplaceDPSGDEvent,
    LaplaceEvent,
    PoissonSampledGaussianEvent,
    PrivacyEvent,
    RepeatAndSelectEvent,
    WithReplacementGaussianEvent,
)

__all__ = [
    "MonteCarloEpsilon",
    "monte_carlo_epsilon",
    "DEFAULT_RDP_ORDERS",
    "DEFAULT_VALUE_DISCRETIZATION_INTERVAL",
    "FILTER_KINDS",
    "METHODS",
    "PLDGridCoarsenedWarning",
    "PLDGridTooLargeError",
    "SAMPLING_RELATIONS",
    "TruncationSlackError",
    "BudgetExhaustedError",
    "EpsilonDeltaEvent",
    "FixedBatchGaussianEvent",
    "GaussianEvent",
    "LaplaceDPSGDEvent",
    "LaplaceEvent",
    "PoissonSampledGaussianEvent",
    "PrivacyAccountant",
    "PrivacyEvent",
    "PrivacyFilter",
    "PrivacyOdometer",
    "RepeatAndSelectEvent",
    "WithReplacementGaussianEvent",
    "advanced_composition",
    "advanced_composition_heterogeneous",
    "advanced_composition_step_budget",
    "advanced_composition_step_epsilon",
    "amplification_by_subsampling",
    "basic_composition",
    "calibrate_noise_multiplier",
    "convert_relation",
    "dpgd_sigma_advanced",
    "dpgd_sigma_zcdp",
    "dp_sgd_epsilon",
    "gaussian_epsilon_upper",
    "gaussian_zcdp_rho",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_mu",
    "gdp_mu_clt_approximation",
    "gdp_tradeoff",
    "group_privacy",
    "max_steps",
    "noise_truncation_delta",
    "optimal_composition_delta",
    "optimal_composition_epsilon",
    "parallel_composition",
    "pld_epsilon",
    "rdp_epsilon",
    "tight_epsilon",
    "to_dp_event",
    "tradeoff_curve",
    "with_replacement_delta",
    "with_replacement_epsilon",
    "truncation_slack",
    "zcdp_compose",
    "zcdp_epsilon",
    "zcdp_epsilon_bun_steinke",
    "zcdp_epsilon_cks",
    "zcdp_gaussian_sigma",
    "zcdp_rho_for_epsilon",
]
