r"""Correlated noise in streaming form: step t adds σ·C_clip·(C⁻¹Z)_t (matrix factorization).

The matrix-factorization mechanism releases the prefix sums of the clipped gradient sums G as
A·G + B·Z with A = B·C (A the all-ones lower triangle). Equivalently (Choquette-Choo, McMahan,
Rush, Thakurta 2023, "Multi-epoch matrix factorization mechanisms for private machine
learning"; Denisov et al. 2022), it is DP-SGD whose step-t noise is the t-th row of C⁻¹Z:

.. math::  \tilde g_t = g_t + \sigma\,\mathrm{clip}\,(C^{-1}Z)_t, \qquad Z_t \sim N(0, I_d)
   \text{ i.i.d.},

because C·(G + σ·clip·C⁻¹Z) = C·G + σ·clip·Z is a Gaussian mechanism on C·G. The solve
C x = Z runs forward in time, one step per update:

* a lower-triangular C with ``bands`` non-zero diagonals keeps the last ``bands − 1`` noise
  vectors: x_t = (Z_t − Σ_{j=1}^{b−1} C[t, t−j]·x_{t−j}) / C[t, t]  — state O(bands·d);
* a buffered linear Toeplitz (BLT) C, c_0 = 1, c_t = Σ_i ω_i θ_i^{t−1} (Dvijotham, McMahan,
  Pillutla, Steinke, Thakurta 2024) keeps one buffer per θ_i:
  x_t = Z_t − Σ_i ω_i S_i,  S_i ← θ_i S_i + x_t  — state O(buffers·d).

Nothing is ever O(n·d). Z is drawn exactly as :func:`dpjax.dp_sgd.add_gaussian_noise` draws it
(the same key splitting, :func:`dpjax._noise.tree_iid_noise_like` with the 64-bit sampler of
:mod:`dpjax._random`), so with the same key the two transforms use the same Z.

The buffers are SECRET: they are past noise, and they predict the noise of later steps (for a
banded C, x_{t+1} is Z_{t+1} minus a known combination of them). Like the key they are removed by
:func:`dpjax.dp_sgd.public_opt_state`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import scipy.linalg

from dpjax import _noise, _validate
from dpjax.dp_sgd import transforms as _tx
from dpjax.dp_sgd._finite_sums import refuse_concrete_nonfinite_sums

__all__ = [
    "CorrelatedNoiseState",
    "correlated_noise",
    "band_table",
    "banded_width",
    "dense_correlated_noise",
]


class CorrelatedNoiseState(NamedTuple):
    """State of :func:`correlated_noise`: key data, count, and the past-noise buffers.

    Attributes:
        key: raw PRNG key data (uint32), split every update (SECRET).
        count: number of noisy releases so far (int32; public).
        noise_buffers: a pytree shaped like the params with a leading axis of ``bands − 1``
            (banded) or ``buffers`` (BLT): past noise, which predicts future noise (SECRET).
        row_order: None, or (in a run of ``make_private(noise=BandMF(b))``) the
            :class:`~dpjax.dp_sgd.matrix_factorization.row_order.RowOrder` record of the
            data's row order, passed through unchanged by the update (SECRET).
    """

    key: jax.Array
    count: jax.Array
    noise_buffers: Any
    row_order: Any = None


#: Recognised by :func:`dpjax.dp_sgd.public_opt_state`: published as its count only.
CorrelatedNoiseState.dpjax_secret_noise_state = True  # type: ignore[attr-defined]


def banded_width(matrix: np.ndarray) -> int:
    """The number of non-zero diagonals of a lower-triangular matrix (1 = diagonal)."""
    c = np.asarray(matrix)
    rows, cols = np.nonzero(c)
    return int(np.max(rows - cols)) + 1 if rows.size else 1


def _check_lower_triangular(matrix: Any) -> np.ndarray:
    c = np.asarray(matrix, dtype=np.float64)
    if c.ndim != 2 or c.shape[0] != c.shape[1] or c.shape[0] < 1:
        _validate.fail("strategy", f"an array of shape {c.shape}", "a square n×n matrix C")
    if not np.all(np.isfinite(c)) or np.any(np.triu(c, 1) != 0.0):
        _validate.fail(
            "strategy",
            "a matrix with entries above the diagonal or non-finite",
            "a finite lower-triangular matrix C",
        )
    if np.any(np.diag(c) == 0.0):
        _validate.fail(
            "strategy",
            "a singular matrix (zero on the diagonal)",
            "an invertible lower-triangular C (non-zero diagonal)",
        )
    return c


def band_table(matrix: Any, bands: int | None = None) -> np.ndarray:
    """The n×bands table T[t, j] = C[t, t − j] (0 where t < j) of a banded lower-triangular C.

    Args:
        matrix: the n×n lower-triangular strategy C (float64).
        bands: its number of non-zero diagonals (None: read from C). Entries of C outside
            the band are refused (they would be silently dropped).

    Returns:
        ``float64[n, bands]``.

    Raises:
        ValueError: C not square, not lower-triangular, singular, or wider than ``bands``.
    """
    c = _check_lower_triangular(matrix)
    n = c.shape[0]
    width = banded_width(c)
    if bands is None:
        bands = width
    bands = _validate.positive_int("bands", bands)
    if bands > n:
        _validate.fail("bands", bands, f"in [1, n={n}]")
    if width > bands:
        _validate.fail("bands", bands, f"≥ {width}, the number of non-zero diagonals of C")
    table = np.zeros((n, bands))
    for j in range(bands):
        table[j:, j] = np.diagonal(c, -j)
    return table


def _is_blt(strategy: Any) -> bool:
    return hasattr(strategy, "buf_decay") and hasattr(strategy, "output_scale")


def _blt_parameters(strategy: Any) -> tuple[np.ndarray, np.ndarray]:
    theta = np.atleast_1d(np.asarray(strategy.buf_decay, np.float64))
    omega = np.atleast_1d(np.asarray(strategy.output_scale, np.float64))
    if theta.ndim != 1 or theta.shape != omega.shape or theta.size < 1:
        _validate.fail(
            "strategy",
            f"a BLT with {theta.shape} decays and {omega.shape} scales",
            "a BLT whose buf_decay and output_scale are vectors of one length ≥ 1",
        )
    if not (np.all(np.isfinite(theta)) and np.all(np.isfinite(omega))):
        _validate.fail("strategy", "a BLT with non-finite parameters", "finite θ and ω")
    if np.any(np.abs(theta) >= 1.0):
        _validate.fail("strategy.buf_decay", theta.tolist(), "|θ_i| < 1 (a stable BLT)")
    return theta, omega


def dense_correlated_noise(
    strategy: Any, z: np.ndarray, *, bands: int | None = None, steps: int | None = None
) -> np.ndarray:
    """The reference C⁻¹Z in float64 (dense solve; O(n·d) — for tests and small n only).

    Args:
        strategy: an n×n lower-triangular C or a BLT (then ``steps`` = n is required).
        z: ``float[n, d]``, the per-step standard normal vectors.
        bands: see :func:`band_table` (checked only).
        steps: n for a BLT.

    Returns:
        ``float64[n, d]``: x with C·x = z.
    """
    z = np.asarray(z, np.float64).reshape(len(z), -1)
    if _is_blt(strategy):
        theta, omega = _blt_parameters(strategy)
        n = _validate.positive_int("steps", steps)
        lags = np.arange(1, n)[:, None]
        tail = (omega[None, :] * theta[None, :] ** (lags - 1)).sum(axis=1)
        c = scipy.linalg.toeplitz(np.concatenate([[1.0], tail]), np.zeros(n))
    else:
        band_table(strategy, bands)
        c = np.asarray(strategy, np.float64)
    return scipy.linalg.solve_triangular(c, z[: c.shape[0]], lower=True)


def _zeros_buffers(params: Any, size: int) -> Any:
    return jax.tree.map(
        lambda p: jnp.zeros((size, *jnp.shape(p)), _noise.noise_dtype_of(p)), params
    )


def _banded_step(table: np.ndarray):
    """The forward-substitution step of a banded C: (z, buffers, t) → (x_t, new buffers)."""
    n, bands = table.shape
    inverse_diagonal = 1.0 / table[:, 0]

    def step(z: jax.Array, past: jax.Array, t: jax.Array) -> tuple[jax.Array, jax.Array]:
        row = jax.lax.dynamic_index_in_dim(jnp.asarray(table[:, 1:], z.dtype), t, 0, False)
        inv = jax.lax.dynamic_index_in_dim(jnp.asarray(inverse_diagonal, z.dtype), t, 0, False)
        if bands == 1:
            return z * inv, past
        # past[j − 1] = x_{t−j}; zeros before step 0, and row[j − 1] = 0 where t < j
        correction = jnp.tensordot(row, past, axes=(0, 0))
        x = (z - correction) * inv
        return x, jnp.concatenate([x[None], past[:-1]], axis=0)

    return step, max(bands - 1, 1), n


def _blt_step(theta: np.ndarray, omega: np.ndarray):
    """The BLT step: x_t = z_t − Σ_i ω_i S_i, S_i ← θ_i S_i + x_t."""

    def step(z: jax.Array, buffers: jax.Array, t: jax.Array) -> tuple[jax.Array, jax.Array]:
        del t
        w = jnp.asarray(omega, z.dtype)
        th = jnp.asarray(theta, z.dtype).reshape((-1,) + (1,) * z.ndim)
        x = z - jnp.tensordot(w, buffers, axes=(0, 0))
        return x, th * buffers + x[None]

    return step, theta.size


def _solver(strategy: Any, bands: int | None, steps: int | None):
    """(step function, buffer length, n) for a banded matrix or a BLT."""
    if _is_blt(strategy):
        theta, omega = _blt_parameters(strategy)
        if steps is None:
            _validate.fail("steps", None, "the number of steps n ≥ 1 the BLT was built for")
        step, size = _blt_step(theta, omega)
        return step, size, _validate.positive_int("steps", steps)
    table = band_table(strategy, bands)
    if steps is not None and _validate.positive_int("steps", steps) != table.shape[0]:
        _validate.fail("steps", steps, f"None or n = {table.shape[0]} (the size of C)")
    return _banded_step(table)


def _void_past_end(tree: Any, count: jax.Array, n: int) -> Any:
    """``tree`` with every float leaf NaN once ``count`` ≥ n (traced code cannot raise)."""
    ok = count < n
    return jax.tree.map(lambda x: jnp.where(ok, x, jnp.full_like(x, jnp.nan)), tree)


def correlated_noise(
    strategy: Any,
    *,
    noise_multiplier: float,
    l2_clip_norm: float,
    key: jax.Array,
    bands: int | None = None,
    steps: int | None = None,
) -> optax.GradientTransformation:
    r"""Add the correlated noise σ·clip·(C⁻¹Z)_t to the clipped sum of step t (streaming).

    .. math::  g_t \mapsto g_t + \sigma\,\mathrm{clip}\,x_t, \qquad C x = Z,\ Z_t \sim N(0, I)

    Apply it where :func:`~dpjax.dp_sgd.add_gaussian_noise` goes: to the clipped SUM of one
    logical batch (after accumulation, before the public normalisation), once per step.

    Args:
        strategy: the n×n lower-triangular C (NumPy, float64; a banded C keeps only its
            n×bands band table) or a BLT (an object with ``buf_decay`` θ and ``output_scale``
            ω, e.g. ``matrix_factorization.blt.BLT``).
        noise_multiplier: σ ≥ 0, RELATIVE to the sensitivity: the release C·G + σ·clip·Z has
            sensitivity clip·sens(C), so the Gaussian's noise multiplier is σ / sens(C)
            (see :mod:`dpjax.dp_sgd.matrix_factorization.accounting`).
        l2_clip_norm: clip > 0, the certified bound of one example's contribution to the sum
            (``grad_fn.l2_norm_bound``).
        key: a JAX PRNG key (required; split every update exactly like ``add_gaussian_noise``).
        bands: number of non-zero diagonals of a matrix C (None: read from C).
        steps: n for a BLT (required); for a matrix, None or its size.

    Returns:
        An ``optax.GradientTransformation`` with state :class:`CorrelatedNoiseState` (key,
        count and O(bands·d) / O(buffers·d) noise buffers).

    Raises:
        TypeError: no key. ValueError: a bad strategy, σ < 0, clip ≤ 0; at ``update``
            (when the count is concrete) a step past n, updates not shaped like params, or
            updates batched by a ``jax.vmap`` that the state is not batched by (one noise
            draw for every row; see :func:`dpjax.dp_sgd.add_gaussian_noise`), or (eagerly)
            updates with a NaN/inf entry (as for ``add_gaussian_noise``); updates of a dtype
            that cannot hold 9.2·σ·clip (float16 with σ·clip ≥ 7120, as
            ``add_gaussian_noise``: give it the float32 sums of ``clipped_grad``).
            Under ``jax.jit`` a step past n cannot raise: it returns NaN updates and state
            (nothing computed from it can be released).

    Formal guarantees:
        For n steps the released noisy sums g_t + σ·clip·x_t are an invertible
        post-processing (multiplication by C) of C·G + σ·clip·Z, the Gaussian mechanism on
        C·G, whose ℓ2 sensitivity under add/remove-one is clip·sens(C) for the participation
        pattern of the sampler (Denisov, McMahan, Rush, Smith, Thakurta 2022, "Improved
        differential privacy for SGD via optimal private linear operators on adaptive
        streams", Theorem 2.1, which also covers adaptively chosen gradients;
        Choquette-Choo et al. 2023 for multiple participations). Covered: the parameter
        trajectory and everything computed from the noisy sums. NOT covered: the key and the
        noise buffers of the state (past noise predicts future noise) — publish
        :func:`~dpjax.dp_sgd.public_opt_state` instead. The solve runs in the noise dtype
        (≥ float32), so C·x = Z holds up to float rounding; the guarantee is for the
        real-valued mechanism (float noise is porous, Mironov 2012).

    Example:
        >>> import jax, jax.numpy as jnp, numpy as np
        >>> c = np.tril(np.ones((4, 4))) - np.tril(np.ones((4, 4)), -2)  # 2 bands
        >>> tx = correlated_noise(c, noise_multiplier=1.0, l2_clip_norm=1.0,
        ...     key=jax.random.key(0))
        >>> state = tx.init(jnp.zeros(3))
        >>> noisy, state = tx.update(jnp.zeros(3), state)
        >>> jax.tree.map(jnp.shape, state.noise_buffers), int(state.count)
        ((1, 3), 1)
    """
    sigma = _validate.non_negative("noise_multiplier", noise_multiplier)
    clip = _validate.positive("l2_clip_norm", l2_clip_norm)
    key = _tx._check_key(key)
    impl = _tx._key_impl(key)
    step, size, n = _solver(strategy, bands, steps)
    stddev = sigma * clip
    shapes = _tx._ParamShapes()

    def init_fn(params: Any) -> CorrelatedNoiseState:
        shapes.record(params)
        base = _tx._init_noise_state(key)
        return CorrelatedNoiseState(base.key, base.count, _zeros_buffers(params, size))

    def update_fn(updates: Any, state: CorrelatedNoiseState, params: Any = None):
        shapes.check(updates, params)
        refuse_concrete_nonfinite_sums(updates)
        # as add_gaussian_noise: a float16 update cannot hold the float32 noise (x_t's
        # Gaussian terms alone reach 9.2·σ·clip); cast to float16 it would be ±inf
        _tx._refuse_noise_beyond_dtype(updates, stddev)
        if _validate.is_concrete(state.count) and int(state.count) >= n:
            _validate.fail(
                "state.count",
                int(state.count),
                f"< n = {n}: the strategy covers n steps (its sensitivity and "
                "accounting are for n); build a strategy for a longer run",
            )
        next_key, noise_key, release = _tx._checked_next_keys(updates, state, impl)
        z = _noise.tree_iid_noise_like(noise_key, updates, jax.random.normal)
        t = jnp.minimum(state.count, n - 1)
        solved = jax.tree.map(lambda zi, b: step(zi, b, t), z, state.noise_buffers)
        is_pair = lambda p: isinstance(p, tuple)  # noqa: E731
        x = jax.tree.map(lambda p: p[0], solved, is_leaf=is_pair)
        buffers = jax.tree.map(lambda p: p[1], solved, is_leaf=is_pair)
        noisy = _noise._add_scaled(_tx._fusion_barrier(updates), x, stddev)
        noisy, buffers = _void_past_end((noisy, buffers), state.count, n)
        count = optax.safe_increment(state.count)
        return release(noisy), CorrelatedNoiseState(next_key, count, buffers, state.row_order)

    return optax.GradientTransformation(init_fn, update_fn)
