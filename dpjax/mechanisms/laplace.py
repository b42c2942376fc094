"""The Laplace mechanism (Dwork & Roth 2014, "the Laplace mechanism") and its
utility statements."""

from __future__ import annotations

import math
from typing import Any

import jax

from dpjax import _validate
from dpjax._noise import tree_add_noise
from dpjax.mechanisms._nonfinite import zero_nonfinite
from dpjax.mechanisms._scale import LAPLACE_SUPPORT, refuse_overflowing_noise
from dpjax.mechanisms._vmap_guard import guarded_release

__all__ = [
    "laplace",
    "laplace_scale",
    "laplace_expected_l1_error",
    "laplace_linf_tail_bound",
]


def laplace_scale(*, sensitivity: float, epsilon: float) -> float:
    r"""Scale b of the Laplace mechanism: :math:`b = \Delta_1 / \varepsilon`.

    Args:
        sensitivity: ℓ1 sensitivity Δ₁ of the query under the caller's neighbouring relation.
        epsilon: privacy parameter ε > 0.

    Returns:
        The Laplace scale b (noise density ∝ exp(−|z|/b)).

    Formal guarantees:
        Adding Lap(b) noise with b = Δ₁/ε to each coordinate of f(D) is (ε, 0)-DP under the
        relation Δ₁ was computed for (Dwork & Roth 2014, the Laplace mechanism;
        Dwork & Roth 2014, Thm 3.6).

    Example:
        >>> laplace_scale(sensitivity=1.0, epsilon=0.5)
        2.0
    """
    _validate.positive("sensitivity", sensitivity)
    _validate.epsilon("epsilon", epsilon)
    return float(sensitivity) / float(epsilon)


@guarded_release("value")
def laplace(key: jax.Array, value: Any, *, sensitivity: float, epsilon: float) -> Any:
    r"""Release ``value + Lap(Δ₁/ε)`` with independent noise on every coordinate.

    Args:
        key: a JAX PRNG key, used once.
        value: the exact query answer f(D): a scalar, an array or a pytree of arrays.
            Non-finite entries (unbounded sensitivity) raise ``ValueError`` when concrete and
            are replaced by 0 before the noise under ``jit``/``vmap``.
        sensitivity: ℓ1 sensitivity Δ₁ of f over all coordinates (of the whole pytree),
            under the neighbouring relation the caller protects.
        epsilon: privacy parameter ε > 0.

    Returns:
        A pytree with the structure of ``value`` (floating dtype): the noisy answer.

    Raises:
        ValueError: invalid ε or sensitivity; a concrete non-finite ``value``; a sensitivity
            so large that value + noise (up to 44.4b) overflows the value's float dtype to
            ±inf (the message gives the largest admissible sensitivity).

    Formal guarantees:
        (ε, 0)-DP under the relation for which Δ₁ holds (Dwork & Roth 2014, the
        Laplace mechanism; Dwork & Roth 2014, Thm 3.6). The non-finite rule makes every
        released coordinate finite-plus-noise: never inf/NaN without noise. Utility:
        E‖M(D) − f(D)‖₁ = kΔ₁/ε and P[‖M(D) − f(D)‖_∞ ≥ (Δ₁/ε) ln(k/β)] ≤ β for k
        coordinates (same reference).
        Input dtype: ``value`` is never rounded before the noise. A concrete value that the
        noise dtype cannot hold exactly (float64 or a wide integer while JAX computes in
        float32) is added to the noise in float64 on the host and rounded once after;
        traced wide integers are clamped (1-Lipschitz) into float32's exact range; an inexact
        float64 constant closed over inside ``jit`` raises ``ValueError``
        (:func:`dpjax._noise.exact_sum_with_noise`).
        Not guarded: ``jax.pmap`` / ``shard_map`` with ONE key replicated to every device
        gives every device's rows the same noise draw; pass one key per device (e.g.
        ``jax.random.fold_in(key, jax.lax.axis_index(name))``) and account for every device.
        Under ``jax.vmap``: each row of a vmap that batches ``key`` with distinct keys is its own
        release with this guarantee (account for every row); a vmap of ``value`` with one key for
        all rows raises ``ValueError``, and repeated keys in the batch raise eagerly and void the
        release under ``jit`` (NaN): rows that share a key share one noise draw and would release
        their differences noise-free.

    Security:
        Floating-point Laplace noise is porous (Mironov 2012): fine for research and audits,
        not for releasing real data. Use OS-seeded keys and non-porous noise for releases.

    Example:
        >>> import jax
        >>> y = laplace(jax.random.key(0), 3.0, sensitivity=1.0, epsilon=1.0)
        >>> y.shape
        ()
    """
    value = zero_nonfinite("value", value)
    scale = laplace_scale(sensitivity=sensitivity, epsilon=epsilon)
    refuse_overflowing_noise(
        value,
        scale,
        support=LAPLACE_SUPPORT,
        sensitivity=sensitivity,
        context=f"epsilon={epsilon!r}",
    )
    return tree_add_noise(key, value, jax.random.laplace, scale)


def laplace_expected_l1_error(*, k: int, sensitivity: float, epsilon: float) -> float:
    """Expected ℓ1 error of the Laplace mechanism on k coordinates: kΔ₁/ε."""
    k = _validate.positive_int("k", k)
    return k * laplace_scale(sensitivity=sensitivity, epsilon=epsilon)


def laplace_linf_tail_bound(*, k: int, sensitivity: float, epsilon: float, beta: float) -> float:
    r"""ℓ∞ error exceeded with probability at most β: :math:`(\Delta_1/\varepsilon)\ln(k/\beta)`.

    From the union bound over k coordinates, P[|Lap(b)| ≥ t] = e^{−t/b} (Dwork & Roth
    2014, utility of the Laplace mechanism).
    """
    k = _validate.positive_int("k", k)
    _validate.in_range("beta", beta, 0.0, 1.0, low_inclusive=False)
    return laplace_scale(sensitivity=sensitivity, epsilon=epsilon) * math.log(k / beta)
