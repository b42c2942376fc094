r"""Noise and normalisation as optax GradientTransformations (applied to a clipped SUM).

The privatised update of DP-SGD is built in three visible steps:

1. :func:`add_gaussian_noise` — the clipped sum (from :func:`dpjax.clipped_grad`) plus
   N(0, stddev²) per coordinate; stddev = σ · sensitivity.
2. :func:`normalize_by` — division by a PUBLIC constant (the expected batch size), never the
   realised batch size, so normalisation leaks nothing (post-processing).
3. any optax optimizer (post-processing again).

:func:`add_laplace_dp_sgd_noise` is the Laplace-noise batch-1
DP-SGD. Every transform that draws noise REQUIRES a key (no default),
keeps its raw key data in its state (checkpointable, see :class:`NoiseState`), splits it on every
update and per leaf (through :mod:`dpjax._noise`), and draws from the 64-bit samplers of
:mod:`dpjax._random` in at least float32 (support ±9.155σ, δ floor
:func:`dpjax.accounting.noise_truncation_delta`; float noise remains porous, Mironov 2012).

Checkpoint and resume: ``flax.serialization.to_bytes(opt_state)`` (or orbax) saves the key data
and count; ``from_bytes(tx.init(params), blob)`` restores a state whose next update continues the
noise stream bit for bit. Re-initialising with the original key instead replays noise already
released.

Per-example gradients are refused: ``update`` checks that the updates are shaped like the
params, and (since a row of per-example gradients under ``jax.vmap`` IS shaped like them) that
no ``jax.vmap`` batches the updates without batching the noise state: one unbatched key would
add ONE noise draw to every row (:mod:`dpjax.dp_sgd._vmap_guard`; a vmap over independent runs
batches the states, with distinct keys, and is unchanged).

Secret and public: a :class:`NoiseState` holds the key data from which every later noise draw is
derived, so an optimizer state holding one is a SECRET checkpoint (given the key, one later
model reveals a noise-free clipped sum). Publish :func:`public_opt_state` ``(opt_state)``
instead: the same tree with every noise state replaced by its count (:class:`PublicNoiseState`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dpjax import _noise, _random, _validate
from dpjax.dp_sgd import _vmap_guard
from dpjax.dp_sgd._finite_sums import refuse_concrete_nonfinite_sums
from dpjax.mechanisms._scale import GAUSSIAN_SUPPORT

__all__ = [
    "NoiseState",
    "PublicNoiseState",
    "public_opt_state",
    "add_gaussian_noise",
    "normalize_by",
    "add_laplace_dp_sgd_noise",
    "laplace_dp_sgd_theta",
    "laplace_dpsgd_step_size",
]


class NoiseState(NamedTuple):
    """State of a noise transform: the raw PRNG key data (split every update) and the count.

    ``key`` holds ``jax.random.key_data(key)`` (uint32), not a typed key, so that the state is a
    plain array pytree: ``flax.serialization.to_bytes`` / orbax can checkpoint it, and a
    restored state CONTINUES the noise stream (the transform wraps it back with the key's
    implementation on every update). Never re-create the transform with the old seed to resume:
    that replays noise already released.

    The key data is SECRET: it determines every later noise draw. Publish
    :func:`public_opt_state` of an optimizer state, never the state itself.
    """

    key: jax.Array
    count: jax.Array


class PublicNoiseState(NamedTuple):
    """What may be published of a :class:`NoiseState`: the number of noisy releases only."""

    count: jax.Array


_KEY_FIELD_HINTS = ("key", "rng", "seed")
#: State fields that hold a running sum of updates between releases: ``accumulate_clipped_sums``'
#: ``clipped_sum`` (and its double-float low part ``clipped_sum_low``), ``optax.MultiSteps``'
#: ``acc_grads``, ``optax.apply_every``'s ``grad_acc``.
#: Placed before a noise transform they hold the NOT yet noised sum; after it, only noisy
#: updates (dropping those is harmless), so they are never published.
_RUNNING_SUM_FIELDS = ("clipped_sum", "clipped_sum_low", "acc_grads", "grad_acc")


def _is_noise_state(x: Any) -> bool:
    """A :class:`NoiseState`, or a state class that declares itself one (class attribute
    ``dpjax_secret_noise_state``, e.g. the correlated noise's state, whose past-noise buffers
    are secret too): published as its count only."""
    return isinstance(x, NoiseState) or getattr(type(x), "dpjax_secret_noise_state", False)


def _field_names(path: Any) -> list[str]:
    """The NamedTuple/dataclass field names along a pytree path (``GetAttrKey.name``)."""
    return [str(k.name).lower() for k in path if isinstance(k, jax.tree_util.GetAttrKey)]


#: Dict keys of a state restored as a plain dict (``flax.serialization.msgpack_restore`` /
#: ``to_state_dict``): a running sum, ``optax.add_noise``'s key, or a noise state's ``key``
#: (recognised by its sibling ``count``, so a model's attention ``key`` layer is not).
_SECRET_DICT_KEYS = ("rng_key",) + _RUNNING_SUM_FIELDS


def _secret_dict_entry(path: Any, children: dict) -> bool:
    for i, k in enumerate(path):
        if not isinstance(k, jax.tree_util.DictKey):
            continue
        name = str(k.key).lower()
        if name in _SECRET_DICT_KEYS or (name == "key" and "count" in children[path[:i]]):
            return True
    return False


def _is_checkable_leaf(leaf: Any) -> bool:
    """An array or a number: a leaf whose content is what it shows (an unregistered object
    may hold a key inside, out of the tree's reach)."""
    return hasattr(leaf, "dtype") or isinstance(leaf, (bool, int, float, complex))


def _refuse_other_keys(tree: Any) -> None:
    """Refuse, in a tree meant for publication: PRNG key leaves, key-named state fields (e.g.
    ``optax.add_noise``'s ``rng_key``), a noise state or a running sum restored as a plain
    dict, and leaves that are not arrays or numbers."""
    leaves = jax.tree_util.tree_leaves_with_path(tree)
    children: dict = {}
    for path, _ in leaves:
        for i, k in enumerate(path):
            if isinstance(k, jax.tree_util.DictKey):
                children.setdefault(path[:i], set()).add(str(k.key).lower())
    for path, leaf in leaves:
        named = _field_names(path)
        is_key = hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key)
        if is_key or any(h in n for n in named for h in _KEY_FIELD_HINTS):
            _validate.fail(
                "opt_state",
                f"a state holding key data at {jax.tree_util.keystr(path)}",
                "an optimizer state whose only randomness is dpjax's noise state (another "
                "transform's key, e.g. optax.add_noise, would be published with it)",
            )
        if _secret_dict_entry(path, children) or not _is_checkable_leaf(leaf):
            _validate.fail(
                "opt_state",
                f"a state holding {type(leaf).__name__} at {jax.tree_util.keystr(path)}",
                "an optimizer state as tx.init builds it (restore a checkpoint into "
                "tx.init(params) first: a noise key or a running sum restored as a plain dict, "
                "or an object the tree does not enter, cannot be published safely)",
            )


