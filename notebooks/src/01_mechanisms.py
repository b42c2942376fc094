# %% [markdown]
# # 1. Mechanisms: the pictures that make each one click
#
# A tour of the noise mechanisms of the lectures, run on dpjax's public API. Every formula cites
# the lecture it comes from, by topic, and the primary paper:
#
# * lecture on privacy background: pure ε-DP, randomized response (Warner 1965), the Laplace
#   mechanism and its utility (Dwork, McSherry, Nissim & Smith 2006; Dwork & Roth 2014, §3.3);
# * lecture on properties of DP: (ε, δ)-DP, the privacy-loss random variable, the Gaussian
#   mechanism (Dwork & Roth 2014, Theorem A.1; analytic calibration: Balle & Wang 2018);
# * lecture on advances in DP: mixed noise, smooth sensitivity of the median (Nissim,
#   Raskhodnikova & Smith 2007), bounded Laplace (Holohan et al. 2020), the exponential mechanism
#   (McSherry & Talwar 2007) and report-noisy-max; DP in practice, the 2020 US Census: the
#   discrete Gaussian (Canonne, Kamath & Steinke 2020) and integer counts.
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
from fractions import Fraction

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

from dpjax import mechanisms as mech

root = jax.random.key(SEED)
(key_lap, key_lap_k, key_plrv, key_util, key_rr, key_exp, key_em_sweep, key_mix, key_ss,
 key_bl) = jax.random.split(root, 10)
key_census = jax.random.fold_in(root, 10)


def runs(mechanism, key, value, n=N_RUNS, **kwargs):
    """n independent runs of ``mechanism(key, value, **kwargs)``: one fresh key per run."""
    return np.asarray(jax.vmap(lambda k: mechanism(k, value, **kwargs))(jax.random.split(key, n)))


# %% [markdown]
# ## The Laplace mechanism
#
# For $f: X \to \mathbb{R}^k$ with ℓ1 sensitivity $\Delta_1 = \sup_{D \sim D'} \|f(D) - f(D')\|_1$,
# $M(D) = f(D) + (Z_1, \dots, Z_k)$ with $Z_i \sim \mathrm{Lap}(\Delta_1/\varepsilon)$ i.i.d. is
# ε-DP (Laplace mechanism theorem, lecture on privacy background; Dwork & Roth 2014, Theorem 3.6). Below: a counting query with
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
# (Laplace utility theorem, lecture on privacy background; Dwork & Roth 2014, Theorem 3.8). We measure both on a $k$-dimensional
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
# (Gaussian mechanism theorem, lecture on properties of DP; Dwork & Roth 2014, Theorem A.1; the note writes "variance" where the
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
ax.loglog(eps_grid[eps_grid < 1], classic, label="classic √(2 ln(1.25/δ))/ε (Dwork–Roth A.1)")
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
# $o \sim M(D)$ (lecture on properties of DP, the privacy-loss random variable). For the Gaussian mechanism it is *linear* in $o$, so
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
# Laplace noise has mean absolute error $b = \Delta_1/\varepsilon$ (lecture on privacy background);
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
ax.loglog(eps_sweep, 1 / eps_sweep, "-", label="Δ₁/ε (Laplace utility)")
ax.loglog(eps_sweep, gauss_rmse, "s", label="Gaussian: measured RMSE")
ax.loglog(eps_sweep, [mech.gaussian_sigma(sensitivity=1.0, epsilon=e, delta=DELTA)
                      for e in eps_sweep], "-", label=f"analytic σ(ε, δ={DELTA:g})")
ax.set_xlabel("ε")
ax.set_ylabel("error")
ax.legend(loc="lower left", fontsize=8)
plt.show()
slope = np.polyfit(np.log(eps_sweep), np.log(lap_mae), 1)[0]
print(f"log-log slope of the Laplace error in ε: {slope:.3f} (lecture: -1)")
assert abs(slope + 1) < 0.05

# %% [markdown]
# ## Randomized response
#
# The coin protocol (lecture on privacy background, "Example: Randomized Response"; Warner 1965): flip a coin;
# heads, answer truthfully; tails, answer yes/no at random. A respondent reports the truth with
# probability $1/2 + 1/4 = 3/4$, so the likelihood ratio of a report under the two possible
# answers is $(3/4)/(1/4) = 3$: the protocol is $\varepsilon = \ln 3$-DP (the lecture's question
# "what is the ε level?"). With $k$-ary randomized response at level ε the truth is kept with
# $p = e^\varepsilon/(e^\varepsilon + k - 1)$, and the true frequencies are recovered without
# bias from $\hat\pi = (\hat\lambda - q)/(p - q)$ (post-processing).

