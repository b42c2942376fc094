# %% [markdown]
# # 2. Composition and accounting
#
# How much privacy do $T$ releases spend together? This notebook compares every accountant in
# `dpjax.accounting` on the same releases, from the lectures' composition theorems to the tight
# numerical accountants:
#
# * basic and advanced composition, group privacy: lecture on properties of DP (Dwork, Rothblum
#   & Vadhan 2010; Dwork & Roth 2014, §3.5);
# * zCDP for the Gaussian mechanism (Bun & Steinke 2016) and amplification by subsampling
#   (DP-SGD; Balle, Barthe & Gaboardi 2018): lecture on ML under DP;
# * sequential and parallel composition: lecture on advances in DP (McSherry 2009);
# * the optimal composition theorem (Kairouz, Oh & Viswanath 2015), Rényi DP (Mironov 2017) and
#   privacy-loss distributions (PLD, through Google's `dp-accounting`), cited in the lecture on
#   properties of DP ("see [Kairouz et al., 2015] for slightly tighter results").
#
# Every section ends with a check cell: a number computed by dpjax against the lecture's formula
# or an exact closed form.

# %%
# parameters
EPS_STEP = 0.05  # ε₀ of each pure-DP (Laplace) release
SIGMA = 20.0  # σ/Δ₂ of each Gaussian release
DELTA = 1e-5  # the δ at which every ε is reported
T_GRID = [1, 3, 10, 30, 100, 300, 1000]  # numbers of releases
SAMPLING_RATE = 0.01  # DP-SGD: Poisson sampling rate q = B/n
NOISE_MULTIPLIER = 1.1  # DP-SGD: σ/C
SEED = 0

# %%
# %matplotlib inline
import math

import jax
import matplotlib.pyplot as plt
import numpy as np

from dpjax import accounting as acc
from dpjax import mechanisms as mech
from dpjax.accounting import GaussianEvent, LaplaceEvent

key_group = jax.random.key(SEED)


def slope(xs, ys):
    """Least-squares slope of log y against log x."""
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


# %% [markdown]
# ## T pure-DP releases: basic, advanced, optimal, zCDP, RDP, PLD
#
# Each release is the Laplace mechanism with $b = \Delta_1/\varepsilon_0$, so it is
# $(\varepsilon_0, 0)$-DP. Then (lecture on properties of DP, composition):
#
# * **basic composition**: $T\varepsilon_0$;
# * **advanced composition**: for every $\delta' > 0$, $(\varepsilon', T\delta + \delta')$-DP with
#   $\varepsilon' = \varepsilon_0\sqrt{2T\ln(1/\delta')} + T\varepsilon_0\frac{e^{\varepsilon_0}-1}{e^{\varepsilon_0}+1}$
#   (the drift term of the lecture's proof);
# * **optimal composition** (Kairouz, Oh & Viswanath 2015): the exact worst case over all
#   $(\varepsilon_0, 0)$-DP mechanisms;
# * **zCDP**: an ε₀-DP mechanism is $\varepsilon_0^2/2$-zCDP and ρ's add up (Bun & Steinke 2016; lecture on ML under DP);
# * **RDP / PLD**: numerical accountants for the Laplace mechanism itself.
#
# `PrivacyAccountant` records the events and answers ε(δ) by each method.

# %%
laplace_eps = {}
for T in T_GRID:
    accountant = acc.PrivacyAccountant([LaplaceEvent(noise_multiplier=1 / EPS_STEP, count=T)])
    for method, value in accountant.epsilons(DELTA).items():
        laplace_eps.setdefault(method, []).append(value)
fig, ax = plt.subplots(figsize=(7, 4))
for method, values in laplace_eps.items():
    ax.loglog(T_GRID, values, "o-", ms=3, label=method)
ax.set_xlabel("number of releases T")
ax.set_ylabel(f"ε at δ = {DELTA:g}")
ax.set_title(f"T Laplace releases, each ε₀ = {EPS_STEP}-DP")
ax.legend()
plt.show()
for method, values in laplace_eps.items():
    print(f"{method:>9}: ε(T={T_GRID[-1]}) = {values[-1]:7.3f}, slope in T = "
          f"{slope(T_GRID[-3:], values[-3:]):.2f}")

