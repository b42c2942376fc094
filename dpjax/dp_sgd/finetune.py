r"""Private fine-tuning of PART of a publicly pre-trained model: full, LoRA, bias-only, last layer.

The noise DP-SGD adds has expected norm σC·√d for d trainable
coordinates, while the signal (the clipped sum) has norm at most B·C — so "noise is proportional
to the square root of the number of parameters", and the state of the art is to pre-train on
PUBLIC data and fine-tune privately, training as few coordinates as the task allows (Yu et al.
2022, "Differentially private fine-tuning of language models": LoRA adapters; Bu, Mao, Xu 2022,
"Differentially private bias-term only fine-tuning of foundation models": DP-BiTFiT).

The tools here split a parameter pytree into a TRAINABLE part (what DP-SGD differentiates,
clips, noises and updates; its size is the noise dimension d) and a FROZEN part (closed over by
the loss as constants: never differentiated, clipped, noised or updated)::

    trainable, frozen = partition(params, is_bias)            # DP-BiTFiT
    loss = trainable_loss(loss_fn, frozen)                    # loss(trainable, example[, rng])
    private = dpjax.make_private(loss, ...)                   # noise of dimension d = num_params
    trainable, state, _ = private.fit(trainable, data)
    params = combine(trainable, frozen)                       # the fine-tuned model

A large frozen part (a pre-trained language model) is better passed as an ARGUMENT of the
compiled step than closed over as a constant (XLA then compiles the step once and fast, and
runs that differ only in σ or the key share it)::

    loss = lambda t, example, public: loss_fn(combine(t, public), example)
    private = dpjax.make_private(loss, public=frozen, ...)

LoRA (Hu et al. 2022, "LoRA: low-rank adaptation of large language models") adds to a dense
layer ``x ↦ x·W₀ + b`` a low-rank update ``(α/r)·(x·A)·B`` with A ∈ R^{d_in×r} (random) and
B ∈ R^{r×d_out} (zeros, so the adapted model starts as the pre-trained one);
:func:`add_lora` puts ``lora_a``/``lora_b`` next to the ``kernel`` of every dense layer of a
parameter dict, :func:`lora_dense` applies such a layer, :func:`partition` with
:func:`is_lora` trains only the adapters, and :func:`merge_lora` folds them back into the kernel.
:func:`lora_dense` computes ``x·W₀`` and ``(x·A)·B`` as separate products, so the ghost
clipping backend sees A and B as two dense layers and W₀ as a constant.

Formal guarantees:
    The loss returned by :func:`trainable_loss` is a function of the trainable part and ONE
    example, with the frozen part a constant: :func:`dpjax.make_private` (or any DP-SGD built
    from :func:`dpjax.clipped_grad`) on it is DP-SGD on the trainable coordinates, with the
    guarantee of :func:`dpjax.make_private` (the Poisson subsampled Gaussian mechanism on a
    per-example clipped sum of ℓ2 sensitivity C, add/remove-one; Abadi et al.
    2016). ε does not depend on d; the noise is N(0, σ²C²·I_d) on the d trainable
    coordinates only (the noise grows as √d). The released model
    ``combine(trainable, frozen)`` (and :func:`merge_lora` of it) is post-processing of the
    private trainable part and the frozen part, so it has the same (ε, δ) guarantee — PROVIDED
    the frozen part is PUBLIC: a function of data that are disjoint from the private data set
    and not chosen, filtered or tuned using it (nor the pre-training's hyperparameters, nor
    the choice of which part to freeze). Frozen weights fitted on the private records, or on a
    "public" set selected by looking at them, carry their own privacy cost, which nothing here
    accounts. The choice of the trainable part (the predicate, the LoRA rank, the
    initialisation of A from a key independent of the data) is a public constant.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dpjax import _validate

__all__ = [
    "LORA_NAMES",
    "add_lora",
    "any_of",
    "combine",
    "is_bias",
    "is_lora",
    "lora_apply",
    "lora_dense",
    "merge_lora",
    "num_params",
    "partition",
    "trainable_loss",
    "under",
]

#: The leaf names of a LoRA adapter in a layer dict (see :func:`add_lora`).
LORA_NAMES = ("lora_a", "lora_b")

Predicate = Callable[[tuple[str, ...], Any], bool]


# ----------------------------------------------------------------------------- partition


def _key_name(entry: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(entry, attr):
            return str(getattr(entry, attr))
    return str(entry)


def _path_names(path: Any) -> tuple[str, ...]:
    return tuple(_key_name(entry) for entry in path)


def partition(params: Any, predicate: Predicate) -> tuple[Any, Any]:
    """Split ``params`` into (trainable, frozen) pytrees of the same structure.

    Args:
        params: any pytree of arrays (a flax ``params`` dict, an ``nnx.State``, ...).
        predicate: ``predicate(path, leaf) -> bool``; ``path`` is the tuple of the leaf's key
            names (``("dense_1", "bias")``). True: trainable.

    Returns:
        ``(trainable, frozen)``: each leaf is in exactly one of them; the other holds
        ``None`` there (an empty subtree for JAX and optax). :func:`combine` inverts it.

    Raises:
        ValueError: no leaf is trainable (DP-SGD on nothing), or ``predicate`` not callable.

    Example:
        >>> params = {"dense": {"kernel": jnp.ones((2, 3)), "bias": jnp.zeros(3)}}
        >>> trainable, frozen = partition(params, is_bias)
        >>> num_params(trainable), num_params(frozen)
        (3, 6)
    """
    if not callable(predicate):
        _validate.fail("predicate", predicate, "a callable predicate(path, leaf) -> bool")
    flags = jax.tree_util.tree_map_with_path(
        lambda path, leaf: bool(predicate(_path_names(path), leaf)), params
    )
    if not any(jax.tree.leaves(flags)):
        _validate.fail(
            "predicate", predicate, "a predicate that selects at least one leaf of params"
        )
    trainable = jax.tree.map(lambda leaf, t: leaf if t else None, params, flags)
    frozen = jax.tree.map(lambda leaf, t: None if t else leaf, params, flags)
    return trainable, frozen


def combine(trainable: Any, frozen: Any) -> Any:
    """The full parameters from the two parts of :func:`partition` (leaf from whichever is set).

    Example:
        >>> params = {"kernel": jnp.ones(2), "bias": jnp.zeros(1)}
        >>> combine(*partition(params, is_bias))["kernel"].shape
        (2,)
    """
    return jax.tree.map(
        lambda t, f: f if t is None else t, trainable, frozen, is_leaf=lambda x: x is None
    )


def num_params(tree: Any) -> int:
    """The number of scalar coordinates in ``tree`` (``None`` leaves count 0): for the
    trainable part, the dimension d of the noise DP-SGD adds."""
    return int(sum(np.prod(np.shape(leaf), dtype=np.int64) for leaf in jax.tree.leaves(tree)))


def trainable_loss(loss_fn: Callable[..., jax.Array], frozen: Any) -> Callable[..., jax.Array]:
    """``loss(trainable, example[, rng]) = loss_fn(combine(trainable, frozen), example[, rng])``.

    The frozen part is closed over as a constant: ``jax.grad`` (and so the clipping, the noise
    and the optimizer of :func:`dpjax.make_private`) sees only the trainable part. The wrapper
    takes an ``rng`` parameter exactly when ``loss_fn`` does (make_private then passes the
    per-example dropout key through).

    Args:
        loss_fn: the loss of ONE example on the full parameters, ``loss_fn(params, example)``
            or ``loss_fn(params, example, rng)``.
        frozen: the frozen part from :func:`partition` (PUBLIC: see the module's guarantees).

    Returns:
        The per-example loss of the trainable part, for :func:`dpjax.make_private`.

    Example:
        >>> params = {"w": jnp.ones(2), "bias": jnp.zeros(())}
        >>> trainable, frozen = partition(params, is_bias)
        >>> loss = trainable_loss(lambda p, x: p["w"] @ x + p["bias"], frozen)
        >>> float(loss(trainable, jnp.array([1.0, 2.0])))
        3.0
    """
    if not callable(loss_fn):
        _validate.fail("loss_fn", loss_fn, "a callable loss_fn(params, example[, rng])")
    if _takes_rng(loss_fn):

        def loss_with_rng(trainable: Any, example: Any, rng: jax.Array) -> jax.Array:
            return loss_fn(combine(trainable, frozen), example, rng=rng)

        return loss_with_rng

    def loss(trainable: Any, example: Any) -> jax.Array:
        return loss_fn(combine(trainable, frozen), example)

    return loss


def _takes_rng(fn: Callable) -> bool:
    try:
        return "rng" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


# ----------------------------------------------------------------------------- predicates


def is_bias(path: tuple[str, ...], leaf: Any = None) -> bool:
    """True for a leaf named ``bias`` (flax) or ``b``: DP-BiTFiT's trainable part."""
    return bool(path) and path[-1] in ("bias", "b")


def is_lora(path: tuple[str, ...], leaf: Any = None) -> bool:
    """True for a LoRA adapter leaf (``lora_a`` / ``lora_b``, see :func:`add_lora`)."""
    return bool(path) and path[-1] in LORA_NAMES


def under(*prefixes: str) -> Predicate:
    """A predicate selecting every leaf under a top-level key in ``prefixes`` (e.g. the
    classification head: ``under("head")``, the last-layer / linear-probe mode)."""
    if not prefixes or not all(isinstance(p, str) for p in prefixes):
        _validate.fail("prefixes", prefixes, "one or more top-level key names (str)")

    def predicate(path: tuple[str, ...], leaf: Any = None) -> bool:
        return bool(path) and path[0] in prefixes

    return predicate


def any_of(*predicates: Predicate) -> Predicate:
    """The union of predicates (e.g. ``any_of(is_bias, under("head"))``)."""
    if not predicates or not all(callable(p) for p in predicates):
        _validate.fail("predicates", predicates, "one or more callables predicate(path, leaf)")
    return lambda path, leaf=None: any(p(path, leaf) for p in predicates)


# ----------------------------------------------------------------------------- LoRA


def lora_apply(
    frozen_kernel: jax.Array, a: jax.Array, b: jax.Array, x: jax.Array, alpha: float
) -> jax.Array:
    r"""A LoRA-adapted dense map without its bias: ``x·W₀ + (α/r)·(x·A)·B``.

    .. math::  y = x W_0 + \frac{\alpha}{r} (x A) B, \quad A \in R^{d_{in}×r},\ B \in
       R^{r×d_{out}}.

    Three products (never ``W₀ + (α/r)·A·B``): per example the gradients of A and B are those
    of two dense layers (ghost clipping recognises them) and W₀ enters as a constant.

    Args:
        frozen_kernel: W₀, shape (d_in, d_out).
        a: A, shape (d_in, r).
        b: B, shape (r, d_out).
        x: inputs, shape (..., d_in).
        alpha: the LoRA scale α > 0, finite (a public constant).

    Returns:
        shape (..., d_out).

    Raises:
        ValueError: ``alpha`` not a finite number > 0 (NaN, 0 and negative values refused).

    Example:
        >>> w0, a, b = jnp.eye(2), jnp.ones((2, 1)), jnp.ones((1, 2))
        >>> lora_apply(w0, a, b, jnp.array([1.0, 2.0]), alpha=1.0).tolist()
        [4.0, 5.0]
    """
    alpha = _lora_alpha(alpha)
    rank = jnp.shape(a)[-1]
    return x @ frozen_kernel + (x @ a) @ b * (alpha / rank)


def _lora_alpha(alpha: Any) -> Any:
    """α checked as a finite number > 0 (a traced α, inside your own jit, passes as is)."""
    if alpha is None:
        _validate.fail(
            "alpha",
            alpha,
            "the LoRA scale α > 0 the adapters were trained with (the alpha given to "
            "lora_dense / lora_apply; it is not stored in the parameters)",
        )
    if not _validate.is_concrete(alpha):
        return alpha
    return _validate.positive("alpha", alpha)


def lora_dense(layer: dict, x: jax.Array, *, alpha: float = 1.0) -> jax.Array:
    """Apply a dense layer dict ``{"kernel", "bias"?, "lora_a"?, "lora_b"?}`` to ``x``:
    ``x·kernel + bias``, plus :func:`lora_apply`'s adapter term when the layer has one.

    ``alpha`` (finite, > 0) is the LoRA scale; :func:`merge_lora` needs the same value.

    Raises:
        ValueError: ``alpha`` not a finite number > 0.
    """
    alpha = _lora_alpha(alpha)
    if "lora_a" in layer:
        y = lora_apply(layer["kernel"], layer["lora_a"], layer["lora_b"], x, alpha)
    else:
        y = x @ layer["kernel"]
    return y + layer["bias"] if "bias" in layer else y


def _is_dense(node: Any) -> bool:
    return isinstance(node, dict) and "kernel" in node and jnp.ndim(node["kernel"]) == 2


def add_lora(key: jax.Array, params: Any, rank: int, *, layers: Predicate | None = None) -> Any:
    """Add LoRA adapters to the dense layers of a nested parameter dict.

    Every dict holding a 2-D ``kernel`` (d_in, d_out) (whose path ``layers`` accepts, default
    all) gets ``lora_a`` ~ N(0, 1/d_in) of shape (d_in, r) and ``lora_b`` = 0 of shape
    (r, d_out): the adapted model computes exactly what ``params`` did until B moves.

    Args:
        key: a JAX PRNG key for A (independent of the private data).
        params: nested dicts (a flax linen ``params`` dict, or your own).
        rank: r ≥ 1.
        layers: optional ``predicate(path, layer_dict)`` choosing the layers to adapt.

    Returns:
        A new dict with the adapters (``params`` is not modified).

    Raises:
        ValueError: ``rank`` not a positive int, or no dense layer adapted.
    """
    rank = _validate.positive_int("rank", rank)
    count = [0]

    def visit(path: tuple[str, ...], node: Any) -> Any:
        if _is_dense(node) and (layers is None or layers(path, node)):
            d_in, d_out = jnp.shape(node["kernel"])
            dtype = jnp.result_type(node["kernel"])
            k = jax.random.fold_in(key, count[0])
            count[0] += 1
            a = jax.random.normal(k, (d_in, rank), dtype) / jnp.sqrt(jnp.asarray(d_in, dtype))
            return {**node, "lora_a": a, "lora_b": jnp.zeros((rank, d_out), dtype)}
        if isinstance(node, dict):
            return {name: visit((*path, str(name)), child) for name, child in node.items()}
        return node

    out = visit((), params)
    if count[0] == 0:
        _validate.fail("params", "no dense layer", "nested dicts with a 2-D 'kernel' to adapt")
    return out


def merge_lora(params: Any, *, alpha: float | None = None) -> Any:
    """Fold every adapter into its kernel: ``kernel + (α/r)·A·B`` (post-processing), and drop
    ``lora_a``/``lora_b``: a plain dense model computing the same function.

    Args:
        params: nested dicts with adapters (from :func:`add_lora`, trained).
        alpha: REQUIRED, the α the adapters were trained with (the ``alpha`` of
            :func:`lora_dense` / :func:`lora_apply`). The parameters do not record it, and a
            merge at another α computes another function.

    Returns:
        The dict without adapters; ``lora_dense(merged[l], x)`` equals
        ``lora_dense(params[l], x, alpha=alpha)`` up to float rounding.

    Raises:
        ValueError: ``alpha`` omitted, or not a finite number > 0.

    Example:
        >>> layer = {"kernel": jnp.eye(2), "lora_a": jnp.ones((2, 1)),
        ...          "lora_b": jnp.ones((1, 2))}
        >>> x = jnp.array([1.0, 2.0])
        >>> merged = merge_lora({"l": layer}, alpha=4.0)["l"]
        >>> lora_dense(merged, x).tolist(), lora_dense(layer, x, alpha=4.0).tolist()
        ([13.0, 14.0], [13.0, 14.0])
    """
    alpha = _lora_alpha(alpha)

    def visit(node: Any) -> Any:
        if isinstance(node, dict) and "lora_a" in node:
            a, b = node["lora_a"], node["lora_b"]
            kernel = node["kernel"] + (a @ b) * (alpha / jnp.shape(a)[-1])
            return {k: v for k, v in node.items() if k not in LORA_NAMES} | {"kernel": kernel}
        if isinstance(node, dict):
            return {name: visit(child) for name, child in node.items()}
        return node

    return visit(params)
