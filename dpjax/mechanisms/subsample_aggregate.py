"""Subsample-and-aggregate ( Nissim,
Raskhodnikova & Smith 2007).

Split the n records into k disjoint blocks, run any (non-private) estimator on each block,
and release a DP clipped mean of the k block estimates. Changing one record changes one block,
hence at most one of the k estimates, each mapped into [l, u]: the mean of the k mapped
estimates has sensitivity (u − l)/k per coordinate.

Every value is mapped into [l, u] by the non-finite rule of
``dpjax.mechanisms.sensitivity.clip_into_range`` (NaN ↦ (l + u)/2, ±inf and out-of-range values
clipped) before the mean, so the sensitivity holds for every input, NaN and ±inf included.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dpjax import _validate
from dpjax.mechanisms._nonfinite import refuse_nonfinite
from dpjax.mechanisms._vmap_guard import guarded_release, unguarded
from dpjax.mechanisms.gaussian import gaussian
from dpjax.mechanisms.laplace import laplace
from dpjax.mechanisms.sensitivity import clip_into_range

__all__ = [
    "clipped_mean",
    "clipped_mean_sensitivity",
    "subsample_and_aggregate",
    "summation_error_bound",
]

_NOISES = ("laplace", "gaussian")


def clipped_mean_sensitivity(
    *, num_values: int, dim: int, lower: float, upper: float, norm: str
) -> float:
    """Sensitivity of the mean of ``num_values`` vectors clipped to the box [l, u]^dim.

    Replacing one vector moves each coordinate of the mean by at most (u − l)/k, so
    Δ₁ = dim·(u − l)/k (``norm="l1"``) and Δ₂ = √dim·(u − l)/k (``norm="l2"``), under
    ``REPLACE_ONE`` at the level of the k values (k public: it is not a data-dependent count).
    """
    k = _validate.positive_int("num_values", num_values)
    d = _validate.positive_int("dim", dim)
    _validate.one_of("norm", norm, ("l1", "l2"))
    width = _width(lower, upper)
    return (d if norm == "l1" else d**0.5) * width / k


def _width(lower: float, upper: float) -> float:
    for name, v in (("lower", lower), ("upper", upper)):
        _validate.in_range(name, v, float("-inf"), float("inf"), low_inclusive=False)
    if not float(lower) < float(upper):
        _validate.fail("upper", upper, f"greater than lower={lower!r}")
    return float(upper) - float(lower)


@guarded_release("values")
def clipped_mean(
    key: jax.Array,
    values: jax.Array,
    *,
    lower: float,
    upper: float,
    epsilon: float,
    delta: float = 0.0,
    noise: str = "laplace",
) -> jax.Array:
    """DP mean of k values (rows), each mapped coordinate-wise into [lower, upper].

    Args:
        key: a JAX PRNG key, used once.
        values: array of shape (k, ...): one row per contributor (e.g. per block). Finite
            values outside [lower, upper] are clipped. Non-finite values: an eager call with a
            concrete NaN or ±inf raises ``ValueError``; under ``jit`` NaN ↦ (lower + upper)/2
            and ±inf ↦ upper / lower (``dpjax.mechanisms.sensitivity.clip_into_range``).
        lower: l.
        upper: u > l.
        epsilon: ε > 0.
        delta: δ; must be 0 for ``"laplace"`` and in (0, 1) for ``"gaussian"``.
        noise: ``"laplace"`` (ε-DP, ℓ1 sensitivity) or ``"gaussian"`` ((ε, δ)-DP, analytic
            calibration, ℓ2 sensitivity).

    Returns:
        The noisy mean, shape ``values.shape[1:]``, in the working dtype (float64 when x64 is
        on, else float32; cast it down yourself, post-processing). Divided by k, the static
        number of rows (public under ``REPLACE_ONE``), never by a data-dependent count.

    Formal guarantees:
        ε-DP (Laplace; Dwork & Roth 2014, the Laplace mechanism) or (ε, δ)-DP
        (Gaussian, Balle & Wang 2018) under ``REPLACE_ONE`` of one row, with the sensitivity of
        ``clipped_mean_sensitivity``, for every input: the non-finite rule maps every row into
        the box before the mean, so a NaN or ±inf row is just another row in the box.
        Floating point: the values are shifted to [0, u − l] before the sum (so a narrow range
        far from 0 loses no digits), summed in float64 when x64 is on (float32 otherwise),
        and the noise is calibrated to (u − l)/k + ``summation_error_bound`` (the rigorous
        rounding bound 2γ_{k−1}(u − l) + 2u(u − l)(1 + γ_{k−1}) of the computed mean;
        relative 2k²·2⁻⁵³ in float64, 2k²·2⁻²⁴ in float32), so the computed mean of
        neighbours moves by at most the sensitivity used; ``lower`` is added back after the
        noise (post-processing). Formerly a float32 sum of the unshifted values moved the mean
        by 12.5× (u − l)/k at [1e6, 1e6 + 1], k = 100 (Casacuberta et al. 2022). The noise is
        float noise: porous (Mironov 2012); the guarantee is for the real-valued mechanism.
        Not stated
        for ``ADD_OR_REMOVE_ONE``: k is the realised number of rows, which that relation
        changes; pad to a public k (rows of a fixed in-range value) to use it there.
        Under ``jax.vmap``: each row of a vmap that batches ``key`` with distinct keys is its own
        release with this guarantee (account for every row); a vmap of ``values`` with one key for
        all rows raises ``ValueError``, and repeated keys in the batch raise eagerly and void the
        release under ``jit`` (NaN): rows that share a key share one noise draw and would release
        their differences noise-free.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> y = clipped_mean(jax.random.key(0), jnp.array([0.2, 0.4, 3.0]), lower=0.0,
        ...                  upper=1.0, epsilon=1.0)
        >>> y.shape
        ()
    """
    values = jnp.asarray(values)
    refuse_nonfinite("values", values)
    return _noisy_clipped_mean(key, values, lower, upper, epsilon, delta, noise)


def _working_dtype() -> Any:
    """float64 when x64 is on, else float32: the dtype the shifted values are summed in."""
    return jax.dtypes.canonicalize_dtype(jnp.float64)


def summation_error_bound(*, num_values: int, width: float, dtype: Any) -> float:
    """Bound on |t − t′| − width/k for t = fl(fl-sum of k values in [0, width]) / k).

    With u the unit roundoff of ``dtype`` and γ_j = ju/(1 − ju) (Higham 2002, "Accuracy and
    Stability of Numerical Algorithms", §4.2: any summation order), the computed sum ŝ of k
    values in [0, w] satisfies |ŝ − s| ≤ γ_{k−1}·k·w and the division adds |t − ŝ/k| ≤ u·|ŝ|/k
    ≤ u·w(1 + γ_{k−1}). Neighbours move the exact s by ≤ w, so
    |t − t′| ≤ w/k + 2γ_{k−1}·w + 2u·w(1 + γ_{k−1}); this returns the last two terms.
    (Casacuberta, Shoemate, Vadhan & Wagaman 2022, "Widespread underestimation of
    sensitivity in differentially private libraries and how to fix it": float sums exceed
    the real-number sensitivity.)
    """
    k = _validate.positive_int("num_values", num_values)
    u = float(jnp.finfo(dtype).eps) / 2.0
    if (k - 1) * u >= 0.5:
        _validate.fail("num_values", num_values, f"below {int(0.5 / u) + 1} for a {dtype} sum")
    gamma = (k - 1) * u / (1.0 - (k - 1) * u)
    return 2.0 * gamma * width + 2.0 * u * width * (1.0 + gamma)


def _noisy_clipped_mean(
    key: jax.Array,
    values: jax.Array,
    lower: float,
    upper: float,
    epsilon: float,
    delta: float,
    noise: str,
) -> jax.Array:
    """lower + (mean of the shifted, clipped values + calibrated noise).

    Values are shifted to [0, w] (w = upper − lower, rounded to the working dtype) BEFORE the
    sum, so the float sum has no large common offset to lose digits against; the sum is in
    float64 when x64 is on (float32 otherwise), and the sensitivity used for the noise is
    w/k plus ``summation_error_bound``. Adding ``lower`` back is post-processing of the
    noisy release.
    """
    _validate.one_of("noise", noise, _NOISES)
    if values.ndim == 0 or values.shape[0] == 0:
        _validate.fail("values", values.shape, "an array with a non-empty leading axis")
    k = values.shape[0]
    dim = max(int(jnp.size(values) // k), 1)
    _width(lower, upper)
    dtype = _working_dtype()
    width = float(np.asarray(float(upper) - float(lower), dtype=dtype))
    if not width > 0.0:
        _validate.fail("upper", upper, f"greater than lower={lower!r} in {dtype}")
    x = values.astype(dtype) if jnp.issubdtype(values.dtype, jnp.floating) else values
    shifted = clip_into_range(jnp.asarray(x, dtype) - float(lower), lower=0.0, upper=width)
    mean = jnp.sum(shifted, axis=0) / jnp.asarray(k, dtype)
    # the callers' vmap guard has checked key against the values: the noise is not re-guarded
    per_coordinate = width / k + summation_error_bound(num_values=k, width=width, dtype=dtype)
    if noise == "laplace":
        if delta != 0.0:
            _validate.fail("delta", delta, "0 for noise='laplace' (pure ε-DP)")
        noisy = unguarded(laplace)(key, mean, sensitivity=dim * per_coordinate, epsilon=epsilon)
    else:
        sens = dim**0.5 * per_coordinate
        noisy = unguarded(gaussian)(key, mean, sensitivity=sens, epsilon=epsilon, delta=delta)
    return noisy + jnp.asarray(float(lower), dtype)


@guarded_release("data")
def subsample_and_aggregate(
    key: jax.Array,
    data: Any,
    estimator: Callable[[Any], jax.Array],
    *,
    num_blocks: int,
    lower: float,
    upper: float,
    epsilon: float,
    delta: float = 0.0,
    noise: str = "laplace",
    shuffle: bool = True,
) -> jax.Array:
    """Subsample-and-aggregate with a DP clipped mean as aggregator.

    Args:
        key: a JAX PRNG key; split into one key for the partition and one for the noise.
        data: records along the leading axis: an array of shape (n, ...) or a pytree of such
            arrays with the same n.
        estimator: any jax-traceable function from one block (same structure, leading axis
            n // k) to an array of fixed shape; it need not be private, and it may return NaN
            or ±inf (e.g. on a degenerate block or on NaN records): block estimates are never
            refused, they are mapped into [lower, upper] by the non-finite rule (NaN ↦
            (lower + upper)/2, ±inf ↦ upper / lower), eagerly and under ``jit`` alike.
        num_blocks: k, the number of disjoint blocks (1 ≤ k ≤ n). The last n mod k records
            (after shuffling) are dropped so that all blocks have n // k records.
        lower: l: each block estimate is mapped coordinate-wise into [l, u].
        upper: u > l.
        epsilon: ε > 0.
        delta: δ (0 for Laplace; in (0, 1) for Gaussian).
        noise: ``"laplace"`` or ``"gaussian"`` (see ``clipped_mean``).
        shuffle: randomly permute the records before splitting (data-independent, so free in
            privacy; protects the estimator against sorted input).

    Returns:
        The private aggregate, shape of one estimate.

    Formal guarantees:
        Under ``REPLACE_ONE`` (n public) one record lies in exactly one block, so one block
        estimate changes; the mapped estimates lie in [l, u] whatever the records and the
        estimator return (NaN and ±inf included), so their mean has sensitivity (u − l)/k per
        coordinate (plus the float summation bound, see ``clipped_mean``) and the release is
        ε-DP (Laplace) or (ε, δ)-DP (Gaussian) (Nissim, Raskhodnikova & Smith
        2007, theory, subsample-and-aggregate; Nissim, Raskhodnikova & Smith 2007,
        Section 4). The divisor is the public k, and n // k is the static block size. Not
        stated for ``ADD_OR_REMOVE_ONE``: a changed n moves the block boundaries.
        Under ``jax.vmap``: each row of a vmap that batches ``key`` with distinct keys is its own
        release with this guarantee (account for every row); a vmap of ``data`` with one key for all
        rows raises ``ValueError``, and repeated keys in the batch raise eagerly and void the
        release under ``jit`` (NaN): rows that share a key share one noise draw and would release
        their differences noise-free.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> x = jnp.linspace(0.0, 1.0, 1000)
        >>> y = subsample_and_aggregate(jax.random.key(0), x, jnp.mean, num_blocks=50,
        ...                             lower=0.0, upper=1.0, epsilon=1.0)
        >>> y.shape
        ()
    """
    k = _validate.positive_int("num_blocks", num_blocks)
    leaves = jax.tree.leaves(data)
    if not leaves or jnp.ndim(leaves[0]) == 0:
        _validate.fail("data", data, "an array or pytree of arrays with a leading record axis")
    n = jnp.shape(leaves[0])[0]
    if any(jnp.shape(leaf)[0] != n for leaf in leaves):
        _validate.fail("data", [jnp.shape(x) for x in leaves], "leaves with the same leading n")
    if k > n:
        _validate.fail("num_blocks", num_blocks, f"at most n={n}")
    perm_key, noise_key = jax.random.split(key)
    order = jax.random.permutation(perm_key, n) if shuffle else jnp.arange(n)
    size = n // k
    blocks = jax.tree.map(
        lambda leaf: jnp.asarray(leaf)[order[: k * size]].reshape((k, size) + jnp.shape(leaf)[1:]),
        data,
    )
    estimates = jnp.asarray(jax.vmap(estimator)(blocks))
    return _noisy_clipped_mean(noise_key, estimates, lower, upper, epsilon, delta, noise)
