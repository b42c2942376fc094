"""Empirical privacy audit of dpjax: claimed ε vs an empirical lower bound, and mutants caught.

The audit suite lives here so that the tests (``tests/auditing/``)
and the report (``python -m experiments audit``) run the same cases. A :class:`Case` is one
mechanism on one worst-case neighbouring pair: either the **correct** dpjax implementation
(called through the public API; its ε_LB must stay ≤ the claimed ε) or a **mutant**, a
deliberately broken re-implementation (its ε_LB must exceed the claimed ε in ≥ 19 of 20
independent repetitions). Mutants exist only here, never in the library.

Every audit uses fixed keys, so the tests are deterministic; each bound holds at 99.75%
(Bonferroni over the ≈ 20 audits: with 95% per bound, one correct audit in
a few hundred is flagged by chance — observed once for the tight ε = 10 Gaussian). "Exact ε"
is the ε of the noise actually implemented (the tightness reference), where it is known in
closed form. Float64 (x64) is enabled by :func:`run` because the ERM solvers need it; the mechanism
cases draw their noise in the dtype of their data.
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
import numpy as np

from dpjax import auditing, mechanisms
from experiments import audit_dpsgd

DESCRIPTION = "privacy audit: empirical ε lower bounds vs claims, mutants caught, FP porosity"

DELTA = 1e-5
REPETITIONS = 20  # the mutant rule: caught in >= 19 of 20 independent repetitions
CORRECT_REPETITIONS = 5  # a correct mechanism must stay below its claim in every one
CAUGHT_AT_LEAST = 19
# Bonferroni over the ≈ 20 audits of one run: each bound holds at 99.75%,
# so a correct implementation is falsely flagged in some audit with probability ≤ 5%.
CONFIDENCE = 0.9975


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
        repetitions: independent audits (default: 20 for a mutant, 5 for a correct case).
        slow: too slow for the default test suite (run under ``pytest -m slow``).
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
    repetitions: int | None = None
    slow: bool = False

    @property
    def name(self) -> str:
        return f"{self.family}/{self.variant}"

    @property
    def is_mutant(self) -> bool:
        return not self.variant.startswith("correct")

    @property
    def default_repetitions(self) -> int:
        if self.repetitions is not None:
            return self.repetitions
        return REPETITIONS if self.is_mutant else CORRECT_REPETITIONS


def run_case(
    case: Case, *, key: jax.Array, repetitions: int | None = None, scale: float = 1.0
) -> auditing.AuditResult:
    """Audit ``case`` ``repetitions`` times with ``scale × case.trials`` runs per data set."""
    data_d, data_dprime = case.make_data()
    return auditing.audit_repeated(
        case.mechanism,
        data_d,
        data_dprime,
        key=key,
        trials=max(int(case.trials * scale), 8),
        repetitions=repetitions or case.default_repetitions,
        score=case.score,
        estimator=case.estimator,
        delta=case.delta,
        confidence=CONFIDENCE,
        claimed_epsilon=case.claimed_epsilon,
        assume_gaussian_tradeoff=case.estimator == "gdp",  # GDP cases audit Gaussian mechanisms
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
        Case(variant="correct", mechanism=discrete, make_data=_scalar_pair(1.0),
             trials=10_000, exact_epsilon=epsilon / (1 + 2.0**-6),
             note="non-porous: grid 2^-6 in [-8, 8], Δ_g = 1 + 2^-6",
             **dict(common, family="discrete_laplace")),
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
    return mechanism_cases() + solver_cases()


# ---------------------------------------------------------------------------------------------
# B–D: the ERM solvers (float64). Canaries saturate the sensitivity bound:
# the linear loss ℓ(w; x, y) = −y⟨w, x⟩ with x = e₁ and y flipped between D and D′ moves the
# minimiser by exactly 2L/(μn) (output perturbation) and the clipped gradient by exactly 2C at
# every step (a Dirac gradient canary for DP-GD); the other n − 1 points have x = 0.

_N, _MU, _STEPS = 10, 0.1, 10


def _canary_pair(n: int, d: int) -> Callable[[], tuple[Any, Any]]:
    def make():
        X = jnp.zeros((n, d), jnp.float64).at[0, 0].set(1.0)
        y = jnp.ones(n, jnp.float64)
        return (X, y), (X, y.at[0].set(-1.0))

    return make


def _minus_first(w: jax.Array) -> jax.Array:
    """D has y = +1 (w₁ pushed up), D′ has y = −1: large −w₁ is evidence for D′."""
    return -w[0]


def output_perturbation_cases() -> list[Case]:
    """B1: Gaussian output perturbation with the linear-loss canary (Δ₂ = 2L/(μn) exactly)."""
    from dpjax import erm

    loss, eps = erm.losses.linear, 1.0
    sens = 2.0 * loss.lipschitz / (_MU * _N)  # replace-one argmin sensitivity
    sigma = mechanisms.analytic_gaussian_sigma(sensitivity=sens, epsilon=eps, delta=DELTA)
    common = dict(
        family="output_perturbation",
        make_data=_canary_pair(_N, 2),
        claimed_epsilon=eps,
        delta=DELTA,
        estimator="gdp",
        score=_minus_first,
    )

    def correct(k, data):
        X, y = data
        return erm.output_perturbation(k, X, y, loss=loss, mu=_MU, epsilon=eps, delta=DELTA).params

    def minimiser(data):
        return erm.solve(*data, loss=loss, mu=_MU).params

    def half_noise(k, data):
        w = minimiser(data)
        return w + (sigma / 2.0) * jax.random.normal(k, w.shape, w.dtype)

    def add_remove_sensitivity(k, data):  # L/(μn): the add/remove bound under replace-one
        w = minimiser(data)
        return mechanisms.gaussian(k, w, sensitivity=sens / 2.0, epsilon=eps, delta=DELTA)

    return [
        Case(variant="correct", mechanism=correct, trials=100_000, exact_epsilon=eps,
             note="linear-loss canary, n = 10, μ = 0.1", **common),
        Case(variant="half_noise", mechanism=half_noise, trials=50_000,
             exact_epsilon=_exact_gaussian_epsilon(sigma / 2.0 / sens), **common),
        Case(variant="add_remove_sensitivity_under_replace_one", mechanism=add_remove_sensitivity,
             trials=50_000, exact_epsilon=_exact_gaussian_epsilon(sigma / 2.0 / sens),
             note="Δ = L/(μn) instead of 2L/(μn)", **common),
    ]  # fmt: skip


def _kst_sigma(eps: float, delta: float, lipschitz: float = 1.0) -> float:
    """KST12's σ = L√(8 ln(2/δ) + 4ε)/ε (the variant dpjax.erm.objective_perturbation uses)."""
    return lipschitz * math.sqrt(8.0 * math.log(2.0 / delta) + 4.0 * eps) / eps