# %%
n_people = N_RUNS
true_rate = 0.3
key_truth, key_coin, key_krr = jax.random.split(key_rr, 3)
truth = jax.random.bernoulli(key_truth, true_rate, (n_people,)).astype(jnp.int32)
reports = mech.coin_randomized_response(key_coin, truth)
kept = float(jnp.mean(reports == truth))
epsilon_measured = math.log(kept / (1 - kept))
estimate = mech.randomized_response_frequencies(reports, epsilon=mech.COIN_EPSILON)
print(f"P[report = truth] = {kept:.4f} (lecture 3/4);"
      f" ε measured {epsilon_measured:.4f}, lecture ln 3 = {mech.COIN_EPSILON:.4f}")
print(f"true yes-rate {float(truth.mean()):.4f}, estimated from the reports {float(estimate[1]):.4f}")

eps_rr = np.geomspace(0.1, 5, 5)
errors_rr = []
for k_e, e in zip(jax.random.split(key_krr, len(eps_rr)), eps_rr):
    noisy_reports = mech.randomized_response(k_e, truth[:20_000], epsilon=float(e))
    est = mech.randomized_response_frequencies(noisy_reports, epsilon=float(e))
    errors_rr.append(abs(float(est[1]) - float(truth[:20_000].mean())))
p_keep = np.array([mech.randomized_response_keep_probability(epsilon=float(e)) for e in eps_rr])
lam = true_rate * p_keep + (1 - true_rate) * (1 - p_keep)
predicted_sd = np.sqrt(lam * (1 - lam) / 20_000) / (2 * p_keep - 1)
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.5))
ax1.bar([0, 1], [1 - kept, kept], width=0.4, label="truth = yes")
ax1.bar([0.4, 1.4], [kept, 1 - kept], width=0.4, label="truth = no")
ax1.set_xticks([0.2, 1.2], ["report no", "report yes"])
ax1.set_title("coin randomized response: P[report | truth]")
ax1.legend()
ax2.loglog(eps_rr, errors_rr, "o", label="|estimated − true| yes-rate, n = 20 000")
ax2.loglog(eps_rr, predicted_sd, "-", label="standard deviation √(λ(1−λ)/n)/(2p−1)")
ax2.set_xlabel("ε")
ax2.legend(fontsize=8)
plt.show()

# %% [markdown]
# **Check.** The measured ε of the coin protocol is ln 3 and the frequency estimate is unbiased,
# both within 5 binomial standard errors.

# %%
se_kept = math.sqrt(0.75 * 0.25 / n_people)
assert abs(kept - 0.75) < 5 * se_kept
assert abs(epsilon_measured - math.log(3)) < 5 * se_kept / (0.75 * 0.25)
se_est = math.sqrt(0.5 * 0.5 / n_people) / (2 * 0.75 - 1)
assert abs(float(estimate[1]) - float(truth.mean())) < 5 * se_est

# %% [markdown]
# ## The exponential mechanism and report-noisy-max
#
# To select the candidate $q$ with the highest score $f(x, q)$ (score sensitivity Δ), the
# exponential mechanism releases $q$ with probability $\propto \exp(\varepsilon f(x, q)/(2\Delta))$
# (lecture on advances in DP, Theorem 27: ε-DP; McSherry & Talwar 2007). Its utility (Lemma 28): with $d$ candidates,
# $P\left(f(x, Q) < f^* - \frac{2\Delta(\ln d + t)}{\varepsilon}\right) \le e^{-t}$.
# Report-noisy-max adds i.i.d. exponential noise of rate ε/(2Δ) to the scores and releases the
# argmax; it is ε-DP with the same bounds (lecture on advances in DP, Example 30).
#
# The election of Example 29: scores (15, 20, 25), ε = 1, so candidate 1 wins with probability
# $e^{7.5}/(e^{7.5} + e^{10} + e^{12.5})$. Its neighbour: one voter moves from candidate 3 to 1.

