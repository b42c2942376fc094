"""Review 2: user-level DP-SGD — the grouping is the unit of privacy, so it must be one.

The per-user bound (sensitivity C when ALL rows of one user are removed) holds only if every
row belongs to at most one user slot and the table the step uses is the one the plan ledger
names. A hand-built :class:`UserGrouping` (a public dataclass) or an edited ``table`` array
broke both silently on the merged main.
"""

import dataclasses
import hashlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dpjax.dp_sgd import clipped_user_sum, group_users, make_private
from dpjax.dp_sgd.user_level import UserGrouping

C = 1.0


def _fingerprint(n, k, table, mask):
    """The documented fingerprint scheme (blake2b-64 of n, k, table, mask), written out here so
    a hand-built grouping can carry a CONSISTENT fingerprint (the attack is the shared row)."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update(np.asarray([n, k], "<i8").tobytes())
    digest.update(np.asarray(table).astype("<i4").tobytes())
    digest.update(np.asarray(mask).astype(np.uint8).tobytes())
    return int.from_bytes(digest.digest(), "little") or 1


def _shared_row_grouping() -> dict:
    """Fields of a grouping where row 0 is in user 0 AND user 1 (rows 1, 2 one each)."""
    table = np.array([[0, 1], [0, 2]], np.int32)
    mask = np.ones((2, 2), bool)
    return dict(
        table=table,
        mask=mask,
        user_keys=np.array([10, 11]),
        dataset_size=3,
        max_examples_per_user=2,
        fingerprint=_fingerprint(3, 2, table, mask),
    )


def test_shared_row_moves_the_sum_by_two_clip_norms_so_the_grouping_is_refused():
    # the attack: if row 0 sits in two users, removing user 0 (its rows: 0 and 1) also
    # changes user 1's vector; with aligned rows the released sum moves by ~2C > C
    fields = _shared_row_grouping()
    forged = object.__new__(UserGrouping)  # what the unchecked dataclass used to accept
    for name, value in fields.items():
        object.__setattr__(forged, name, value)
    rows = jnp.array([[1e3, 0.0], [1e3, 0.0], [1e3, 0.0]])  # aligned, far above C
    loss = lambda w, x: x @ w  # noqa: E731
    users = jnp.array([0, 1])
    both = clipped_user_sum(loss, jnp.zeros(2), rows, forged, users, l2_clip_norm=C)
    neighbour = rows.at[0].set(0.0).at[1].set(0.0)  # user 0 (rows 0, 1) removed: rows zeroed
    rest = clipped_user_sum(
        loss,
        jnp.zeros(2),
        neighbour,
        forged,
        users,
        l2_clip_norm=C,
        user_mask=jnp.array([False, True]),
    )
    moved = float(jnp.linalg.norm(both - rest))
    assert moved > 1.4 * C  # 1.5C: user 1 lost half its vector too (a shared row)
    with pytest.raises(ValueError, match="grouping.table"):
        UserGrouping(**fields)
    with pytest.raises(ValueError, match="grouping.table"):
        make_private(
            lambda w, x: x @ w,
            optimizer=optax.sgd(0.1),
            l2_clip_norm=C,
            dataset_size=3,
            batch_size=1,
            steps=1,
            noise_multiplier=1.0,
            delta=1e-3,
            key=jax.random.key(0),
            user_ids=dataclasses.replace(group_users([0, 1, 2]), **fields),
        )


def test_a_valid_grouping_keeps_the_per_user_bound():
    # the same three rows, each in one user: removing user 0 moves the sum by ≤ C
    g = group_users(np.array([10, 10, 11]))
    rows = jnp.array([[1e3, 0.0], [1e3, 0.0], [1e3, 0.0]])
    with_0 = clipped_user_sum(
        lambda w, x: x @ w, jnp.zeros(2), rows, g, jnp.array([0, 1]), l2_clip_norm=C
    )
    without_0 = clipped_user_sum(
        lambda w, x: x @ w,
        jnp.zeros(2),
        rows,
        g,
        jnp.array([0, 1]),
        l2_clip_norm=C,
        user_mask=jnp.array([False, True]),
    )
    assert float(jnp.linalg.norm(with_0 - without_0)) <= C * (1 + 1e-6)


def test_table_edited_after_grouping_is_refused():
    g = group_users(np.array([0, 0, 1, 1]))
    with pytest.raises(ValueError, match="read-only"):
        g.table[1, 0] = g.table[0, 0]  # would put row 0 in both users, after the fingerprint


def test_a_fingerprint_that_is_not_the_tables_is_refused():
    # the ledger records the fingerprint: it must name the table the step uses
    g = group_users(np.array([0, 0, 1, 1]))
    other = np.array([[1, 0], [2, 3]], np.int32)
    with pytest.raises(ValueError, match="grouping.fingerprint"):
        dataclasses.replace(g, table=other)


@pytest.mark.parametrize("bad_row", [-1, 4])
def test_a_row_outside_the_data_is_refused(bad_row):
    fields = _shared_row_grouping()
    fields["table"] = np.array([[0, 1], [2, bad_row]], np.int32)
    fields["dataset_size"] = 4
    with pytest.raises(ValueError, match=r"rows in \[0, 4\)"):
        UserGrouping(**fields)


def test_a_batch_naming_one_user_twice_is_refused():
    # clipped_user_sum is public and promises "removing one user moves the sum by ≤ C"; a
    # batch [0, 0] (e.g. a with-replacement sampler) sums user 0 twice: removing it moves 2C
    g = group_users(np.array([10, 10, 11]))
    rows = jnp.array([[1e3, 0.0], [1e3, 0.0], [0.0, 0.0]])
    loss = lambda w, x: x @ w  # noqa: E731
    with pytest.raises(ValueError, match="users"):
        clipped_user_sum(loss, jnp.zeros(2), rows, g, jnp.array([0, 0]), l2_clip_norm=C)
    with pytest.raises(ValueError, match=r"slots in \[0, 2\)"):
        clipped_user_sum(loss, jnp.zeros(2), rows, g, jnp.array([0, 2]), l2_clip_norm=C)
    # padding slots may repeat (they contribute exactly 0)
    s = clipped_user_sum(
        loss,
        jnp.zeros(2),
        rows,
        g,
        jnp.array([0, 0, 1]),
        l2_clip_norm=C,
        user_mask=jnp.array([True, False, True]),
    )
    assert float(jnp.linalg.norm(s)) <= C * (1 + 1e-6)