def _logistic_tilted_argmin(b: jax.Array, x: jax.Array, mu: float) -> jax.Array:
    """argmin_w log(1 + e^{−xw}) + (μ/2)w² + bw in 1-D (n = 1, y = 1), by bisection on ∇."""

    def grad(w):
        return -x * jax.nn.sigmoid(-x * w) + mu * w + b

    def body(_, bracket):
        lo, hi = bracket
        mid = 0.5 * (lo + hi)
        up = grad(mid) > 0
        return jnp.where(up, lo, mid), jnp.where(up, mid, hi)

    r = (jnp.abs(b) + 1.0) / mu
    lo, hi = jax.lax.fori_loop(0, 200, body, (-r, r))
    return 0.5 * (lo + hi)


def objective_perturbation_cases() -> list[Case]:
    """C1 (linear loss, Gaussian-mechanism case) and C2 (logistic: the extra regulariser)."""
    from dpjax import erm

    eps = 1.0

    def correct_linear(k, data):
        X, y = data
        return erm.objective_perturbation(
            k, X, y, loss=erm.losses.linear, mu=_MU, epsilon=eps, delta=DELTA
        ).params

    # C2: n = 1, d = 1, μ far below c/(εn): D = {x = 1}, D′ = {x = 0}. The Jacobian term
    # (φ''(0) + μ)/μ = 251 is what the extra ridge Δ = 2c/(εn) − μ pays for.
    mu_small, c = 1e-3, erm.losses.logistic.smoothness
    extra = 2.0 * c / eps - mu_small

    def correct_logistic(k, data):
        X, y = data
        return erm.objective_perturbation(
            k, X, y, loss=erm.losses.logistic, mu=mu_small, epsilon=eps, delta=DELTA
        ).params

    def no_extra_regularizer(k, data):
        X, _ = data
        b = _kst_sigma(eps, DELTA) * jax.random.normal(k, (), X.dtype)
        return _logistic_tilted_argmin(b, X[0, 0], mu_small)[None]

    def logistic_pair():
        one = jnp.ones(1, jnp.float64)
        return (jnp.ones((1, 1), jnp.float64), one), (jnp.zeros((1, 1), jnp.float64), one)

    def abs_first(w):
        return jnp.abs(w[0])  # D′ (no curvature) spreads w over ±σ/μ

    gdp = dict(family="objective_perturbation", claimed_epsilon=eps, delta=DELTA)
    return [
        Case(variant="correct_linear", mechanism=correct_linear, make_data=_canary_pair(_N, 2),
             estimator="gdp", trials=20_000, score=_minus_first, repetitions=3,
             exact_epsilon=_exact_gaussian_epsilon(_kst_sigma(eps, DELTA) / 2.0),
             note="KST12 σ, linear loss (c = 0): Gaussian mechanism with Δ = 2L", **gdp),
        Case(variant="correct_logistic", mechanism=correct_logistic, make_data=logistic_pair,
             estimator="direct", trials=10_000, score=abs_first, repetitions=3,
             note=f"logistic, n = 1, μ = {mu_small:g}, D = {{x=1}}, D′ = {{x=0}}", **gdp),
        Case(variant="no_extra_regularizer", mechanism=no_extra_regularizer,
             make_data=logistic_pair, estimator="direct", trials=20_000, score=abs_first,
             note=f"KST σ without the extra ridge Δ = {extra:.3f}", **gdp),
    ]  # fmt: skip


