# %% [markdown]
# # 4. DP-SGD with optax and flax
#
# DP-SGD (lecture on ML under DP, "DP Stochastic Gradient Descent"; Abadi et al. 2016) in three
# visible pieces:
#
# 1. **per-example clipping**: $[g]_C = g\cdot\min(1, C/\|g\|_2)$ (the note writes max where
#    min is meant), summed over the batch (`dpjax.clipped_grad`); one example moves the sum by
#    at most $C$, so the sum has ℓ2 sensitivity $C$ under add/remove-one and $2C$ under
#    replace-one (lecture on ML under DP, "DP Gradient Descent");
# 2. **the Gaussian mechanism on the sum**: $N(0, \sigma^2C^2 I)$ added once per step
#    (`dpjax.add_gaussian_noise`), then division by the PUBLIC expected batch size $qn$
#    (`dpjax.normalize_by`) and any optax optimizer (post-processing);
#    `dpjax.dp_sgd_optimizer` chains the three;
# 3. **accounting**: Poisson sampling at rate $q$ amplifies privacy (lecture on ML under DP,
#    "privacy amplification by subsampling") and `dpjax.accounting.dp_sgd_epsilon` composes the $T$
#    subsampled Gaussian steps tightly (PLD).
#
# `dpjax.make_private` wires all three (and the Poisson sampler) in one call; we look at the
# pieces first, then train with it. The model is a small flax MLP on scikit-learn's 8×8 digits
# (1797 images shipped with the package, no download). We train one model per noise multiplier
# and plot accuracy against ε.

# %%
# parameters
NOISE_MULTIPLIERS = [0.7, 1.0, 1.5, 3.0, 6.0]  # σ of the private runs (0 = non-private baseline added)
CLIP = 1.0  # C, the per-example clip norm of training
DEMO_CLIP = 4.0  # the clip norm of the clipping demo (gradients at initialisation are ~3-5)
EXPECTED_BATCH = 64  # q·n
STEPS = 300  # T
LEARNING_RATE = 0.1
DELTA = 1e-5
SEED = 0

# %%
# %matplotlib inline
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import optax
from sklearn.datasets import load_digits

import dpjax
from dpjax import accounting as acc

digits = load_digits()
perm = np.random.default_rng(SEED).permutation(len(digits.target))
test, train = perm[:360], perm[360:]
x_train = jnp.asarray(digits.data[train] / 16.0, jnp.float32)
y_train = jnp.asarray(digits.target[train], jnp.int32)
x_test = jnp.asarray(digits.data[test] / 16.0, jnp.float32)
y_test = jnp.asarray(digits.target[test], jnp.int32)
n = len(y_train)


class MLP(nn.Module):
    """64 → 32 → 10 with tanh."""

    @nn.compact
    def __call__(self, x):
        return nn.Dense(10)(jnp.tanh(nn.Dense(32)(x)))


model = MLP()


def example_loss(params, x, y):
    """Cross-entropy of ONE example: the function clipped_grad differentiates per example."""
    logits = model.apply({"params": params}, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y)


key_init, key_clip, key_noise, key_train = jax.random.split(jax.random.key(SEED), 4)
params0 = model.init(key_init, jnp.zeros((1, 64), jnp.float32))["params"]
# backend="vmap": per-example gradients by jax.vmap (fastest to compile for a model this small;
# "auto" picks ghost clipping for larger models)
grad_fn = dpjax.clipped_grad(example_loss, l2_clip_norm=CLIP, backend="vmap")
print(f"n = {n} training images, {sum(p.size for p in jax.tree.leaves(params0))} parameters")

# %% [markdown]
# ## Per-example clipping
#
# On one batch of 64 examples at initialisation: the per-example gradient norms before
# clipping, and the change of the clipped sum when one example is removed. The lecture's
# sensitivity argument says that change is $\|[g_i]_C\| = \min(\|g_i\|, C) \le C$. (The
# demo uses `DEMO_CLIP`, so that some examples are clipped and some are not.)

# %%
demo_grad_fn = dpjax.clipped_grad(example_loss, l2_clip_norm=DEMO_CLIP, backend="vmap")
idx = jax.random.permutation(key_clip, n)[:64]
xb, yb = x_train[idx], y_train[idx]


