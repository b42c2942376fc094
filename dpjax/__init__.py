"""dpjax: differentially private optimization in JAX.

Sub-packages:
    dpjax.mechanisms  noise mechanisms and their calibrations
    dpjax.accounting  composition theorems, RDP/PLD accounting, calibration
    dpjax.erm         private convex ERM solvers (output/objective perturbation, DP-GD)
    dpjax.auditing    empirical lower bounds on ε

Security note: JAX's threefry PRNG is fine for research and audits. Releases of real data need
keys seeded from the OS (``os.urandom``) and non-porous noise; see README "Security".
"""

from dpjax import accounting, mechanisms
from dpjax.relation import ADD_OR_REMOVE_ONE, REPLACE_ONE, NeighbouringRelation

__version__ = "0.1.0"

__all__ = [
    "ADD_OR_REMOVE_ONE",
    "REPLACE_ONE",
    "NeighbouringRelation",
    "accounting",
    "mechanisms",
]
