"""The state of a DP-SGD run: the SECRET checkpoint and what may be published of it.

:class:`PrivateState` (step count, key data, optimizer state, plan ledger) resumes a run and
must stay secret; :class:`PublicState` is what
:meth:`~dpjax.dp_sgd.PrivateTraining.public_state` returns for publication next to the
parameters (no key data, no randomness). The two helpers read a state on the host.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax

from dpjax import _validate

__all__ = ["PrivateState", "PublicState"]


class PrivateState(NamedTuple):
    """Training state of :class:`PrivateTraining`: a SECRET checkpoint (a pytree of arrays).

    It holds the key data from which every later batch and noise draw is derived: given it,
    one later model reveals a noise-free clipped sum (issue 20). Save it to resume a run and
    keep it private; publish :meth:`PrivateTraining.public_state` instead.

    Attributes:
        step: int32 scalar, noisy updates applied so far (what ``epsilon`` reads).
        key: uint32 raw key data for sampling and dropout, split at every step (SECRET).
        opt_state: the optax state of noise (its own key data, SECRET) → ÷ q·n → optimizer.
            With ``noise=BandMF(b)`` the noise state also holds the past noise and the keyed
            digest of the data's row order (both SECRET; see
            :mod:`~dpjax.dp_sgd.matrix_factorization.row_order`).
        plan: uint32[k, 29] ledger of the run's phases (exact σ, q, C, normaliser, n, cap,
            relation, start step, adaptive clipping's (γ, η, σ_b), the privacy unit and the
            correlated noise (bands, strategy digest) of each; public): ``step``/``fit``
            refuse a state whose current phase is another plan, ``epsilon`` composes every
            phase
            (:meth:`PrivateTraining.continue_from` opens a new one).
    """

    step: jax.Array
    key: jax.Array
    opt_state: Any
    plan: jax.Array


class PublicState(NamedTuple):
    """What may be published of a run besides its parameters (no key data, no randomness).

    Built by :meth:`PrivateTraining.public_state`.

    Attributes:
        step: noisy updates applied so far.
        opt_state: the optimizer state with every noise state reduced to its count
            (:func:`~dpjax.dp_sgd.public_opt_state`): moments are post-processing.
        plan: the phase ledger (see :class:`PrivateState`).
        epsilon: ε of the whole run at ``delta`` (every phase composed, slack included).
        delta: δ of that guarantee.
    """

    step: jax.Array
    opt_state: Any
    plan: jax.Array
    epsilon: float
    delta: float


def _as_private_state(state: Any) -> PrivateState:
    """``state`` if it is a :class:`PrivateState` (a pre-ledger 3-field state is refused)."""
    if not isinstance(state, PrivateState):
        _validate.fail(
            "state",
            type(state).__name__,
            "a PrivateState from init / step / fit / continue_from (a PublicState holds no "
            "keys and cannot be stepped)",
        )
    return state


def _steps_of(state: Any) -> int:
    """The step count t ≥ 0 of a state (read on the host) or an integer."""
    is_state = isinstance(state, (PrivateState, PublicState))
    value = jax.device_get(state.step) if is_state else state
    t = _validate.integer("state.step", value)
    _validate.non_negative("state.step", t)
    return t