# %%
votes = jnp.array([15.0, 20.0, 25.0])
votes_neighbour = jnp.array([16.0, 20.0, 24.0])
k1, k2, k3, k4 = jax.random.split(key_exp, 4)
em_D = runs(mech.exponential_mechanism, k1, votes, sensitivity=1.0, epsilon=1.0)
em_Dp = runs(mech.exponential_mechanism, k2, votes_neighbour, sensitivity=1.0, epsilon=1.0)
rnm_D = runs(mech.report_noisy_max, k3, votes, sensitivity=1.0, epsilon=1.0)
rnm_Dp = runs(mech.report_noisy_max, k4, votes_neighbour, sensitivity=1.0, epsilon=1.0)
freq = {name: np.bincount(out, minlength=3) / len(out)
        for name, out in [("EM D", em_D), ("EM D'", em_Dp), ("RNM D", rnm_D), ("RNM D'", rnm_Dp)]}
lecture_p1 = math.exp(7.5) / (math.exp(7.5) + math.exp(10) + math.exp(12.5))
fig, ax = plt.subplots(figsize=(7, 3.5))
for i, (name, f) in enumerate(freq.items()):
    ax.bar(np.arange(3) + 0.2 * i - 0.3, f, width=0.2, label=name)
ax.set_xticks(range(3), ["candidate 1", "candidate 2", "candidate 3"])
ax.set_yscale("log")
ax.set_title("selection frequencies, ε = 1 (advanced-DP lecture, Examples 29-30)")
ax.legend()
plt.show()
print(f"P[candidate 1 wins]: measured {freq['EM D'][0]:.5f}, lecture {lecture_p1:.5f}")
print("exponential mechanism probabilities:",
      np.round(np.asarray(mech.exponential_mechanism_probabilities(votes, sensitivity=1.0,
                                                                    epsilon=1.0)), 5))

# %% [markdown]
# **Check.** Measured frequencies match Example 29's closed form (5 binomial standard errors),
# and the frequency ratios between the neighbours stay below $e^\varepsilon$ (up to sampling
# error) for both mechanisms.

# %%
p_closed = np.exp(0.5 * np.asarray(votes, float)) / np.exp(0.5 * np.asarray(votes, float)).sum()
assert math.isclose(p_closed[0], lecture_p1)
assert np.all(np.abs(freq["EM D"] - p_closed) < 5 * np.sqrt(p_closed * (1 - p_closed) / N_RUNS))
for a, b_ in [("EM D", "EM D'"), ("RNM D", "RNM D'")]:
    ok = (freq[a] > 0.01) & (freq[b_] > 0.01)
    assert np.all(np.abs(np.log(freq[a][ok] / freq[b_][ok])) < 1.0 + 0.1)

# %% [markdown]
# ### Utility against ε: Lemma 28
#
# $d = 50$ candidates with random scores; the expected gap $f^* - E f(x, Q)$ of both mechanisms
# against ε, next to the bound $2\Delta \ln d/\varepsilon$ (Lemma 28 at $t = 0$).

# %%
d_cand = 50
key_scores, key_picks = jax.random.split(key_em_sweep)
scores = jax.random.uniform(key_scores, (d_cand,), minval=0.0, maxval=20.0)
eps_em = np.geomspace(0.1, 10, 6)
gap_em, gap_rnm = [], []
for kk, e in zip(jax.random.split(key_picks, len(eps_em)), eps_em):
    ka, kb = jax.random.split(kk)
    pick_em = runs(mech.exponential_mechanism, ka, scores, n=20_000, sensitivity=1.0, epsilon=e)
    pick_rnm = runs(mech.report_noisy_max, kb, scores, n=20_000, sensitivity=1.0, epsilon=e)
    gap_em.append(float(scores.max()) - float(np.asarray(scores)[pick_em].mean()))
    gap_rnm.append(float(scores.max()) - float(np.asarray(scores)[pick_rnm].mean()))
bound_em = [mech.exponential_mechanism_expected_gap_bound(sensitivity=1.0, epsilon=e,
                                                          num_candidates=d_cand) for e in eps_em]
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.loglog(eps_em, gap_em, "o", label="exponential mechanism")
ax.loglog(eps_em, gap_rnm, "s", label="report-noisy-max")
ax.loglog(eps_em, bound_em, "-", label="Lemma 28: 2Δ ln d / ε")
ax.set_xlabel("ε")
ax.set_ylabel("f* − E f(x, Q)")
ax.legend()
plt.show()
assert all(g <= bnd for g, bnd in zip(gap_em, bound_em))
assert all(g <= bnd for g, bnd in zip(gap_rnm, bound_em))

