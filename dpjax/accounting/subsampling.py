"""Privacy amplification by subsampling for a generic (ε, δ)-DP mechanism.

Each sampling scheme comes with the neighbouring relation its amplification theorem is proved
under, and the base mechanism's (ε, δ) must be stated under that same relation (on the
subsample). Mixing them is the sampler/accountant mismatch of the accountant.
"""

from __future__ import annotations

import math

from dpjax import _validate
from dpjax.relation import ADD_OR_REMOVE_ONE, REPLACE_ONE, NeighbouringRelation, as_relation

__all__ = ["SAMPLING_RELATIONS", "amplification_by_subsampling"]

#: The relation under which each sampling scheme's amplification bound holds.
SAMPLING_RELATIONS: dict[str, NeighbouringRelation] = {
    "poisson": ADD_OR_REMOVE_ONE,
    "without_replacement": REPLACE_ONE,
}


def amplification_by_subsampling(
    *,
    epsilon: float,
    delta: float,
    sampling_rate: float,
    sampling: str = "poisson",
    relation: NeighbouringRelation | str | None = None,
) -> tuple[float, float]:
    """(ε, δ) of an (ε, δ)-DP mechanism run on a random subsample: (ln(1 + p(e^ε − 1)), pδ).

    Formal guarantees:
        Privacy amplification by subsampling (Abadi et al. 2016; Balle, Barthe,
        Gaboardi 2018): M(S(x)) is (ln(1 + (e^ε − 1)p), pδ)-DP. The relation matters
        (Balle, Barthe and Gaboardi, "Privacy Amplification by Subsampling", NeurIPS 2018):

        * ``"poisson"`` (each record kept independently with probability p): holds under
          add/remove-one, with the base mechanism (ε, δ)-DP under add/remove-one (Li, Qardaji
          and Su 2012; BBG18 Theorem 8).
        * ``"without_replacement"`` (a uniform subset of m = pn records, n public): holds under
          replace-one, with the base mechanism (ε, δ)-DP under replace-one on size-m data
          (BBG18 Theorem 9).

    Args:
        epsilon: base mechanism's ε in (0, inf).
        delta: base mechanism's δ in [0, 1).
        sampling_rate: p in (0, 1] (m/n for sampling without replacement).
        sampling: ``"poisson"`` or ``"without_replacement"``.
        relation: optional; if given it must be the relation of ``sampling`` (see above),
            otherwise ``ValueError`` — the bound is not claimed under the other relation.

    Returns:
        ``(epsilon_amplified, delta_amplified)`` under ``SAMPLING_RELATIONS[sampling]``.

    Example:
        >>> eps, dlt = amplification_by_subsampling(epsilon=1.0, delta=1e-5, sampling_rate=0.01)
        >>> round(eps, 6), round(dlt, 12)
        (0.017037, 1e-07)
    """
    epsilon = _validate.real("epsilon", epsilon)
    _validate.epsilon("epsilon", epsilon)
    delta = _validate.real("delta", delta)
    _validate.delta("delta", delta)
    sampling_rate = _validate.real("sampling_rate", sampling_rate)
    _validate.probability("sampling_rate", sampling_rate)
    _validate.one_of("sampling", sampling, tuple(SAMPLING_RELATIONS))
    holds_under = SAMPLING_RELATIONS[sampling]
    if relation is not None and as_relation(relation) is not holds_under:
        _validate.fail("relation", relation, f"{holds_under.value!r} for sampling={sampling!r}")
    eps = math.log1p(sampling_rate * math.expm1(epsilon))
    return eps, sampling_rate * float(delta)