@jax.jit
def removal_effect(params, xb, yb):
    """Per-example norms, and ‖S(D) − S(D without i)‖ for every i (mask drops example i)."""
    full, info = demo_grad_fn(params, xb, yb)

    def without(i):
        partial, _ = demo_grad_fn(params, xb, yb, mask=jnp.arange(64) != i)
        return optax.global_norm(jax.tree.map(jnp.subtract, full, partial))

    return info, jax.vmap(without)(jnp.arange(64))


info, change = removal_effect(params0, xb, yb)
norms = np.asarray(info.per_example_norms)
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.5))
ax1.hist(norms, 30)
ax1.axvline(DEMO_CLIP, color="k", ls="--", label=f"C = {DEMO_CLIP}")
ax1.set_xlabel("‖∇ℓ(θ; x_i)‖ before clipping")
ax1.legend()
ax2.plot(norms, np.asarray(change), "o", ms=4, label="‖S(D) − S(D without i)‖")
ax2.plot(np.sort(norms), np.minimum(np.sort(norms), DEMO_CLIP), "k-", label="min(‖g_i‖, C)")
ax2.set_xlabel("‖g_i‖")
ax2.legend()
plt.show()
print(f"{int(info.num_clipped)} of 64 examples clipped; sensitivity of the sum:"
      f" add/remove-one {demo_grad_fn.sensitivity(dpjax.ADD_OR_REMOVE_ONE)},"
      f" replace-one {demo_grad_fn.sensitivity(dpjax.REPLACE_ONE)}")

# %% [markdown]
# **Check (clipped-sum sensitivity).** Removing any one example changes the clipped sum by exactly
# $\min(\|g_i\|, C) \le C$ (float32 tolerance), and dpjax reports the sensitivities $C$
# (add/remove-one) and $2C$ (replace-one).

# %%
assert np.allclose(np.asarray(change), np.minimum(norms, DEMO_CLIP), rtol=1e-4, atol=1e-5)
assert float(np.max(change)) <= DEMO_CLIP * (1 + 1e-5)
assert 0 < int(info.num_clipped) < 64
assert demo_grad_fn.sensitivity(dpjax.ADD_OR_REMOVE_ONE) == DEMO_CLIP
assert demo_grad_fn.sensitivity(dpjax.REPLACE_ONE) == 2 * DEMO_CLIP
assert grad_fn.sensitivity(dpjax.ADD_OR_REMOVE_ONE) == CLIP

# %% [markdown]
# ## The noise transform
#
# `dpjax.add_gaussian_noise(σC, key=...)` is an optax transform: its state holds the key, split
# on every update. Applied to zero updates 200 times, its output should be $N(0, \sigma^2C^2)$ in
# every coordinate, fresh at every step.

# %%
sigma_demo = 1.5
noise_tx = dpjax.add_gaussian_noise(sigma_demo * CLIP, key=key_noise)
zeros = jax.tree.map(jnp.zeros_like, params0)


def noisy_update(state, _):
    out, state = noise_tx.update(zeros, state)
    return state, jnp.concatenate([leaf.ravel() for leaf in jax.tree.leaves(out)])


_, samples = jax.lax.scan(noisy_update, noise_tx.init(params0), None, length=200)
samples = np.asarray(samples)
print(f"noise std {samples.std():.4f} (σC = {sigma_demo * CLIP}); correlation of consecutive"
      f" steps {np.corrcoef(samples[:-1].ravel(), samples[1:].ravel())[0, 1]:+.4f}")
se_std = sigma_demo * CLIP / math.sqrt(2 * samples.size)
assert abs(samples.std() - sigma_demo * CLIP) < 5 * se_std
assert abs(np.corrcoef(samples[:-1].ravel(), samples[1:].ravel())[0, 1]) < 5 / math.sqrt(samples.size)

# %% [markdown]
# ## Training with `make_private`: one call per noise level
#
# `dpjax.make_private` states σ, C, the batch and the accountant once. It builds the
# `PoissonSampler` at rate $q = 64/n$ (padded to a fixed shape, with a cap sized so that its
# truncation slack $(1 + e^\varepsilon)T\bar p$ is at most $10^{-3}\delta$), gathers each batch
# from `data` (here a dict of arrays), clips with the padding mask applied, adds $N(0,
# \sigma^2C^2 I)$ once per step, divides by the PUBLIC $qn$ and applies the optimizer;
# `epsilon(state)` reads the privacy spent from the step count (one
# `PoissonSampledGaussianEvent` with `count = t`, δ includes the slack). σ = 0 is not a private
# run, so the non-private baseline is built from the pieces above with σ = 0.

