"""dpjax: differentially private optimization in JAX.

Sub-packages:
    dpjax.mechanisms  noise mechanisms and their calibrations
    dpjax.accounting  composition theorems, RDP/PLD accounting, calibration
    dpjax.dp_sgd       DP-SGD parts: samplers, per-example clipping, noise transforms, optimizers
    dpjax.erm         private convex ERM solvers (output/objective perturbation, DP-GD)
    dpjax.auditing    empirical lower bounds on ε
    dpjax.tuning      private hyperparameter selection (Papernot & Steinke 2022)

Ground floor: ``dpjax.relation`` (neighbouring relations), ``dpjax.events`` (the privacy events
that mechanisms, samplers and solvers emit and accountants consume), ``dpjax.typing``.

Security note: JAX's threefry PRNG is fine for research and audits. Releases of real data need
keys seeded from the OS (:func:`dpjax.os_key`) and non-porous noise; see the soundness guide
(docs/guides/soundness.md, "Releasing real data").
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dpjax._version import __version__
from dpjax._warnings import PrivacyLeakWarning
from dpjax.relation import ADD_OR_REMOVE_ONE, REPLACE_ONE, NeighbouringRelation

if TYPE_CHECKING:  # what the lazy names below resolve to (for type checkers and editors)
    from dpjax import accounting, auditing, dp_sgd, erm, events, mechanisms, tuning
    from dpjax._random import os_key
    from dpjax.dp_sgd import (
        ClippedGrad,
        ClippingInfo,
        PaddedBatch,
        PoissonSampler,
        ShuffledBatchSampler,
        UniformBatchSampler,
        accumulate_clipped_sums,
        add_gaussian_noise,
        add_laplace_dp_sgd_noise,
        clipped_grad,
        data_parallel,
        dp_sgd_optimizer,
        laplace_dp_sgd_event,
        laplace_dp_sgd_optimizer,
        make_private,
        normalize_by,
    )

# Loaded on first use (PEP 562): ``import dpjax`` imports neither JAX nor dp-accounting, SciPy or
# scikit-learn, so a console script's ``--help`` is instant. ``dpjax.accounting``, ``from dpjax
# import make_private`` and ``import dpjax.erm`` work as before: each imports its room (and JAX)
# when first asked for.
_SUBPACKAGES = ("accounting", "auditing", "dp_sgd", "erm", "events", "mechanisms", "tuning")
_FROM_DP_SGD = (
    "ClippedGrad",
    "ClippingInfo",
    "PaddedBatch",
    "PoissonSampler",
    "ShuffledBatchSampler",
    "UniformBatchSampler",
    "accumulate_clipped_sums",
    "add_gaussian_noise",
    "add_laplace_dp_sgd_noise",
    "clipped_grad",
    "data_parallel",
    "dp_sgd_optimizer",
    "laplace_dp_sgd_event",
    "laplace_dp_sgd_optimizer",
    "make_private",
    "normalize_by",
)


def __getattr__(name: str) -> Any:
    """Import a room (``dpjax.accounting``, ...) or a DP-SGD entry point on first access."""
    if name in _SUBPACKAGES:
        value = importlib.import_module(f"dpjax.{name}")
    elif name == "os_key":
        value = importlib.import_module("dpjax._random").os_key
    elif name in _FROM_DP_SGD:
        value = getattr(importlib.import_module("dpjax.dp_sgd"), name)
    else:
        raise AttributeError(f"module 'dpjax' has no attribute {name!r}")
    globals()[name] = value  # the next access is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "__version__",
    "ADD_OR_REMOVE_ONE",
    "REPLACE_ONE",
    "NeighbouringRelation",
    "PrivacyLeakWarning",
    "accounting",
    "auditing",
    "dp_sgd",
    "dp_sgd_optimizer",
    "erm",
    "events",
    "mechanisms",
    "os_key",
    "tuning",
    # DP-SGD in one call, then the parts (see dpjax.dp_sgd)
    "make_private",
    "ClippedGrad",
    "ClippingInfo",
    "clipped_grad",
    "dp_sgd_optimizer",
    "data_parallel",
    "accumulate_clipped_sums",
    "laplace_dp_sgd_optimizer",
    "laplace_dp_sgd_event",
    "PaddedBatch",
    "PoissonSampler",
    "ShuffledBatchSampler",
    "UniformBatchSampler",
    "add_gaussian_noise",
    "add_laplace_dp_sgd_noise",
    "normalize_by",
]
