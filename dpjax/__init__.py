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

from dpjax import accounting, auditing, dp_sgd, erm, events, mechanisms, tuning
from dpjax._random import os_key
from dpjax._version import __version__
from dpjax._warnings import PrivacyLeakWarning
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
from dpjax.relation import ADD_OR_REMOVE_ONE, REPLACE_ONE, NeighbouringRelation

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