# %%
data = {"x": x_train, "y": y_train}
sigmas = list(NOISE_MULTIPLIERS)  # Python floats: privacy parameters are constants


def train_private(noise_multiplier, key):
    private = dpjax.make_private(
        lambda params, ex: example_loss(params, ex["x"], ex["y"]),  # the loss of ONE example
        optimizer=optax.sgd(LEARNING_RATE, momentum=0.9), l2_clip_norm=CLIP, dataset_size=n,
        batch_size=EXPECTED_BATCH, steps=STEPS, noise_multiplier=noise_multiplier,
        delta=DELTA, key=key, clipping="vmap")
    params, state, _ = private.fit(params0, data, progress=False)
    return private, params, state


def train_non_private(key):
    """The baseline: the same pieces by hand, with σ = 0 (no privacy)."""
    sampler = dpjax.PoissonSampler(dataset_size=n, sampling_rate=EXPECTED_BATCH / n)
    noise_key, sample_key = jax.random.split(key)
    tx = dpjax.dp_sgd_optimizer(optimizer=optax.sgd(LEARNING_RATE, momentum=0.9),
                                noise_multiplier=0.0, clipped_grad=grad_fn,
                                normalizer=sampler.expected_batch_size, key=noise_key)

    def step(carry, k):
        params, opt_state = carry
        batch = sampler.sample(k)
        total, _ = grad_fn(params, x_train, y_train, batch=batch)  # gathers + masks
        updates, opt_state = tx.update(total, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), None

    (params, _), _ = jax.lax.scan(step, (params0, tx.init(params0)),
                                  jax.random.split(sample_key, STEPS))
    return params


def accuracy(params, x, y):
    return jnp.mean(jnp.argmax(model.apply({"params": params}, x), axis=-1) == y)


keys = jax.random.split(key_train, len(sigmas) + 1)
runs = [train_private(s, k) for s, k in zip(sigmas, keys[1:])]
trained = [jax.jit(train_non_private)(keys[0])] + [params for _, params, _ in runs]
test_acc = np.array([accuracy(params, x_test, y_test) for params in trained])
epsilons = [private.epsilon(state) for private, _, state in runs]
q = runs[0][0].sampling_rate
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.semilogx(epsilons, test_acc[1:], "o-", label="DP-SGD")
ax.axhline(test_acc[0], color="k", ls="--", label="non-private (σ = 0)")
for s, e, a in zip(NOISE_MULTIPLIERS, epsilons, test_acc[1:]):
    ax.annotate(f"σ={s}", (e, a), textcoords="offset points", xytext=(4, -10), fontsize=8)
ax.set_xlabel(f"ε (δ = {DELTA:.0e}, truncation slack included), PLD accountant")
ax.set_ylabel("test accuracy")
ax.set_title(f"flax MLP on digits, q = {q:.3f}, T = {STEPS}, C = {CLIP}")
ax.legend()
plt.show()
for s, e, a in zip(NOISE_MULTIPLIERS, epsilons, test_acc[1:]):
    print(f"σ = {s:4}: ε = {e:6.3f}, test accuracy {a:.3f}")
print(f"non-private: test accuracy {test_acc[0]:.3f}")

# %% [markdown]
# **Check.** ε spent, read by `make_private` from the step count, is `dp_sgd_epsilon` for
# $(\sigma, q, T)$ at the δ left after the truncation slack, and the generic
# `PrivacyAccountant` gives the same ε at δ for the run's event (which carries the sampler's cap,
# so the accountant pays the same slack); ε falls as σ grows; the non-private
# model learns the task and the most private model pays for its privacy in accuracy.

# %%
private, _, state = runs[0]
delta_accounted = DELTA * (1 - dpjax.dp_sgd.private.SLACK_FRACTION)
assert int(state.step) == STEPS == private.event().count
assert epsilons[0] == acc.dp_sgd_epsilon(noise_multiplier=NOISE_MULTIPLIERS[0], sampling_rate=q,
                                         steps=STEPS, delta=delta_accounted)
assert math.isclose(acc.PrivacyAccountant([private.event()]).epsilon(DELTA, accounting="pld"),
                    epsilons[0], rel_tol=1e-9)
assert private.sampler.delta_slack(STEPS, epsilons[0]) <= DELTA - delta_accounted
assert all(a > b for a, b in zip(epsilons, epsilons[1:]))
assert test_acc[0] > 0.9
assert test_acc[0] > test_acc[-1]
