r"""User-level DP-SGD: neighbouring data sets differ in ALL the examples of one user.

Example-level DP-SGD protects one record; a user who wrote 50 of the records is protected
only by group privacy, whose bound grows like k·ε and k·e^{(k−1)ε}·δ (Dwork & Roth 2014,
"The algorithmic foundations of differential privacy", Theorem 2.2). Here the unit of privacy
is the user (McMahan, Ramage, Talwar, Zhang 2018, "Learning differentially private recurrent
language models", DP-FedSGD; jax_privacy's user-level sampling):

    users Poisson-sampled at rate q = b/U  ->  each sampled user's examples (at most k):
    per-example gradients, each clipped to C, averaged over the user's examples  ->
    that aggregate re-clipped to f·C (certified in floating point)  ->  summed over users
    (fixed-order double-float tree, one rounding)  ->  N(0, (σC)²) once  ->  ÷ q·U  ->  optimizer

Why the mean of per-example clipped gradients (and not the clipped sum of raw gradients): it is
McMahan et al.'s and jax_privacy's per-user aggregate; each example's weight in its user's
vector is bounded (one exploding or NaN example cannot take over the user's direction, as it
does in the clipped sum of raw gradients); and a user with many examples gets the same
influence as one with a few, which is what the user-level bound allows anyway. The mean of
vectors of norm ≤ C has norm ≤ C; the second clip (to f·C, with a certified upper bound of
the norm of the aggregate AS STORED) only absorbs the rounding, so in floating point the
per-user bound holds exactly as the per-example bound of :func:`~dpjax.dp_sgd.clipped_grad`.

Grouping. ``user_ids`` (one integer per example) is PUBLIC metadata: which user wrote which row,
how many users there are and how many rows each has (up to the cap) are not protected — only
the content of the rows is, user by user. :func:`group_users` builds, once on the host, a
padded ``[U, k]`` table of row indices (users in increasing id order); a user with m > k rows
keeps the k rows at positions ⌊i·m/k⌋ (i < k) of its rows in data order (deterministic, spread
over the user's rows; the others are never used), so every shape is static.

Formal guarantees:
    Adding or removing ALL the rows of one user moves the released float sum of a step by at
    most C (certified in floating point, the rounding of the sum over users included), so a
    user-level run is the Poisson-subsampled Gaussian mechanism over users, accounted as
    ``PoissonSampledGaussianEvent(σ, q = b/U, T)`` (McMahan et al. 2018; Abadi et al. 2016);
    see :class:`UserLevelTraining`. An example-level guarantee (ε, δ) implies for a user with
    k rows only the group-privacy bound (kε, k·e^{(k−1)ε}·δ) (lecture on the properties of
    DP, group privacy; Dwork & Roth 2014, Theorem 2.2 for δ = 0): (1, 10⁻⁵) at k = 10 gives
    (10, 0.81), or (10, 0.13) with the lecture's tighter δ·(e^{kε} − 1)/(e^ε − 1).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dpjax import _validate
from dpjax.dp_sgd import _certified
from dpjax.dp_sgd.clipping import _weighted_row_sum, _zero_rows
from dpjax.dp_sgd.samplers import PaddedBatch
from dpjax.dp_sgd.training.loop import PrivateTraining

__all__ = ["UserGrouping", "UserLevelTraining", "clipped_user_sum", "group_users"]


# ----------------------------------------------------------------------------- grouping


@dataclasses.dataclass(frozen=True, eq=False)
class UserGrouping:
    """Public grouping of a data set's rows into users, padded to k rows per user.

    Built by :func:`group_users`.

    Attributes:
        table: int32 ``[U, k]`` row indices of each user's kept rows (padding slots hold 0).
        mask: bool ``[U, k]``, True for real rows.
        user_keys: the distinct user ids, in increasing order (row u of ``table``).
        dataset_size: n, the number of rows (examples) the ids were given for.
        max_examples_per_user: k, the cap.
        fingerprint: a 64-bit hash of (n, k, table, mask): the plan ledger records it.
    """

    table: np.ndarray
    mask: np.ndarray
    user_keys: np.ndarray
    dataset_size: int
    max_examples_per_user: int
    fingerprint: int

    def __post_init__(self) -> None:
        """Check the invariants the per-user sensitivity rests on, and freeze the arrays.

        Every real slot holds a row in [0, n) and no row is in two slots: a row shared by two
        users (a hand-built grouping) would move both users' vectors when one user is
        removed (sensitivity 2C, not C). The fingerprint must be that of the table (the plan
        ledger records it), and the arrays are read-only copies: a table edited after
        ``make_private`` would no longer be the grouping the ledger names.

        Raises:
            ValueError: a grouping that violates one of these (named, with the valid range).
        """
        n = _validate.positive_int("dataset_size", self.dataset_size)
        k = _validate.positive_int("max_examples_per_user", self.max_examples_per_user)
        table, mask = np.array(self.table), np.array(self.mask)
        keys = np.array(self.user_keys)
        if (
            table.ndim != 2
            or table.shape[1] != k
            or mask.shape != table.shape
            or mask.dtype != np.bool_
            or not np.issubdtype(table.dtype, np.integer)
            or keys.shape != (table.shape[0],)
            or table.shape[0] < 1
        ):
            _validate.fail(
                "grouping",
                f"table {table.dtype}{table.shape}, mask {mask.dtype}{mask.shape}, "
                f"user_keys {keys.shape}, k={k}",
                "an int table [U, k] with a bool mask [U, k] and U user keys (group_users)",
            )
        rows = table[mask]
        if rows.size and (rows.min() < 0 or rows.max() >= n):
            _validate.fail("grouping.table", "a row index outside the data", f"rows in [0, {n})")
        if np.unique(rows).size != rows.size:
            _validate.fail(
                "grouping.table",
                "a row in two user slots",
                "each row in at most one user (a shared row moves two users' vectors: "
                "sensitivity 2C); build it with group_users",
            )
        table = np.where(mask, table, 0).astype(np.int32)
        if self.fingerprint != _fingerprint(n, k, table, mask):
            _validate.fail(
                "grouping.fingerprint",
                self.fingerprint,
                "the fingerprint of its table (build the grouping with group_users)",
            )
        for name, value in (("table", table), ("mask", mask), ("user_keys", keys)):
            value.flags.writeable = False
            object.__setattr__(self, name, value)

    @property
    def num_users(self) -> int:
        """U, the number of distinct users."""
        return int(self.table.shape[0])

    @property
    def num_dropped(self) -> int:
        """Rows beyond the cap k of their user (never used)."""
        return self.dataset_size - int(self.mask.sum())

    def __repr__(self) -> str:
        return (
            f"UserGrouping(num_users={self.num_users}, dataset_size={self.dataset_size}, "
            f"max_examples_per_user={self.max_examples_per_user}, "
            f"num_dropped={self.num_dropped})"
        )


def _as_user_id_array(user_ids: Any) -> np.ndarray:
    if isinstance(user_ids, jax.core.Tracer):
        _validate.fail("user_ids", "a traced array", "a concrete host array (public metadata)")
    ids = np.asarray(user_ids)
    if ids.ndim != 1 or ids.shape[0] < 1:
        _validate.fail("user_ids", f"an array of shape {ids.shape}", "a 1-D array of length ≥ 1")
    if ids.dtype == np.bool_ or not np.issubdtype(ids.dtype, np.integer):
        _validate.fail("user_ids", f"an array of {ids.dtype}", "an array of integer user ids")
    return ids.astype(np.int64)


def group_users(user_ids: Any, *, max_examples_per_user: int | None = None) -> UserGrouping:
    """Group rows by user: a padded ``[U, k]`` table of row indices (host-side, once).

    Args:
        user_ids: int array of length n (one id per row of the data; any integers). PUBLIC.
        max_examples_per_user: k ≥ 1, the cap of rows per user; default: the largest number
            of rows of one user (nothing dropped). A user with m > k rows keeps the rows at
            positions ⌊i·m/k⌋, i < k, of its rows in data order.

    Returns:
        A :class:`UserGrouping`.

    Raises:
        ValueError: ``user_ids`` not a 1-D integer array, or a bad ``max_examples_per_user``.

    Example:
        >>> g = group_users([7, 3, 7, 7, 3, 9], max_examples_per_user=2)
        >>> g.num_users, g.table.tolist(), g.mask.tolist()
        (3, [[1, 4], [0, 2], [5, 0]], [[True, True], [True, True], [True, False]])
    """
    ids = _as_user_id_array(user_ids)
    keys, inverse, counts = np.unique(ids, return_inverse=True, return_counts=True)
    k = int(counts.max())
    if max_examples_per_user is not None:
        k = _validate.positive_int("max_examples_per_user", max_examples_per_user)
    order = np.argsort(inverse, kind="stable")  # rows grouped by user, data order kept
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    i = np.arange(k)[None, :]
    m = counts[:, None]
    pos = np.where(m <= k, i, (i * m) // k)
    mask = i < np.minimum(m, k)
    table = np.where(mask, order[starts[:, None] + np.where(mask, pos, 0)], 0).astype(np.int32)
    return UserGrouping(
        table=table,
        mask=mask,
        user_keys=keys,
        dataset_size=int(ids.shape[0]),
        max_examples_per_user=k,
        fingerprint=_fingerprint(int(ids.shape[0]), k, table, mask),
    )


def _fingerprint(n: int, k: int, table: np.ndarray, mask: np.ndarray) -> int:
    """The 64-bit fingerprint of a grouping (n, k, table, mask) that the plan ledger records."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update(np.asarray([n, k], "<i8").tobytes())
    digest.update(np.asarray(table).astype("<i4").tobytes())
    digest.update(np.asarray(mask).astype(np.uint8).tobytes())
    return int.from_bytes(digest.digest(), "little") or 1


