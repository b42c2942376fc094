"""Ghost clipping's per-backend policy (issue 24): the accelerator path, exercised on the CPU.

On a GPU ghost forms large sequence layers for the whole batch (book-keeping), streams bigger
chunks and batches the accurate branch's per-example products. The policy is forced here with
:func:`dpjax.dp_sgd._ghost_policy.use`, so these choices run on the CPU: results must equal an
independent vmap reference, the clip shrink must follow the policy the program was traced
under, and one example must move the released sum by ≤ C.
"""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpjax.dp_sgd import _ghost_policy, ghost
from dpjax.dp_sgd._ghost_trace import DenseTap

# every T > 1 layer on the Gram path, the streamed sum 2 examples per chunk, the accurate
# branch 3 examples per batched product: the CPU's choices, shrunk to test sizes
GRAM = _ghost_policy.GhostPolicy("gram", 0, 2 * 96 * 96, 3)


def reference(loss_fn, params, batch, clip, mask=None):
    """(clipped sum, norms) from per-example gradients by vmap(grad), in float64 NumPy."""
    grads = jax.vmap(jax.grad(loss_fn), in_axes=(None,) + (0,) * len(batch))(params, *batch)
    leaves = [np.asarray(g, np.float64) for g in jax.tree.leaves(grads)]
    rows = np.concatenate([g.reshape(g.shape[0], -1) for g in leaves], axis=1)
    norms = np.linalg.norm(rows, axis=1)
    scale = np.minimum(1.0, clip / norms)
    if mask is not None:
        scale = np.where(mask, scale, 0.0)
    sums = [np.tensordot(scale, g, axes=1) for g in leaves]
    return jax.tree.unflatten(jax.tree.structure(grads), sums), norms


def ghost_sum(loss_fn, params, batch, clip, mask=None):
    """(sum, norms, f) of ghost under the policy in force; f is the shrink applied to C."""
    pairs, norms, _, f = ghost.ghost_clipped_pairs(
        loss_fn, params, batch, l2_clip_norm=clip, mask=mask
    )
    total = jax.tree.map(lambda h, lo: np.asarray(h, np.float64) + np.asarray(lo), *pairs)
    return total, np.asarray(norms), f


def assert_close(actual, expected, rtol):
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
        assert np.max(np.abs(a - e)) <= rtol * np.max(np.abs(e)), (a, e)


def seq_loss(p, x):
    """A 96×96 kernel on T = 32 positions (Gram or book-keeping by budget), linear head."""
    return jnp.sum(jnp.tanh(x @ p["w"]) @ p["head"])


@pytest.fixture
def seq_model(key):
    k1, k2, k3 = jax.random.split(key, 3)
    params = {
        "w": jax.random.normal(k1, (96, 96)) / 10.0,
        "head": jax.random.normal(k2, (96, 4)),
    }
    return params, (jax.random.normal(k3, (6, 32, 96)),)


def test_cpu_is_the_default_and_accelerators_get_the_large_budgets():
    assert _ghost_policy.current() == _ghost_policy.CPU  # the test suite runs on the CPU
    assert _ghost_policy.for_platform("cpu") == _ghost_policy.CPU
    assert _ghost_policy.for_platform("gpu") == _ghost_policy.ACCELERATOR
    assert _ghost_policy.for_platform("tpu") == _ghost_policy.ACCELERATOR
    assert _ghost_policy.for_platform("gpu", 80 * 10**9) == _ghost_policy.ACCELERATOR
    small = _ghost_policy.for_platform("gpu", 16 * 2**30)  # budgets: 1/64 of it in float32
    assert small.materialise_budget == small.stream_budget == 2**26
    assert _ghost_policy.for_platform("gpu", 2**20).materialise_budget == 2**23
    assert _ghost_policy.for_platform("cpu", 2**40) == _ghost_policy.CPU
    with pytest.raises(ValueError, match="policy must be a GhostPolicy"):
        with _ghost_policy.use("gpu"):
            pass


def test_accelerator_forms_the_transformer_head_for_the_whole_batch():
    """Issue 24's GPU row: the head (T = 128, K·N = 256·8192, B = 32) took the Gram path and
    its 19%-loose bound sent every step to the sequential accurate branch; on an accelerator
    it is formed once for the batch (no Gram, no retry, no streamed scan)."""
    head = DenseTap(0, 0, 1, (0, 1), (0, 1), (0, 1), 128, 256, 8192, (128, 8192), "f", (256, 8192))
    assert not ghost._materialise(head, 32)
    assert ghost._stream_steps([head], 32) == 4
    with _ghost_policy.use(_ghost_policy.ACCELERATOR):
        assert ghost._materialise(head, 32)
        assert ghost._materialise(head, 128)  # 2²⁸ entries: the full bench's batch
        assert ghost._stream_steps([head], 32) == 0
    assert not ghost._materialise(head, 32)  # restored on exit