def _holds_a_running_sum(x: Any) -> bool:
    """A state carrying a running sum of updates (gradient accumulation; see
    ``_RUNNING_SUM_FIELDS``)."""
    fields = getattr(x, "_fields", ()) if isinstance(x, tuple) else ()
    return any(f in fields for f in _RUNNING_SUM_FIELDS)


def _is_secret_node(x: Any) -> bool:
    return _is_noise_state(x) or _holds_a_running_sum(x)


def _publishable(x: Any) -> Any:
    if _is_noise_state(x):
        return PublicNoiseState(count=x.count)
    if _holds_a_running_sum(x):  # drop the partial sum, publish what is inside
        sums = {f: None for f in x._fields if f in _RUNNING_SUM_FIELDS}
        rest = {f: getattr(x, f) for f in x._fields if f not in sums}
        rest = {f: jax.tree.map(_publishable, v, is_leaf=_is_secret_node) for f, v in rest.items()}
        return x._replace(**sums, **rest)
    return x


def public_opt_state(opt_state: Any) -> Any:
    """The publishable form of an optimizer state: every :class:`NoiseState` → its count.

    The optimizer's moments (Adam's μ, ν, …) and step counts are post-processing of the
    noisy sums and stay; the noise key data, from which every later noise draw is derived,
    is removed (:class:`PublicNoiseState` keeps the count, so
    :func:`dpjax.dp_sgd.noise_releases` still reads T), and so is the running clipped sum of
    :func:`dpjax.dp_sgd.accumulate_clipped_sums` (``clipped_sum=None``: between releases it
    is the NOT yet noised sum of the micro-batches seen), and likewise ``optax.MultiSteps``'
    ``acc_grads`` and ``optax.apply_every``'s ``grad_acc`` (un-noised when they accumulate
    before a noise transform).

    Args:
        opt_state: the state of a :func:`dpjax.dp_sgd_optimizer` (or of any chain holding
            dpjax noise transforms).

    Returns:
        The same tree with no key data.

    Raises:
        ValueError: the state holds other PRNG key data (a typed key leaf, or a state field
            named like a key, e.g. ``optax.add_noise``'s ``rng_key``, or a noise state
            restored as a plain dict by ``flax.serialization.msgpack_restore``), a running
            sum outside its NamedTuple state, or a leaf that is not an array or a number.

    Formal guarantees:
        The result is a function of the released noisy sums and public constants only (the
        optimizer is post-processing, Dwork–Roth 2014, Proposition 2.1), so the DP-SGD
        guarantee covers it; the removed key data is not covered and stays secret.

    Example:
        >>> import jax, jax.numpy as jnp, optax, dpjax
        >>> tx = dpjax.dp_sgd_optimizer(optimizer=optax.adam(0.1), noise_multiplier=1.0,
        ...     l2_clip_norm=1.0, normalizer=10.0, key=jax.random.key(0))
        >>> public = public_opt_state(tx.init(jnp.zeros(3)))
        >>> public[0]
        PublicNoiseState(count=Array(0, dtype=int32))
    """
    public = jax.tree.map(_publishable, opt_state, is_leaf=_is_secret_node)
    _refuse_other_keys(public)
    return public