# %% [markdown]
# **Check (advanced composition).** dpjax's advanced composition equals the lecture's formula; basic composition
# grows like $T$ (slope 1) and the tight accountants like $\sqrt T$ (slope ≈ 1/2 while the drift
# $T\varepsilon_0^2/2$ is small); the optimal composition theorem is never worse than advanced
# or basic, and the Laplace-specific PLD is never worse than the generic optimum (up to its
# discretisation).

# %%
T = T_GRID[-1]
eps_adv, delta_adv = acc.advanced_composition(epsilon=EPS_STEP, delta=0.0, steps=T,
                                              delta_prime=DELTA)
lecture = (EPS_STEP * math.sqrt(2 * T * math.log(1 / DELTA))
           + T * EPS_STEP * (math.exp(EPS_STEP) - 1) / (math.exp(EPS_STEP) + 1))
print(f"advanced composition: dpjax {eps_adv:.6f}, lecture formula {lecture:.6f}")
assert math.isclose(eps_adv, lecture, rel_tol=1e-12) and delta_adv == DELTA
assert math.isclose(slope(T_GRID, laplace_eps["basic"]), 1.0, rel_tol=1e-9)
assert 0.45 < slope(T_GRID[-3:], laplace_eps["pld"][-3:]) < 0.65
for i in range(len(T_GRID)):
    assert laplace_eps["optimal"][i] <= min(laplace_eps["advanced"][i], laplace_eps["basic"][i]) + 1e-9
    assert laplace_eps["pld"][i] <= laplace_eps["optimal"][i] + 1e-3

# %% [markdown]
# ### The corollary: a per-step budget for a total ε'
#
# To make $T$ releases $(\varepsilon', T\delta + \delta')$-DP with $0 < \varepsilon' < 1$ it suffices
# that each is ε-DP with $\varepsilon \le \varepsilon'/\sqrt{8T\ln(1/\delta')}$
# (corollary of advanced composition, lecture on properties of DP).

# %%
target = 0.5
for T in (10, 100, 1000):
    eps_step = acc.advanced_composition_step_epsilon(target_epsilon=target, steps=T,
                                                     delta_prime=DELTA)
    total, _ = acc.advanced_composition(epsilon=eps_step, delta=0.0, steps=T, delta_prime=DELTA)
    print(f"T = {T:5d}: per-step ε = {eps_step:.5f} → advanced composition gives {total:.4f} ≤ {target}")
    assert math.isclose(eps_step, target / math.sqrt(8 * T * math.log(1 / DELTA)))
    assert total <= target

# %% [markdown]
# ### Sequential versus parallel composition
#
# Releases on the *same* data compose sequentially ($\sum_i \varepsilon_i$); releases on
# *disjoint* parts of the data (the bins of a histogram) compose in parallel, at
# $\max_i \varepsilon_i$ (lecture on advances in DP, sequential and parallel composition).

# %%
bins = [EPS_STEP] * 20
sequential, _ = acc.basic_composition(bins)
parallel, _ = acc.parallel_composition(bins)
print(f"20 releases at ε₀ = {EPS_STEP}: sequential {sequential:.2f}, parallel (disjoint bins) {parallel:.2f}")
assert math.isclose(sequential, 20 * EPS_STEP) and parallel == EPS_STEP

# %% [markdown]
# ## T Gaussian releases: zCDP, RDP and PLD against the exact answer
#
# A Gaussian release with noise $\sigma$ and sensitivity Δ is $\rho = \Delta^2/(2\sigma^2)$-zCDP,
# zCDP composes additively, and $\rho$-zCDP implies
# $(\rho + 2\sqrt{\rho\ln(1/\delta)}, \delta)$-DP (lecture on ML under DP, "Improved analysis
# with concentrated DP"). Here the truth is known exactly: $T$ Gaussian releases of the same
# query are one Gaussian release with sensitivity $\sqrt T\,\Delta$, whose exact ε(δ) is
# Balle & Wang's profile (`dpjax.mechanisms.gaussian_epsilon`).