@pytest.mark.parametrize("policy", [_ghost_policy.ACCELERATOR, GRAM], ids=lambda p: p.name)
def test_forced_policy_equals_vmap_reference(seq_model, policy):
    params, batch = seq_model
    mask = np.array([True, True, False, True, True, True])
    clip = float(np.median(reference(seq_loss, params, batch, 1.0)[1]))
    with _ghost_policy.use(policy):
        total, norms, f = ghost_sum(seq_loss, params, batch, clip, mask)
    ref_sum, ref_norms = reference(seq_loss, params, batch, clip * f, mask)
    assert np.sum(ref_norms > clip) >= 2 and np.sum(ref_norms < clip) >= 2
    np.testing.assert_allclose(norms, np.where(mask, ref_norms, 0.0), rtol=1e-10)
    assert_close(total, ref_sum, 1e-10)


def test_shrink_and_program_follow_the_policy_they_were_traced_under(seq_model):
    """The attack: a program traced under one policy reused under another (plain jax.jit
    cache on shapes) would release a streamed sum certified with the depth of a book-kept one.
    The policy is a static jit key, so each policy gets its own program and its own f (float32
    sums: f64 rounding is too fine to show the depth)."""
    params, batch = jax.tree.map(lambda v: v.astype(jnp.float32), seq_model)

    def program(policy):
        """(the lowered ghost program, the shrink f used while tracing it)."""
        shrinks = []

        def fn(p, b):
            pairs, norms, _, f = ghost.ghost_clipped_pairs(seq_loss, p, b, l2_clip_norm=1.0)
            shrinks.append(f)
            return pairs, norms

        with _ghost_policy.use(policy):
            return jax.jit(fn).lower(params, batch).as_text(), shrinks[0]

    (gram, f_gram), (accel, f_accel) = program(GRAM), program(_ghost_policy.ACCELERATOR)
    assert "stablehlo.while" in gram and "stablehlo.case" in gram  # stream scan, retry cond
    assert "stablehlo.while" not in accel and "stablehlo.case" not in accel
    assert f_gram < f_accel < 1.0  # 3 sequential merges deepen the certified sum


@pytest.mark.parametrize("policy", [_ghost_policy.ACCELERATOR, GRAM], ids=lambda p: p.name)
def test_removing_one_example_moves_the_sum_by_at_most_c(seq_model, policy):
    """Add/remove-one under each policy (magnitudes 1e-3…1e3): a clipped row moves the
    released sum by ≈ C, never more."""
    params, (x,) = seq_model
    x = x * jnp.array([1e3, 1.0, 1e-3, 30.0, 1e2, 5.0])[:, None, None]
    clip = 0.05
    with _ghost_policy.use(policy):
        full, _, _ = ghost_sum(seq_loss, params, (x,), clip)
        for i in (0, 3):
            mask = np.arange(6) != i
            less, _, _ = ghost_sum(seq_loss, params, (x,), clip, mask)
            moved = np.sqrt(
                sum(np.sum((a - b) ** 2) for a, b in zip(*map(jax.tree.leaves, (full, less))))
            )
            assert clip * 0.99 <= moved <= clip * (1.0 + 1e-6), (i, moved)


def test_batched_accurate_branch_equals_one_at_a_time(key):
    """The accurate branch forms per-example matrices 16 at a time on an accelerator (20 rows:
    one batch and a remainder of 4): the same norms and bounds as one at a time."""
    ka, kg = jax.random.split(key)
    a = jax.random.normal(ka, (20, 5, 24)) * jnp.logspace(-3, 3, 20)[:, None, None]
    g = jax.random.normal(kg, (20, 5, 40))
    bound = jax.jit(ghost._materialised_gram_bound, static_argnums=2)  # traced on each call
    one = bound(a, g, jnp.float64)
    with _ghost_policy.use(_ghost_policy.ACCELERATOR):
        batched = jax.jit(ghost._materialised_gram_bound, static_argnums=2)(a, g, jnp.float64)
    exact = np.sum(np.einsum("btk,btn->bkn", np.asarray(a), np.asarray(g)) ** 2, axis=(1, 2))
    for x, y in zip(one, batched, strict=True):
        np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=1e-13)
    np.testing.assert_allclose(np.asarray(batched.sq), exact, rtol=1e-12)
    assert np.all(np.asarray(batched.n2) >= exact) and np.all(np.asarray(batched.u2) >= exact)


# ------------------------------------------------------------------------------------------------
# ghost clipping's sensitivity under the ACCELERATOR policy, forced on
# the CPU, with narrow dtypes and extreme rows.
#
# Each example's removal must move the released (rounded) sum by at most C in ℓ2, whatever its
# magnitude (1e±30 in float32: squares overflow float32), with bfloat16 / float16 parameters
# and inputs (book-kept per-example matrices of a narrow dtype), a NaN or inf row (counted bad
# and dropped), and rows that cancel in the sum.
# ------------------------------------------------------------------------------------------------

B = 6
# (T, K): K·K = 16384 > 2·T·2K: the Gram path (streamed sum, accurate retry, batched by
# 16 under ACCELERATOR); K·K = 9216 ≤ 2·T·2K: book-kept (per-example matrices formed)
SHAPES = [(8, 128), (32, 96)]
CLIP = 0.05