# %% [markdown]
# ## Mixed noise (lecture on advances in DP, Definition 9 and Theorem 10)
#
# The mixed-noise mechanism adds $N(0, \sigma^2_{MNM})$ when $\Delta f \le t_0$ and
# $\mathrm{Lap}(\Delta f/\varepsilon)$ otherwise, with $t_0 = \sqrt\pi\,\delta\varepsilon/2$ and
# $\sigma^2_{MNM} = 2(\Delta f/\varepsilon)^2$ (lecture on advances in DP, Theorem 10), so
# that its variance is always the Laplace one, $2(\Delta f/\varepsilon)^2$.
#
# **A caveat dpjax documents:** (ε, δ)-DP of additive noise is scale invariant, so the Gaussian
# branch with $\sigma = \sqrt2\Delta/\varepsilon$ has the same exact δ(ε) whatever Δ is: about
# 0.04 at ε = 1, far above a typical δ. dpjax keeps the lecture's branch rule and threshold but
# calibrates the Gaussian branch exactly (analytic Gaussian). The plot shows the exact δ of the
# lecture's Gaussian branch (Balle & Wang's profile) against ε.

# %%
eps_mix = np.geomspace(0.1, 5, 30)
lecture_delta = [mech.mixed_noise_lecture_delta(epsilon=e) for e in eps_mix]
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.5))
ax1.semilogy(eps_mix, lecture_delta)
ax1.axhline(DELTA, color="k", ls="--", label=f"δ = {DELTA:g}")
ax1.set_xlabel("ε")
ax1.set_title("exact δ of N(0, 2Δ²/ε²) noise (Theorem 10's σ)")
ax1.legend()
t0 = mech.mixed_noise_threshold(epsilon=EPSILON, delta=DELTA)
sens_grid = np.geomspace(t0 / 100, t0 * 100, 41)
stds = []
for s_ in sens_grid:
    choice = mech.mixed_noise_scale(sensitivity=float(s_), epsilon=EPSILON, delta=DELTA)
    stds.append(choice.scale * (math.sqrt(2) if choice.distribution == "laplace" else 1) / s_)
ax2.semilogx(sens_grid, stds)
ax2.axvline(t0, color="k", ls="--", label="t₀ = √π δ ε / 2")
ax2.set_xlabel("sensitivity Δ")
ax2.set_ylabel("noise std / Δ")
ax2.set_title("dpjax mixed noise: Gaussian below t₀, Laplace above")
ax2.legend()
plt.show()

# %% [markdown]
# **Check.** Above the threshold the released noise has the Laplace variance
# $2(\Delta/\varepsilon)^2$ that the lecture states for the mechanism (measured on dpjax's
# draws; the variance estimate of a Laplace sample has relative standard error $\sqrt{5/n}$).

# %%
sens_big = 2.0
draws = runs(mech.mixed_noise, key_mix, 0.0, sensitivity=sens_big, epsilon=EPSILON, delta=DELTA)
predicted_var = 2 * (sens_big / EPSILON) ** 2
print(f"variance: measured {draws.var():.3f}, lecture 2(Δ/ε)² = {predicted_var:.3f};"
      f" exact δ of Theorem 10's Gaussian branch at ε=1: {mech.mixed_noise_lecture_delta(epsilon=1.0):.4f}")
assert abs(draws.var() / predicted_var - 1) < 5 * math.sqrt(5 / N_RUNS)

# %% [markdown]
# ## Bounded Laplace (lecture on advances in DP, Definition 24 and Theorem 26; Holohan et al. 2020)
#
# Example 25: ages lie in $[0, 110]$; an unbounded Laplace release of a small answer can be a
# negative age. The bounded Laplace mechanism samples the Laplace density **restricted** to the
# domain, with normaliser $C_q = 1 - \frac12\left(e^{-(q-l)/b} + e^{-(u-q)/b}\right)$. Because
# $C_q$ depends on the data, $b = \Delta/\varepsilon$ is not enough: Theorem 26 requires
# $b \ge \Delta / (\varepsilon - \ln\Delta C - \ln(1 - \delta))$ with
# $\Delta C = C_{l+\Delta}/C_l$. Below: $\Delta = 5$ years, ε = 1, neighbours with answers 0
# and 5.

