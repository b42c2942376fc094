"""User-level DP-SGD (``make_private(..., user_ids=...)``): neighbours differ in a whole user.

The attacks: add or remove one user with 1–50 examples whose gradients are huge, aligned with
everyone else's, NaN or inf, and measure how far the RELEASED float sum moves (≤ C(1 + 1e-6));
a per-example clip only would let a 50-example user move it by 50·C. The accounting is a
Poisson-sampled Gaussian event at the USER rate b/U, cross-checked against dp-accounting.
"""

import dataclasses
import hashlib
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dpjax
from dpjax.accounting import dp_sgd_epsilon
from dpjax.dp_sgd import (
    UserLevelTraining,
    _plan,
    clipped_grad,
    clipped_user_sum,
    group_users,
    make_private,
)
from dpjax.dp_sgd.private import SLACK_FRACTION
from dpjax.dp_sgd.samplers import PoissonSampler, realised_sampling_rate
from dpjax.dp_sgd.user_level import UserGrouping
from dpjax.events import PoissonSampledGaussianEvent

DIM = 4
TOLERANCE = 1e-6  # the rounding of C itself (the certificate is ≤ C in exact arithmetic)


def linear_loss(w, x):
    """Its gradient is the row itself: the test chooses every per-example gradient."""
    return x @ w


def adversarial_users(sizes, kinds, seed=0):
    """Rows for users of the given sizes; ``kinds``: aligned / huge / nan / inf / tiny / random."""
    rng = np.random.default_rng(seed)
    rows, ids = [], []
    for u, (m, kind) in enumerate(zip(sizes, kinds, strict=True)):
        block = rng.normal(size=(m, DIM)).astype(np.float32)
        if kind == "aligned":  # everyone pushes e_0 as hard as possible
            block = np.zeros((m, DIM), np.float32)
            block[:, 0] = 1e3
        elif kind == "huge":
            block *= np.float32(1e30)
        elif kind == "nan":
            block[0, 1] = np.nan
            block[1:, 0] = 7.0
        elif kind == "inf":
            block[-1, 2] = np.inf
            block[:-1] *= 50.0
        elif kind == "tiny":
            block *= np.float32(1e-30)
        rows.append(block)
        ids += [100 + 3 * u] * m
    perm = rng.permutation(len(ids))  # users' rows interleaved in the data
    return jnp.asarray(np.concatenate(rows)[perm]), np.asarray(ids)[perm]


SIZES = [1, 50, 2, 17, 50, 3, 1, 50, 9, 33]
KINDS = ["aligned", "aligned", "huge", "nan", "inf", "aligned", "tiny", "random", "aligned", "huge"]


def released_moves(sum_fn, c):
    """‖S(all users) − S(all but u)‖ for every user u (float64 on the released floats).

    "All but u" is u's slot masked out (the user is not in the batch: how a removed user
    appears to a DP-SGD step); one jitted call evaluates all U + 1 neighbouring batches.
    """
    x, ids = adversarial_users(SIZES, KINDS)
    grouping = group_users(ids)
    u = grouping.num_users
    masks = np.concatenate([np.ones((1, u), bool), ~np.eye(u, dtype=bool)])
    sums = jax.jit(jax.vmap(lambda m: sum_fn(x, grouping, m, c)))(jnp.asarray(masks))
    sums = np.asarray(sums, np.float64)
    return np.linalg.norm(sums[1:] - sums[0], axis=1)


def user_level_sum(x, grouping, mask, c):
    users = jnp.arange(grouping.num_users)
    zero = jnp.zeros(DIM, jnp.float32)
    return clipped_user_sum(linear_loss, zero, x, grouping, users, l2_clip_norm=c, user_mask=mask)


def example_level_sum(x, grouping, mask, c):
    """The per-example clip only: every kept row of the users in the batch, each clipped to C."""
    rows = jnp.asarray(grouping.table.reshape(-1))
    row_mask = (jnp.asarray(grouping.mask) & mask[:, None]).reshape(-1)
    grad_fn = clipped_grad(linear_loss, l2_clip_norm=c, backend="vmap")
    return grad_fn(jnp.zeros(DIM, jnp.float32), x[rows], mask=row_mask)[0]


