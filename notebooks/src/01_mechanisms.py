# %% [markdown]
# # 1. Mechanisms: the pictures that make each one click
#
# A tour of the noise mechanisms of the lectures, run on dpjax's public API. Every formula cites
# the lecture note it comes from (the seed files in `/work/shared/seeds/`, index in its README):
#
# * `001_22975d579ade9c52.txt`: pure ε-DP, randomized response, the Laplace mechanism and its utility;
# * `000_a9865af81d0677e1.txt`: (ε, δ)-DP, the privacy-loss random variable, the Gaussian mechanism;
# * `004_f02b245d52dd0fec.txt`: mixed noise, smooth sensitivity of the median, bounded Laplace,
#   the exponential mechanism and report-noisy-max.
#
# Each section draws the mechanism's output on two **neighbouring** data sets, and ends with a check
# cell that compares a number measured with dpjax against the number the lecture predicts.

# %%
# parameters
EPSILON = 1.0  # privacy parameter ε of the demos
DELTA = 1e-5  # δ for the Gaussian calibrations
N_RUNS = 100_000  # independent runs of each mechanism (Monte Carlo sample size)
K = 10  # number of coordinates for the utility checks
SEED = 0

# %%
# %matplotlib inline
import math

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from scipy import stats

import dpjax
from dpjax import mechanisms as mech

root = jax.random.key(SEED)
(key_lap, key_lap_k, key_gauss, key_plrv, key_util, key_rr, key_exp, key_rnm, key_mix, key_ss,
 key_bl) = jax.random.split(root, 11)


def runs(mechanism, key, value, n=N_RUNS, **kwargs):
    """n independent runs of ``mechanism(key, value, **kwargs)``: one fresh key per run."""
    return np.asarray(jax.vmap(lambda k: mechanism(k, value, **kwargs))(jax.random.split(key, n)))


# %% [markdown]
# ## The Laplace mechanism
#
# For $f: X \to \mathbb{R}^k$ with ℓ1 sensitivity $\Delta_1 = \sup_{D \sim D'} \|f(D) - f(D')\|_1$,
# $M(D) = f(D) + (Z_1, \dots, Z_k)$ with $Z_i \sim \mathrm{Lap}(\Delta_1/\varepsilon)$ i.i.d. is
# ε-DP (Laplace mechanism theorem, `001_22975d579ade9c52.txt`). Below: a counting query with
# $f(D) = 0$, $f(D') = 1$, $\Delta_1 = 1$. The log ratio of the two output densities stays inside
# $[-\varepsilon, \varepsilon]$ everywhere: that is the definition of ε-DP.

# %%
f_D, f_Dprime, sensitivity = 0.0, 1.0, 1.0
b = mech.laplace_scale(sensitivity=sensitivity, epsilon=EPSILON)
key_D, key_Dprime = jax.random.split(key_lap)
out_D = runs(mech.laplace, key_D, f_D, sensitivity=sensitivity, epsilon=EPSILON)
out_Dprime = runs(mech.laplace, key_Dprime, f_Dprime, sensitivity=sensitivity, epsilon=EPSILON)

edges = np.linspace(-4 * b, 1 + 4 * b, 61)
count_D, _ = np.histogram(out_D, edges)
count_Dprime, _ = np.histogram(out_Dprime, edges)
centres = 0.5 * (edges[1:] + edges[:-1])
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.5))
ax1.hist(out_D, edges, density=True, alpha=0.5, label="M(D), f(D)=0")
ax1.hist(out_Dprime, edges, density=True, alpha=0.5, label="M(D'), f(D')=1")
ax1.set_title(f"Laplace mechanism, ε={EPSILON}, b=Δ₁/ε={b:g}")
ax1.legend()
populated = (count_D > 300) & (count_Dprime > 300)
log_ratio = np.log(count_D[populated] / count_Dprime[populated])
ax2.plot(centres[populated], log_ratio, "o", ms=3, label="measured log p_D/p_D'")
ax2.axhline(EPSILON, color="k", ls="--", label="±ε")
ax2.axhline(-EPSILON, color="k", ls="--")
ax2.set_title("privacy loss of each output")
ax2.legend()
plt.show()