# %%
lower, upper, sens_age = 0.0, 110.0, 5.0
b_bounded = mech.bounded_laplace_scale(sensitivity=sens_age, epsilon=EPSILON, lower=lower,
                                       upper=upper)
ka, kb, kc = jax.random.split(key_bl, 3)
bl_D = runs(mech.bounded_laplace, ka, 0.0, sensitivity=sens_age, epsilon=EPSILON, lower=lower,
            upper=upper)
bl_Dp = runs(mech.bounded_laplace, kb, 5.0, sensitivity=sens_age, epsilon=EPSILON, lower=lower,
             upper=upper)
plain = runs(mech.laplace, kc, 0.0, sensitivity=sens_age, epsilon=EPSILON)
edges_bl = np.linspace(-30, 40, 71)
fig, ax = plt.subplots(figsize=(7, 3.5))
ax.hist(plain, edges_bl, density=True, alpha=0.4, label="Laplace, f(D) = 0 (negative ages!)")
ax.hist(bl_D, edges_bl, density=True, alpha=0.5, label="bounded Laplace, f(D) = 0")
ax.hist(bl_Dp, edges_bl, density=True, alpha=0.5, label="bounded Laplace, f(D') = 5")
ax.set_title(f"bounded Laplace on [0, 110]: b = {b_bounded:.3f} > Δ/ε = {sens_age / EPSILON:g}")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# **Check (Theorem 26).** With the lecture's normaliser $C_q$ computed here from its formula, the
# scale dpjax chose satisfies $b \ge \Delta/(\varepsilon - \ln\Delta C)$ (δ = 0); every output lies
# in the domain; and the probability of the most revealing event, an output in $[0, 1]$, differs
# between the neighbours by at most $e^\varepsilon$.

# %%
def C(q, b):  # the lecture's normaliser C_q
    return 1 - 0.5 * (math.exp(-(q - lower) / b) + math.exp(-(upper - q) / b))


delta_C = C(lower + sens_age, b_bounded) / C(lower, b_bounded)
print(f"ΔC = {delta_C:.4f}; Theorem 26 needs b ≥ {sens_age / (EPSILON - math.log(delta_C)):.4f},"
      f" dpjax b = {b_bounded:.4f}")
assert b_bounded >= sens_age / (EPSILON - math.log(delta_C)) * (1 - 1e-9)
assert bl_D.min() >= lower and max(bl_D.max(), bl_Dp.max()) <= upper and plain.min() < 0
p_D, p_Dp = np.mean(bl_D <= 1.0), np.mean(bl_Dp <= 1.0)
print(f"P[output ≤ 1]: {p_D:.4f} vs {p_Dp:.4f}, ratio {p_D / p_Dp:.3f} ≤ e^ε = {math.e:.3f}")
assert p_D / p_Dp <= math.exp(EPSILON) * (1 + 5 * math.sqrt(1 / (p_Dp * N_RUNS)))

# %% [markdown]
# ## Smooth sensitivity of the median (lecture on advances in DP, Examples 12, 20, 21; Nissim, Raskhodnikova & Smith 2007)
#
# The median of $n$ values in $[0, \Lambda]$ has global sensitivity Λ. Its local sensitivity
# $\max(x_{m+1} - x_m, x_m - x_{m-1})$ is small on typical data, but scaling noise to it is not
# DP (Example 12): on Dataset 1 ($m$ zeros, then Λ's) it is Λ, on the neighbouring Dataset 2
# ($m + 1$ zeros) it is 0, so Dataset 2 releases the median without noise. The β-smooth
# sensitivity $S^*_\beta(x) = \max_k e^{-k\beta} \max_{t} (x_{m+t} - x_{m+t-k-1})$ (equation (4))
# fixes this: it never changes by more than a factor $e^\beta$ between neighbours (Definition 13),
# and Laplace noise $\mathrm{Lap}(2S/\varepsilon)$ with $\beta \le \varepsilon/(2\ln(2/\delta'))$ is
# (ε, δ)-DP (Proposition 16, Corollary 17).