# %%
gauss_eps, exact = {}, []
for T in T_GRID:
    accountant = acc.PrivacyAccountant([GaussianEvent(noise_multiplier=SIGMA, count=T)])
    for method, value in accountant.epsilons(DELTA).items():
        gauss_eps.setdefault(method, []).append(value)
    rho = acc.zcdp_compose([acc.gaussian_zcdp_rho(sigma=SIGMA, sensitivity=1.0)] * T)
    gauss_eps.setdefault("zcdp (BS16: ρ + 2√(ρ ln 1/δ))", []).append(
        acc.zcdp_epsilon_bun_steinke(rho=rho, delta=DELTA))
    exact.append(mech.gaussian_epsilon(sigma=SIGMA, sensitivity=math.sqrt(T), delta=DELTA))
fig, ax = plt.subplots(figsize=(7, 4))
for method, values in gauss_eps.items():
    ax.loglog(T_GRID, values, "o-", ms=3, label=method)
ax.loglog(T_GRID, exact, "k--", label="exact (one Gaussian, sensitivity √T)")
ax.set_xlabel("number of releases T")
ax.set_ylabel(f"ε at δ = {DELTA:g}")
ax.set_title(f"T Gaussian releases, σ/Δ = {SIGMA:g}")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# **Check.** PLD reproduces the exact ε within its discretisation, every accountant is an upper
# bound on the exact ε, and dpjax's zCDP conversion is the lecture's formula.

# %%
for i, T in enumerate(T_GRID):
    assert abs(gauss_eps["pld"][i] - exact[i]) < 1e-3 * max(1.0, exact[i]) + 2e-3, (T,)
    for method, values in gauss_eps.items():
        assert values[i] >= exact[i] - 2e-3, (method, T)
rho = T_GRID[-1] / (2 * SIGMA**2)
print(f"T = {T_GRID[-1]}: exact ε = {exact[-1]:.4f}, PLD {gauss_eps['pld'][-1]:.4f},"
      f" RDP {gauss_eps['rdp'][-1]:.4f}, zCDP (BS16) {rho + 2 * math.sqrt(rho * math.log(1 / DELTA)):.4f}")
assert math.isclose(gauss_eps["zcdp (BS16: ρ + 2√(ρ ln 1/δ))"][-1],
                    rho + 2 * math.sqrt(rho * math.log(1 / DELTA)), rel_tol=1e-12)

# %% [markdown]
# ## Group privacy
#
# An (ε, δ)-DP mechanism protects a group of $k$ records at level
# $\left(k\varepsilon, \delta\frac{e^{k\varepsilon}-1}{e^{\varepsilon}-1}\right)$
# (lecture on properties of DP, "Group Privacy"; Dwork & Roth 2014, Theorem 2.2). For the Laplace mechanism the factor $e^{k\varepsilon}$
# is attained: a count that differs by $k$ shifts the output by $k$, and
# $P[M(D) \le 0] / P[M(D_k) \le 0] = e^{k\varepsilon}$. We measure it with dpjax's Laplace draws.

# %%
eps_g = 0.5
group_sizes = [1, 2, 3, 4]
n_draws = 100_000
measured = []
for k, kk in zip(group_sizes, jax.random.split(key_group, len(group_sizes))):
    k_a, k_b = jax.random.split(kk)
    draws_D = np.asarray(mech.laplace(k_a, np.zeros(n_draws), sensitivity=1.0, epsilon=eps_g))
    draws_Dk = np.asarray(mech.laplace(k_b, np.full(n_draws, float(k)), sensitivity=1.0,
                                       epsilon=eps_g))
    measured.append(math.log(np.mean(draws_D <= 0) / np.mean(draws_Dk <= 0)))
theory = [acc.group_privacy(epsilon=eps_g, delta=0.0, group_size=k)[0] for k in group_sizes]
group_delta = [acc.group_privacy(epsilon=eps_g, delta=1e-6, group_size=k)[1] for k in range(1, 11)]
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.5))
ax1.plot(group_sizes, measured, "o", label="measured log P[M(D)≤0]/P[M(D_k)≤0]")
ax1.plot(group_sizes, theory, "-", label="group privacy: kε")
ax1.set_xlabel("group size k")
ax1.legend(fontsize=8)
ax2.semilogy(range(1, 11), group_delta, "o-")
ax2.set_xlabel("group size k")
ax2.set_title("group δ for a (0.5, 1e-6)-DP mechanism")
plt.show()

