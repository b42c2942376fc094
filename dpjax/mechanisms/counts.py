r"""Noisy histograms as a census publishes them: non-negative integer counts.

The discrete Gaussian mechanism (:func:`dpjax.mechanisms.discrete_gaussian`) releases integer
counts, but some are negative ("unrealistic output": the 2020 US
Census released its tables under zCDP with discrete Gaussian noise and then post-processed them
to non-negative integers consistent with invariant totals). Both steps here are post-processing
of the noisy counts (and of a PUBLIC total), so they cost no privacy, but they bias small counts
upwards (clamping) and move mass between cells (the total): the mechanisms notebook measures it.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dpjax import _validate
from dpjax.events import DiscreteGaussianEvent
from dpjax.mechanisms._vmap_guard import guarded_release, unguarded
from dpjax.mechanisms.discrete_gaussian import discrete_gaussian, sigma_squared_fraction
from dpjax.relation import ADD_OR_REMOVE_ONE, as_relation

__all__ = ["noisy_counts", "noisy_counts_event", "consistent_counts"]


def _l2_sensitivity(relation: Any) -> float:
    """‖h(D) − h(D′)‖₂ of a histogram: 1 (add/remove one record), √2 (replace one)."""
    rel = as_relation(relation)
    return 1.0 if rel is ADD_OR_REMOVE_ONE else 2.0**0.5


def noisy_counts_event(
    *, sigma: Any, relation: Any = ADD_OR_REMOVE_ONE, count: int = 1
) -> DiscreteGaussianEvent:
    """The event of ``count`` :func:`noisy_counts` releases (for the accountant, ``zcdp``).

    Example:
        >>> from dpjax.accounting import PrivacyAccountant
        >>> acc = PrivacyAccountant([noisy_counts_event(sigma=10)])
        >>> round(acc.epsilon(1e-6, accounting="zcdp"), 3)
        0.43
    """
    sigma_squared_fraction(sigma)  # the same σ the sampler accepts
    return DiscreteGaussianEvent(
        sigma=float(sigma),
        sensitivity=_l2_sensitivity(relation),
        count=count,
        relation=as_relation(relation),
    )


def consistent_counts(noisy: Any, total: int, *, key: jax.Array | None = None) -> np.ndarray:
    r"""The non-negative integer vector x with Σx = ``total`` nearest (ℓ2) to ``noisy``.

    Args:
        noisy: integer counts (a release; concrete).
        total: a PUBLIC total (an invariant, or a total released separately with DP).
        key: optional key to break ties at random (else the lowest indices lose first).

    Returns:
        An int64 NumPy array.

    Formal guarantees:
        Post-processing: a function of the release and of public inputs only, so it keeps the
        release's guarantee (Dwork & Roth 2014, Proposition 2.1). x_i = max(y_i − τ, 0) with the
        integer τ for which Σ max(y_i − τ, 0) ≥ total > Σ max(y_i − τ − 1, 0), minus one on
        the surplus among the cells with y_i − τ > 0 (the integer ℓ2 projection onto the
        scaled simplex).

    Example:
        >>> consistent_counts([5, -2, 3], 6).tolist()
        [4, 0, 2]
    """
    y = np.asarray(noisy)
    if not np.issubdtype(y.dtype, np.integer):
        _validate.fail("noisy", f"an array of dtype {y.dtype}", "an integer array")
    y = y.astype(np.int64).ravel()
    n = _validate.integer("total", total, "a non-negative integer")
    if n < 0:
        _validate.fail("total", total, "a non-negative integer")
    if n == 0 or y.size == 0:
        if n > 0:
            _validate.fail("total", total, "0 for an empty histogram")
        return np.zeros(np.shape(noisy), np.int64)

    def mass(tau: int) -> int:
        return int(np.sum(np.maximum(y - tau, 0)))

    lo, hi = int(y.min()) - n - 1, int(y.max())  # mass(lo) ≥ n > mass(hi) = 0
    while hi - lo > 1:  # invariant: mass(lo) ≥ n > mass(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if mass(mid) >= n else (lo, mid)
    x = np.maximum(y - lo, 0)
    surplus = int(x.sum()) - n  # < number of cells with x > 0 (mass(lo + 1) < n)
    positive = np.flatnonzero(x > 0)
    if key is not None:
        positive = positive[np.asarray(jax.random.permutation(key, positive.size))]
    x[positive[:surplus]] -= 1
    return x.reshape(np.shape(noisy))


@guarded_release("counts")
def noisy_counts(
    key: jax.Array,
    counts: Any,
    *,
    sigma: Any,
    total: int | None = None,
    clamp: bool = True,
) -> Any:
    r"""Release a histogram with discrete Gaussian noise as non-negative integers.

    Args:
        key: a JAX PRNG key, used once (split for the noise and the tie-breaking).
        counts: the true counts h(D) (an integer array, one cell per category).
        sigma: σ of the discrete Gaussian noise (see :func:`dpjax.mechanisms.discrete_gaussian`).
        total: optional PUBLIC total; when given the result is the nearest non-negative integer
            vector summing to it (:func:`consistent_counts`; eager, NumPy output).
        clamp: clamp negative counts to 0 (default True; ignored when ``total`` is given).

    Returns:
        int32 counts (a JAX array), or an int64 NumPy array when ``total`` is given.

    Formal guarantees:
        The noisy histogram h(D) + N_ℤ(0, σ²)^k is ρ-zCDP with ρ = Δ₂²/(2σ²) (Canonne, Kamath,
        Steinke 2020, Theorem 14), Δ₂ = 1 when neighbours add or remove one record (one cell
        moves by 1) and Δ₂ = √2 under replace-one (two cells move by 1); the event is
        :func:`noisy_counts_event`. Clamping and the consistent total are post-processing
        (the total must be public or released separately: a private total used here would
        leak). They bias the release: E[max(Y, 0)] ≈ 0.4σ for an empty cell.
        Under ``jax.vmap``: each row of a vmap that batches ``key`` with distinct keys is its own
        release with this guarantee (account for every row); a vmap of ``counts`` with one key for
        all rows raises ``ValueError``, and repeated keys in the batch raise eagerly and void the
        release under ``jit`` (the int32 minimum): rows that share a key share one noise draw and
        would release their differences noise-free.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> y = noisy_counts(jax.random.key(0), jnp.array([120, 0, 3]), sigma=2)
        >>> bool(jnp.all(y >= 0))
        True
    """
    k_noise, k_ties = jax.random.split(key)
    # the outer guard has checked key against counts: no second check
    noisy = unguarded(discrete_gaussian)(k_noise, counts, sensitivity=1, sigma=sigma)
    if total is not None:
        return consistent_counts(noisy, total, key=k_ties)
    return jnp.maximum(noisy, 0) if clamp else noisy
