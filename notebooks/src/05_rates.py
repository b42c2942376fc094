# %% [markdown]
# # 5. Excess-risk rates: a small sweep and its fitted slopes
#
# The lectures state how the excess risk of private ERM must fall with the sample size $n$
# (μ-strongly convex regularised objective, L-Lipschitz loss, $\|x\| \le 1$):
#
# | method | bound | slope in n | slope in ε | source |
# |---|---|---|---|---|
# | output perturbation | $\frac{3L^2\sqrt{d\log(1.25/\delta)}}{\varepsilon\mu n}$ | −1 | −1 | lecture on output perturbation, "utility"; Chaudhuri, Monteleoni & Sarwate 2011 |
# | objective perturbation | $\frac{d\sigma^2}{2n^2\mu}$, $\sigma^2 = \frac{8L^2\log(1.25/\delta)}{\varepsilon^2}$ | −2 | −2 | lecture on objective perturbation, "utility analysis"; Kifer, Smith & Thakurta 2012 |
#
# These are worst-case upper bounds: a benign instance can decay faster (a smooth loss makes
# output perturbation's excess fall like $n^{-2}$). To see a slope of −1 we need an instance
# that attains it: interpolating absolute-loss regression $y = \langle w_0, x\rangle$, whose
# loss is sharp at its minimiser $w_0$, so $J(w_0 + b) - J(w_0) \approx E|\langle b, x\rangle|
# \propto \sigma \propto 1/n$. For objective perturbation we use logistic regression (smooth,
# as the method requires; its bound is attained up to a constant) and dpjax's default variant,
# Kifer, Smith & Thakurta's (2012) published one: a slightly larger σ and a small extra ridge,
# with the same $n^{-2}$ bound.
#
# Change `N_GRID`, `D` and `EPSILON` below and rerun: the fitted slopes should stay near the
# theory. (The dimension enters the output-perturbation bound as $\sqrt d$ through
# $E\|b\| \le \sigma\sqrt d$; on this instance $|\langle b, x\rangle| \sim \sigma$ for unit
# $x$, so the measured excess barely moves with d while the bound grows: another worst case.) **Float64** is enabled first: the excess risks reach 1e-5 and the privacy of both
# solvers needs exact minimisation.

# %%
# parameters
N_GRID = [512, 2048, 8192]  # sample sizes n of the sweep (each new n compiles once)
D = 5  # dimension d
EPSILON = 1.0  # ε of the n-sweep
EPS_GRID = [0.25, 0.5, 1.0]  # ε values of the ε-sweep (at n = N_GRID[1])
DELTA = 1e-6  # fixed δ (δ = 1/n² would bend the slopes by its log factor)
MU = 0.01  # strong convexity of the regulariser
N_KEYS = 64  # noise draws per cell
SEED = 0

# %%
# %matplotlib inline
import jax

jax.config.update("jax_enable_x64", True)  # exact solvers and excess risks down to 1e-5

import math

import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

from dpjax import erm
from dpjax.erm import losses

rng = np.random.default_rng(SEED)
key_n_sweep, key_eps_sweep = jax.random.split(jax.random.key(SEED))


def unit_sphere(n, d):
    g = rng.normal(size=(n, d))
    return g / np.linalg.norm(g, axis=1, keepdims=True)


def sharp_instance(n, d):
    """Interpolating absolute-loss regression: y = <w0, x>, ‖w0‖ = 1, minimiser w0 (μ small)."""
    X = unit_sphere(n, d)
    w0 = rng.normal(size=d)
    w0 /= np.linalg.norm(w0)
    return jnp.asarray(X), jnp.asarray(X @ w0), jnp.asarray(w0)


def logistic_instance(n, d):
    """Logistic regression with labels from P(y = 1 | x) = sigmoid(<w_true, x>), ‖w_true‖ = 2."""
    X = unit_sphere(n, d)
    w_true = rng.normal(size=d)
    w_true *= 2 / np.linalg.norm(w_true)
    y = np.where(rng.random(n) < 1 / (1 + np.exp(-X @ w_true)), 1.0, -1.0)
    return jnp.asarray(X), jnp.asarray(y)


def excess_output(key, n, d, epsilon):
    """J(w_priv) − J(w*) of output perturbation on a fresh sharp instance, and the bound."""
    X, y, w0 = sharp_instance(n, d)
    result = jax.vmap(lambda k: erm.output_perturbation(
        k, X, y, loss=losses.absolute, mu=MU, epsilon=epsilon, delta=DELTA))(
        jax.random.split(key, N_KEYS))
    J = erm.objective(losses.absolute, MU, X, y)
    return np.asarray(jax.vmap(J)(result.params) - J(w0)), float(result.excess_risk_bound)