# ----------------------------------------------------------------------------- sensitivity


@pytest.mark.parametrize("c", [1.0, 0.37])
def test_adding_or_removing_a_user_moves_the_released_sum_by_at_most_c(c):
    moves = released_moves(user_level_sum, c)
    assert moves.max() <= c * (1 + TOLERANCE)
    # the attack is tight: an aligned user moves the sum by (almost) C, not less
    assert moves[1] >= c * (1 - 1e-3)


def test_a_user_removed_from_the_data_moves_the_released_sum_by_at_most_c():
    """The neighbour without user 1's rows at all (regrouped): same bound."""
    x, ids = adversarial_users(SIZES, KINDS)
    keep = ids != 103  # user 1: 50 aligned rows
    zero = jnp.zeros(DIM, jnp.float32)
    sums = []
    for xs, group in ((x, group_users(ids)), (x[keep], group_users(ids[keep]))):
        users = np.arange(group.num_users)
        sums.append(
            np.asarray(
                clipped_user_sum(linear_loss, zero, xs, group, users, l2_clip_norm=1.0), np.float64
            )
        )
    move = np.linalg.norm(sums[0] - sums[1])
    assert 1 - 1e-3 <= move <= 1 + TOLERANCE


def test_a_user_with_50_examples_contributes_c_where_per_example_clipping_gives_50c():
    c = 1.0
    moves_user = released_moves(user_level_sum, c)
    moves_example = released_moves(example_level_sum, c)
    assert moves_user.max() <= c * (1 + TOLERANCE)
    # the same check fails for a per-example clip: user 1 has 50 aligned rows of norm 1000
    assert moves_example[1] == pytest.approx(50 * c, rel=1e-3)
    assert moves_example.max() > c * (1 + TOLERANCE)


def test_nonfinite_rows_are_dropped_and_the_user_mean_uses_the_finite_ones():
    x = jnp.array([[3.0, 4.0], [jnp.nan, 0.0], [0.0, 0.5], [jnp.inf, 1.0]], jnp.float32)
    grouping = group_users(np.array([5, 5, 9, 9]))
    s = clipped_user_sum(
        lambda w, r: r @ w, jnp.zeros(2, jnp.float32), x, grouping, [0, 1], l2_clip_norm=1.0
    )
    # user 5: mean of clip([3, 4]) over its one finite row = [0.6, 0.8]; user 9: [0, 0.5]
    np.testing.assert_allclose(np.asarray(s), [0.6, 1.3], rtol=1e-5)


# ----------------------------------------------------------------------------- grouping