# %% [markdown]
# **Check (ε-DP).** The measured log ratio in every well-populated bin is within ε, up to the
# Poisson error of the bin counts (standard error $\sqrt{1/c_D + 1/c_{D'}}$, 5 standard errors
# allowed).

# %%
standard_error = np.sqrt(1 / count_D[populated] + 1 / count_Dprime[populated])
print(f"max |log ratio| = {np.abs(log_ratio).max():.3f}  vs  ε = {EPSILON}")
assert np.all(np.abs(log_ratio) <= EPSILON + 5 * standard_error)
# and the bound is attained: outputs left of f(D) have log ratio exactly +ε
assert abs(log_ratio[centres[populated] < f_D].mean() - EPSILON) < 0.05

# %% [markdown]
# ### Utility of the Laplace mechanism
#
# For $k$ coordinates, $E\|M(D) - f(D)\|_1 = k\Delta_1/\varepsilon$ and
# $P\left(\|M(D) - f(D)\|_\infty > \frac{\Delta_1}{\varepsilon}\ln\frac{k}{\beta}\right) < \beta$
# (Laplace utility theorem, `001_22975d579ade9c52.txt`). We measure both on a $k$-dimensional
# histogram query (disjoint bins, so $\Delta_1 = 1$ under add/remove-one).

# %%
histogram = jnp.arange(K, dtype=float)
noisy = runs(mech.laplace, key_lap_k, histogram, n=20_000, sensitivity=1.0, epsilon=EPSILON)
errors = noisy - np.asarray(histogram)
l1 = np.abs(errors).sum(axis=1)
predicted_l1 = mech.laplace_expected_l1_error(k=K, sensitivity=1.0, epsilon=EPSILON)
beta = 0.05
linf_level = mech.laplace_linf_tail_bound(k=K, sensitivity=1.0, epsilon=EPSILON, beta=beta)
exceed = np.mean(np.abs(errors).max(axis=1) > linf_level)
print(f"E||M(D)-f(D)||_1: measured {l1.mean():.3f}, lecture kΔ₁/ε = {predicted_l1:.3f}")
print(f"P(||M(D)-f(D)||_inf > {linf_level:.2f}): measured {exceed:.4f}, lecture bound β = {beta}")

# %% [markdown]
# **Check (utility).** $|Lap(b)|$ has mean $b$ and standard deviation $b$, so the mean of
# $\|\cdot\|_1$ over $n$ runs has standard error $b\sqrt{k/n}$: allow 5 of them. The tail
# frequency must stay below β (plus 5 binomial standard errors).

# %%
tolerance = 5 * (1 / EPSILON) * math.sqrt(K / len(l1))
assert abs(l1.mean() - predicted_l1) < tolerance, (l1.mean(), predicted_l1, tolerance)
assert exceed < beta + 5 * math.sqrt(beta * (1 - beta) / len(l1))

# %% [markdown]
# ## The Gaussian mechanism: classical versus analytic calibration
#
# With ℓ2 sensitivity $\Delta_2$, $M(D) = f(D) + N(0, \sigma^2 I)$ with
# $\sigma = \Delta_2\sqrt{2\ln(1.25/\delta)}/\varepsilon$ is (ε, δ)-DP
# (Gaussian mechanism theorem, `000_a9865af81d0677e1.txt`; the note writes "variance" where the
# standard deviation is meant). The theorem only covers $\varepsilon < 1$, and dpjax refuses the
# classical formula beyond it. The *analytic* calibration (Balle & Wang 2018) finds the smallest
# σ for which the exact privacy profile
# $\delta(\varepsilon) = \Phi\left(\frac{\Delta}{2\sigma} - \frac{\varepsilon\sigma}{\Delta}\right)
#   - e^{\varepsilon}\Phi\left(-\frac{\Delta}{2\sigma} - \frac{\varepsilon\sigma}{\Delta}\right)$
# is at most δ; it is valid for every ε and always needs less noise.

