"""Issue 24, compile time of the ghost step: the cheaper program computes the same thing.

* ONE scan for every T = 1 dense layer of a call (:func:`dpjax.dp_sgd.ghost._rank_one_sums`),
  its m group products as one batched product and the layers' merges in one flat packed
  carry, must give bit for bit the pairs of the code it replaced: one scan per layer with m
  separate products (:func:`_one_scan_per_layer` below is that code, kept as the reference),
  on layers of different widths, padded batches, dropped NaN rows and bfloat16/float16
  parameters (whose sums are formed in float32).
* The accurate branch's exponent scaling reads exponent bits instead of ``jnp.frexp`` /
  ``jnp.ldexp``: the same exponents for every normal maximum, exact scaling back.
* The retry ``lax.cond`` is built only where it can change a bound.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpjax.dp_sgd import _certified, ghost
from dpjax.dp_sgd._certified import HIGHEST


def _one_scan_per_layer(pairs, keep, sanitize):
    """The T = 1 sums as before issue 24's compile work: one scan per layer, m dots."""
    out = []
    for a, g_scaled in pairs:
        b, _, k = a.shape
        c, m = ghost._group_size(b), ghost._merge_size(b)
        pad = -b % (c * m)
        a2, g2, keep2 = a.reshape(b, k), g_scaled.reshape(b, -1), keep
        if pad:
            a2 = jnp.pad(a2, ((0, pad), (0, 0)))
            g2 = jnp.pad(g2, ((0, pad), (0, 0)))
            keep2 = jnp.pad(keep, (0, pad))
        steps = (b + pad) // (c * m)
        n = g2.shape[1]

        def body(carry, chunk, m=m):
            a_c, g_c, keep_c = chunk
            if sanitize:
                a_c = jnp.where(keep_c[..., None], a_c, jnp.zeros((), a_c.dtype))
            part = jnp.dot(a_c[0].T, g_c[0], precision=HIGHEST)
            for j in range(1, m):
                part = part + jnp.dot(a_c[j].T, g_c[j], precision=HIGHEST)
            return _certified.df_add_packed(carry, part), None

        dt = jnp.result_type(a2.dtype, g2.dtype)
        xs = (a2.reshape(steps, m, c, k), g2.reshape(steps, m, c, n), keep2.reshape(steps, m, c))
        z, _ = jax.lax.scan(body, _certified.df_pack(*_certified.df_zeros((k, n), dt)), xs)
        out.append(_certified.df_unpack(z))
    return out


def _layers(rng, b, widths, dtypes):
    pairs = []
    for (k, n), dt in zip(widths, dtypes, strict=True):
        a = rng.standard_normal((b, 1, k)) * np.exp(rng.uniform(-6, 6, (b, 1, 1)))
        g = rng.standard_normal((b, 1, n)) * np.exp(rng.uniform(-6, 6, (b, 1, 1)))
        pairs.append((jnp.asarray(a, dt), jnp.asarray(g, dt)))
    return pairs


@pytest.mark.parametrize(
    "b, widths, dtypes",
    [
        (300, [(17, 5), (5, 33), (1, 3)], [jnp.float32] * 3),  # padded: 3 steps of 128
        pytest.param(
            256,
            [(20, 16), (16, 12), (12, 3)],
            [jnp.float64, jnp.float32, jnp.float64],
            marks=pytest.mark.slow,
        ),
        pytest.param(5, [(4, 3), (3, 2)], [jnp.float32] * 2, marks=pytest.mark.slow),
    ],
)
def test_one_scan_is_bitwise_a_scan_per_layer(b, widths, dtypes):
    rng = np.random.default_rng(b)
    pairs = _layers(rng, b, widths, dtypes)
    keep = np.ones(b, bool)
    keep[1] = False
    pairs[0] = (pairs[0][0].at[1].set(jnp.nan), pairs[0][1])  # a dropped row holds NaN
    keep = jnp.asarray(keep)
    got = jax.jit(ghost._rank_one_sums, static_argnums=2)(pairs, keep, True)
    want = jax.jit(_one_scan_per_layer, static_argnums=2)(pairs, keep, True)
    for (hi, lo), (ref_hi, ref_lo) in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(hi), np.asarray(ref_hi))
        np.testing.assert_array_equal(np.asarray(lo), np.asarray(ref_lo))
        assert np.all(np.isfinite(np.asarray(hi)))