def test_group_users_caps_each_user_at_k_spread_over_its_rows():
    ids = np.repeat(np.arange(6), [1, 50, 2, 17, 5, 3])
    ids = np.random.default_rng(1).permutation(ids)
    g = group_users(ids, max_examples_per_user=10)
    assert g.num_users == 6 and g.table.shape == (6, 10) and g.dataset_size == ids.size
    for u in range(6):
        own = np.flatnonzero(ids == u)
        kept = g.table[u][g.mask[u]]
        assert len(set(kept.tolist())) == len(kept) == min(own.size, 10)
        assert set(kept.tolist()) <= set(own.tolist())
        if own.size > 10:  # spread: positions ⌊i·m/k⌋ of the user's rows in data order
            assert kept.tolist() == own[(np.arange(10) * own.size) // 10].tolist()
    assert g.num_dropped == (50 - 10) + (17 - 10)
    assert group_users(ids).max_examples_per_user == 50
    # another grouping of the same rows (same U, k) has another fingerprint
    assert group_users(ids[::-1], max_examples_per_user=10).fingerprint != g.fingerprint


# ----------------------------------------------------------------------------- make_private


NUM_ROWS, NUM_USERS = 300, 40


def user_ids_for(seed=0):
    ids = np.random.default_rng(seed).integers(0, NUM_USERS, NUM_ROWS)
    ids[:NUM_USERS] = np.arange(NUM_USERS)  # every user has at least one row
    return ids


def square_loss(w, ex):
    return 0.5 * (ex["x"] @ w - ex["y"]) ** 2


def data_for(key=jax.random.key(3)):
    x = jax.random.normal(key, (NUM_ROWS, 3))
    return {"x": x, "y": x @ jnp.array([1.0, -2.0, 0.5])}


def user_private(**kwargs):
    args = dict(
        optimizer=optax.sgd(0.5),
        l2_clip_norm=1.0,
        dataset_size=NUM_ROWS,
        batch_size=8,
        steps=40,
        noise_multiplier=1.1,
        delta=1e-5,
        key=jax.random.key(11),
        user_ids=user_ids_for(),
    )
    args.update(kwargs)
    return make_private(square_loss, **args)


def test_epsilon_is_a_poisson_sampled_gaussian_event_at_the_user_rate():
    dp_accounting = pytest.importorskip("dp_accounting")
    private = user_private()
    q = realised_sampling_rate(8 / NUM_USERS)  # users: b/U, not b/n
    assert isinstance(private, UserLevelTraining)
    assert private.sampling_rate == q and private.expected_batch_size == 8.0
    assert isinstance(private.sampler, PoissonSampler) and private.sampler.dataset_size == NUM_USERS
    event = private.event()
    assert (event.noise_multiplier, event.sampling_rate, event.count) == (1.1, q, 40)
    assert isinstance(event, PoissonSampledGaussianEvent)
    accounted = 1e-5 * (1 - SLACK_FRACTION)
    eps = private.epsilon(40)
    assert eps == dp_sgd_epsilon(noise_multiplier=1.1, sampling_rate=q, steps=40, delta=accounted)
    reference = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-3)
    reference.compose(
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(1.1)), 40
        )
    )
    assert eps == pytest.approx(reference.get_epsilon(accounted), rel=1e-2)
    # the example-level rate b/n would claim a much smaller ε
    assert eps > 2 * dp_sgd_epsilon(
        noise_multiplier=1.1, sampling_rate=8 / NUM_ROWS, steps=40, delta=accounted
    )
    # the cap is sized over users (U + 1 for an added user), not rows
    assert private.max_batch_size <= NUM_USERS
    assert private.sampler.delta_slack(40, eps) <= SLACK_FRACTION * 1e-5


@pytest.mark.parametrize("users_per_micro_batch", [None, 5])
def test_a_full_batch_step_is_the_user_sum_over_the_public_q_times_u(users_per_micro_batch):
    """σ = 0 and q = 1: the update is −S/(q·U) with S the certified user-level sum (whole
    batch at once, or micro-batches of 5 users: double-float partial sums, one rounding)."""
    ids = user_ids_for()
    data = data_for()
    grouping = group_users(ids)
    expected = (
        clipped_user_sum(
            square_loss, jnp.zeros(3), data, grouping, np.arange(NUM_USERS), l2_clip_norm=1.0
        )
        / NUM_USERS
    )
    physical = None
    if users_per_micro_batch is not None:  # make_private's argument counts rows
        physical = users_per_micro_batch * grouping.max_examples_per_user
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dpjax.PrivacyLeakWarning)
        private = user_private(
            optimizer=optax.sgd(1.0),
            batch_size=NUM_USERS,
            noise_multiplier=0.0,
            physical_batch_size=physical,
        )
    assert private.max_batch_size == NUM_USERS
    assert private.physical_batch_size == users_per_micro_batch
    params, state, metrics = private.step(jnp.zeros(3), private.init(jnp.zeros(3)), data)
    np.testing.assert_allclose(np.asarray(params), -np.asarray(expected), rtol=2e-6)
    assert int(metrics["batch_size"]) == NUM_ROWS