# %% [markdown]
# **Check.** dpjax's group privacy is the lecture's formula, and the Laplace mechanism attains
# $k\varepsilon$ (the measured log ratio is within 5 standard errors of $k\varepsilon$; each
# probability has relative standard error $\sqrt{(1-p)/(pn)}$).

# %%
for k, got, want in zip(group_sizes, measured, theory):
    p_small = 0.5 * math.exp(-k * eps_g)
    se = math.sqrt((1 - p_small) / (p_small * n_draws)) + math.sqrt(1 / n_draws)
    assert abs(got - want) < 5 * se, (k, got, want)
eps_k, delta_k = acc.group_privacy(epsilon=eps_g, delta=1e-6, group_size=3)
assert math.isclose(eps_k, 3 * eps_g)
assert math.isclose(delta_k, 1e-6 * (math.exp(3 * eps_g) - 1) / (math.exp(eps_g) - 1))
print(f"(ε, δ) = (0.5, 1e-6) for a group of 3: ({eps_k:.2f}, {delta_k:.3e})")

# %% [markdown]
# ## Amplification by subsampling and DP-SGD
#
# If $M$ is (ε, δ)-DP and runs on a secret random subsample containing each record with
# probability $p$, the composition is $(\ln(1 + (e^\varepsilon - 1)p), p\delta)$-DP
# (lecture on ML under DP, "Privacy amplification by subsampling"; ≈ pε for small ε).
# DP-SGD composes $T$ such subsampled Gaussian steps. The lecture's recipe amplifies each step and
# composes with advanced composition; the tight accountants (RDP, the "moments accountant" of
# Abadi et al.; PLD) account the subsampled Gaussian directly (`dp_sgd_epsilon`). For the recipe
# each step is a Gaussian release at $(\varepsilon_0, \delta_0)$ with $\delta_0 = \delta/(2Tq)$,
# amplified to $(\ln(1 + q(e^{\varepsilon_0} - 1)), q\delta_0)$, and composed with
# $\delta' = \delta/2$, so that the total δ is the same for all three.

# %%
p_grid = np.geomspace(1e-3, 1, 30)
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.5))
for eps0 in (0.5, 1.0, 2.0):
    amplified = [acc.amplification_by_subsampling(epsilon=eps0, delta=0.0, sampling_rate=p)[0]
                 for p in p_grid]
    ax1.loglog(p_grid, amplified, label=f"ε = {eps0}")
ax1.loglog(p_grid, p_grid, "k:", label="p (for reference)")
ax1.set_xlabel("sampling rate p")
ax1.set_ylabel("amplified ε")
ax1.legend(fontsize=8)

steps_grid = [10, 100, 1000, 3000]
eps_pld = [acc.dp_sgd_epsilon(noise_multiplier=NOISE_MULTIPLIER, sampling_rate=SAMPLING_RATE,
                             steps=s, delta=DELTA, accounting="pld") for s in steps_grid]
eps_rdp = [acc.dp_sgd_epsilon(noise_multiplier=NOISE_MULTIPLIER, sampling_rate=SAMPLING_RATE,
                             steps=s, delta=DELTA, accounting="rdp") for s in steps_grid]
# the lecture's recipe: per-step Gaussian (ε₀, δ₀), amplified by p, then advanced composition
eps_recipe = []
for s in steps_grid:
    delta0 = DELTA / (2 * s * SAMPLING_RATE)
    eps0 = mech.gaussian_epsilon(sigma=NOISE_MULTIPLIER, sensitivity=1.0, delta=delta0)
    eps_amp, delta_amp = acc.amplification_by_subsampling(epsilon=eps0, delta=delta0,
                                                          sampling_rate=SAMPLING_RATE)
    total, _ = acc.advanced_composition(epsilon=eps_amp, delta=delta_amp, steps=s,
                                        delta_prime=DELTA / 2)
    eps_recipe.append(min(total, s * eps_amp))
