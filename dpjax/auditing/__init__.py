"""Empirical privacy auditing: lower bounds on ε that catch implementation bugs.

* :mod:`dpjax.auditing.estimators` – ε lower bounds from scores (direct Clopper–Pearson,
  Gaussian-DP, one-run);
* :mod:`dpjax.auditing.harness` – runs a mechanism on D and D′ with independent keys (vmapped);
* :mod:`dpjax.auditing.porosity` – Mironov's floating-point test: outputs on D impossible on D′;
* :mod:`dpjax.auditing.dp_sgd_audit` – whole ``make_private`` runs: Dirac gradient canaries,
  the white-box likelihood-ratio statistic, :func:`audit_run` (one-run audit of a training run);
* :mod:`dpjax.auditing.exact` – exact privacy profiles (pure ε, δ(ε)) of mechanisms whose
  output law is finite and computable, over adversarial neighbour pairs.

Audits are evidence, not proofs: a correct mechanism must give ε_LB ≤ claimed ε, a broken one
is caught when ε_LB > claimed ε.
"""

from dpjax.auditing import dp_sgd_audit, exact, porosity
from dpjax.auditing.dp_sgd_audit import RunAudit, audit_run
from dpjax.auditing.estimators import (
    EpsilonLowerBound,
    clopper_pearson_lower,
    clopper_pearson_upper,
    direct_epsilon_lower_bound,
    epsilon_from_rates,
    gdp_delta,
    gdp_epsilon,
    gdp_epsilon_lower_bound,
    gdp_mu_for,
    gdp_mu_from_rates,
    guesses_from_scores,
    one_run_epsilon_lower_bound,
    one_run_max_epsilon,
    one_run_p_value,
)
from dpjax.auditing.harness import AuditResult, audit, audit_repeated, run_trials

__all__ = [
    "AuditResult",
    "EpsilonLowerBound",
    "RunAudit",
    "audit",
    "audit_run",
    "audit_repeated",
    "clopper_pearson_lower",
    "clopper_pearson_upper",
    "direct_epsilon_lower_bound",
    "dp_sgd_audit",
    "epsilon_from_rates",
    "exact",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_epsilon_lower_bound",
    "gdp_mu_for",
    "gdp_mu_from_rates",
    "guesses_from_scores",
    "one_run_epsilon_lower_bound",
    "one_run_max_epsilon",
    "one_run_p_value",
    "porosity",
    "run_trials",
]
