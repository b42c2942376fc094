r"""Per-backend memory choices of ghost clipping: CPU budgets or accelerator budgets.

Ghost clipping (:mod:`dpjax.dp_sgd.ghost`) chooses at trace time, from static shapes, how to
evaluate each sequence (T > 1) layer: per-example gradients formed once and reused for the norm
and the sum (book-keeping) when ``B·K·N`` fits a budget, else Gram norms with per-example
matrices streamed through the sum in chunks, and, where the Gram bound is loose, an accurate
branch that forms every example's matrix on its own. On a CPU the budgets are small and the
accurate branch loops one example at a time: sequential work is cheap there and fresh memory
pages are not. On a GPU (or TPU) each loop iteration and each ``lax.cond`` is a launch sequence
and a host round trip, and memory is large and fast, so the same layer is better formed for the
whole batch at once.

Found (transformer 2×256, T = 128, B = 32): the output head (K·N = 256·8192,
B·K·N = 2²⁶ entries) exceeds the CPU budget 2²³, so it takes the Gram path; its fast bound is
19% loose on the benchmark data (P² ≫ ‖∇W‖² for near-orthogonal positions), so the accurate
branch ran on every step: a ``lax.cond``, 32 sequential per-example (256, 8192) products, then
4 sequential chunks for the streamed sum. Under :data:`ACCELERATOR` the head is formed once
for the batch (no Gram, no cond, no loop). NVIDIA H200, jax 0.11.2, ``python -m benchmarks
--quick --repeats 11 --only transformer``: DP step 3.8 → 3.2 ms against 2.4 ms non-private
(1.55× → 1.30×), compile 1.88× → 1.24×; same-process A/B (``python -m
benchmarks.ghost_policy``): 4.64 ms (CPU policy) vs 4.23 ms (accelerator policy), 3.24 ms
non-private.

The policy only changes WHICH of the existing, equally certified evaluations ghost uses, never
a bound: book-keeping certifies the norm of the formed matrix (what the sum receives), the
streamed sum's extra merges are counted in the summation depth from the same policy, and the
accurate branch's per-example matrices have the same entrywise error bound (γ_T of a T-term
dot product) whether one or sixteen are formed by one batched product. To keep the depth the
clip shrink uses and the traced program consistent, :func:`keyed_jit` makes the policy a static
argument of the jitted ghost step: a program traced under one policy is never reused under
another.

Injectable: :func:`use` forces a policy (tests force :data:`ACCELERATOR` on the CPU so the
accelerator path stays exercised there).

Formal guarantees:
    None of its own: under every policy ghost's guarantee holds unchanged (each example's
    contribution, as computed, has ℓ2 norm ≤ f·C and the released sum is within f·C·rel of the
    exact sum, so ℓ2 sensitivity C under add/remove-one; Abadi et al. 2016, "Deep Learning with
    Differential Privacy", §3.1), because every bound it uses holds for any summation order
    and batching of the same dot products (Higham, "Accuracy and Stability of Numerical
    Algorithms", 2nd ed., Lemma 3.1 and §3.1) and f is computed from the policy the program
    is traced under (:func:`keyed_jit`).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator
from typing import NamedTuple

import jax

from dpjax import _validate

__all__ = ["GhostPolicy", "CPU", "ACCELERATOR", "current", "for_platform", "use", "keyed_jit"]


class GhostPolicy(NamedTuple):
    """Budgets of one backend (all public, static; ``None`` keeps ghost's CPU constant).

    Attributes:
        name: a label (``"cpu"``, ``"accelerator"``) for reports and jit keys.
        materialise_budget: a T > 1 layer whose Gram norms cost at least half of forming its
            per-example gradients is formed for the whole batch when ``B·K·N`` entries (wide
            dtype) fit this budget (book-keeping: no Gram, no retry, no streamed sum).
        stream_budget: entries of per-example ``(K, N)`` matrices formed at once by the
            streamed clipped sum of a Gram layer (fewer sequential merges where larger).
        map_batch: examples whose matrices the accurate branch forms in one batched product
            (``lax.map(..., batch_size=)``); ``None`` forms them one at a time.
    """

    name: str
    materialise_budget: int | None
    stream_budget: int | None
    map_batch: int | None


CPU = GhostPolicy("cpu", None, None, None)

# 2²⁸ entries: 1 GiB in float32 (2 GiB under x64) for one layer's (B, K, N) stack; the
# transformer's head at B = 128 (2²⁸) fits, and an 80 GB card holds several such layers.
ACCELERATOR = GhostPolicy("accelerator", 2**28, 2**28, 16)

# a device with less memory gets per-layer budgets of memory/256 bytes entries (1/64 of it in
# float32: every book-kept layer stays alive until the clipped sums), never below the CPU's
_BYTES_PER_ENTRY = 256
_LEAST_BUDGET = 2**23

# the stack of forced policies, per thread (and per asyncio task): a policy forced in one
# thread must not change what another thread reads between its depth and its program
_FORCED: contextvars.ContextVar[tuple[GhostPolicy, ...]] = contextvars.ContextVar(
    "dpjax_ghost_policy_forced", default=()
)


def for_platform(platform: str, memory_bytes: int | None = None) -> GhostPolicy:
    """:data:`CPU` for ``"cpu"``, else :data:`ACCELERATOR` sized to the device's memory.

    Args:
        platform: ``jax.default_backend()`` (``"cpu"``, ``"gpu"``, ``"tpu"``, ...).
        memory_bytes: the device's memory limit where known; budgets are capped at
            ``memory_bytes / 256`` entries (at least 2²³, at most :data:`ACCELERATOR`'s).

    Returns:
        The policy.
    """
    if platform == "cpu":
        return CPU
    if memory_bytes is None:
        return ACCELERATOR
    top = ACCELERATOR.materialise_budget
    per_layer = int(max(_LEAST_BUDGET, min(top, int(memory_bytes) // _BYTES_PER_ENTRY)))
    if per_layer == top:
        return ACCELERATOR
    return ACCELERATOR._replace(materialise_budget=per_layer, stream_budget=per_layer)


@functools.lru_cache(maxsize=8)
def _device_memory(platform: str) -> int | None:
    """``bytes_limit`` of the default device where the runtime reports it, else None."""
    try:
        stats = jax.devices()[0].memory_stats() or {}
    except Exception:  # noqa: BLE001 - not every backend reports memory
        return None
    limit = stats.get("bytes_limit")
    return int(limit) if limit else None


def current() -> GhostPolicy:
    """The policy in force: the innermost :func:`use`, else the default backend's."""
    forced = _FORCED.get()
    if forced:
        return forced[-1]
    platform = jax.default_backend()
    if platform == "cpu":
        return CPU
    return for_platform(platform, _device_memory(platform))


@contextlib.contextmanager
def use(policy: GhostPolicy) -> Iterator[GhostPolicy]:
    """Force ``policy`` for ghost calls traced inside the block (tests, A/B timings).

    The forcing is local to the calling thread (a context variable): other threads keep
    their own policy.

    Raises:
        ValueError: ``policy`` is not a :class:`GhostPolicy`.
    """
    if not isinstance(policy, GhostPolicy):
        _validate.fail("policy", policy, "a GhostPolicy (e.g. CPU or ACCELERATOR)")
    token = _FORCED.set((*_FORCED.get(), policy))
    try:
        yield policy
    finally:
        _FORCED.reset(token)


def budget(value: int | None, default: int) -> int:
    """``value`` where the policy sets one, else ghost's (CPU) ``default``."""
    return default if value is None else int(value)


def keyed_jit(fn: Callable, static_argnums: tuple[int, ...]) -> Callable:
    """``jax.jit(fn)`` whose cache is also keyed by :func:`current`, traced under that policy.

    The caller computes the summation depth (hence the clip shrink) from :func:`current` just
    before the call; the program it runs is traced under the same policy, never a cached
    program from another.
    """

    def under(policy: GhostPolicy, *args):
        with use(policy):
            return fn(*args)

    jitted = jax.jit(under, static_argnums=(0, *(i + 1 for i in static_argnums)))

    @functools.wraps(fn)
    def call(*args):
        return jitted(current(), *args)

    return call