ax2.loglog(steps_grid, eps_recipe, "o-", label="amplify + advanced composition (lecture recipe)")
ax2.loglog(steps_grid, eps_rdp, "s-", label="RDP (moments accountant)")
ax2.loglog(steps_grid, eps_pld, "^-", label="PLD")
ax2.set_xlabel("DP-SGD steps T")
ax2.set_ylabel(f"ε at δ = {DELTA:g}")
ax2.set_title(f"DP-SGD, q = {SAMPLING_RATE}, σ/C = {NOISE_MULTIPLIER}")
ax2.legend(fontsize=8)
plt.show()
for s, a, b, c in zip(steps_grid, eps_recipe, eps_rdp, eps_pld):
    print(f"T = {s:5d}: recipe {a:8.3f}   RDP {b:6.3f}   PLD {c:6.3f}")

# %% [markdown]
# **Check.** dpjax's amplification is the lecture's formula; the tight accountants beat the
# lecture's recipe; with $q = 1$ (full batch) DP-SGD is $T$ Gaussian releases, whose exact ε
# dpjax's PLD reproduces; and calibrating σ for a target ε round-trips.

# %%
eps_amp, delta_amp = acc.amplification_by_subsampling(epsilon=1.0, delta=1e-6, sampling_rate=0.01)
assert math.isclose(eps_amp, math.log(1 + (math.e - 1) * 0.01))
assert math.isclose(delta_amp, 0.01 * 1e-6)
assert all(c <= b + 1e-6 <= a + 1e-6 for a, b, c in zip(eps_recipe, eps_rdp, eps_pld))
full_batch = acc.dp_sgd_epsilon(noise_multiplier=5.0, sampling_rate=1.0, steps=10, delta=DELTA)
exact_full = mech.gaussian_epsilon(sigma=5.0, sensitivity=math.sqrt(10), delta=DELTA)
print(f"full-batch DP-GD, 10 steps, σ/C = 5: PLD {full_batch:.4f}, exact {exact_full:.4f}")
assert abs(full_batch - exact_full) < 5e-3
sigma_needed = acc.calibrate_noise_multiplier(target_epsilon=1.0, delta=DELTA,
                                              sampling_rate=SAMPLING_RATE, steps=1000,
                                              accounting="rdp")
eps_back = acc.dp_sgd_epsilon(noise_multiplier=sigma_needed, sampling_rate=SAMPLING_RATE,
                             steps=1000, delta=DELTA, accounting="rdp")
print(f"σ/C for ε = 1 after 1000 steps at q = {SAMPLING_RATE}: {sigma_needed:.4f} (ε back: {eps_back:.4f})")
assert 0.99 <= eps_back <= 1.0

# %% [markdown]
# ## f-DP: the trade-off curve of a DP-SGD run, and where the GDP approximation is optimistic
#
# A mechanism is $f$-DP if every test of "$D$" against "$D'$" at type-I error $\alpha$ has
# type-II error at least $f(\alpha)$ (Dong, Roth, Su). `acc.tradeoff_curve` computes a valid
# lower bound on $f$ for any composition PLD accounts, as
# $\beta(\alpha) = \sup_\varepsilon \max\{0,\ 1 - \delta(\varepsilon) - e^\varepsilon\alpha,\
# e^{-\varepsilon}(1 - \delta(\varepsilon) - \alpha)\}$ from its privacy profile. The central
# limit theorem of Bu, Dong, Long and Su gives $\mu = q\sqrt{T(e^{1/\sigma^2} - 1)}$ and the
# curve $G_\mu(\alpha) = \Phi(\Phi^{-1}(1-\alpha) - \mu)$ — an **approximation**
# (`acc.gdp_mu_clt_approximation`): at few steps and a large rate it lies above the true curve
# at small $\alpha$, i.e. it claims more privacy than the run has. The single $(\varepsilon,
# \delta)$ guarantee is the polygon $f_{\varepsilon,\delta}$, far below both.

# %%
from dpjax.accounting import PoissonSampledGaussianEvent

Q_F, SIGMA_F, T_F = 0.2, 1.0, 10
run = acc.PrivacyAccountant(
    [PoissonSampledGaussianEvent(noise_multiplier=SIGMA_F, sampling_rate=Q_F, count=T_F)],
    value_discretization_interval=1e-3,
)
alphas = np.geomspace(1e-6, 1.0, 300)
beta_pld = acc.tradeoff_curve(run, alphas)
mu_clt = acc.gdp_mu_clt_approximation(noise_multiplier=SIGMA_F, sampling_rate=Q_F, steps=T_F)
beta_gdp = acc.gdp_tradeoff(mu_clt, alphas)
eps_run = run.epsilon(DELTA)
beta_region = np.maximum.reduce([np.zeros_like(alphas), 1 - DELTA - np.exp(eps_run) * alphas,
                                 np.exp(-eps_run) * (1 - DELTA - alphas)])