def rekeyed_noise_states(opt_state: Any, key: jax.Array) -> Any:
    """``opt_state`` with the key data of its i-th noise state replaced by that of
    ``fold_in(key, i)`` (counts, moments and past-noise buffers kept): every later noise draw
    comes from ``key``, none from the old streams.

    Raises:
        ValueError: a noise state whose key data is not shaped like ``key``'s (another PRNG
            implementation).
    """
    found = [x for x in jax.tree.leaves(opt_state, is_leaf=_is_noise_state) if _is_noise_state(x)]
    fresh = iter(range(len(found)))
    like = jax.random.key_data(key)

    def rekey(x: Any) -> Any:
        if not _is_noise_state(x):
            return x
        if jnp.shape(x.key) != like.shape:
            _validate.fail(
                "key",
                f"a key whose data has shape {like.shape}",
                f"a key of the run's PRNG implementation (key data shape {jnp.shape(x.key)})",
            )
        data = jax.random.key_data(jax.random.fold_in(key, next(fresh)))
        return x._replace(key=jnp.asarray(data, jnp.uint32))

    return jax.tree.map(rekey, opt_state, is_leaf=_is_noise_state)


def _check_key(key: Any) -> jax.Array:
    """A JAX PRNG key is required: no default, no int seeds (they invite reuse across runs)."""
    if key is None:
        raise TypeError("key is required: pass key=jax.random.key(<seed>) (no default key)")
    if not isinstance(key, jax.Array):
        raise TypeError(f"key must be a JAX PRNG key (jax.random.key(seed)); got {key!r}")
    is_typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
    if not (is_typed or (key.dtype == jnp.uint32 and key.shape == (2,))):
        raise TypeError(f"key must be a JAX PRNG key; got an array of {key.dtype}{key.shape}")
    return key


def _leaf_shapes(tree: Any) -> tuple[tuple[int, ...], ...]:
    """The shapes of the leaves, in order (the container types are not compared: a dict and a
    FrozenDict of the same arrays match; a leading per-example axis never does)."""
    return tuple(tuple(jnp.shape(leaf)) for leaf in jax.tree.leaves(tree))


def _check_update_shapes(updates: Any, params: Any) -> None:
    """Updates must be shaped like params: a SUM, not per-example gradients (B, ...)."""
    shapes_u = jax.tree.map(jnp.shape, updates)
    shapes_p = jax.tree.map(jnp.shape, params)
    if shapes_u != shapes_p:
        _validate.fail(
            "updates",
            f"a tree of shapes {shapes_u}",
            f"shaped like params {shapes_p} (the clipped SUM from dpjax.clipped_grad, "
            "not per-example gradients)",
        )