def excess_objective(key, n, d, epsilon):
    """J(w_priv) − J(w*) of objective perturbation (KST12 variant) on a logistic instance."""
    X, y = logistic_instance(n, d)
    w_star = erm.solve(X, y, loss=losses.logistic, mu=MU).params
    result = jax.vmap(lambda k: erm.objective_perturbation(
        k, X, y, loss=losses.logistic, mu=MU, epsilon=epsilon, delta=DELTA))(
        jax.random.split(key, N_KEYS))
    J = erm.objective(losses.logistic, MU, X, y)
    return np.asarray(jax.vmap(J)(result.params) - J(w_star)), float(result.excess_risk_bound)


def fitted_slope(xs, samples):
    """Least-squares slope of log(mean excess) on log(x), with a bootstrap standard error."""
    means = np.array([s.mean() for s in samples])
    slope = np.polyfit(np.log(xs), np.log(means), 1)[0]
    boot_rng = np.random.default_rng(0)
    boot = [np.polyfit(np.log(xs), np.log([boot_rng.choice(s, len(s)).mean() for s in samples]),
                       1)[0] for _ in range(200)]
    return float(slope), float(np.std(boot))


# %% [markdown]
# ## The sweep in n
#
# One fresh data set per $n$, `N_KEYS` independent private solutions on it (the solvers are
# `jax.vmap`-ed over keys), for both methods.

# %%
sweep = {"output perturbation (sharp L1)": [], "objective perturbation (logistic)": []}
bound = {name: [] for name in sweep}
for n, key in zip(N_GRID, jax.random.split(key_n_sweep, len(N_GRID))):
    k1, k2 = jax.random.split(key)
    for name, fn, k in [("output perturbation (sharp L1)", excess_output, k1),
                        ("objective perturbation (logistic)", excess_objective, k2)]:
        excess, bnd = fn(k, n, D, EPSILON)
        sweep[name].append(excess)
        bound[name].append(bnd)
theory = {"output perturbation (sharp L1)": -1.0, "objective perturbation (logistic)": -2.0}
slopes = {name: fitted_slope(N_GRID, sweep[name]) for name in sweep}

fig, ax = plt.subplots(figsize=(7, 4))
for i, name in enumerate(sweep):
    means = [s.mean() for s in sweep[name]]
    ax.loglog(N_GRID, means, "o-", color=f"C{i}",
              label=f"{name}: slope {slopes[name][0]:.2f} (theory {theory[name]:.0f})")
    ax.loglog(N_GRID, bound[name], "--", color=f"C{i}", label="   its bound (dpjax)")
ax.set_xlabel("n")
ax.set_ylabel("mean J(w_priv) − J(w*)")
ax.set_title(f"d = {D}, ε = {EPSILON}, δ = {DELTA:g}, μ = {MU}")
ax.legend(fontsize=8)
plt.show()
for name, (s, se) in slopes.items():
    print(f"{name:36s} fitted slope {s:6.3f} ± {se:.3f}   theory {theory[name]:.0f}")

# %% [markdown]
# **Check.** Each fitted slope is within 0.15 (output) / 0.25 (objective) of the lecture's
# exponent, and every cell's mean excess is below its theorem bound (up to 3 standard errors).

# %%
assert abs(slopes["output perturbation (sharp L1)"][0] - (-1.0)) < 0.15
assert abs(slopes["objective perturbation (logistic)"][0] - (-2.0)) < 0.25
for name in sweep:
    for s, bnd in zip(sweep[name], bound[name]):
        assert s.mean() - 3 * s.std(ddof=1) / math.sqrt(len(s)) <= bnd, (name, s.mean(), bnd)

# %% [markdown]
# ## The sweep in ε
#
# At fixed $n$ the output-perturbation bound falls like $1/\varepsilon$ (lecture on output perturbation), as long as the
# Gaussian calibration is linear in $1/\varepsilon$ (it is for small ε; fit on ε ≤ 1).

# %%
n_eps = N_GRID[1]
eps_samples, eps_bounds = [], []
for e, key in zip(EPS_GRID, jax.random.split(key_eps_sweep, len(EPS_GRID))):
    excess, bnd = excess_output(key, n_eps, D, e)
    eps_samples.append(excess)
    eps_bounds.append(bnd)
eps_slope, eps_se = fitted_slope(EPS_GRID, eps_samples)
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.loglog(EPS_GRID, [s.mean() for s in eps_samples], "o-", label=f"measured, slope {eps_slope:.2f}")
ax.loglog(EPS_GRID, eps_bounds, "--", label="bound (dpjax)")
ax.set_xlabel("ε")
ax.set_ylabel("mean J(w_priv) − J(w*)")
ax.set_title(f"output perturbation, sharp L1, n = {n_eps}, d = {D}")
ax.legend()
plt.show()
print(f"ε-slope {eps_slope:.3f} ± {eps_se:.3f} (theory −1)")
assert abs(eps_slope - (-1.0)) < 0.2
