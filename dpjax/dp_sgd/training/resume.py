"""Continuing a run's state: under another plan (a new phase), or re-keyed for a re-run.

:meth:`Resuming.continue_from` (a mixin of :class:`~dpjax.dp_sgd.PrivateTraining`) appends a
phase to the state's ledger, refuses a state of another privacy unit, of another optimizer or
from/to correlated noise, and with ``key=`` replaces the sampling key and every noise state's
key data, so a second run from one checkpoint never replays the first one's batches and noise.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from dpjax import _validate
from dpjax.dp_sgd import adaptive_clip
from dpjax.dp_sgd.training import ledger as _plan
from dpjax.dp_sgd.training.inputs import _check_key
from dpjax.dp_sgd.training.state import PrivateState, _as_private_state, _steps_of
from dpjax.dp_sgd.transforms import rekeyed_noise_states

__all__ = ["Resuming"]


class Resuming:
    """``continue_from`` of a :class:`~dpjax.dp_sgd.PrivateTraining` (a mixin of it).

    Reads ``l2_clip_norm`` and the private ``_plan``, ``_impl``, ``_start``,
    ``_fresh_state`` and ``_refuse_another_unit`` of the training object.
    """

    def continue_from(self, state: PrivateState, *, key: jax.Array | None = None) -> PrivateState:
        """Continue a run made under ANOTHER plan (σ, q, C, n, …) with this one, or re-key it.

        The keys of ``state`` continue (nothing is replayed), and a new phase is recorded in
        its ledger from the current step on, so :meth:`epsilon` reports the composition of
        every phase (not the cost of this plan's steps alone). A state already in this plan
        is returned unchanged (re-keyed with ``key``). Counts as this object's run (see
        :meth:`init`).

        Re-running from one checkpoint (e.g. again after deleting a record, to "unlearn" it)
        must pass a NEW ``key``: without it, the re-run draws the same batches and the same
        noise as the first continuation, so the difference of the two runs' parameters is
        the noise-free difference of their clipped sums (it shows whether, and how, the
        deleted record moved the model whenever it was sampled). With ``key`` every later
        batch, dropout mask and noise draw comes from ``key`` (the sampling key and every
        noise state's key data are replaced; counts, optimizer moments and correlated-noise
        buffers are kept). Releasing both runs still costs the steps after the checkpoint
        twice: ``epsilon`` of each state counts one run only.

        Args:
            state: the :class:`PrivateState` of the earlier phase(s) (the optimizer state must
                have this object's structure: same optimizer transformations).
            key: None (continue the state's key streams: a plain resume), or a NEW JAX PRNG
                key of this object's implementation (e.g. ``dpjax.os_key()``; never one used
                before) from which the rest of the run is drawn.

        Returns:
            The state to pass to ``step``/``fit`` of this object.

        Raises:
            ValueError: ``state`` has no valid ledger, a phase of another privacy unit
                (example level vs user level, or another grouping of users), a change from
                or to a correlated-noise plan (``noise=BandMF``), an optimizer state of
                another structure than this object's optimizer (e.g. an ``optax.sgd`` run
                continued under ``optax.adam``), or this object already ran; ``key`` of
                another PRNG implementation.
            TypeError: ``key`` is not a JAX PRNG key.
        """
        state = _as_private_state(state)
        step = _steps_of(state)
        phases = _plan.read_ledger(state.plan, step)
        self._refuse_another_unit(phases)
        adaptive_clip.check_continuable(state.opt_state, self.l2_clip_norm)
        same_plan = phases[-1][0] == self._plan
        if not same_plan and (phases[-1][0].bands or self._plan.bands):
            _validate.fail(
                "state",
                "a phase change from or to correlated noise (make_private(noise=BandMF(...)))",
                "a state of this plan: the noise buffers would carry one strategy's past noise "
                "into another's rows, so the phases would not be the independent mechanisms "
                "that ε composes; start a new run",
            )
        self._refuse_another_optimizer(state.opt_state)
        new_key = None if key is None else self._check_new_key(key)
        self._start("continue_from")
        if new_key is not None:
            state = _rekeyed(state, new_key)
        if same_plan:
            return state
        ledger = _plan.append_phase(state.plan, self._plan, step)
        return state._replace(plan=jnp.asarray(ledger))

    def _check_new_key(self, key: Any) -> jax.Array:

        key = _check_key(key)
        if jax.random.key_impl(key) != self._impl:
            _validate.fail(
                "key",
                f"a key of PRNG implementation {jax.random.key_impl(key)}",
                f"a key of this run's implementation ({self._impl}): the state's key data is "
                "wrapped with it at every step",
            )
        return key

    def _refuse_another_optimizer(self, opt_state: Any) -> None:
        """Refuse an optimizer state whose transformations are not this object's (compared by
        the types of its optax/dpjax state nodes, not by the parameters' shapes): it would
        fail inside the first step (e.g. ``EmptyState`` has no ``mu`` for an sgd run
        continued under adam)."""
        try:
            template = jax.eval_shape(
                lambda p: self._fresh_state(p).opt_state, jnp.zeros((), jnp.float32)
            )
        except Exception:  # an optimizer whose init needs the real parameters: step checks
            return
        have, want = _state_skeleton(opt_state), _state_skeleton(template)
        if have != want:
            _validate.fail(
                "state",
                f"an optimizer state of other transformations ({_skeleton_names(have)})",
                f"a state of this object's optimizer ({_skeleton_names(want)}): continue a "
                "run with the optimizer it was trained with (its moments are part of the "
                "state), or start a new run",
            )


def _rekeyed(state: PrivateState, key: jax.Array) -> PrivateState:
    """``state`` with its sampling key and every noise state's key data drawn from ``key``."""
    train_key, noise_key = jax.random.split(key)
    return state._replace(
        key=jax.random.key_data(train_key),
        opt_state=rekeyed_noise_states(state.opt_state, noise_key),
    )


def _is_state_node(x: Any) -> bool:
    """A NamedTuple state of an optax or dpjax transformation (not ``optax.MaskedNode``, which
    stands for a masked-out parameter leaf inside a parameter-shaped tree)."""
    module = type(x).__module__ or ""
    return (
        isinstance(x, tuple)
        and hasattr(x, "_fields")
        and module.startswith(("optax", "dpjax"))
        and type(x).__name__ != "MaskedNode"
    )


def _holds_state_nodes(x: Any) -> bool:
    return any(_is_state_node(n) for n in jax.tree.leaves(x, is_leaf=_is_state_node))


def _state_skeleton(x: Any) -> Any:
    """The nesting of the transformation states in an optimizer state, with every subtree that
    holds no transformation state (parameter-shaped moments, counts, None) as ``"*"``."""
    if not _holds_state_nodes(x) and not _is_state_node(x):
        return "*"
    if _is_state_node(x):
        return (type(x).__qualname__, tuple(_state_skeleton(v) for v in x))
    if isinstance(x, (tuple, list)):
        return ("seq", tuple(_state_skeleton(v) for v in x))
    if isinstance(x, dict):
        return ("dict", tuple((k, _state_skeleton(x[k])) for k in sorted(x, key=str)))
    return "*"


def _skeleton_names(skeleton: Any) -> str:
    """The state types of a skeleton, in order (for error messages)."""
    if not isinstance(skeleton, tuple):
        return ""
    head, children = skeleton
    inner = [n for c in children for n in [_skeleton_names(c[1] if head == "dict" else c)] if n]
    names = ([] if head in ("seq", "dict") else [head]) + inner
    return ", ".join(names)