def test_the_plan_records_the_user_level_unit_and_refuses_another_grouping():
    data = data_for()
    private = user_private()
    params, state, _ = private.step(jnp.zeros(3), private.init(jnp.zeros(3)), data)
    plan = _plan.current_plan(state.plan)
    grouping = private.grouping
    assert plan.dataset_size == NUM_USERS
    assert plan.examples_per_user == grouping.max_examples_per_user
    assert plan.grouping == grouping.fingerprint != 0
    # the same rows grouped otherwise (same n, U and k): refused, not charged as this plan
    other_ids = user_ids_for()
    other_ids[NUM_USERS:] = np.random.default_rng(9).permutation(other_ids[NUM_USERS:])
    other = user_private(user_ids=other_ids, key=jax.random.key(12))
    assert other.num_users == NUM_USERS
    with pytest.raises(ValueError, match="another plan"):
        other.step(params, state, data)
    # an example-level run of the same data, and back
    example = make_private(
        square_loss,
        optimizer=optax.sgd(0.5),
        l2_clip_norm=1.0,
        dataset_size=NUM_ROWS,
        batch_size=8,
        steps=40,
        noise_multiplier=1.1,
        delta=1e-5,
        key=jax.random.key(13),
    )
    with pytest.raises(ValueError, match="another plan"):
        example.step(params, state, data)
    ex_state = example.init(jnp.zeros(3))
    with pytest.raises(ValueError, match="another plan"):
        user_private(key=jax.random.key(14)).step(params, ex_state, data)


def test_continue_from_refuses_to_mix_privacy_units():
    """Example-level and user-level phases (or two groupings) do not compose into one ε."""
    private = user_private()
    state = private.init(jnp.zeros(3))
    example = make_private(
        square_loss,
        optimizer=optax.sgd(0.5),
        l2_clip_norm=1.0,
        dataset_size=NUM_ROWS,
        batch_size=8,
        steps=40,
        noise_multiplier=1.1,
        delta=1e-5,
        key=jax.random.key(13),
    )
    with pytest.raises(ValueError, match="privacy unit"):
        example.continue_from(state)
    with pytest.raises(ValueError, match="privacy unit"):
        user_private(key=jax.random.key(15)).continue_from(example.init(jnp.zeros(3)))
    other_ids = user_ids_for()
    other_ids[NUM_USERS:] = other_ids[NUM_USERS:][::-1]
    with pytest.raises(ValueError, match="privacy unit"):
        user_private(user_ids=other_ids, key=jax.random.key(16)).continue_from(state)
    # same grouping, another σ: a new phase, ε composed over both
    more = user_private(noise_multiplier=2.0, key=jax.random.key(17)).continue_from(state)
    assert more.plan.shape[0] == 2


def test_a_traced_state_of_another_grouping_voids_the_update():
    data = data_for()
    private = user_private()
    state = private.init(jnp.zeros(3))
    other_ids = user_ids_for()
    other_ids[NUM_USERS:] = other_ids[NUM_USERS:][::-1]
    other = user_private(user_ids=other_ids, key=jax.random.key(12))
    params, _, _ = jax.jit(other.step)(jnp.zeros(3), state, data)
    assert np.all(np.isnan(np.asarray(params)))


def test_legacy_ledger_rows_read_as_example_level():
    plan = _plan.Plan(1.0, 0.1, 1.0, 10.0, 100, 30, dpjax.relation.ADD_OR_REMOVE_ONE)
    row = _plan.ledger_row(plan, 0)
    assert row.shape == (_plan.WORDS,)
    assert _plan.current_plan(row[None, :16]) == plan
    assert _plan.append_phase(row[None, :16], plan, 5).shape == (2, _plan.WORDS)


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "user_ids, match",
    [
        (np.zeros(NUM_ROWS - 1, int), "user_ids"),
        (np.zeros((NUM_ROWS, 1), int), "user_ids"),
        (np.zeros(NUM_ROWS), "user_ids"),
        (np.zeros(NUM_ROWS, bool), "user_ids"),
        (group_users(np.arange(NUM_ROWS + 1)), "user_ids"),
    ],
)
def test_user_ids_that_do_not_match_the_data_are_refused(user_ids, match):
    with pytest.raises(ValueError, match=match):
        user_private(user_ids=user_ids)