def _dp_gd_stddev(eps: float, delta: float, steps: int, clip: float = 1.0) -> float:
    """σ_s = 2C√(T/(2ρ)) of dpjax.erm.dp_gd (replace-one, "cks" zCDP conversion)."""
    from dpjax.accounting import zcdp_rho_for_epsilon

    rho = zcdp_rho_for_epsilon(epsilon=eps, delta=delta, conversion="cks")
    return 2.0 * clip * math.sqrt(steps / (2.0 * rho))


def dp_gd_cases() -> list[Case]:
    """D1: full-batch DP-GD with the Dirac gradient canary; D2: DP-SGD with Poisson sampling."""
    import dpjax
    from dpjax import erm

    eps, radius = 1.0, 10.0
    linear = erm.losses.linear
    stddev = _dp_gd_stddev(eps, DELTA, _STEPS)

    def correct(k, data):
        X, y = data
        return erm.dp_gd(k, X, y, loss=linear, epsilon=eps, delta=DELTA, radius=radius,
                         steps=_STEPS, output="last").params  # fmt: skip

    def noise_on_mean(k, data):  # noise sized for the mean (σ_s/n) added to the sum
        X, y = data
        grad_fn = dpjax.clipped_grad(linear, l2_clip_norm=1.0)
        noise = dpjax.add_gaussian_noise(stddev / X.shape[0], key=k)

        def step(carry, _):
            w, state = carry
            clipped_sum, _ = grad_fn(w, X, y)
            noisy_sum, state = noise.update(clipped_sum, state)
            return (w - noisy_sum / X.shape[0], state), None

        w0 = jnp.zeros(X.shape[1], X.dtype)
        (w, _), _ = jax.lax.scan(step, (w0, noise.init(w0)), None, length=_STEPS)
        return w

    logistic_grad = dpjax.clipped_grad(erm.losses.logistic, l2_clip_norm=1.0)

    def key_reused(k, data):  # the noise state is re-initialised every step: same noise
        X, y = data
        noise = dpjax.add_gaussian_noise(stddev, key=k)

        def step(w, _):
            clipped_sum, _ = logistic_grad(w, X, y)
            noisy_sum, _ = noise.update(clipped_sum, noise.init(w))
            return w - 0.1 * noisy_sum / X.shape[0], noisy_sum[0]

        _, released = jax.lax.scan(step, jnp.zeros(X.shape[1], X.dtype), None, length=_STEPS)
        return released  # white box: the T released noisy sums

    def released_spread(sums):  # 0 on D′ (no gradient, same noise every step)
        return -jnp.max(jnp.abs(sums - sums[0]))

    def logistic_pair():
        one = jnp.ones(1, jnp.float64)
        return (jnp.ones((1, 1), jnp.float64), one), (jnp.zeros((1, 1), jnp.float64), one)

    q, sgd_eps = 0.2, 2.0

    def correct_sgd(k, data):
        X, y = data
        return erm.dp_sgd(k, X, y, loss=linear, epsilon=sgd_eps, delta=DELTA, radius=radius,
                          sampling_rate=q, steps=_STEPS, relation="replace_one",
                          output="last").params  # fmt: skip

    mu_gdp = 2.0 * math.sqrt(_STEPS) / stddev  # T Gaussian steps, Δ = 2C each
    common = dict(family="dp_gd", claimed_epsilon=eps, delta=DELTA)
    return [
        Case(variant="correct", mechanism=correct, make_data=_canary_pair(_N, 1),
             estimator="gdp", trials=100_000, score=_minus_first, repetitions=3,
             exact_epsilon=auditing.gdp_epsilon(mu_gdp, DELTA),
             note=f"Dirac canary, T = {_STEPS}, n = {_N}, last iterate; zCDP-calibrated",
             **common),
        Case(variant="noise_on_mean", mechanism=noise_on_mean, make_data=_canary_pair(_N, 1),
             estimator="gdp", trials=10_000, score=_minus_first,
             exact_epsilon=auditing.gdp_epsilon(mu_gdp * _N, DELTA),
             note="noise σ_s/n added to the sum (own loop, no projection)", **common),
        Case(variant="key_reused", mechanism=key_reused, make_data=logistic_pair,
             estimator="direct", trials=2_000, score=released_spread, exact_epsilon=math.inf,
             note="logistic canary x = 1 vs x = 0; white-box released sums (ε_LB capped by N)",
             **common),
        Case(family="dp_sgd", variant="correct", mechanism=correct_sgd,
             make_data=_canary_pair(_N, 1), claimed_epsilon=sgd_eps, delta=DELTA,
             estimator="direct", trials=20_000, score=_minus_first, repetitions=2, slow=True,
             note=f"Poisson q = {q}, T = {_STEPS}, PLD-calibrated, last iterate"),
    ]  # fmt: skip