# %%
eps_grid = np.geomspace(0.05, 10, 40)
classic = [mech.gaussian_sigma(sensitivity=1.0, epsilon=e, delta=DELTA, calibration="classic")
           for e in eps_grid if e < 1]
analytic = [mech.gaussian_sigma(sensitivity=1.0, epsilon=e, delta=DELTA) for e in eps_grid]
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.loglog(eps_grid[eps_grid < 1], classic, label="classic √(2 ln(1.25/δ))/ε (000)")
ax.loglog(eps_grid, analytic, label="analytic (Balle & Wang 2018)")
ax.set_xlabel("ε")
ax.set_ylabel("σ / Δ₂")
ax.set_title(f"Gaussian noise needed, δ = {DELTA:g}")
ax.legend()
plt.show()
try:
    mech.gaussian_sigma(sensitivity=1.0, epsilon=2.0, delta=DELTA, calibration="classic")
except ValueError as error:
    print("classic at ε = 2 is refused:", str(error)[:90], "...")

# %% [markdown]
# **Check (calibration).** The classical σ at ε = 0.5 is the lecture's formula, it is private
# (its exact δ is below the target) but loose; the analytic σ meets the target δ exactly.

# %%
eps_half = 0.5
sigma_classic = mech.gaussian_sigma(sensitivity=1.0, epsilon=eps_half, delta=DELTA,
                                    calibration="classic")
sigma_analytic = mech.gaussian_sigma(sensitivity=1.0, epsilon=eps_half, delta=DELTA)
delta_classic = mech.gaussian_delta(sigma=sigma_classic, sensitivity=1.0, epsilon=eps_half)
delta_analytic = mech.gaussian_delta(sigma=sigma_analytic, sensitivity=1.0, epsilon=eps_half)
print(f"σ classic {sigma_classic:.3f} (exact δ {delta_classic:.2e}),"
      f" σ analytic {sigma_analytic:.3f} (exact δ {delta_analytic:.2e}), target δ {DELTA:g}")
assert math.isclose(sigma_classic, math.sqrt(2 * math.log(1.25 / DELTA)) / eps_half)
assert delta_classic <= DELTA and math.isclose(delta_analytic, DELTA, rel_tol=1e-6)
assert sigma_analytic < sigma_classic

# %% [markdown]
# ### Why Gaussian noise needs a δ: the privacy-loss random variable
#
# The privacy loss of an output $o$ is $L(o) = \ln\frac{P(M(D) = o)}{P(M(D') = o)}$ with
# $o \sim M(D)$ (`000_a9865af81d0677e1.txt`). For the Gaussian mechanism it is *linear* in $o$, so
# it exceeds any ε with positive probability: no pure ε-DP, only (ε, δ). The exact δ(ε) is the
# expectation $E_{o \sim M(D)}[(1 - e^{\varepsilon - L(o)})_+]$; we estimate it by Monte Carlo
# from dpjax's Gaussian samples and compare with `gaussian_delta`. We use a small σ so that δ is
# large enough to estimate.

