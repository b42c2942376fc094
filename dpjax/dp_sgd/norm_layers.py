"""Swap BatchNorm for GroupNorm in a flax nnx model, so that DP-SGD can train it.

BatchNorm normalises each example by statistics of the whole batch: one example then moves
every other example's output, so per-example clipping no longer bounds what one example adds
to the update, and the running statistics are a release of the data that no noise covers. On
the ONE example a per-example loss sees, a training-mode BatchNorm outputs 0.
:func:`dpjax.dp_sgd.nnx_loss` therefore refuses it. GroupNorm (Wu & He 2018, "Group
normalization", https://arxiv.org/abs/1803.08494) normalises each example by its own
statistics over groups of channels: nothing crosses examples, and it is what De, Berrada,
Hayes, Smith, Balle 2022 ("Unlocking high-accuracy differentially private image
classification through scale", https://arxiv.org/abs/2204.13650) train with DP-SGD.

:func:`replace_batch_norm` does for an ``nnx.Module`` what Opacus's ``ModuleValidator.fix`` does
for a PyTorch module. For flax.linen there is no sound automatic fix (a ``@nn.compact`` module
builds its submodules inside ``__call__``, so no module object exists to swap before it runs):
the recipe is a norm-layer field, ``model.clone(norm=functools.partial(nn.GroupNorm,
num_groups=...))``, shown in the tuning guide (docs/guides/tuning.md).
"""

from __future__ import annotations

from typing import Any

from dpjax import _validate

__all__ = ["group_count", "replace_batch_norm"]


def group_count(num_features: int, num_groups: int) -> int:
    """The largest divisor of ``num_features`` that is at most ``num_groups``.

    GroupNorm needs the channels split into equal groups; 32 groups (Wu & He's default) of 48
    channels is impossible, so 48 channels get 24 groups of 2.

    Example:
        >>> group_count(64, 32), group_count(48, 32), group_count(3, 32)
        (32, 24, 3)
    """
    num_features = _validate.positive_int("num_features", num_features)
    num_groups = _validate.positive_int("num_groups", num_groups)
    return max(g for g in range(1, min(num_groups, num_features) + 1) if num_features % g == 0)


def _group_norm(batch_norm: Any, num_groups: int, rngs: Any) -> Any:
    """A fresh ``nnx.GroupNorm`` over the channels of ``batch_norm`` (its ε, dtypes, affine)."""
    from flax import nnx

    if batch_norm.axis != -1:
        _validate.fail(
            "model",
            f"an nnx.BatchNorm over axis {batch_norm.axis}",
            "BatchNorms over the last axis (axis=-1; nnx.GroupNorm normalises the last axis)",
        )
    return nnx.GroupNorm(
        batch_norm.num_features,
        num_groups=group_count(batch_norm.num_features, num_groups),
        epsilon=batch_norm.epsilon,
        dtype=batch_norm.dtype,
        param_dtype=batch_norm.param_dtype,
        use_bias=batch_norm.use_bias,
        use_scale=batch_norm.use_scale,
        rngs=rngs,
    )


def _child(parent: Any, key: Any) -> Any:
    return getattr(parent, key) if isinstance(key, str) and hasattr(parent, key) else parent[key]


def _set_child(parent: Any, key: Any, child: Any) -> None:
    """``parent.key = child`` (a module attribute) or ``parent[key] = child`` (nnx.List/Dict);
    ValueError when the parent does not take it (e.g. a tuple)."""
    try:
        if isinstance(key, str) and hasattr(parent, key):
            setattr(parent, key, child)
        else:
            parent[key] = child
    except (TypeError, AttributeError):
        pass
    if _child(parent, key) is not child:
        _validate.fail(
            "model",
            f"a BatchNorm held at {key!r} by a {type(parent).__name__}",
            "BatchNorms held by module attributes, nnx.List or nnx.Dict (replaceable)",
        )


def replace_batch_norm(model: Any, *, num_groups: int = 32) -> Any:
    """Replace every ``nnx.BatchNorm`` in ``model`` by an ``nnx.GroupNorm``, in place.

    Each BatchNorm over C channels becomes ``nnx.GroupNorm(C, num_groups=g)`` with g the
    largest divisor of C that is at most ``num_groups`` (:func:`group_count`), the same ε,
    dtypes and affine switches, and a FRESH scale 1 and bias 0: a BatchNorm's learnt affine
    belongs to its batch statistics and means nothing after another normalisation, and its
    running statistics are dropped. A BatchNorm shared by several parents becomes one
    GroupNorm shared by the same parents. Other modules are untouched.

    GroupNorm takes its statistics over every axis but the first (the batch axis) within each
    group of channels, so call the model on a batch; inside a per-example loss of
    :func:`dpjax.make_private` that is ``model(example[None])[0]`` (a batch of one). The
    statistics are then those of that one example: nothing crosses examples, so per-example
    clipping bounds each example's contribution as for any other layer.

    Args:
        model: an ``nnx.Module`` (or a BatchNorm itself).
        num_groups: the most groups per layer, ≥ 1 (default 32, Wu & He 2018's default). On a
            (batch, features) input a group of ONE feature normalises to 0: use fewer groups
            there (``num_groups=1`` is LayerNorm over the features).

    Returns:
        ``model`` itself with its BatchNorms replaced (a new GroupNorm when ``model`` is a
        BatchNorm). Re-split it (``nnx_loss`` / ``nnx.split``) after the fix.

    Raises:
        ValueError: ``model`` not an ``nnx.Module``, ``num_groups`` < 1, or a BatchNorm over an
            axis other than the last.

    Example:
        >>> from flax import nnx
        >>> model = nnx.Sequential(nnx.Linear(3, 8, rngs=nnx.Rngs(0)),
        ...                        nnx.BatchNorm(8, rngs=nnx.Rngs(0)))
        >>> model = replace_batch_norm(model, num_groups=4)
        >>> type(model.layers[1]).__name__, model.layers[1].num_groups
        ('GroupNorm', 4)
    """
    from flax import nnx

    if not isinstance(model, nnx.Module):
        _validate.fail("model", type(model).__name__, "an nnx.Module")
    num_groups = _validate.positive_int("num_groups", num_groups)
    rngs = nnx.Rngs(0)  # GroupNorm's initialisers (ones, zeros) draw nothing
    if isinstance(model, nnx.BatchNorm):
        return _group_norm(model, num_groups, rngs)
    # id(BatchNorm) -> (BatchNorm, GroupNorm): a shared BatchNorm gets ONE GroupNorm (the
    # BatchNorm is kept referenced so that its id is not reused while we walk)
    replaced: dict[int, tuple[Any, Any]] = {}
    while True:  # one path per node each pass: repeat until a shared BatchNorm is gone everywhere
        paths = [p for p, n in nnx.iter_graph(model) if isinstance(n, nnx.BatchNorm) and p]
        if not paths:
            return model
        for path in paths:
            parent = model
            for key in path[:-1]:
                parent = _child(parent, key)
            old = _child(parent, path[-1])
            if id(old) not in replaced:
                replaced[id(old)] = (old, _group_norm(old, num_groups, rngs))
            _set_child(parent, path[-1], replaced[id(old)][1])