# %%
n_med, Lambda = 101, 1.0
m = (n_med + 1) // 2
dataset1 = jnp.concatenate([jnp.zeros(m), jnp.full(n_med - m, Lambda)])
dataset2 = jnp.concatenate([jnp.zeros(m + 1), jnp.full(n_med - m - 1, Lambda)])
params = mech.smooth_noise_parameters(epsilon=EPSILON, delta=DELTA, noise="laplace")
ls1 = float(mech.local_sensitivity_median(dataset1, upper=Lambda))
ls2 = float(mech.local_sensitivity_median(dataset2, upper=Lambda))
ss1 = float(mech.smooth_sensitivity_median(dataset1, upper=Lambda, beta=params.beta))
ss2 = float(mech.smooth_sensitivity_median(dataset2, upper=Lambda, beta=params.beta))
print(f"local sensitivity: Dataset 1 {ls1:g}, Dataset 2 {ls2:g} (Example 12)")
print(f"{params.beta:.4f}-smooth sensitivity: Dataset 1 {ss1:.4f}, Dataset 2 {ss2:.4f} (Example 21)")

key_typical, key_smooth, key_global = jax.random.split(key_ss, 3)
typical = jnp.sort(jnp.clip(0.5 + 0.15 * jax.random.normal(key_typical, (n_med,)), 0.0, Lambda))
betas = np.geomspace(1e-3, 1.0, 5)
smooth_typical = [float(mech.smooth_sensitivity_median(typical, upper=Lambda, beta=float(bb)))
                  for bb in betas]
releases = runs(mech.smooth_median, key_smooth, typical, n=4_000,
                upper=Lambda, epsilon=EPSILON, delta=DELTA, noise="laplace")
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.5))
ax1.loglog(betas, smooth_typical, label="smooth S*_β(x)")
ax1.axhline(float(mech.local_sensitivity_median(typical, upper=Lambda)), color="g", ls=":",
            label="local")
ax1.axhline(Lambda, color="k", ls="--", label="global Λ")
ax1.axvline(params.beta, color="r", ls="-.", label=f"β for ε={EPSILON}, δ={DELTA:g}")
ax1.set_xlabel("β")
ax1.set_title(f"sensitivities of the median, n = {n_med}, N(0.5, 0.15²) data")
ax1.legend(fontsize=8)
ax2.hist(releases, 80, density=True, alpha=0.6, label="smooth-sensitivity median")
ax2.hist(runs(mech.laplace, key_global, float(jnp.median(typical)), n=4_000,
              sensitivity=Lambda, epsilon=EPSILON), 80, density=True, alpha=0.4,
         label="Laplace with global sensitivity")
ax2.set_xlim(-3, 4)
ax2.set_title("released medians")
ax2.legend(fontsize=8)
plt.show()

# %% [markdown]
# **Check (Definition 13).** On the neighbouring data sets of Example 12 the local sensitivity
# jumps from Λ to 0, while the smooth sensitivity changes by at most $e^\beta$ and upper-bounds
# the local one; Corollary 17's δ for the chosen β equals the target δ.

# %%
assert ls1 == Lambda and ls2 == 0.0
assert ss1 >= ls1 and ss2 >= ls2 and ss2 > 0
assert math.exp(-params.beta) <= ss1 / ss2 <= math.exp(params.beta) * (1 + 1e-12)
delta_prime = 2 * DELTA / (math.exp(EPSILON / 2) + 1)
assert math.isclose(params.beta, EPSILON / (2 * math.log(2 / delta_prime)))
assert math.isclose(mech.smooth_laplace_delta(epsilon=EPSILON, delta_prime=delta_prime), DELTA)

# %% [markdown]
# ## Counts as a census publishes them: "people born on Mars" (lecture on advances in DP, DP in practice: the 2020 US Census)
#
# The lecture's "unrealistic output": a noisy histogram of place of birth says that −2.3 people
# were born on Mars. The 2020 US Census released its tables with **discrete Gaussian** noise
# (integer noise, accounted in zCDP; Canonne, Kamath & Steinke 2020, Theorem 14:
# $\rho = \Delta^2/(2\sigma^2)$) and then post-processed them into non-negative integers that
# add up to invariant totals. Post-processing costs no privacy, but it is not free: it **biases**
# the small cells. Below, a histogram whose Mars cell is 0, under add/remove-one (Δ = 1), four
# ways at the same ρ = ε²/2 (pure ε-DP implies ε²/2-zCDP, Bun & Steinke 2016):
#
# * Laplace, b = 1/ε: unbiased, but negative and fractional counts;
# * bounded Laplace on [0, total]: non-negative, but fractional and biased upwards near 0;
# * discrete Gaussian, σ = 1/ε, clamped at 0 (`noisy_counts`): integers ≥ 0, biased upwards
#   by E[max(Y, 0)] ≈ 0.4σ on empty cells;
# * the same with a consistent public total (`noisy_counts(total=...)`, the nearest non-negative
#   integer vector with that sum): the surplus the clamp creates is taken back from the cells.