optimistic = beta_gdp > beta_pld + 1e-9

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
for ax in (ax1, ax2):
    ax.plot(alphas, beta_pld, label="trade-off from the PLD (valid lower bound)")
    ax.plot(alphas, beta_gdp, "--", label=f"GDP CLT approximation, μ = {mu_clt:.2f}")
    ax.plot(alphas, beta_region, ":", label=f"(ε, δ) = ({eps_run:.2f}, {DELTA:g}) region edge")
    ax.fill_between(alphas, beta_pld, beta_gdp, where=optimistic, color="C3", alpha=0.3,
                    label="approximation optimistic")
    ax.set_xlabel("type-I error α")
ax1.set_ylabel("type-II error β")
ax1.set_title(f"DP-SGD, q = {Q_F}, σ/C = {SIGMA_F}, T = {T_F}")
ax2.set_xscale("log")
ax2.set_xlim(1e-6, 0.1)
ax2.set_ylim(0.85, 1.0)
ax2.set_title("small α (log scale)")
ax1.legend(fontsize=7)
plt.show()
eps_clt = acc.gdp_epsilon(mu=mu_clt, delta=DELTA)
print(f"ε at δ = {DELTA:g}: accountant {eps_run:.3f}, GDP CLT approximation {eps_clt:.3f}")
first_safe = alphas[~optimistic].min()
print(f"approximation optimistic for every α below {first_safe:.1e} "
      f"(and on {optimistic.mean():.0%} of the α grid)")

# %% [markdown]
# **Check.** The CLT curve is optimistic at small α here and its ε undercuts the accountant's;
# the PLD curve never goes above the exact Gaussian curve for a plain Gaussian release.

# %%
assert optimistic[alphas < 1e-3].all() and eps_clt < eps_run
gauss = acc.tradeoff_curve(GaussianEvent(noise_multiplier=2.0), alphas)
assert np.all(gauss <= acc.gdp_tradeoff(0.5, alphas) + 1e-9)

# %% [markdown]
# ## Correlated noise: matrix factorization and the bands–amplification trade-off
#
# DP-SGD adds independent noise at each step. The matrix-factorization mechanism releases the
# prefix sums $AG$ of the clipped gradient sums as $AG + BZ$ with $A = BC$ ($A$ the all-ones
# lower triangle): step $t$ gets the noise $(C^{-1}Z)_t$, correlated across steps so that much
# of it cancels in the running sum (Choquette-Choo, McMahan, Rush & Thakurta 2023). The
# privacy cost is that of releasing $CG + Z$: a Gaussian mechanism whose sensitivity is the
# largest norm of a sum of $C$'s columns over one example's participations. The Toeplitz square
# root $C = A^{1/2}$, $c_k = \binom{2k}{k}/4^k$ (Fichtenberger, Henzinger & Upadhyay 2023), and
# a banded $C$ optimised for the root-mean-squared error (Choquette-Choo et al. 2023,
# "(Amplified) banded matrix factorization") on $n = 16$ steps, each example participating every
# 4 steps:

# %%
from dpjax.dp_sgd import matrix_factorization as mf

N_MF = 16
c_sqrt = mf.toeplitz_matrix(mf.sqrt_prefix_sum_coefficients(N_MF))
c_band = mf.banded_strategy(N_MF, 4, min_separation=4, max_participations=4)


def noise_correlation(c):
    """Correlation of the per-step noise C⁻¹Z: C⁻¹C⁻ᵀ scaled to unit diagonal."""
    inverse = np.linalg.inv(c)
    cov = inverse @ inverse.T
    scale = np.sqrt(np.diag(cov))
    return cov / np.outer(scale, scale)