def _mlp_loss(p, x, y):
    h = x
    for i, (w, bias) in enumerate(p):
        h = h @ w + bias.astype(h.dtype)
        if i < len(p) - 1:
            h = jnp.tanh(h)
    return jnp.sum((h.astype(jnp.float32) - y) ** 2)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_ghost_sum_unchanged_with_low_precision_layers(monkeypatch, dtype):
    """The whole clipped sum, bit for bit, with the per-layer scans put back (mixed widths)."""
    rng = np.random.default_rng(3)
    widths, b = [9, 16, 5, 3], 140
    p = [
        (
            jnp.asarray(rng.standard_normal((k, n)) / np.sqrt(k), dtype),
            jnp.asarray(rng.standard_normal(n) * 0.1, dtype),
        )
        for k, n in zip(widths[:-1], widths[1:], strict=True)
    ]
    x = jnp.asarray(rng.standard_normal((b, widths[0])), dtype)
    y = jnp.asarray(rng.standard_normal((b, widths[-1])), jnp.float32)

    def pairs():
        jax.clear_caches()  # the ghost step is jitted on the loss: re-trace it
        (hi, lo), norms, _, _ = ghost.ghost_clipped_pairs(_mlp_loss, p, (x, y), l2_clip_norm=0.3)
        return [np.asarray(v) for v in jax.tree.leaves((hi, lo, norms))]

    got = pairs()
    monkeypatch.setattr(ghost, "_rank_one_sums", _one_scan_per_layer)
    want = pairs()
    jax.clear_caches()
    for u, v in zip(got, want, strict=True):
        np.testing.assert_array_equal(u, v)


def test_scale_exponent_is_frexps_exponent():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 7)) * np.exp2(rng.integers(-125, 127, (300, 1)))
    x = x.astype(np.float32)
    x[0], x[1, 2], x[2, 3], x[3] = 0.0, np.inf, np.nan, 1e-39  # zero, inf, NaN, subnormal
    got = np.asarray(jax.jit(_certified.scale_exponent)(jnp.asarray(x)))
    top = np.abs(x).max(axis=1)
    normal = np.isfinite(top) & (top >= np.finfo(np.float32).tiny)
    np.testing.assert_array_equal(got[normal], np.frexp(top[normal])[1])
    np.testing.assert_array_equal(got[~normal], 0)
    assert got.dtype == np.int32


def test_times_pow2_twice_is_exact_scaling():
    rng = np.random.default_rng(1)
    x = (rng.uniform(0.5, 2.0, 400) * np.exp2(rng.integers(-60, 61, 400))).astype(np.float32)
    s = rng.integers(-300, 301, 400).astype(np.int32)
    got = np.asarray(jax.jit(_certified.times_pow2_twice)(jnp.asarray(x), jnp.asarray(s)))
    want = np.ldexp(x.astype(np.float64), 2 * s)
    info = np.finfo(np.float32)
    normal = (want >= info.tiny) & (want <= info.max)
    np.testing.assert_array_equal(got[normal], want[normal].astype(np.float32))
    assert np.all(got[want > info.max] == np.inf)  # overflow: inf, an upper bound
    low = want < info.tiny
    assert np.all((got[low] == 0) | (np.abs(got[low] - want[low]) <= 2.0**-149))


def _has_cond(loss, params, *batch):
    fn = jax.jit(lambda p, *bt: ghost.ghost_clipped_pairs(loss, p, bt, l2_clip_norm=1.0)[:3])
    jax.clear_caches()
    text = fn.lower(params, *batch).as_text()
    return "stablehlo.case" in text or "stablehlo.if" in text


