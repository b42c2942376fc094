"""Global sensitivities of the mean, variance and median of bounded data, under both relations.

Data are scalars in [lower, upper]; w = upper − lower. ``n`` is public:

* ``REPLACE_ONE``: both data sets have exactly n records.
* ``ADD_OR_REMOVE_ONE``: n is a public lower bound on the size of the *smaller* data set of
  every neighbouring pair the guarantee covers (the larger one then has ≥ n + 1 records).

Every bound below is tight (attained by a pair of neighbours, shown in each docstring).
A common textbook statement of the sensitivities of mean, variance and median quotes Λ/m
for the mean, Λ²/m for the variance and Λ for the median under replace-one: the mean and median
agree; Λ²/m for the variance is a valid but loose bound (the exact value is (m − 1)Λ²/m²).

**The non-finite rule** (``clip_into_range``; used by every dpjax mechanism that clips to a
public range [lower, upper]: ``clipped_mean``, ``subsample_and_aggregate``, ``bounded_laplace``,
``smooth_median``). Each entry x is mapped, before the sensitivity-bounded step, to

* (lower + upper)/2 if x is NaN,
* min(max(x, lower), upper) otherwise (so +inf ↦ upper and −inf ↦ lower).

The map is data independent and runs under ``jit``, so a NaN record is just another record in
the range and every sensitivity stated for data in [lower, upper] holds for *every* input.
The midpoint is the public value closest, in the worst case, to every value in the range (at
distance ≤ (upper − lower)/2), which halves the worst-case bias a NaN record adds compared with
an end of the range. Separately, ``_nonfinite.refuse_nonfinite`` raises ``ValueError`` eagerly
when a concrete input holds NaN or ±inf (a usage check for the data holder, before any
release); each mechanism says which of the two applies to which argument.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from dpjax import _validate
from dpjax.relation import REPLACE_ONE, NeighbouringRelation, as_relation

__all__ = [
    "clip_into_range",
    "mean_sensitivity",
    "variance_sensitivity",
    "median_sensitivity",
]


def clip_into_range(values: Any, *, lower: float, upper: float) -> jax.Array:
    """The non-finite rule: NaN ↦ (lower + upper)/2, then clip to [lower, upper] (±inf included).

    Args:
        values: an array (or scalar); integer inputs are promoted to the default float dtype.
        lower: public lower end of the range (finite).
        upper: public upper end (finite, > lower).

    Returns:
        An array of the same shape with every entry in [lower, upper]; jit- and vmap-safe.

    Formal guarantees:
        The map is a fixed function of one entry, independent of the data set, so replacing one
        record changes at most one mapped entry, and that entry stays in [lower, upper]: any
        sensitivity proved for data in the range holds for arbitrary (NaN, ±inf) inputs.
        On finite values it is the clip, which is 1-Lipschitz.

    Example:
        >>> import jax.numpy as jnp
        >>> x = jnp.array([jnp.nan, jnp.inf, -jnp.inf, 0.25, 7.0])
        >>> clip_into_range(x, lower=0.0, upper=1.0).tolist()
        [0.5, 1.0, 0.0, 0.25, 1.0]
    """
    lo, hi = float(lower), float(upper)
    _width(lo, hi)
    x = jnp.asarray(values)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(jnp.result_type(float))
    return jnp.clip(jnp.where(jnp.isnan(x), 0.5 * (lo + hi), x), lo, hi)


def _width(lower: float, upper: float) -> float:
    for name, v in (("lower", lower), ("upper", upper)):
        _validate.in_range(name, v, float("-inf"), float("inf"), low_inclusive=False)
    if not float(lower) < float(upper):
        _validate.fail("upper", upper, f"greater than lower={lower!r}")
    return float(upper) - float(lower)


def mean_sensitivity(
    *,
    n: int,
    lower: float = 0.0,
    upper: float,
    relation: NeighbouringRelation | str,
) -> float:
    """Sensitivity of the sample mean of n values in [lower, upper].

    * ``REPLACE_ONE``: w/n (one value moves from lower to upper).
    * ``ADD_OR_REMOVE_ONE``: w/(n + 1): adding z to a set of n values moves the mean by
      (z − mean)/(n + 1); attained by n copies of ``lower`` plus one ``upper``.

    Args:
        n: public number of records (see the module docstring for add/remove).
        lower: lower end of the data range.
        upper: upper end of the data range (> lower).
        relation: the neighbouring relation.

    Returns:
        Δ (ℓ1 = ℓ2 for a scalar query).

    Formal guarantees:
        The Dwork & Roth 2014 and output perturbation (mean estimation, replace-one:
        2c/n for ‖x‖ ≤ c, i.e. w/n for w = 2c) and the textbook sensitivity of the mean
        (Λ/m); add/remove derived above.

    Example:
        >>> mean_sensitivity(n=100, upper=1.0, relation="replace_one")
        0.01
    """
    n = _validate.positive_int("n", n)
    w = _width(lower, upper)
    if as_relation(relation) == REPLACE_ONE:
        return w / n
    return w / (n + 1)


def variance_sensitivity(
    *,
    n: int,
    lower: float = 0.0,
    upper: float,
    relation: NeighbouringRelation | str,
) -> float:
    r"""Sensitivity of the population variance (1/n)Σ(x_i − x̄)² of values in [lower, upper].

    * ``REPLACE_ONE``: (n − 1)w²/n². Replacing x by y changes nV by
      (1 − 1/n)((y − μ)² − (x − μ)²) with μ the mean of the other n − 1 values; attained by
      n − 1 copies of ``lower`` and x = lower → y = upper.
    * ``ADD_OR_REMOVE_ONE``: n w²/(n + 1)². Adding z to n values with mean μ and variance V
      gives V' − V = (n(z − μ)²/(n + 1) − V)/(n + 1); attained by n copies of ``lower`` plus
      one ``upper`` (the decrease is at most (w²/4)/(n + 1), which is smaller).

    For the unbiased variance (1/(n − 1)) multiply the replace-one value by n/(n − 1) (= w²/n).

    Args:
        n: public number of records (n ≥ 1).
        lower: lower end of the data range.
        upper: upper end of the data range (> lower).
        relation: the neighbouring relation.

    Returns:
        Δ of the population variance.

    Formal guarantees:
        Derived in this docstring; textbooks often state the looser
        Λ²/m.

    Example:
        >>> variance_sensitivity(n=2, upper=1.0, relation="replace_one")
        0.25
    """
    n = _validate.positive_int("n", n)
    w = _width(lower, upper)
    if as_relation(relation) == REPLACE_ONE:
        return (n - 1) * w * w / (n * n)
    return n * w * w / ((n + 1) ** 2)


def median_sensitivity(
    *,
    lower: float = 0.0,
    upper: float,
    relation: NeighbouringRelation | str,
) -> float:
    """Global sensitivity of the median of values in [lower, upper]: w under both relations.

    An upper bound for any definition of the median; attained for the lower median
    x_(⌈n/2⌉) (the one ``smooth_median`` releases) by x_1 = … = x_m = lower,
    x_{m+1} = … = x_n = upper and its neighbour with one more ``lower`` (replace-one;
    the median example), or by m − 1 copies of ``lower`` and m of ``upper`` plus one
    added ``lower`` (add/remove): the median jumps from one end of the range to the other. This
    global bound destroys utility; see ``dpjax.mechanisms.smooth_median`` for the
    smooth-sensitivity alternative.

    Formal guarantees:
        Nissim, Raskhodnikova & Smith 2007 (local vs smooth sensitivity of the
        median; Δf = Λ for data in [0, Λ]).
    """
    as_relation(relation)
    return _width(lower, upper)