def as_grouping(user_ids: Any, dataset_size: int) -> UserGrouping:
    """``user_ids`` (an id array or a :class:`UserGrouping`) as a grouping of ``dataset_size`` rows.

    Raises:
        ValueError: the grouping is not for ``dataset_size`` rows.
    """
    grouping = user_ids if isinstance(user_ids, UserGrouping) else group_users(user_ids)
    if grouping.dataset_size != dataset_size:
        _validate.fail(
            "user_ids",
            f"ids for {grouping.dataset_size} rows",
            f"one user id per row: length dataset_size={dataset_size}",
        )
    return grouping


# ----------------------------------------------------------------------------- the clipped sum


def user_release(users: int, clip: float, calls: int = 1) -> _certified.Release:
    """The :class:`~dpjax.dp_sgd._certified.Release` of a sum over ``users`` padded user slots
    formed in ``calls`` chunks (double-float partial sums added in sequence, one rounding)."""
    depth = _certified.tree_depth(users) + 1 + (calls if calls > 1 else 0)
    return _certified.Release(users, 1, depth + 2, float(clip))


def _user_pairs(
    example_loss: Callable,
    params: Any,
    data: Any,
    rows: jax.Array,
    row_mask: jax.Array,
    user_mask: jax.Array,
    extra: tuple[jax.Array, ...],
    *,
    l2_clip_norm: float,
    release: _certified.Release,
) -> tuple[list, tuple[jax.Array, ...]]:
    """Per-user clipped aggregates of ``rows`` ([B, k] row indices), summed over users.

    Returns:
        ``(pairs, (loss_sum, size, num_clipped, num_nonfinite))``: one double-float
        ``(hi, lo)`` per parameter leaf in ``params``' leaf order (not yet rounded) and
        monitoring counters (examples).
    """
    b, k = rows.shape
    examples = jax.tree.map(lambda x: jnp.take(x, rows.reshape(-1), axis=0), data)
    flat_extra = tuple(e.reshape((b * k,) + e.shape[2:]) for e in extra)
    in_axes = (None, 0) + (0,) * len(extra)
    losses, grads = jax.vmap(jax.value_and_grad(example_loss), in_axes=in_axes)(
        params, examples, *flat_extra
    )
    # one stored value: the norms and the sums read the same gradients
    grads = jax.lax.optimization_barrier(grads)
    wide = _certified.wide_dtype()
    leaves = jax.tree.leaves(grads)
    sum_dts = [_certified.sum_dtype(x.dtype) for x in leaves]
    out_dts = [_certified.output_dtype(x.dtype) for x in leaves]
    eta = _certified.shrink(wide, sum_dts, out_dts)
    c = float(l2_clip_norm)
    # inner clip: each example to C (certified), mean over the user's kept examples
    parts = [_certified.row_sq_norms(x, wide) for x in leaves]
    upper = _certified.combine_norms([p[1] for p in parts])
    norms = jnp.sqrt(sum((p[0] for p in parts[1:]), parts[0][0]))
    real = row_mask.reshape(-1) & jnp.repeat(user_mask, k)
    keep = real & jnp.isfinite(upper)
    kept = jnp.maximum(jnp.sum(keep.reshape(b, k), axis=1), 1).astype(wide)
    weight = _certified.certified_scale(upper, c, eta) / jnp.repeat(kept, k)
    weight = jnp.where(keep, weight, jnp.zeros((), wide)).reshape(b, k)
    leaves = jax.tree.leaves(_zero_rows(grads, keep))
    aggregates = []
    for x, sd in zip(leaves, sum_dts, strict=True):
        x = x.reshape((b, k) + x.shape[1:]).astype(sd)
        w = weight.astype(sd).reshape((b, k) + (1,) * (x.ndim - 2))
        aggregates.append(jnp.sum(x * w, axis=1))
    aggregates = jax.lax.optimization_barrier(aggregates)
    # outer clip: the aggregate AS STORED to f·C (certified; absorbs the rounding above)
    f, _ = _certified.release_shrink(release, sum_dts, out_dts)
    outer = _certified.combine_norms([_certified.row_sq_norms(a, wide)[1] for a in aggregates])
    keep_user = user_mask & jnp.isfinite(outer)
    scale = _certified.certified_scale(outer, f * c, eta)
    scale = jnp.where(keep_user, scale, jnp.zeros((), scale.dtype))
    aggregates = jax.tree.leaves(_zero_rows(aggregates, keep_user))
    pairs = _weighted_row_sum(aggregates, [scale] * len(aggregates), sum_dts)
    loss_sum = jnp.sum(jnp.where(real, losses, jnp.zeros((), losses.dtype)))
    over = jnp.isfinite(norms) & (norms > jnp.asarray(c, norms.dtype))
    stats = (
        loss_sum,
        jnp.sum(real, dtype=jnp.int32),
        jnp.sum(real & over, dtype=jnp.int32),
        jnp.sum(real & ~jnp.isfinite(upper), dtype=jnp.int32),
        jnp.zeros((), jnp.int32),  # adaptive clipping's centred count: not at user level
    )
    return pairs, stats