def solver_cases() -> list[Case]:
    """Every ERM-solver case (B1, C1, C2, D1, D2)."""
    return output_perturbation_cases() + objective_perturbation_cases() + dp_gd_cases()


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
        exact_epsilon=case.exact_epsilon
        if case.exact_epsilon is None or math.isfinite(case.exact_epsilon)
        else "inf",
        note=case.note,
        seconds=round(seconds, 2),
        ok=caught if case.is_mutant else result.exceed_count == 0,
    )
    return s


# ---------------------------------------------------------------------------------------------
# E: the one-run bound (Steinke, Nasr, Jagielski 2023). m canaries, each included w.p. ½; ONE
# Gaussian release of the inclusion vector (ℓ2 sensitivity 1 per canary, add/remove); guess IN
# for the top 5% and OUT for the bottom 5% (fixed in advance).

ONE_RUN_CANARIES = 10_000


def _one_run_correct(k, x):
    return mechanisms.gaussian(k, x, sensitivity=1.0, epsilon=1.0, delta=DELTA)


def _one_run_delta_ignored(k, x):
    return x + 1.0 * jax.random.normal(k, x.shape, x.dtype)  # σ = Δ/ε


ONE_RUN_RELEASES = {"correct": _one_run_correct, "delta_ignored": _one_run_delta_ignored}