def extreme_seq_loss(p, x):
    return jnp.sum((x @ p["w"]) @ p["head"])


def _released(params, x, mask):
    total, _, bad = ghost.ghost_clipped_sum(
        extreme_seq_loss, params, (x,), l2_clip_norm=CLIP, mask=mask
    )
    leaves = [np.asarray(v, np.float64) for v in jax.tree.leaves(total)]
    return leaves, int(bad)


def _moves(dtype, scales, t, k):
    key = jax.random.key(4)
    k1, k2, k3 = jax.random.split(key, 3)
    params = {
        "w": (jax.random.normal(k1, (k, k)) / 5.0).astype(dtype),
        "head": jax.random.normal(k2, (k, 2)).astype(dtype),
    }
    x = (
        jax.random.normal(k3, (B, t, k), jnp.float32)
        * jnp.asarray(scales, jnp.float32)[:, None, None]
    )
    x = x.at[5].set(-x[4])  # row 5 cancels row 4 in the sum
    x = x.astype(dtype)
    with _ghost_policy.use(_ghost_policy.ACCELERATOR):
        full, bad = _released(params, x, None)
        moves = []
        for i in range(B):
            less, _ = _released(params, x, np.arange(B) != i)
            moves.append(np.sqrt(sum(np.sum((a - b) ** 2) for a, b in zip(full, less))))
    return np.array(moves), bad, full


@pytest.mark.slow
@pytest.mark.parametrize("shape", SHAPES, ids=["gram", "book_kept"])
@pytest.mark.parametrize(
    "dtype", [jnp.float32, jnp.bfloat16, jnp.float16], ids=lambda d: jnp.dtype(d).name
)
def test_removing_any_extreme_row_moves_the_sum_by_at_most_c(dtype, shape):
    """Catches accelerator-policy ghost clipping moving the sum by more than C on extreme rows."""
    big = float(jnp.finfo(dtype).max) ** 0.5 * 4.0  # its square overflows the dtype
    scales = [big, 1.0, float(jnp.finfo(dtype).tiny), np.nan, 1e3, 1e3]
    moves, bad, full = _moves(dtype, scales, *shape)
    assert all(np.all(np.isfinite(v)) for v in full)
    assert bad >= 1  # the NaN row
    assert np.all(moves <= CLIP * (1.0 + 1e-6)), moves
    assert moves[3] == 0.0  # the NaN row contributes nothing
    assert np.sum(moves > CLIP * 0.99) >= 2  # the big rows are clipped to C, not lost


def test_the_shapes_take_the_gram_and_the_book_kept_paths_under_the_accelerator_policy():
    """Catches the accelerator policy not reaching the Gram / book-kept ghost paths it claims."""
    with _ghost_policy.use(_ghost_policy.ACCELERATOR):
        for (t, k), formed in zip(SHAPES, (False, True), strict=True):
            p = {"w": jnp.zeros((k, k)), "head": jnp.zeros((k, 2))}
            taps = ghost.plan(extreme_seq_loss, p, jnp.zeros((B, t, k)))[0].taps
            assert [ghost._materialise(tap, B) for tap in taps if tap.k == tap.n] == [formed]


# ------------------------------------------------------------------------------------------------
# the ghost policy forced in one thread must not leak into another.
#
# ghost_clipped_pairs reads the policy twice: once for the summation depth (the clip shrink f)
# and once, through keyed_jit, for the program it runs (and, while tracing, the budgets of every
# layer). With a process-global stack of forced policies, a thread that forces ACCELERATOR
# (``_ghost_policy.use``, e.g. an A/B benchmark or a test runner thread) changes what another
# thread reads between those two reads: a CPU program (more streamed merges: deeper sums) could
# run with ACCELERATOR's shallower depth, i.e. a clip shrink too small for its rounding, or a
# program traced with one thread's budgets could be cached under the other's key.
# ------------------------------------------------------------------------------------------------


def _policy_seen_while_other_thread_forces(policy):
    entered, release = threading.Event(), threading.Event()

    def other():
        with _ghost_policy.use(policy):
            entered.set()
            release.wait(5.0)

    thread = threading.Thread(target=other)
    thread.start()
    try:
        assert entered.wait(5.0)
        return _ghost_policy.current()
    finally:
        release.set()
        thread.join()


def test_policy_forced_in_another_thread_is_not_seen_here():
    """Catches a ghost policy forced in one thread leaking into another thread."""
    baseline = _ghost_policy.current()
    accelerator, cpu = _ghost_policy.ACCELERATOR, _ghost_policy.CPU
    other = accelerator if baseline != accelerator else cpu
    assert _policy_seen_while_other_thread_forces(other) == baseline


def test_policy_forced_here_is_kept_while_another_thread_forces_another():
    """Catches another thread's forced ghost policy overriding this thread's."""
    with _ghost_policy.use(_ghost_policy.CPU):
        seen = _policy_seen_while_other_thread_forces(_ghost_policy.ACCELERATOR)
        assert seen == _ghost_policy.CPU
        assert _ghost_policy.current() == _ghost_policy.CPU