def _round(pairs: list, params: Any) -> Any:
    """The released sum: each leaf's double-float pair rounded ONCE to its output dtype."""
    leaves, treedef = jax.tree.flatten(params)
    outs = [_certified.output_dtype(jnp.result_type(p)) for p in leaves]
    return jax.tree.unflatten(
        treedef, [_certified.df_round(p, o) for p, o in zip(pairs, outs, strict=True)]
    )


def _check_distinct_users(users: jax.Array, mask: jax.Array, num_users: int) -> None:
    """Refuse (when concrete) a batch naming one user twice or a slot outside [0, U): a
    repeated user enters the sum twice, and removing it moves the sum by 2C, not C."""
    if not (_validate.is_concrete(users) and _validate.is_concrete(mask)):
        return
    real = np.asarray(users)[np.asarray(mask, bool)]
    if real.size and (real.min() < 0 or real.max() >= num_users):
        _validate.fail("users", "a user slot outside the grouping", f"slots in [0, {num_users})")
    if np.unique(real).size != real.size:
        _validate.fail(
            "users",
            "a batch naming one user twice",
            "distinct user slots (a repeated user is summed twice: sensitivity 2C, not C)",
        )


def clipped_user_sum(
    loss_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    data: Any,
    grouping: UserGrouping,
    users: Any,
    *,
    l2_clip_norm: float,
    user_mask: Any = None,
) -> Any:
    r"""Σ over ``users`` of each user's clipped aggregate (the noise-free user-level sum).

    .. math::  S = \sum_{u} \mathrm{clip}_{f C}\Big(\frac{1}{m_u} \sum_{j \le m_u}
       \mathrm{clip}_C(\nabla \ell(\theta; x_{u,j}))\Big),

    m_u the user's kept rows (≤ k; NaN/inf rows dropped and not counted).

    Args:
        loss_fn: ``loss_fn(params, example)``, the loss of ONE example.
        params: the parameters.
        data: the whole data set (leading axis n = ``grouping.dataset_size``).
        grouping: the :class:`UserGrouping` of ``data``'s rows.
        users: int (B,) user slots (rows of ``grouping.table``) in the batch.
        l2_clip_norm: C > 0.
        user_mask: bool (B,), False for padding slots (default: all real).

    Returns:
        The clipped sum (a pytree like ``params``, float32 at least).

    Raises:
        ValueError: ``users`` (when concrete) names a user twice among its real slots, or a
            slot outside [0, U).

    Formal guarantees:
        Each user's vector, rounding included, has ℓ2 norm ≤ f·C (certified upper bound of
        the stored aggregate's norm, :mod:`dpjax.dp_sgd._certified`) and the fixed-order
        double-float sum over users is within rel·f·C of exact, f = 1/(1 + 2·rel): adding or
        removing one user (all its rows) moves the returned float sum by ≤ C (Casacuberta et
        al. 2022, CCS, for the rounding; McMahan et al. 2018 for the per-user clip).

    Example:
        >>> import jax.numpy as jnp
        >>> g = group_users(jnp.array([0, 0, 1]))
        >>> x = jnp.array([[3.0, 4.0], [3.0, 4.0], [0.0, 0.5]])
        >>> s = clipped_user_sum(lambda w, ex: ex @ w, jnp.zeros(2), x, g, jnp.array([0, 1]),
        ...     l2_clip_norm=1.0)
        >>> [round(float(v), 3) for v in s]
        [0.6, 1.3]
    """
    c = _validate.positive("l2_clip_norm", l2_clip_norm)
    users = jnp.asarray(users, jnp.int32)
    mask = jnp.ones(users.shape, bool) if user_mask is None else jnp.asarray(user_mask, bool)
    _check_distinct_users(users, mask, grouping.num_users)
    table, row_mask = jnp.asarray(grouping.table), jnp.asarray(grouping.mask)
    rows, row_mask = jnp.take(table, users, axis=0), jnp.take(row_mask, users, axis=0)
    release = user_release(int(users.shape[0]), c)

    def released(params, data, rows, row_mask, mask):
        pairs, _ = _user_pairs(
            loss_fn, params, data, rows, row_mask, mask, (), l2_clip_norm=c, release=release
        )
        return _round(pairs, params)

    return jax.jit(released)(params, data, rows, row_mask, mask)


