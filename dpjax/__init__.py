"""dpjax: differentially private optimization in JAX.

Sub-packages:
    dpjax.mechanisms  noise mechanisms and their calibrations
    dpjax.accounting  composition theorems, RDP/PLD accounting, calibration
    dpjax.erm         private convex ERM solvers (output/objective perturbation, DP-GD)
    dpjax.auditing    empirical lower bounds on ε

Security note: JAX's threefry PRNG is fine for research and audits. Releases of real data need
keys seeded from the OS (``os.urandom``) and non-porous noise; see README "Security".
"""

from dpjax import accounting, auditing, erm, mechanisms
from dpjax.clipping import ClippedGrad, ClippingInfo, clipped_grad
from dpjax.distributed import data_parallel
from dpjax.optimizers import accumulate_clipped_sums, dpsgd, laplace_dpsgd, laplace_dpsgd_event
from dpjax.relation import ADD_OR_REMOVE_ONE, REPLACE_ONE, NeighbouringRelation
from dpjax.samplers import (
    PaddedBatch,
    PoissonSampler,
    ShuffledBatchSampler,
    UniformBatchSampler,
)
from dpjax.transforms import add_gaussian_noise, add_laplace_dpsgd_noise, normalize_by

__version__ = "0.1.0"

__all__ = [
    "ADD_OR_REMOVE_ONE",
    "REPLACE_ONE",
    "NeighbouringRelation",
    "accounting",
    "auditing",
    "erm",
    "mechanisms",
    # DP-SGD (issue 4)
    "ClippedGrad",
    "ClippingInfo",
    "clipped_grad",
    "data_parallel",
    "accumulate_clipped_sums",
    "dpsgd",
    "laplace_dpsgd",
    "laplace_dpsgd_event",
    "PaddedBatch",
    "PoissonSampler",
    "ShuffledBatchSampler",
    "UniformBatchSampler",
    "add_gaussian_noise",
    "add_laplace_dpsgd_noise",
    "normalize_by",
]