def test_bad_user_level_arguments_are_refused():
    with pytest.raises(ValueError, match="batch_size"):
        user_private(batch_size=NUM_USERS + 1)  # more users per batch than users
    with pytest.raises(ValueError, match="clipping"):
        user_private(clipping="ghost")
    with pytest.raises(ValueError, match="max_examples_per_user"):
        group_users(np.arange(5), max_examples_per_user=0)
    private = user_private()
    with pytest.raises(ValueError, match="data"):
        private.step(jnp.zeros(3), private.init(jnp.zeros(3)), {"x": jnp.zeros((NUM_USERS, 3))})


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32, jnp.float64])
@pytest.mark.parametrize("data_dtype", [jnp.int32, "same"])
def test_a_user_moves_the_sum_by_at_most_c_in_every_dtype(dtype, data_dtype):
    """Low-precision params and integer features (60 000-sized — float16's largest is 65 504 —,
    aligned, cancelling): the released (float32-at-least) sum still moves by ≤ C when one
    whole user is removed, and an aligned user still moves it by about C (not dropped)."""
    rng = np.random.default_rng(3)
    m = 24
    x = np.zeros((3 * m, DIM))
    x[:m, 0] = 60000.0  # user 0: aligned, huge
    x[m : 2 * m] = rng.choice([-60000.0, 59999.0], size=(m, DIM))  # user 1: cancelling
    x[2 * m :] = rng.integers(-3, 4, size=(m, DIM))  # user 2: small
    data = jnp.asarray(x, jnp.int32 if data_dtype == jnp.int32 else dtype)
    grouping = group_users(np.repeat(np.arange(3), m))
    params = jnp.zeros(DIM, dtype)

    def loss(w, row):
        return row.astype(w.dtype) @ w

    def released(mask):
        users = jnp.arange(3)
        return clipped_user_sum(
            loss, params, data, grouping, users, l2_clip_norm=0.5, user_mask=mask
        )

    masks = np.concatenate([np.ones((1, 3), bool), ~np.eye(3, dtype=bool)])
    sums = np.stack([np.asarray(released(jnp.asarray(k)), np.float64) for k in masks])
    moves = np.linalg.norm(sums[1:] - sums[0], axis=1)
    assert moves.max() <= 0.5 * (1 + TOLERANCE)
    assert moves[0] >= 0.5 * (1 - 1e-2)  # the aligned user is clipped to C, not zeroed


# ------------------------------------------------------------------------------------------------
# user-level DP-SGD — the grouping is the unit of privacy, so it must be one.
#
# The per-user bound (sensitivity C when ALL rows of one user are removed) holds only if every
# row belongs to at most one user slot and the table the step uses is the one the plan ledger
# names. A hand-built :class:`UserGrouping` (a public dataclass) or an edited ``table`` array
# broke both silently on the merged main.
# ------------------------------------------------------------------------------------------------

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
    """Catches a grouping that puts one row in two users (sensitivity 2C) being accepted."""
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
    """Catches removing one user of a valid grouping moving the clipped sum by more than C."""
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
    """Catches a grouping table edited in place after its fingerprint was taken."""
    g = group_users(np.array([0, 0, 1, 1]))
    with pytest.raises(ValueError, match="read-only"):
        g.table[1, 0] = g.table[0, 0]  # would put row 0 in both users, after the fingerprint


def test_a_fingerprint_that_is_not_the_tables_is_refused():
    # the ledger records the fingerprint: it must name the table the step uses
    """Catches a grouping whose table was replaced while its fingerprint stayed."""
    g = group_users(np.array([0, 0, 1, 1]))
    other = np.array([[1, 0], [2, 3]], np.int32)
    with pytest.raises(ValueError, match="grouping.fingerprint"):
        dataclasses.replace(g, table=other)


@pytest.mark.parametrize("bad_row", [-1, 4])
def test_a_row_outside_the_data_is_refused(bad_row):
    """Catches a grouping that names a row outside [0, dataset_size)."""
    fields = _shared_row_grouping()
    fields["table"] = np.array([[0, 1], [2, bad_row]], np.int32)
    fields["dataset_size"] = 4
    with pytest.raises(ValueError, match=r"rows in \[0, 4\)"):
        UserGrouping(**fields)


def test_a_batch_naming_one_user_twice_is_refused():
    # clipped_user_sum is public and promises "removing one user moves the sum by ≤ C"; a
    # batch [0, 0] (e.g. a with-replacement sampler) sums user 0 twice: removing it moves 2C
    """Catches a user batch naming one user twice (that user would count twice)."""
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