def one_run_audit(key: jax.Array, release: Callable, m: int = ONE_RUN_CANARIES):
    """ε_LB (claimed ε = 1, δ = 1e-5) from ONE release of m randomly included canaries."""
    k_incl, k_noise = jax.random.split(key)
    truths = jax.random.bernoulli(k_incl, 0.5, (m,))
    y = release(k_noise, truths.astype(jnp.result_type(float)))
    guesses = auditing.guesses_from_scores(np.asarray(y), k_in=m // 20, k_out=m // 20)
    return auditing.one_run_epsilon_lower_bound(
        guesses, np.asarray(truths), delta=DELTA, confidence=CONFIDENCE
    )


def one_run_table(key: jax.Array, repetitions: int = REPETITIONS) -> list[dict]:
    """ε_LB of the correct release and of the δ-ignored mutant over independent runs."""
    rows = []
    for i, (variant, release) in enumerate(ONE_RUN_RELEASES.items()):
        keys = jax.random.split(jax.random.fold_in(key, i), repetitions)
        eps = np.array([one_run_audit(k, release).epsilon for k in keys])
        rows.append(dict(variant=variant, claimed_epsilon=1.0, m=ONE_RUN_CANARIES,
                         epsilon_lb_median=float(np.median(eps)), epsilon_lb_min=float(eps.min()),
                         epsilon_lb_max=float(eps.max()), exceed_count=int(np.sum(eps > 1.0)),
                         repetitions=repetitions))  # fmt: skip
    return rows


def _one_run_markdown(rows: list[dict]) -> list[str]:
    lines = [
        "### One-run audit (Steinke, Nasr, Jagielski 2023)",
        "",
        f"Gaussian mechanism, claimed (1, 1e-5); one release of {ONE_RUN_CANARIES} canaries "
        f"per run, 5% IN / 5% OUT guesses, {CONFIDENCE:.2%} confidence, δ term included.",
        "",
        "| variant | ε_LB median [min, max] | > claim |",
        "|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['epsilon_lb_median']:.3f} [{r['epsilon_lb_min']:.3f}, "
            f"{r['epsilon_lb_max']:.3f}] | {r['exceed_count']}/{r['repetitions']} |"
        )
    return lines + [""]


def porosity_table() -> list[dict]:
    """Mironov's test, exact over all float32 noise values: f(D) = 0, f(D′) = 1, Δ = 1."""
    rows = []
    for eps in (0.1, 1.0, 2.0):
        r = auditing.porosity.textbook_laplace_porosity(f_d=0.0, f_dprime=1.0, scale=1.0 / eps)
        rows.append(dict(mechanism="dpjax.mechanisms.laplace (float32)", epsilon=eps,
                         fraction=r.fraction, outputs=r.outputs))  # fmt: skip
    sigma = mechanisms.classic_gaussian_sigma(sensitivity=1.0, epsilon=0.5, delta=DELTA)
    r = auditing.porosity.textbook_porosity(f_d=0.0, f_dprime=1.0, scale=sigma, noise="gaussian")
    rows.append(dict(mechanism="dpjax.mechanisms.gaussian classic (float32, δ = 1e-5)",
                     epsilon=0.5, fraction=r.fraction, outputs=r.outputs))  # fmt: skip
    rows += _porosity_float64_rows()
    grid = dict(sensitivity=1.0, epsilon=1.0, bound=8.0, granularity=2.0**-6)
    r = auditing.porosity.discrete_laplace_porosity(f_d=0.0, f_dprime=1.0, **grid)
    rows.append(dict(mechanism="dpjax.mechanisms.discrete_laplace (g = 2^-6, B = 8, float32)",
                     epsilon=1.0, fraction=r.fraction, outputs=r.outputs))  # fmt: skip
    return rows


def _porosity_float64_rows(samples: int = 10_000) -> list[dict]:
    """Float64 (x64): sampled outputs on D, exact attainability on D′ by binary search."""
    key_l, key_g = jax.random.split(jax.random.key(2012))
    zeros = jnp.zeros(samples, jnp.float64)
    y_l = mechanisms.laplace(key_l, zeros, sensitivity=1.0, epsilon=1.0)
    sigma = mechanisms.gaussian_sigma(sensitivity=1.0, epsilon=1.0, delta=DELTA)
    y_g = mechanisms.gaussian(key_g, zeros, sensitivity=1.0, epsilon=1.0, delta=DELTA)
    rows = []
    for name, y, scale, noise in [
        ("dpjax.mechanisms.laplace (float64, sampled)", y_l, 1.0, "laplace"),
        ("dpjax.mechanisms.gaussian analytic (float64, sampled)", y_g, sigma, "gaussian"),
    ]:
        ok = auditing.porosity.attainable_float64(y, f=1.0, scale=scale, noise=noise)
        rows.append(dict(mechanism=name, epsilon=1.0, fraction=float(1.0 - ok.mean()),
                         outputs=samples))  # fmt: skip
    return rows


def _porosity_markdown(rows: list[dict]) -> list[str]:
    lines = [
        "### Floating-point porosity (Mironov 2012)",
        "",
        "Fraction of outputs on D = {0} that are impossible on D′ = {1}: float32 by exact "
        "enumeration of every noise value; float64 over 10^4 sampled outputs, each decided "
        "exactly by binary search over the 2^52 uniform mantissas. Such an output identifies D "
        "with certainty. 'distinct outputs' = number of distinct float32 outputs (or samples).",
        "",
        "| mechanism | ε | distinct outputs / samples | impossible on D′ |",
        "|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['mechanism']} | {r['epsilon']:g} | {r['outputs']} | {r['fraction']:.1%} |"
        )
    return lines


def _family_summary(rows: list[dict]) -> list[str]:
    """Per mechanism: claimed ε, ε_LB of the correct implementation, ratio, mutants caught."""
    lines = [
        "| mechanism | claimed ε | ε_LB (median, correct) | ratio | exact-ε ratio "
        "| mutants caught |",
        "|---|---|---|---|---|---|",
    ]
    for family in dict.fromkeys(r["family"] for r in rows):
        mine = [r for r in rows if r["family"] == family]
        correct = next((r for r in mine if r["variant"] == "correct"), None)
        correct = correct or next(r for r in mine if not r["mutant"])
        mutants = [r for r in mine if r["mutant"]]
        exact = correct["exact_epsilon"]
        tight = f"{correct['epsilon_lb_median'] / exact:.2f}" if isinstance(exact, float) else ""
        names = ", ".join(r["variant"] for r in mutants if r["ok"]) or "—"
        lines.append(
            f"| {family} | {correct['claimed_epsilon']:g} | {correct['epsilon_lb_median']:.3f} | "
            f"{correct['ratio']:.2f} | {tight} | {sum(r['ok'] for r in mutants)}/{len(mutants)}"
            f" ({names}) |"
        )
    return lines + [""]


def _markdown(rows: list[dict], extra: list[str]) -> str:
    lines = [
        "## Privacy audit (empirical lower bounds on ε)",
        "",
        f"{REPETITIONS} independent repetitions per mutant ({CORRECT_REPETITIONS} per correct "
        "implementation, fewer for the slow solvers); ε_LB is a one-sided "
        f"{CONFIDENCE:.2%} Clopper–Pearson lower bound (threshold chosen on a held-out half); "
        "shown: median [min, max] over repetitions. Ratio = median ε_LB / claimed ε. "
        f"A mutant is caught when ε_LB > claimed ε in ≥ {CAUGHT_AT_LEAST}/{REPETITIONS}.",
        "",
        *_family_summary(rows),
        "| case | estimator | N/side | claimed ε | exact ε | ε_LB median [min, max] | ratio "
        "| > claim | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        exact = r["exact_epsilon"]
        exact = "" if exact is None else exact if isinstance(exact, str) else f"{exact:.3g}"
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
    """Run every audit case; write ``audit.json``, ``audit.md`` and (the DP-SGD runs,
    :mod:`experiments.audit_dpsgd`) ``audit_dpsgd.json`` / ``audit_dpsgd.png`` under ``out_dir``."""
    jax.config.update("jax_enable_x64", True)  # the ERM solvers need float64
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    root = jax.random.key(seed)
    rows = []
    for i, case in enumerate(all_cases()):
        start = time.perf_counter()
        result = run_case(case, key=jax.random.fold_in(root, i), scale=4.0 if full else 1.0)
        rows.append(_row(case, result, time.perf_counter() - start))
    one_run_rows = one_run_table(jax.random.fold_in(root, 10_000))
    porosity_rows = porosity_table()
    dp_sgd = audit_dpsgd.run(out_dir, full=full, seed=seed, confidence=CONFIDENCE)
    extra = dp_sgd["markdown"] + _one_run_markdown(one_run_rows) + _porosity_markdown(porosity_rows)
    summary = {
        "cases": rows,
        "one_run": one_run_rows,
        "porosity": porosity_rows,
        "dp_sgd": dp_sgd["records"],
    }
    report_md = _markdown(rows, extra)
    (out_dir / "audit.json").write_text(json.dumps(summary, indent=2, default=str))
    (out_dir / "audit.md").write_text(report_md)
    return {"report_md": report_md, **summary}
