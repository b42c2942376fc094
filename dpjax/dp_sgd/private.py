"""``dpjax.dp_sgd.private``: the former home of ``make_private``, kept as a re-export.

The training room is the package :mod:`dpjax.dp_sgd.training`: :func:`make_private` and
:func:`poisson_schedule` in ``training.factory``, :class:`PrivateTraining` and ``fit`` in
``training.loop``, the update in ``training.step``, ε of a run's phases and
:data:`SLACK_FRACTION` in ``training.accounting``, :class:`PrivateState` /
:class:`PublicState` in ``training.state``, the plan ledger in ``training.ledger`` and
:func:`nnx_loss` in ``training.models``. Import from :mod:`dpjax.dp_sgd` (or ``dpjax``); the
names below stay importable from here.
"""

from dpjax.dp_sgd.training.accounting import NOT_PRIVATE_EPSILON, SLACK_FRACTION
from dpjax.dp_sgd.training.factory import ACCOUNTING_METHODS, make_private, poisson_schedule
from dpjax.dp_sgd.training.loop import PrivateTraining
from dpjax.dp_sgd.training.models import nnx_loss
from dpjax.dp_sgd.training.state import PrivateState, PublicState

__all__ = [
    "ACCOUNTING_METHODS",
    "NOT_PRIVATE_EPSILON",
    "SLACK_FRACTION",
    "PrivateState",
    "PublicState",
    "PrivateTraining",
    "make_private",
    "nnx_loss",
    "poisson_schedule",
]