# ----------------------------------------------------------------------------- training


class UserLevelTraining(PrivateTraining):
    """DP-SGD at user level, built by :func:`~dpjax.make_private` with ``user_ids=``.

    A :class:`~dpjax.dp_sgd.PrivateTraining` whose sampler draws USERS (q = b/U, b the expected
    number of users per batch), whose step releases the sum of per-user clipped aggregates
    (:func:`clipped_user_sum`) and whose plan records the unit (users U, cap k, grouping
    fingerprint): ``step``/``fit`` refuse a state of another grouping or of an example-level
    plan. ``expected_batch_size`` is q·U (users); ``physical_batch_size`` counts USERS per
    micro-batch (make_private's argument, in rows, divided by k); ``grad_fn`` is the
    example-level clipped gradient and is NOT what the step uses. The step's ``metrics``
    count rows (``batch_size``: real rows of the sampled users; ``num_clipped``,
    ``num_nonfinite``: rows) and are not private.

    Attributes:
        grouping: the :class:`UserGrouping`.
        num_users: U.
        max_examples_per_user: k.
        privacy_unit: "user".

    Formal guarantees:
        Neighbouring data sets differ in all the rows of one user (add/remove one user; the
        ids are public, a removed user is a slot never sampled that contributes 0). Each step
        is the Gaussian mechanism with standard deviation σ·C on a sum of one vector per
        Poisson-sampled user; each vector, as stored and rounding included, has ℓ2 norm
        ≤ f·C and the released float sum moves by ≤ C when one user is added or removed
        (:func:`clipped_user_sum`; padding slots contribute exactly 0; micro-batches add
        double-float partial sums rounded once, the release's depth counting them). Users
        are sampled independently at the realised rate q = b/U, so T steps are one
        ``PoissonSampledGaussianEvent(σ, q, T)`` with U in place of n — the subsampled
        Gaussian analysis of DP-SGD (Abadi et al. 2016) with the user as the record, as in
        DP-FedSGD (McMahan, Ramage, Talwar, Zhang 2018, "Learning differentially private
        recurrent language models"); the cap on sampled users is sized for
        U + 1 users and its truncation slack paid from δ as in
        :func:`~dpjax.make_private`. Normalising by the public q·U and the optimizer are
        post-processing. Resume, publish and re-run follow :func:`~dpjax.make_private`; the
        plan ledger records k and the grouping's fingerprint, so a state is never continued
        (nor charged) under another grouping of the rows or at example level.
    """

    privacy_unit = "user"

    def __init__(self, *, grouping: UserGrouping, clipping: str, **kwargs: Any):
        if clipping == "ghost":
            _validate.fail(
                "clipping", clipping, "'auto' or 'vmap' with user_ids (user level runs on vmap)"
            )
        self.grouping = grouping
        self.num_users = grouping.num_users
        self.max_examples_per_user = grouping.max_examples_per_user
        physical = kwargs.pop("physical_batch_size")
        if physical is not None:
            physical = max(1, physical // grouping.max_examples_per_user)
        super().__init__(clipping=clipping, physical_batch_size=physical, **kwargs)

    def _plan_unit(self) -> dict[str, int]:
        return {
            "examples_per_user": self.grouping.max_examples_per_user,
            "grouping": self.grouping.fingerprint,
        }

    def _check_data(self, data: Any) -> None:
        leaves = jax.tree.leaves(data)
        n = self.grouping.dataset_size
        if not leaves:
            _validate.fail("data", data, "an array or a pytree of arrays with leading axis n")
        for leaf in leaves:
            shape = jnp.shape(leaf)
            if not shape or shape[0] != n:
                _validate.fail(
                    "data",
                    f"a leaf of shape {shape}",
                    f"arrays with leading axis dataset_size={n} (rows, one user id each)",
                )

    def _user_call(self, params, data, users, user_mask, dropout_key, release):
        table = jnp.asarray(self.grouping.table)
        rows = jnp.take(table, users, axis=0)
        row_mask = jnp.take(jnp.asarray(self.grouping.mask), users, axis=0)
        extra: tuple[jax.Array, ...] = ()
        if self._uses_rng:  # one stream per (step, row index)
            fold = lambda i: jax.random.key_data(jax.random.fold_in(dropout_key, i))  # noqa: E731
            extra = (jax.vmap(jax.vmap(fold))(rows),)
        return _user_pairs(
            self._example_loss,
            params,
            data,
            rows,
            row_mask,
            user_mask,
            extra,
            l2_clip_norm=self.l2_clip_norm,
            release=release,
        )

    def _clipped_part(
        self, params: Any, data: Any, batch: PaddedBatch, dropout_key: jax.Array, clip: Any = None
    ):
        """The user-level clipped sum of one padded batch of users, and its counters (a fixed
        C: ``clip`` is always None, adaptive clipping is refused at user level)."""
        release = user_release(int(batch.indices.shape[0]), self.l2_clip_norm)
        pairs, stats = self._user_call(
            params, data, batch.indices, batch.mask, dropout_key, release
        )
        return _round(pairs, params), stats

    def _accumulate(
        self, params: Any, data: Any, batch: PaddedBatch, dropout_key: jax.Array, clip: Any = None
    ):
        """The same sum formed in micro-batches of users (double-float partial sums, one
        rounding; the release's depth counts the chunks)."""
        micro = batch.micro_batches(self.physical_batch_size)
        calls, size = micro.mask.shape
        release = user_release(calls * size, self.l2_clip_norm, calls)

        def part(users, mask):
            return self._user_call(params, data, users, mask, dropout_key, release)

        pairs0, stats0 = jax.eval_shape(part, micro.indices[0], micro.mask[0])
        zeros = lambda s: jnp.zeros(s.shape, s.dtype)  # noqa: E731
        init = (jax.tree.map(zeros, pairs0), jax.tree.map(zeros, stats0))

        def body(acc, xs):
            pairs, stats = part(*xs)
            total = [_certified.df_add(a, b) for a, b in zip(acc[0], pairs, strict=True)]
            return (total, tuple(s + t for s, t in zip(acc[1], stats, strict=True))), None

        (total, stats), _ = jax.lax.scan(body, init, (micro.indices, micro.mask))
        return _round(total, params), stats

    def __repr__(self) -> str:
        return (
            f"UserLevelTraining(noise_multiplier={self.noise_multiplier:.4g}, "
            f"sampling_rate={self.sampling_rate:.4g} (users), steps={self.steps}, "
            f"l2_clip_norm={self.l2_clip_norm}, num_users={self.num_users}, "
            f"max_examples_per_user={self.max_examples_per_user}, "
            f"expected_batch_size={self.expected_batch_size:.4g} (users), "
            f"max_batch_size={self.max_batch_size} (users), delta={self.delta})"
        )
