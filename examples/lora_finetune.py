"""LoRA: pre-train on public digits 0–4, fine-tune only rank-4 adapters + head on 5–9 at ε = 3."""

import jax
import jax.numpy as jnp
import optax
from sklearn.datasets import load_digits

import dpjax
from dpjax.dp_sgd import finetune as ft


def mlp(p, x):  # 64 → 64 → 64 → 5; lora_dense adds (α/r)·(x·A)·B where a layer has adapters
    x = jnp.tanh(ft.lora_dense(p["dense_0"], x, alpha=8.0))
    return ft.lora_dense(p["head"], jnp.tanh(ft.lora_dense(p["dense_1"], x, alpha=8.0)), alpha=8.0)


def example_loss(p, ex):  # the loss of ONE example
    return optax.softmax_cross_entropy_with_integer_labels(mlp(p, ex["x"]), ex["y"])


x, y = jnp.asarray(load_digits().data / 16, jnp.float32), jnp.asarray(load_digits().target)
pub, xp, yp = {"x": x[y < 5], "y": y[y < 5]}, x[y >= 5], y[y >= 5] - 5  # public 0–4, private 5–9
k = jax.random.split(jax.random.key(0), 3)
dense = lambda k, n: {"kernel": jax.random.normal(k, (64, n)) / 8, "bias": jnp.zeros(n)}  # noqa: E731
params = {"dense_0": dense(k[0], 64), "dense_1": dense(k[1], 64), "head": dense(k[2], 5)}
grad = jax.jit(jax.grad(lambda p: jnp.mean(jax.vmap(example_loss, (None, 0))(p, pub))))
opt = (tx := optax.adam(1e-2)).init(params)
for _ in range(200):  # NON-private pre-training on the public part only
    updates, opt = tx.update(grad(params), opt, params)
    params = optax.apply_updates(params, updates)
params = ft.add_lora(jax.random.key(1), params, rank=4, layers=lambda path, _: path[0] != "head")
params["head"] = {"kernel": jnp.zeros((64, 5)), "bias": jnp.zeros(5)}  # new classes: new head
trainable, frozen = ft.partition(params, ft.any_of(ft.is_lora, ft.under("head")))
n = len(yp) - 300  # the last 300 private rows are the test set; frozen: a constant, never noised
private = dpjax.make_private(ft.trainable_loss(example_loss, frozen), key=jax.random.key(2),
    optimizer=optax.sgd(0.5, momentum=0.9), l2_clip_norm=1.0, dataset_size=n, batch_size=64,
    epochs=10, target_epsilon=3.0, delta=1e-5)  # fmt: skip
trainable, state, _ = private.fit(trainable, {"x": xp[:n], "y": yp[:n]}, progress=False)
acc = jnp.mean(jnp.argmax(mlp(ft.combine(trainable, frozen), xp[n:]), -1) == yp[n:])
print(f"LoRA: d = {ft.num_params(trainable)}, accuracy {acc:.3f}, ε = {private.epsilon(state):.2f}")
