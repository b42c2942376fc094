"""The training room: DP-SGD in one call, the training object, its states and its accounting.

Modules, from the bottom up (each imports only modules listed before it):

- ``ledger``: the plan ledger, one exact ``uint32`` row per phase of a run (σ, q, C, the
  normaliser, n, the cap, the relation, adaptive clipping's config, the privacy unit).
- ``state``: :class:`PrivateState` (the SECRET checkpoint) and :class:`PublicState`.
- ``accounting``: ε of a state's phases, composed, the truncation slack included
  (``PhaseAccounting``, a mixin of the training object), and the bounds ``make_private``
  uses before a run.
- ``step``: one jit-compiled DP-SGD update (``Stepping``, a mixin of the training object).
- ``resume``: ``continue_from`` (``Resuming``, a mixin of the training object): another plan's
  state as a new phase, or the state re-keyed (``key=``) for a re-run from a checkpoint; it
  reads the key check of ``factory`` at call time.
- ``hooks``: the callbacks of ``fit`` (evaluate on public data, checkpoint, log, stop
  early) and its lazily accounted history.
- ``loop``: :class:`PrivateTraining`: the run's keys and states, ``public_state`` and the
  training loop ``fit``.
- ``inputs``: the checks of ``make_private``'s arguments that need more than a range (σ the
  accountant can handle, a noise std float32 holds).
- ``models``: :func:`nnx_loss`, a per-example loss from a flax nnx Module.
- ``factory``: :func:`make_private` (arguments checked, schedule, σ, the sampler's cap) and
  :func:`poisson_schedule`.

User-level DP-SGD (:mod:`dpjax.dp_sgd.user_level`) subclasses ``loop.PrivateTraining``;
``factory`` imports it inside ``make_private`` only, so no module of this package imports
one that imports it back.
"""

from dpjax.dp_sgd.training.factory import make_private, poisson_schedule
from dpjax.dp_sgd.training.hooks import (
    Callback,
    Checkpoint,
    CSVLogger,
    EarlyStopping,
    Evaluate,
    FitRun,
    restore_checkpoint,
)
from dpjax.dp_sgd.training.loop import PrivateTraining
from dpjax.dp_sgd.training.models import nnx_loss
from dpjax.dp_sgd.training.state import PrivateState, PublicState

__all__ = [
    "CSVLogger",
    "Callback",
    "Checkpoint",
    "EarlyStopping",
    "Evaluate",
    "FitRun",
    "PrivateState",
    "PrivateTraining",
    "PublicState",
    "make_private",
    "nnx_loss",
    "poisson_schedule",
    "restore_checkpoint",
]