# %%
places = ["Earth", "Moon", "Mars", "Jupiter"]
truth = jnp.array([1_000, 3, 0, 0], jnp.int32)
total = int(truth.sum())  # a public invariant (like a state's population in 2020)
sigma_dg = Fraction(1) / Fraction(EPSILON).limit_denominator(1000)  # ρ = ε²/2 for Δ = 1
n_census = 20_000
k1, k2, k3, k4 = jax.random.split(key_census, 4)
tiled = jnp.broadcast_to(truth, (n_census, truth.size))
lap = np.asarray(tiled + jax.random.laplace(k1, tiled.shape) / EPSILON)
bounded = runs(mech.bounded_laplace, k2, truth.astype(jnp.float32), n=n_census,
               sensitivity=1.0, epsilon=EPSILON, lower=0.0, upper=float(total))
clamped = np.asarray(mech.noisy_counts(k3, tiled, sigma=sigma_dg))  # n_census independent runs
consistent = np.stack([mech.noisy_counts(k, truth, sigma=sigma_dg, total=total)
                       for k in jax.random.split(k4, 2_000)])
rows = {"Laplace": lap, "bounded Laplace": bounded, "discrete Gaussian + clamp": clamped,
        "discrete Gaussian + clamp + total": consistent}
print(f"{'release':34s} {'P[Mars < 0]':>12s} {'integer':>8s} " +
      " ".join(f"{'bias ' + p:>12s}" for p in places))
for name, r in rows.items():
    bias = r.mean(axis=0) - np.asarray(truth)
    print(f"{name:34s} {np.mean(r[:, 2] < 0):12.3f} {str(bool(np.all(r == np.round(r)))):>8s} " +
          " ".join(f"{b:12.3f}" for b in bias))
fig, ax = plt.subplots(figsize=(7, 3.5))
edges_m = np.arange(-6.5, 7.5, 0.25)
ax.hist(lap[:, 2], edges_m, density=True, alpha=0.4, label="Laplace")
ax.hist(bounded[:, 2], edges_m, density=True, alpha=0.4, label="bounded Laplace")
ax.hist(clamped[:, 2], edges_m, density=True, alpha=0.6, label="discrete Gaussian, clamped")
ax.set_title(f"released number of people born on Mars (truth 0), ρ = {EPSILON ** 2 / 2:g}")
ax.set_xlabel("released count")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# **Check (post-processing and its bias).** The discrete Gaussian releases are non-negative
# integers; the consistent ones add up to the public total exactly; the Laplace release of the
# Mars cell is negative about half the time; and the clamped Mars cell's mean matches the bias
# computed from the discrete Gaussian pmf, $E[\max(Y, 0)] = \sum_{y>0} y\,P[Y = y]$ (within 5
# standard errors). Both noises have the same ρ.

# %%
assert np.all(clamped >= 0) and np.all(consistent >= 0) and clamped.dtype == np.int32
assert np.all(consistent.sum(axis=1) == total)
assert 0.45 < np.mean(lap[:, 2] < 0) < 0.55
ys = np.arange(1, 60 * int(math.ceil(sigma_dg)) + 60)
pmf = mech.discrete_gaussian_pmf(ys, sigma=sigma_dg)
expected_bias, second = float(np.sum(ys * pmf)), float(np.sum(ys**2 * pmf))
se = math.sqrt((second - expected_bias**2) / n_census)
print(f"Mars bias: measured {clamped[:, 2].mean():.4f}, pmf says {expected_bias:.4f} ± {5 * se:.4f}")
assert abs(clamped[:, 2].mean() - expected_bias) < 5 * se
rho_dg = mech.discrete_gaussian_rho(sensitivity=1, sigma=sigma_dg)
assert math.isclose(rho_dg, EPSILON**2 / 2, rel_tol=1e-3)
