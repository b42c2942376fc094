"""Empirical privacy audit of dpjax: claimed ε vs an empirical lower bound, and mutants caught.

The audit suite (literature.md §3.4) lives here so that the tests (``tests/test_audit_*.py``)
and the report (``python -m experiments audit``) run the same cases. A :class:`Case` is one
mechanism on one worst-case neighbouring pair: either the **correct** dpjax implementation
(called through the public API; its ε_LB must stay ≤ the claimed ε) or a **mutant**, a
deliberately broken re-implementation (its ε_LB must exceed the claimed ε in ≥ 19 of 20
independent repetitions). Mutants exist only here, never in the library.

Float64 (x64) is enabled by :func:`run` because the ERM solvers need it; the mechanism cases
draw their noise in the dtype of their data.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from dpjax import auditing, mechanisms

DESCRIPTION = "privacy audit: empirical ε lower bounds vs claims, mutants caught, FP porosity"

DELTA = 1e-5
REPETITIONS = 20  # the mutant rule: caught in >= 19 of 20 independent repetitions
CAUGHT_AT_LEAST = 19
CONFIDENCE = 0.95


@dataclasses.dataclass(frozen=True)
class Case:
    """One audit: a mechanism, its neighbouring pair, its claim and how to score it.

    Attributes:
        family: the audited dpjax mechanism/solver (e.g. ``"laplace"``).
        variant: ``"correct..."`` (the dpjax implementation) or the name of the mutant.
        mechanism: ``mechanism(key, data) -> output``.
        make_data: returns ``(D, D′)`` (built lazily, in the current default float dtype).
        claimed_epsilon: ε the implementation claims.
        delta: δ of the claim.
        estimator: ``"direct"`` or ``"gdp"``.
        trials: runs per data set per repetition at the default scale.
        score: output → scalar, large = evidence for D′ (None: the scalar output).
        exact_epsilon: the true ε of the implemented noise, where known (tightness reference).
        note: what the case checks.
    """

    family: str
    variant: str
    mechanism: Callable[[jax.Array, Any], Any]
    make_data: Callable[[], tuple[Any, Any]]
    claimed_epsilon: float
    delta: float
    estimator: str
    trials: int
    score: Callable[[Any], jax.Array] | None = None
    exact_epsilon: float | None = None
    note: str = ""

    @property
    def name(self) -> str:
        return f"{self.family}/{self.variant}"

    @property
    def is_mutant(self) -> bool:
        return not self.variant.startswith("correct")


def run_case(
    case: Case, *, key: jax.Array, repetitions: int = REPETITIONS, scale: float = 1.0
) -> auditing.AuditResult:
    """Audit ``case`` ``repetitions`` times with ``scale × case.trials`` runs per data set."""
    data_d, data_dprime = case.make_data()
    return auditing.audit_repeated(
        case.mechanism,
        data_d,
        data_dprime,
        key=key,
        trials=max(int(case.trials * scale), 8),
        repetitions=repetitions,
        score=case.score,
        estimator=case.estimator,
        delta=case.delta,
        confidence=CONFIDENCE,
        claimed_epsilon=case.claimed_epsilon,
    )


# ---------------------------------------------------------------------------------------------
# A1: Laplace mechanism, D = {0}, D′ = {Δ}.


def _scalar_pair(shift: float) -> Callable[[], tuple[Any, Any]]:
    return lambda: (jnp.zeros(()), jnp.full((), shift))


def _laplace_lr_score(y: jax.Array) -> jax.Array:
    """Laplace log-likelihood ratio of D′ = 1_d vs D = 0_d (up to the scale): Σ|y|−|y−1|."""
    return jnp.sum(jnp.abs(y) - jnp.abs(y - 1.0))


def laplace_cases(epsilon: float = 1.0) -> list[Case]:
    """A1: the Laplace mechanism and its mutants (half noise, Δ ignored, ℓ2 for ℓ1)."""
    d = 4  # ℓ1 sensitivity of 1_d is d, its ℓ2 sensitivity √d
    common = dict(family="laplace", claimed_epsilon=epsilon, delta=0.0, estimator="direct")

    def correct(k, x):
        return mechanisms.laplace(k, x, sensitivity=1.0, epsilon=epsilon)

    def correct_vec(k, x):
        return mechanisms.laplace(k, x, sensitivity=float(d), epsilon=epsilon)

    def half_noise(k, x):
        return x + (0.5 / epsilon) * jax.random.laplace(k, jnp.shape(x), x.dtype)

    def sensitivity_ignored(k, x):  # pair differs by Δ = 2, scale 1/ε as if Δ = 1
        return x + (1.0 / epsilon) * jax.random.laplace(k, jnp.shape(x), x.dtype)

    def l2_for_l1(k, x):  # scale √d/ε instead of d/ε
        return x + (math.sqrt(d) / epsilon) * jax.random.laplace(k, jnp.shape(x), x.dtype)

    def discrete(k, x):  # the non-porous option, on the grid 2^-6 within [-8, 8]
        return mechanisms.discrete_laplace(
            k, x, sensitivity=1.0, epsilon=epsilon, bound=8.0, granularity=2.0**-6
        )

    vec_pair = lambda: (jnp.zeros(d), jnp.ones(d))  # noqa: E731
    return [
        Case(variant="correct_discrete", mechanism=discrete, make_data=_scalar_pair(1.0),
             trials=10_000, exact_epsilon=epsilon / (1 + 2.0**-6),
             note="discrete Laplace on 2^-6 grid (Δ_g = 1 + 2^-6)", **common),
        Case(variant="correct", mechanism=correct, make_data=_scalar_pair(1.0), trials=10_000,
             exact_epsilon=epsilon, note="Δ₁ = 1, output as score", **common),
        Case(variant="correct_l1_d4", mechanism=correct_vec, make_data=vec_pair,
             trials=10_000, score=_laplace_lr_score, exact_epsilon=epsilon,
             note="d = 4, Δ₁ = 4, likelihood-ratio score", **common),
        Case(variant="half_noise", mechanism=half_noise, make_data=_scalar_pair(1.0),
             trials=10_000, exact_epsilon=2 * epsilon, **common),
        Case(variant="sensitivity_ignored", mechanism=sensitivity_ignored,
             make_data=_scalar_pair(2.0), trials=10_000, exact_epsilon=2 * epsilon,
             note="Δ = 2 pair, scale 1/ε", **common),
        Case(variant="l2_sensitivity_for_l1", mechanism=l2_for_l1, make_data=vec_pair,
             trials=10_000, score=_laplace_lr_score, exact_epsilon=epsilon * math.sqrt(d),
             note="d = 4: scale √d/ε instead of d/ε", **common),
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------------
# A2: Gaussian mechanism, D = {0}, D′ = {1}, GDP estimator.


def _gaussian_noise(sigma: float) -> Callable[[jax.Array, Any], Any]:
    def mechanism(k, x):
        return x + sigma * jax.random.normal(k, jnp.shape(x), x.dtype)

    return mechanism


def _exact_gaussian_epsilon(sigma: float, delta: float = DELTA) -> float:
    return mechanisms.gaussian_epsilon(sigma=sigma, sensitivity=1.0, delta=delta)


def gaussian_cases() -> list[Case]:
    """A2: the Gaussian mechanism (analytic, classic) and its mutants."""
    common = dict(family="gaussian", delta=DELTA, estimator="gdp", make_data=_scalar_pair(1.0))
    sigma = mechanisms.analytic_gaussian_sigma(sensitivity=1.0, epsilon=1.0, delta=DELTA)
    classic = lambda eps: math.sqrt(2.0 * math.log(1.25 / DELTA)) / eps  # noqa: E731

    def analytic(eps):
        return lambda k, x: mechanisms.gaussian(k, x, sensitivity=1.0, epsilon=eps, delta=DELTA)

    def classic_api(k, x):
        return mechanisms.gaussian(
            k, x, sensitivity=1.0, epsilon=0.5, delta=DELTA, calibration="classic"
        )

    return [
        Case(variant="correct", mechanism=analytic(1.0), claimed_epsilon=1.0, trials=100_000,
             exact_epsilon=1.0, note="analytic σ (Balle–Wang) at ε = 1", **common),
        Case(variant="correct_eps10", mechanism=analytic(10.0), claimed_epsilon=10.0,
             trials=400_000, exact_epsilon=10.0, note="analytic σ at ε = 10", **common),
        Case(variant="correct_classic_eps0.5", mechanism=classic_api, claimed_epsilon=0.5,
             trials=100_000, exact_epsilon=_exact_gaussian_epsilon(classic(0.5)),
             note="classical σ at ε = 0.5 (loose: exact ε 0.353)", **common),
        Case(variant="half_noise", mechanism=_gaussian_noise(sigma / 2), claimed_epsilon=1.0,
             trials=100_000, exact_epsilon=_exact_gaussian_epsilon(sigma / 2), **common),
        Case(variant="delta_ignored", mechanism=_gaussian_noise(1.0), claimed_epsilon=1.0,
             trials=10_000, exact_epsilon=_exact_gaussian_epsilon(1.0),
             note="σ = Δ/ε", **common),
        Case(variant="classic_formula_eps10", mechanism=_gaussian_noise(classic(10.0)),
             claimed_epsilon=10.0, trials=400_000,
             exact_epsilon=_exact_gaussian_epsilon(classic(10.0)),
             note="σ = Δ√(2 ln(1.25/δ))/ε outside its range ε < 1", **common),
        Case(variant="classic_formula_eps20", mechanism=_gaussian_noise(classic(20.0)),
             claimed_epsilon=20.0, trials=100_000,
             exact_epsilon=_exact_gaussian_epsilon(classic(20.0)), **common),
    ]  # fmt: skip


def mechanism_cases() -> list[Case]:
    """Every Laplace and Gaussian case (A1, A2)."""
    return laplace_cases() + gaussian_cases()


def all_cases() -> list[Case]:
    """Every case of the suite."""
    return mechanism_cases()


# ---------------------------------------------------------------------------------------------
# The report.


def _row(case: Case, result: auditing.AuditResult, seconds: float) -> dict:
    s = result.summary()
    caught = result.exceed_count >= CAUGHT_AT_LEAST
    s.update(
        case=case.name,
        family=case.family,
        variant=case.variant,
        mutant=case.is_mutant,
        exact_epsilon=case.exact_epsilon,
        note=case.note,
        seconds=round(seconds, 2),
        ok=caught if case.is_mutant else result.exceed_count == 0,
    )
    return s


def _markdown(rows: list[dict], extra: list[str]) -> str:
    lines = [
        "## Privacy audit (empirical lower bounds on ε)",
        "",
        f"{REPETITIONS} independent repetitions per case; ε_LB is a one-sided "
        f"{CONFIDENCE:.0%} Clopper–Pearson lower bound (threshold chosen on a held-out half); "
        "shown: median [min, max] over repetitions. Ratio = median ε_LB / claimed ε. "
        f"A mutant is caught when ε_LB > claimed ε in ≥ {CAUGHT_AT_LEAST}/{REPETITIONS}.",
        "",
        "| case | estimator | N/side | claimed ε | exact ε | ε_LB median [min, max] | ratio "
        "| > claim | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        exact = "" if r["exact_epsilon"] is None else f"{r['exact_epsilon']:.3g}"
        verdict = ("caught" if r["ok"] else "MISSED") if r["mutant"] else (
            "pass" if r["ok"] else "FAIL")  # fmt: skip
        lines.append(
            f"| {r['case']} | {r['method']} | {r['trials_per_dataset']} | "
            f"{r['claimed_epsilon']:.3g} | {exact} | {r['epsilon_lb_median']:.3f} "
            f"[{r['epsilon_lb_min']:.3f}, {r['epsilon_lb_max']:.3f}] | {r['ratio']:.2f} | "
            f"{r['exceed_count']}/{r['repetitions']} | {verdict} |"
        )
    return "\n".join(lines + [""] + extra) + "\n"


def run(out_dir: pathlib.Path, *, full: bool, seed: int) -> dict:
    """Run every audit case; write ``audit.json`` and ``audit.md`` under ``out_dir``."""
    jax.config.update("jax_enable_x64", True)  # the ERM solvers need float64
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    root = jax.random.key(seed)
    rows = []
    for i, case in enumerate(all_cases()):
        start = time.perf_counter()
        result = run_case(case, key=jax.random.fold_in(root, i), scale=4.0 if full else 1.0)
        rows.append(_row(case, result, time.perf_counter() - start))
    extra: list[str] = []
    summary = {"cases": rows}
    report_md = _markdown(rows, extra)
    (out_dir / "audit.json").write_text(json.dumps(summary, indent=2, default=str))
    (out_dir / "audit.md").write_text(report_md)
    return {"report_md": report_md, **summary}