shown = {"DP-SGD (C = I)": np.eye(N_MF), "square root": c_sqrt, "banded, 4 bands": c_band}
fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
for ax, (name, c) in zip(axes, shown.items()):
    image = ax.imshow(noise_correlation(c), cmap="RdBu_r", vmin=-1, vmax=1)
    ax.set_title(name)
    ax.set_xlabel("step")
axes[0].set_ylabel("step")
fig.colorbar(image, ax=axes, shrink=0.8, label="correlation of the step noise")
plt.show()
table = mf.compare_strategies(shown, min_separation=4, max_participations=4)
for name, e in table.items():
    print(f"{name:16s} sensitivity {e.sensitivity:5.3f} RMSE {e.rmse:5.2f} max {e.max_error:5.2f}")

# %% [markdown]
# **Check.** $C\cdot C = A$ to rounding; neighbouring steps' noise is negatively correlated (it
# cancels in the sum); both correlated strategies beat DP-SGD's prefix-sum error at the same
# sensitivity-calibrated noise.

# %%
A_MF = mf.prefix_sum_matrix(N_MF)
assert np.max(np.abs(c_sqrt @ c_sqrt - A_MF)) < 1e-12
assert noise_correlation(c_sqrt)[1, 0] < 0 and noise_correlation(c_band)[1, 0] < 0
assert table["banded, 4 bands"].rmse < table["DP-SGD (C = I)"].rmse
assert table["square root"].rmse < table["DP-SGD (C = I)"].rmse

# %% [markdown]
# **Bands against amplification.** With $b$ bands and *cyclic Poisson sampling* — the data split
# into $b$ groups, step $t$ Poisson-samples from group $t \bmod b$ at rate $bq$ — the columns an
# example touches are $b$ apart and do not overlap, so the mechanism is exactly as private as
# DP-SGD with sampling rate $bq$ over $n/b$ steps, at the same noise multiplier for column norm 1
# (Choquette-Choo et al. 2023, amplified banded MF). More bands cancel more noise but amplify
# less; $b = 1$ is DP-SGD. For a fixed $(\varepsilon, \delta)$ the noise multiplier is calibrated
# per $b$ (RDP accounting here, to keep the cell fast; PLD is tighter), and the root-mean-squared
# error of the $n$ prefix sums is $z_b \cdot \mathrm{rmse}(C_b)$ per unit of clip norm:

# %%
N_STEPS, Q_MF, EPS_MF = 64, 1 / 16, 2.0
BANDS = [1, 2, 4, 8, 16]
unit_rmse, z_b, rmse_b = [], [], []
for bands in BANDS:
    participations = N_STEPS // bands
    c = mf.banded_strategy(
        N_STEPS, bands, min_separation=bands, max_participations=participations, steps=40
    )
    unit_rmse.append(mf.prefix_sum_errors(c).rmse)  # per-participation sensitivity × error
    z_b.append(
        acc.calibrate_noise_multiplier(
            target_epsilon=EPS_MF, delta=DELTA, sampling_rate=min(1.0, bands * Q_MF),
            steps=participations, accounting="rdp",
        )
    )
    rmse_b.append(z_b[-1] * unit_rmse[-1])
fig, ax = plt.subplots(figsize=(5.5, 3.6))
ax.plot(BANDS, rmse_b, "o-")
ax.set_xscale("log", base=2)
ax.set_xlabel("bands b (b = 1: DP-SGD)")
ax.set_ylabel("RMSE of the prefix sums (× clip)")
ax.set_title(f"n = {N_STEPS}, q = {Q_MF:g}, ε = {EPS_MF}, δ = {DELTA:g}")
plt.show()
for bands, z, u, r in zip(BANDS, z_b, unit_rmse, rmse_b):
    print(f"b = {bands:2d}: noise multiplier {z:6.3f}  unit RMSE {u:6.3f}  RMSE {r:7.3f}")

# %% [markdown]
# **Check.** $b = 1$ is DP-SGD, whose unit error has the closed form $\sqrt{(n+1)/2}$; more
# bands lower the unit error and need more noise (less amplification).

# %%
assert abs(unit_rmse[0] - math.sqrt((N_STEPS + 1) / 2)) < 1e-9
assert all(later < earlier for earlier, later in zip(unit_rmse, unit_rmse[1:]))
assert all(later > earlier for earlier, later in zip(z_b, z_b[1:]))