class _ParamShapes:
    """The shapes of the params a noise transform was initialised with (host-side record).

    ``update(updates, state)`` with ``params`` omitted is checked against them, so per-example
    gradients (a leading batch axis) are refused even then (without
    ``params`` the check was skipped and unclipped rows were released with noise). With no
    ``init`` in this process and no ``params``, the update is refused: there is nothing to
    check it against.
    """

    def __init__(self) -> None:
        self._seen: list[Any] = []

    def record(self, params: Any) -> None:
        if params is None:
            return
        shapes = _leaf_shapes(params)
        if shapes not in self._seen:
            self._seen.append(shapes)

    def check(self, updates: Any, params: Any) -> None:
        if params is not None:
            _check_update_shapes(updates, params)
            return
        if not self._seen:
            _validate.fail(
                "params",
                None,
                "the params (tx.update(updates, state, params)), or a tx.init(params) of this "
                "transform in this process: without them nothing shows that updates is the "
                "clipped SUM and not per-example gradients",
            )
        shapes = _leaf_shapes(updates)
        if shapes not in self._seen:
            _validate.fail(
                "updates",
                f"a tree of shapes {list(shapes)}",
                "shaped like the params given to tx.init (the clipped SUM from "
                "dpjax.clipped_grad, not per-example gradients)",
            )