# %%
DELTA_DEMO = 0.1  # a large δ, so that Monte Carlo can see it
o = runs(mech.gaussian, key_plrv, 0.0, sensitivity=1.0, epsilon=1.0, delta=DELTA_DEMO)  # f(D) = 0
sigma_demo = mech.gaussian_sigma(sensitivity=1.0, epsilon=1.0, delta=DELTA_DEMO)
loss = ((o - 1.0) ** 2 - o**2) / (2 * sigma_demo**2)  # ln p_D(o)/p_D'(o), f(D') = 1
eps_values = np.linspace(0.0, 2.5, 11)
delta_mc = [np.mean(np.maximum(0.0, 1 - np.exp(e - loss))) for e in eps_values]
delta_exact = [mech.gaussian_delta(sigma=sigma_demo, sensitivity=1.0, epsilon=e)
               for e in eps_values]
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.5))
ax1.hist(loss, 100, density=True)
ax1.axvline(1.0, color="k", ls="--", label="ε = 1")
ax1.set_title(f"privacy loss L(o), Gaussian, σ/Δ = {sigma_demo:.3f}")
ax1.legend()
ax2.semilogy(eps_values, delta_exact, label="gaussian_delta (exact)")
ax2.semilogy(eps_values, delta_mc, "o", label="Monte Carlo E[(1-e^{ε-L})+]")
ax2.set_xlabel("ε")
ax2.set_ylabel("δ(ε)")
ax2.legend()
plt.show()

# %% [markdown]
# **Check (privacy profile).** The privacy loss of the Gaussian mechanism is
# $N(\Delta^2/2\sigma^2, \Delta^2/\sigma^2)$; its Monte Carlo δ(ε) agrees with the exact profile
# within 5 standard errors at every ε, and at ε = 1 it equals the δ σ was calibrated for.

# %%
for e, mc, exact in zip(eps_values, delta_mc, delta_exact):
    se = np.std(np.maximum(0.0, 1 - np.exp(e - loss))) / math.sqrt(len(loss))
    assert abs(mc - exact) < 5 * se + 1e-12, (e, mc, exact)
mean_loss = 1 / (2 * sigma_demo**2)
print(f"mean privacy loss {loss.mean():.4f} (theory Δ²/2σ² = {mean_loss:.4f});"
      f" δ(ε=1): exact {delta_exact[4]:.4f}, Monte Carlo {delta_mc[4]:.4f}, target {DELTA_DEMO}")
assert abs(loss.mean() - mean_loss) < 5 * math.sqrt(2 * mean_loss / len(loss))
assert math.isclose(delta_exact[4], DELTA_DEMO, rel_tol=1e-6)

# %% [markdown]
# ### Utility against ε
#
# Laplace noise has mean absolute error $b = \Delta_1/\varepsilon$ (`001_22975d579ade9c52.txt`);
# analytic Gaussian noise has root mean square error σ(ε, δ). Measured with dpjax on a scalar
# query with sensitivity 1, against ε:

# %%
eps_sweep = np.geomspace(0.1, 10, 9)
keys = jax.random.split(key_util, 2 * len(eps_sweep))
lap_mae = [np.abs(runs(mech.laplace, k, 0.0, n=20_000, sensitivity=1.0, epsilon=e)).mean()
           for k, e in zip(keys[::2], eps_sweep)]
gauss_rmse = [np.sqrt(np.mean(runs(mech.gaussian, k, 0.0, n=20_000, sensitivity=1.0, epsilon=e,
                                   delta=DELTA) ** 2))
              for k, e in zip(keys[1::2], eps_sweep)]
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.loglog(eps_sweep, lap_mae, "o", label="Laplace: measured mean |error|")
ax.loglog(eps_sweep, 1 / eps_sweep, "-", label="Δ₁/ε (001)")
ax.loglog(eps_sweep, gauss_rmse, "s", label="Gaussian: measured RMSE")
ax.loglog(eps_sweep, [mech.gaussian_sigma(sensitivity=1.0, epsilon=e, delta=DELTA)
                      for e in eps_sweep], "-", label=f"analytic σ(ε, δ={DELTA:g})")
ax.set_xlabel("ε")
ax.set_ylabel("error")
ax.legend()
plt.show()
slope = np.polyfit(np.log(eps_sweep), np.log(lap_mae), 1)[0]
print(f"log-log slope of the Laplace error in ε: {slope:.3f} (lecture: -1)")
assert abs(slope + 1) < 0.05
