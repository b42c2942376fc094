"""DP-SGD on scikit-learn's digits with a small flax MLP, and the ε it spends.

Run from the repository root::

    python -m examples.flax_digits            # or: python examples/flax_digits.py
    python -m examples.flax_digits --noise-multiplier 2.0 --steps 800

The loop is the whole recipe, in the order a reviewer checks it:

1. ``PoissonSampler`` draws each training example with probability q into a padded batch
   (indices + mask), and gives the ``PoissonSampledGaussianEvent`` its sampling justifies;
2. ``clipped_grad`` returns the SUM of per-example gradients clipped to ℓ2 norm C;
3. ``dp_sgd_optimizer`` adds N(0, (σC)²) once, divides by the PUBLIC expected batch size
   q·n, applies the optimizer;
4. ε comes from ``dpjax.accounting.dp_sgd_epsilon`` for (σ, q, T, δ) — the same numbers as the
   event.

Inputs are scaled to [0, 1]; the test split is never touched by training (and ε is about the
training set only).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import dpjax  # noqa: E402
from dpjax.accounting import dp_sgd_epsilon  # noqa: E402


class MLP(nn.Module):
    """64 → hidden → 10, tanh (bounded activations keep per-example gradients tame)."""

    hidden: int = 64

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = jnp.tanh(nn.Dense(self.hidden)(x))
        return nn.Dense(10)(x)


def load_digits(seed: int = 0, test_fraction: float = 0.2):
    """The 1797 8×8 digit images (ships with scikit-learn), float32 in [0, 1], split."""
    from sklearn.datasets import load_digits as sk_load_digits

    data = sk_load_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int32)
    perm = np.random.default_rng(seed).permutation(len(y))
    n_test = int(round(test_fraction * len(y)))
    test, train = perm[:n_test], perm[n_test:]
    return x[train], y[train], x[test], y[test]


def make_loss(model: nn.Module):
    """Per-example cross-entropy: loss_fn(params, x, y) for ONE example."""

    def loss_fn(params, x, y):
        logits = model.apply({"params": params}, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y)

    return loss_fn


def accuracy(model: nn.Module, params, x, y) -> float:
    logits = model.apply({"params": params}, jnp.asarray(x))
    predicted = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return float(jnp.mean(predicted == jnp.asarray(y, jnp.int32)))


def train(
    *,
    noise_multiplier: float = 1.5,
    l2_clip_norm: float = 1.0,
    expected_batch_size: float = 64.0,
    steps: int = 500,
    learning_rate: float = 0.1,
    delta: float = 1e-5,
    seed: int = 0,
) -> dict:
    """Train the MLP with DP-SGD (Poisson sampling); return accuracy, ε and the event.

    Args:
        noise_multiplier: σ (noise std σ·C on the clipped sum).
        l2_clip_norm: C.
        expected_batch_size: q·n; sets q = expected_batch_size / n (public).
        steps: T noisy releases.
        learning_rate: for optax.sgd with momentum 0.9.
        delta: δ of the reported (ε, δ).
        seed: seeds the data split, init, sampling and noise keys (all split from one key).

    Returns:
        A dict with ``test_accuracy``, ``train_accuracy``, ``epsilon``, ``delta``, ``event``,
        ``seconds`` and the hyperparameters.
    """
    x_tr, y_tr, x_te, y_te = load_digits(seed)
    n = len(y_tr)
    sampler = dpjax.PoissonSampler(dataset_size=n, sampling_rate=expected_batch_size / n)
    model = MLP()
    init_key, noise_key, sample_key = jax.random.split(jax.random.key(seed), 3)
    params = model.init(init_key, jnp.zeros((1, 64), jnp.float32))["params"]
    grad_fn = dpjax.clipped_grad(make_loss(model), l2_clip_norm=l2_clip_norm)
    tx = dpjax.dp_sgd_optimizer(
        optimizer=optax.sgd(learning_rate, momentum=0.9),
        noise_multiplier=noise_multiplier,
        l2_clip_norm=l2_clip_norm,
        normalizer=sampler.expected_batch_size,
        key=noise_key,
    )
    x_all, y_all = jnp.asarray(x_tr), jnp.asarray(y_tr)

    @jax.jit
    def step(params, opt_state, key):
        batch = sampler.sample(key)
        x, y = x_all[batch.indices], y_all[batch.indices]
        clipped_sum, _ = grad_fn(params, x, y, mask=batch.mask)
        updates, opt_state = tx.update(clipped_sum, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    start = time.perf_counter()
    opt_state = tx.init(params)
    for key in jax.random.split(sample_key, steps):
        params, opt_state = step(params, opt_state, key)
    jax.block_until_ready(params)
    seconds = time.perf_counter() - start

    event = sampler.event(noise_multiplier=noise_multiplier, steps=steps)
    epsilon = dp_sgd_epsilon(
        noise_multiplier=noise_multiplier,
        sampling_rate=sampler.sampling_rate,
        steps=steps,
        delta=delta,
    )
    return {
        "test_accuracy": accuracy(model, params, x_te, y_te),
        "train_accuracy": accuracy(model, params, x_tr, y_tr),
        "epsilon": epsilon,
        "delta": delta + sampler.delta_slack(steps, epsilon),  # truncation slack depends on ε
        "event": event,
        "seconds": seconds,
        "dataset_size": n,
        "sampling_rate": sampler.sampling_rate,
        "noise_multiplier": noise_multiplier,
        "l2_clip_norm": l2_clip_norm,
        "steps": steps,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--noise-multiplier", type=float, default=1.5)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--batch", type=float, default=64.0, help="expected batch size q·n")
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    result = train(
        noise_multiplier=args.noise_multiplier,
        l2_clip_norm=args.clip,
        expected_batch_size=args.batch,
        steps=args.steps,
        learning_rate=args.lr,
        delta=args.delta,
        seed=args.seed,
    )
    print(
        f"DP-SGD on digits (n={result['dataset_size']}, q={result['sampling_rate']:.4f}, "
        f"σ={result['noise_multiplier']}, C={result['l2_clip_norm']}, T={result['steps']}): "
        f"test accuracy {result['test_accuracy']:.3f} (train {result['train_accuracy']:.3f}) "
        f"at ε = {result['epsilon']:.2f}, δ = {result['delta']:.1e} "
        f"[{result['seconds']:.1f} s]"
    )
    return result


if __name__ == "__main__":
    main()