def _normal(key: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.Array:
    return _random.normal(key, shape, dtype)


def _laplace(key: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.Array:
    return _random.laplace(key, shape, dtype)


def _key_impl(key: jax.Array) -> Any:
    """The PRNG implementation of ``key`` (a raw uint32[2] key is the default threefry)."""
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return jax.random.key_impl(key)
    return None


def _fusion_barrier(updates: Any) -> Any:
    """``updates`` unchanged, behind ``jax.lax.optimization_barrier`` (speed only).

    Keeps XLA from fusing the end of the clipped sum with the noise draw and the addition
    (measured for the MLP 784-512-512-10 at batch 1024 with ``jax.random.normal``,
    18.5 ms per jitted DP step without it and 11.3 ms with it; ``python -m benchmarks``
    times the step with and without it as ``dpjax`` / ``dpjax_nobarrier``). It changes no
    value: the same key gives bit-identical noisy sums (tests/dp_sgd/test_noise_transforms.py).
    """
    return jax.lax.optimization_barrier(updates)


def _init_noise_state(key: jax.Array) -> NoiseState:
    data = key if key.dtype == jnp.uint32 else jax.random.key_data(key)
    return NoiseState(key=jnp.array(data, jnp.uint32), count=jnp.zeros([], jnp.int32))


def _next_keys(state: NoiseState, impl: Any) -> tuple[jax.Array, jax.Array]:
    """(next key data for the state, this update's noise key) from the stored key data."""
    key = jax.random.wrap_key_data(state.key, impl=impl)
    next_key, noise_key = jax.random.split(key)
    return jax.random.key_data(next_key), noise_key


def _checked_next_keys(updates: Any, state: Any, impl: Any) -> tuple[jax.Array, jax.Array, Any]:
    """:func:`_next_keys` of ``state`` after the vmap check of :mod:`._vmap_guard`, and a
    function that voids (NaN) the noisy updates of a vmapped batch with repeated keys.

    Raises:
        ValueError: ``updates`` batched by a ``jax.vmap`` that the noise key is not (e.g.
            ``jax.vmap(tx.update, in_axes=(0, None, None))`` over per-example gradients: one
            noise draw would be added to every row), or, eagerly, batched together with keys
            that repeat.
    """
    key_data, ok = _vmap_guard.guard_key(updates, state.key)
    next_key, noise_key = _next_keys(NoiseState(key_data, state.count), impl)

    def release(noisy: Any) -> Any:
        if _validate.is_concrete(ok):  # no vmap, no jit: nothing to void (no sync either)
            return noisy
        return _vmap_guard.void_unless(ok, noisy)

    return next_key, noise_key, release


def add_gaussian_noise(stddev: float, *, key: jax.Array) -> optax.GradientTransformation:
    r"""Add N(0, stddev²) independently to every coordinate of every leaf.

    .. math::  u \mapsto u + \text{stddev} \cdot Z, \quad Z \sim N(0, I).

    Apply it to the clipped SUM (shape of params): with stddev = σ · Δ₂ (Δ₂ =
    ``grad_fn.sensitivity(relation)``) each update is the Gaussian mechanism with noise
    multiplier σ.

    Args:
        stddev: absolute noise standard deviation ≥ 0 (0 = no privacy, for debugging).
        key: a JAX PRNG key (``jax.random.key(seed)``); required, copied into the state and
            split on every update. Within an update all leaves of one noise dtype get disjoint
            slices of ONE i.i.d. N(0, 1) draw from :func:`dpjax._random.normal` (in at least
            float32; the sum is cast back to the leaf's dtype), through
            ``dpjax._noise.tree_iid_noise_like``: independent across leaves and steps, and ~4×
            faster to compile than one draw per leaf.

    Returns:
        An ``optax.GradientTransformation`` with state :class:`NoiseState`.

    Raises:
        TypeError: no key / not a key. ValueError: negative or non-finite stddev; at
            ``update``: a leaf whose dtype cannot hold the noise (9.2·stddev, an upper bound of
            the sampler's support, ≥ its largest value: float16 with stddev ≥ 7120; pass
            float32 sums), updates not shaped like
            ``params`` (with ``params`` omitted: like the
            params given to ``init`` in this process; omitted with no ``init``: refused), or
            updates batched by a ``jax.vmap`` that the state is not batched by (per-example
            gradients under ``vmap(tx.update, in_axes=(0, None, None))``; a vmap over runs
            batches the state too, with distinct keys: repeated keys raise eagerly and give
            NaN updates under ``jit``); eagerly, updates with a NaN/inf entry (named
            ``updates``: NaN + noise would reveal the record behind it). Under ``jit`` that is
            not checked here (feed ``dpjax.clipped_grad`` sums, finite by construction, or use
            ``dp_sgd_optimizer(l2_clip_norm=C)``, which also refuses them under ``jit``).

    Formal guarantees:
        With stddev = σ·Δ₂, one update is the Gaussian mechanism on a query of ℓ2 sensitivity Δ₂
        (Dwork & Roth 2014, Theorem A.1;
        exact profile Balle–Wang 2018); T updates compose adaptively and are accounted by
        :mod:`dpjax.accounting`. The sampler's support ends at ±9.155·stddev: the δ floor this
        adds is :func:`dpjax.accounting.noise_truncation_delta` (below 1e-12 per release at
        σ ≥ 0.5 for models of up to 1.8·10⁷ coordinates; it grows as d·2⁻⁶⁴ beyond). Float
        outputs remain porous (Mironov 2012): the guarantee is for the
        real-valued mechanism; releases of real data need OS-seeded keys and non-porous noise
        (:func:`dpjax.mechanisms.discrete_laplace`).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> tx = add_gaussian_noise(1.0, key=jax.random.key(0))
        >>> state = tx.init(jnp.zeros(3))
        >>> noisy, state = tx.update(jnp.zeros(3), state)
        >>> noisy.shape, int(state.count)
        ((3,), 1)
    """
    init_fn, add_noise = _gaussian_noise_fns(stddev, key)

    def update_fn(updates: Any, state: NoiseState, params: Any = None):
        return add_noise(updates, state, params, stddev)

    return optax.GradientTransformation(init_fn, update_fn)


def _gaussian_noise_fns(stddev: float, key: jax.Array):
    """``(init_fn, add_noise)`` shared by :func:`add_gaussian_noise` and its runtime-std twin.

    ``add_noise(updates, state, params, scale)`` draws the noise at ``scale``: ``stddev``
    itself, or a traced value the caller guarantees equal to it. Every host-side check uses
    ``stddev`` (concrete), so both transforms refuse exactly the same inputs.
    """
    _validate.non_negative("stddev", stddev)
    key = _check_key(key)
    impl = _key_impl(key)
    shapes = _ParamShapes()

    def init_fn(params: Any) -> NoiseState:
        shapes.record(params)
        return _init_noise_state(key)

    def add_noise(updates: Any, state: NoiseState, params: Any, scale: Any):
        shapes.check(updates, params)
        refuse_concrete_nonfinite_sums(updates)
        _refuse_noise_beyond_dtype(updates, stddev)
        next_key, noise_key, release = _checked_next_keys(updates, state, impl)
        noisy = _noise.tree_add_iid_noise(noise_key, _fusion_barrier(updates), _normal, scale)
        return release(noisy), NoiseState(key=next_key, count=optax.safe_increment(state.count))

    return init_fn, add_noise


def _gaussian_noise_at_runtime_stddev(
    stddev: float, *, key: jax.Array
) -> optax.GradientTransformationExtraArgs:
    """:func:`add_gaussian_noise` whose std reaches the compiled update as an ARGUMENT.

    For :class:`~dpjax.dp_sgd.PrivateTraining` only (private): ``update(updates, state,
    params, noise_stddev=s)`` adds ``s·Z``, where ``s`` is a traced scalar that the caller
    passes at every update. The host-side checks (non-negative, non-vanishing, a dtype that
    holds 9.2·stddev) use ``stddev``, the value the caller must pass as ``s``:
    ``PrivateTraining.step`` passes its own σ·C (the σ its ledger records), never a
    user-supplied value, rounded UP to float32 when x64 is off (a traced scale already in the
    noise dtype is used as is). Same key: bit-identical to :func:`add_gaussian_noise` (the
    scale is rounded up to the noise dtype before the product in both), but one compiled
    step serves every σ of the same shapes (the persistent compilation cache can reuse it
    across ε).
    """
    init_fn, add_noise = _gaussian_noise_fns(stddev, key)

    def update_fn(updates: Any, state: NoiseState, params: Any = None, *, noise_stddev: Any,
                  **extra_args: Any):  # fmt: skip
        del extra_args
        return add_noise(updates, state, params, noise_stddev)

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def _refuse_noise_beyond_dtype(updates: Any, stddev: float) -> None:
    """Refuse a std the updates' dtypes cannot hold: too large for the leaf (e.g. float16 with
    σ·C ≥ 7120) or too small for the noise dtype (a subnormal std is flushed to 0).

    The noise is drawn and added in float32 and the noisy sum cast back to each leaf's dtype;
    a leaf of float16 (largest value 65504) would turn every draw beyond its range into ±inf
    (checked on the dtype, so also under ``jit``). A nonzero std below the noise dtype's
    smallest normal number would release almost no noise
    (:func:`dpjax._noise.check_scale_representable`).
    """
    for leaf in jax.tree.leaves(updates):
        _noise.check_scale_representable(stddev, _noise.noise_dtype_of(leaf))
        dtype = _noise.float_dtype_of(leaf)
        top = float(jnp.finfo(dtype).max)
        if GAUSSIAN_SUPPORT * stddev >= top:
            _validate.fail(
                "stddev",
                stddev,
                f"below {top / GAUSSIAN_SUPPORT:.6g} for {jnp.dtype(dtype).name} updates "
                f"(noise up to {GAUSSIAN_SUPPORT}·stddev is added in float32 and cast back to the "
                f"update's dtype, whose largest value is {top:.6g}: it would become inf); pass "
                "the clipped sum in float32 (clipped_grad returns float32 sums for "
                "float16/bfloat16 parameters) and let optax.apply_updates cast the update once",
            )


def normalize_by(constant: float) -> optax.GradientTransformation:
    """Divide updates by a PUBLIC constant (e.g. the expected batch size q·n).

    The division is done in at least float32 and the quotient cast once to the update's
    dtype: a float16 update divided by a constant beyond 65504 (float16's largest value) is
    not divided by inf.

    Args:
        constant: a data-independent positive number. Never pass the realised batch size of a
            Poisson batch: it depends on the data and breaks the accounting (opacus#571).

    Returns:
        A stateless ``optax.GradientTransformation``.

    Formal guarantees:
        Post-processing of the noised sum (Dwork–Roth 2014, Proposition 2.1): privacy is
        unchanged.

    Example:
        >>> import jax.numpy as jnp
        >>> tx = normalize_by(4.0)
        >>> float(tx.update(jnp.array([8.0]), tx.init(None))[0][0])
        2.0
    """
    _validate.positive("constant", constant)

    def scale(u: Any) -> jax.Array:  # in at least float32, cast once to the update's dtype
        wide = _noise.noise_dtype_of(u)
        quotient = jnp.asarray(u, wide) / jnp.asarray(constant, wide)
        return quotient.astype(_noise.float_dtype_of(u))

    def update_fn(updates: Any, state: optax.EmptyState, params: Any = None):
        del params
        return jax.tree.map(scale, updates), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)


# ----------------------------------------------------------------------------- Laplace DP-SGD


def laplace_dpsgd_step_size(h: Any, rho: float) -> Any:
    """γ_{h-1} = h^(-ρ): the step size used by iteration h = 1, 2, … (γ_j = (1+j)^(-ρ))."""
    return h ** (-rho)


def laplace_dp_sgd_theta(
    h: Any, *, l1_sensitivity: float, epsilon: float, rho: float, kappa: float
):
    r"""Noise scale θ_h of iteration h ≥ 1 (the Laplace batch-1 DP-SGD's schedule).

    .. math::  \theta_h = \frac{1}{a_h}\Big\{\frac{\sum_{j=0}^{h-2}\gamma_j}{\gamma_{h-1}}
       + 1\Big\} \frac{\Delta_1}{\varepsilon}, \quad a_h = h^\kappa, \ \gamma_j = (1+j)^{-\rho}

    (θ_1 = Δ₁/ε). Works on NumPy or JAX arrays ``h`` (float).

    Args:
        h: iteration index (1-based).
        l1_sensitivity: Δ₁ = Δ(∇L), the ℓ1 sensitivity of the (batch-1) gradient.
        epsilon: ε > 0, the base budget of the privacy theorem.
        rho: step-size exponent ρ ∈ (0, 1).
        kappa: privacy-weight exponent κ ≥ 0 (a_h = h^κ).

    Returns:
        θ_h, same shape as ``h``.
    """
    xp = jnp if isinstance(h, jax.Array) else np
    h = xp.asarray(h)
    # Σ_{j=0}^{h-2} (1+j)^{-ρ} = Σ_{k=1}^{h-1} k^{-ρ}: the generalised harmonic number H_{h-1}^{(ρ)}
    past = _harmonic(h - 1, rho, xp)
    ratio = past / laplace_dpsgd_step_size(h, rho) + 1.0
    return ratio / h**kappa * (l1_sensitivity / epsilon)


def _harmonic(m: Any, rho: float, xp: Any) -> Any:
    """Σ_{k=1}^{m} k^{-ρ} for integer-valued m ≥ 0 (exact sum; m up to ~1e6 in NumPy)."""
    if xp is np:
        m = np.asarray(m)
        top = int(np.max(m)) if m.size else 0
        cums = np.concatenate([[0.0], np.cumsum(np.arange(1, top + 1, dtype=np.float64) ** -rho)])
        return cums[m.astype(np.int64)]
    # JAX (traced h): jax.scipy.special.zeta needs s > 1 (here s = ρ < 1), so use
    # the Euler–Maclaurin expansion, accurate to ~1e-10 relative in float64.
    return _harmonic_em(m, rho, xp)


def _harmonic_em(m: Any, rho: float, xp: Any) -> Any:
    """Euler–Maclaurin: Σ_{k=1}^m k^{-ρ} with the first 16 terms summed exactly."""
    m = xp.asarray(m)
    head_n = 16
    k = xp.arange(1, head_n + 1, dtype=m.dtype)
    head = xp.sum(xp.where(k <= m[..., None], k ** (-rho), 0.0), axis=-1)
    a = xp.asarray(head_n, m.dtype)
    b = xp.maximum(m, a)

    def integral(x):
        return x ** (1.0 - rho) / (1.0 - rho)

    tail = (
        integral(b)
        - integral(a)
        + 0.5 * (b ** (-rho) - a ** (-rho))
        - rho / 12.0 * (b ** (-rho - 1.0) - a ** (-rho - 1.0))
        + rho * (rho + 1.0) * (rho + 2.0) / 720.0 * (b ** (-rho - 3.0) - a ** (-rho - 3.0))
    )
    return xp.where(m > head_n, head + tail, head)


def _theta_on_host(h: np.ndarray, dtype: Any, theta_kw: dict) -> np.ndarray:
    """θ_h in float64 (the exact sum :func:`laplace_dp_sgd_event` uses), rounded UP to ``dtype``."""
    exact = laplace_dp_sgd_theta(np.asarray(h, np.int64), **theta_kw).astype(np.float64)
    rounded = exact.astype(dtype)
    too_small = rounded.astype(np.float64) < exact
    return np.where(too_small, np.nextafter(rounded, np.asarray(np.inf, dtype)), rounded)


def _theta_rounded_up(h: jax.Array, dtype: Any, theta_kw: dict) -> jax.Array:
    """θ_h computed on the host in float64 and rounded up to ``dtype`` (never below exact).

    The noise drawn is then never smaller than the float64 θ_h the privacy event accounts
    (a float32 θ_h computed on device was up to 6.9e-7 relative too small).
    """
    dtype = np.dtype(dtype)
    return jax.pure_callback(
        lambda hh: _theta_on_host(hh, dtype, theta_kw).astype(dtype),
        jax.ShapeDtypeStruct(jnp.shape(h), dtype),
        h,
        vmap_method="broadcast_all",
    )


def add_laplace_dp_sgd_noise(
    *, l1_sensitivity: float, epsilon: float, rho: float, kappa: float, key: jax.Array
) -> optax.GradientTransformation:
    r"""Add θ_h · Laplace(0, 1) noise at iteration h (Laplace batch-1 DP-SGD).

    Implements the noise of  β^{(h)} = β^{(h-1)} − γ_{h-1}(∇L_{Ω_h}(β^{(h-1)}) + θ_h Z_h)  with
    :func:`laplace_dp_sgd_theta`; chain it with ``optax.scale_by_schedule`` of −γ (see
    :func:`dpjax.laplace_dp_sgd_optimizer`, which also builds the privacy event).

    Args:
        l1_sensitivity: Δ₁, ℓ1 sensitivity of the released gradient under replace-one (for a
            batch-1 gradient clipped to ℓ2 norm C in dimension d: Δ₁ ≤ 2C√d).
        epsilon: ε > 0 of the privacy theorem.
        rho: step-size exponent ρ ∈ (0, 1), γ_j = (1+j)^{-ρ}.
        kappa: privacy-weight exponent κ ≥ 0, a_h = h^κ; the utility term vanishes iff
            2κ + ρ > 2 (the utility theorem discussion).
        key: required JAX PRNG key.

    Returns:
        An ``optax.GradientTransformation`` with state :class:`NoiseState`.

    Raises:
        ValueError: at ``update``, updates not shaped like ``params`` (with ``params``
            omitted: like the params given to ``init``; omitted with no ``init``: refused),
            or batched by a ``jax.vmap`` that the state is not batched by, or (eagerly) with
            a NaN/inf entry (see :func:`add_gaussian_noise`).

    Formal guarantees:
        Per step, the noisy gradient is the Laplace mechanism with b = θ_h on a query of ℓ1
        sensitivity Δ₁, hence (Δ₁/θ_h, 0)-DP (replace-one; Dwork–Roth 2014, Theorem 3.6), and T
        steps are (Σ_h Δ₁/θ_h, 0)-DP by basic composition — the rigorous statement recorded by
        :func:`dpjax.laplace_dp_sgd_event`. The stated analysis additionally claims that the
        h-th iterate alone is ε·a_h-DP (its proof bounds the iterate's sensitivity by
        Σ_{j<h} γ_j Δ₁ and treats earlier steps as fixed).
    """
    _validate.positive("l1_sensitivity", l1_sensitivity)
    _validate.epsilon("epsilon", epsilon)
    _validate.in_range("rho", rho, 0.0, 1.0, low_inclusive=False)
    _validate.non_negative("kappa", kappa)
    key = _check_key(key)
    impl = _key_impl(key)
    shapes = _ParamShapes()
    theta_kw = dict(l1_sensitivity=l1_sensitivity, epsilon=epsilon, rho=rho, kappa=kappa)

    def init_fn(params: Any) -> NoiseState:
        shapes.record(params)
        return _init_noise_state(key)

    def update_fn(updates: Any, state: NoiseState, params: Any = None):
        shapes.check(updates, params)
        refuse_concrete_nonfinite_sums(updates)
        # rounded up in the NARROWEST noise dtype of the tree: that value is exact in every
        # wider one, so no leaf's cast can round θ below the accounted float64 value
        dtypes = [np.dtype(_noise.noise_dtype_of(u)) for u in jax.tree.leaves(updates)]
        theta = _theta_rounded_up(state.count + 1, min(dtypes, key=lambda d: d.itemsize), theta_kw)
        next_key, noise_key, release = _checked_next_keys(updates, state, impl)
        noisy = _noise.tree_add_iid_noise(noise_key, _fusion_barrier(updates), _laplace, theta)
        return release(noisy), NoiseState(key=next_key, count=optax.safe_increment(state.count))

    return optax.GradientTransformation(init_fn, update_fn)
