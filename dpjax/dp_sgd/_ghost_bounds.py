"""Ghost clipping's certified per-example norm bounds (the clip factors come from them).

For each tapped part of the gradient, ``_Bound`` holds the estimate of the squared norm, an
upper bound of the exact one and an upper bound of what the clipped sum adds, rounding
included: ‖a‖²‖g‖² for T = 1, the Gram trick with its cancellation term for T > 1, the
formed gradient's norm for materialised layers; ``_totals`` adds the parts. The error terms
are stated in :mod:`dpjax.dp_sgd.ghost`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from dpjax.dp_sgd import _certified, _ghost_policy
from dpjax.dp_sgd._certified import HIGHEST


class _Bound(NamedTuple):
    """Per-example norm information of one part of the gradient (all (B,), wide dtype).

    ``sq``: the estimate of the squared norm (reported). ``n2``: an upper bound of the exact
    squared norm of the part's gradient (for the looseness test). ``u2``: an upper bound of the
    squared norm of what the clipped sum adds for this part before scaling, contraction rounding
    included (the clip factor comes from it).
    """

    sq: jax.Array
    n2: jax.Array
    u2: jax.Array


def _dot(spec: str, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.einsum(spec, x, y, precision=HIGHEST)


def _rank_one_bound(a: jax.Array, g: jax.Array, sum_dt: Any) -> _Bound:
    """T = 1: ``‖aᵀg‖ = ‖a‖‖g‖``; bound from the two sums of squares (γ_{K+2}, γ_{N+2})."""
    sa, sa_up = _certified.row_sq_norms(a, a.dtype)
    sg, sg_up = _certified.row_sq_norms(g, g.dtype)
    n2 = _certified.inflate(sa_up * sg_up, 0.0)
    nup = _certified.sqrt_up(n2)
    upper = _certified.inflate(nup, _certified.gamma(a.shape[1] + 3, sum_dt))
    return _Bound(sa * sg, n2, _certified.inflate(upper * upper, 0.0))


def _row_norms_up(x: jax.Array) -> jax.Array:
    """Upper bounds of ``‖x_{b,t}‖`` over the last axis, (B, T)."""
    b, t, k = x.shape
    _, up = _certified.row_sq_norms(x.reshape(b * t, k), x.dtype)
    return _certified.sqrt_up(up).reshape(b, t)


def _contraction_bound(nup: jax.Array, p_up: jax.Array, rows: int, sum_dt: Any) -> jax.Array:
    """u2 from a norm bound ``nup`` and ``P = Σ_t ‖a_t‖‖g_t‖``: (nup + γ_{rows+3}·P)².

    ``rows`` = T: the clipped sum forms each example's ``Σ_t a_tᵀ(s·g_t)`` on its own (a
    batched contraction over its T positions only), so the matrix it adds is within
    γ_{T+3}·s·P of the exact one; the batch sum over examples is a fixed-order tree.
    """
    err = _certified.gamma(rows + 3, sum_dt)
    err = _certified.inflate(p_up * jnp.asarray(err, p_up.dtype), 0.0)
    upper = _certified.inflate(nup + err, 0.0)
    return _certified.inflate(upper * upper, 0.0)


def _gram_bound(a: jax.Array, g: jax.Array, sum_dt: Any) -> _Bound:
    r"""T > 1, Gram trick: ``Σ_{t,s}(a_t·a_s)(g_t·g_s)`` and its evaluation error.

    |computed − exact| ≤ γ_G·P² with P = Σ_t ‖a_t‖‖g_t‖ and
    γ_G = (1+γ_{K+2})(1+γ_{N+2})(1+u)(1+γ_{T²}) − 1 (each Gram entry, the product, the T² sum).
    """
    _, t, k = a.shape
    n, wide = g.shape[2], a.dtype
    gram_a, gram_g = _dot("btk,bsk->bts", a, a), _dot("btn,bsn->bts", g, g)
    sq = jnp.einsum("bts,bts->b", gram_a, gram_g, precision=HIGHEST)
    u = _certified.unit_roundoff(wide)
    at = _certified.sqrt_up(
        _certified.sq_upper_from(jnp.diagonal(gram_a, axis1=1, axis2=2), _gk(k, wide), k)
    )
    gt = _certified.sqrt_up(
        _certified.sq_upper_from(jnp.diagonal(gram_g, axis1=1, axis2=2), _gk(n, wide), n)
    )
    rel_t = _certified.compose(_certified.gamma(t, wide), u)
    p_up = _certified.inflate(jnp.sum(at * gt, axis=1), rel_t)
    s_a = _certified.inflate(jnp.sum(at, axis=1), rel_t)
    s_g = _certified.inflate(jnp.sum(gt, axis=1), rel_t)
    gamma_g = _certified.compose(_gk(k, wide), _gk(n, wide), u, _certified.gamma(t * t, wide))
    err = _certified.inflate(jnp.asarray(gamma_g, wide) * _certified.inflate(p_up * p_up, 0.0), 0.0)
    tiny = _certified.tiny(wide)
    floor = (
        jnp.asarray(4 * tiny * (k + 2), wide) * _certified.inflate(s_g * s_g, 0.0)
        + jnp.asarray(4 * tiny * (n + 2), wide) * _certified.inflate(s_a * s_a, 0.0)
        + jnp.asarray(4 * tiny * (t * t + 1), wide)
    )
    n2 = _certified.inflate(jnp.maximum(sq + err + floor, jnp.zeros((), wide)), 8 * u)
    return _Bound(sq, n2, _contraction_bound(_certified.sqrt_up(n2), p_up, t, sum_dt))


def _gk(k: int, dtype: Any) -> float:
    """Relative error of one dot product of length k of converted entries (γ_{k+2})."""
    return _certified.gamma(k + 2, dtype)


def _materialised_gram_bound(a: jax.Array, g: jax.Array, sum_dt: Any) -> _Bound:
    """T > 1, accurate: each example's ``aᵀg`` formed one at a time (``lax.map``), no Gram.

    ‖W* − M‖ ≤ γ_T·P for the formed M (an entry is a T-term dot product), so
    ‖W*‖ ≤ ‖M‖ + γ_{T+2}·P: no cancellation beyond float rounding of T-term sums.
    """
    t, wide = a.shape[1], a.dtype

    def one(ag: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        m = _dot("tk,tn->kn", ag[0], ag[1])
        sq, up = _certified.row_sq_norms(m[None], wide)
        return sq[0], up[0]

    sq, sq_up = jax.lax.map(one, (a, g), batch_size=_ghost_policy.current().map_batch)
    p_up = _certified.inflate(
        jnp.sum(_row_norms_up(a) * _row_norms_up(g), axis=1),
        _certified.compose(_certified.gamma(t, wide), _certified.unit_roundoff(wide)),
    )
    err = _certified.inflate(p_up * jnp.asarray(_certified.gamma(t + 2, wide), wide), 0.0)
    nup = _certified.inflate(_certified.sqrt_up(sq_up) + err, 0.0)
    u2 = _contraction_bound(nup, p_up, t, sum_dt)
    return _Bound(sq, _certified.inflate(nup * nup, 0.0), u2)


def _scaled(bound_fn: Callable, a: jax.Array, g: jax.Array, sum_dt: Any) -> _Bound:
    """``bound_fn`` on a and g scaled by powers of two per example, then unscaled.

    No intermediate ‖a‖² or ‖g‖² overflows or underflows unless the gradient norm itself does.
    The scaling is exact for normal entries with normal results; a backend that flushes
    subnormals (XLA:CPU) zeroes subnormal entries here exactly as in the clipped sum's own
    products, so the bound is of what that sum adds (:func:`dpjax.dp_sgd._certified.ldexp_rows`).
    An entry below 2^-126 of its row's maximum, dropped by the scaling but kept by the sum, moves
    the norm by < √K·2^-126·‖a‖‖g‖, far inside the bounds' rounding terms (≥ u·‖a‖‖g‖).
    """
    ea, eg = _certified.scale_exponent(a), _certified.scale_exponent(g)
    inner = bound_fn(_certified.ldexp_rows(a, -ea), _certified.ldexp_rows(g, -eg), sum_dt)
    e2 = 2 * (ea + eg)
    return _Bound(*(jnp.ldexp(x, e2) for x in inner))


def _totals(parts: list[_Bound]) -> _Bound:
    """Whole-gradient estimate and bounds from the parts' (sums of L terms, γ_L)."""
    n = len(parts)
    rel = _certified.gamma(n, parts[0].sq.dtype)

    def add(xs: list[jax.Array]) -> jax.Array:
        return sum(xs[1:], xs[0])

    sq = add([p.sq for p in parts])
    n2 = _certified.inflate(add([p.n2 for p in parts]), rel)
    u2 = _certified.inflate(add([p.u2 for p in parts]), rel)
    return _Bound(sq, n2, u2)