def test_retry_cond_only_where_a_tap_can_need_it():
    """x64: a T = 1 plan of float32 layers cannot overflow its bound: no cond; else one."""
    assert jax.config.jax_enable_x64  # the suite's setting (conftest)
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal((8, 5)), jnp.float32)
    y = jnp.asarray(rng.standard_normal(8), jnp.float32)
    w32 = jnp.ones(5, jnp.float32)

    def linear(w, xi, yi):
        return (xi.astype(w.dtype) @ w - yi.astype(w.dtype)) ** 2

    assert not _has_cond(linear, w32, x, y)
    assert _has_cond(linear, w32.astype(jnp.float64), x, y)  # float64 squares can overflow

    def seq(w, xi, yi):  # T = 4 positions of a 128×128 kernel: a Gram tap, it can cancel
        return jnp.sum((xi.reshape(4, 128) @ w - yi) ** 2)

    xs = jnp.asarray(rng.standard_normal((8, 512)), jnp.float32)
    assert _has_cond(seq, jnp.ones((128, 128), jnp.float32), xs, y)


def test_huge_activation_kept_without_the_retry():
    """x64, float32 layer: ‖a‖ ≈ 1e30 with tiny g; the fast float64 bound keeps it, clipped."""
    x = jnp.asarray([[3e29, 4e29], [0.3, 0.4]], jnp.float32)
    y = jnp.zeros(2, jnp.float32)

    def linear(w, xi, yi):
        return 1e-30 * (xi @ w - yi)

    total, norms, bad = ghost.ghost_clipped_sum(
        linear, jnp.ones(2, jnp.float32), (x, y), l2_clip_norm=1.0
    )
    assert int(bad) == 0
    np.testing.assert_allclose(np.asarray(norms), [5e-1, 5e-31], rtol=1e-5)
    np.testing.assert_allclose(np.asarray(total), [0.3, 0.4], rtol=1e-4)


def _two_layer(p, x, y):
    return 1e-200 * jnp.sum((x @ p[0]) @ p[1] - y)


def _huge_example():
    rng = np.random.default_rng(4)
    w = [jnp.asarray(rng.standard_normal((3, 4))), jnp.asarray(rng.standard_normal((4, 2)))]
    x = jnp.asarray(rng.standard_normal((1, 3)) * 1e200)  # ‖a‖² overflows float64
    return w, x, jnp.zeros((1, 2))


def _exact_grad_norm(w, x):
    """‖∇ℓ‖ of _two_layer's one example, formed without overflow (x scaled first)."""
    xs = np.asarray(x[0]) * 1e-200
    w1, w2 = np.asarray(w[0]), np.asarray(w[1])
    g1 = np.outer(xs, w2.sum(axis=1))
    g2 = np.outer(xs @ w1, np.ones(2))
    return math.sqrt((g1**2).sum() + (g2**2).sum())


def test_accurate_branch_keeps_and_clips_an_overflowing_example():
    """float64 layers (the retry is built): ‖a‖² = inf in the fast bound, the stacked accurate
    bound (both T = 1 layers reduced together) keeps the example and clips it to ≤ C."""
    w, x, y = _huge_example()
    clip = 0.1
    total, norms, bad = ghost.ghost_clipped_sum(_two_layer, w, (x, y), l2_clip_norm=clip)
    exact = _exact_grad_norm(w, x)
    assert int(bad) == 0
    np.testing.assert_allclose(float(norms[0]), exact, rtol=1e-10)
    got = math.sqrt(sum(float(jnp.sum(t.astype(jnp.float64) ** 2)) for t in total))
    assert exact > clip and got <= clip and got > 0.99 * clip


@pytest.mark.slow
def test_understated_accurate_bound_is_caught(monkeypatch):
    """The check above is sharp: a bound scaled back by 2^-2 too little lets the sum exceed C."""
    w, x, y = _huge_example()
    real = _certified.times_pow2_twice
    monkeypatch.setattr(_certified, "times_pow2_twice", lambda v, s: real(v, s - 1))
    jax.clear_caches()
    total, _, _ = ghost.ghost_clipped_sum(_two_layer, w, (x, y), l2_clip_norm=0.1)
    jax.clear_caches()
    got = math.sqrt(sum(float(jnp.sum(t.astype(jnp.float64) ** 2)) for t in total))
    assert got > 0.1
