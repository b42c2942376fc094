"""Grey-box add/remove check: ‖S(D) − S(D \\ {x})‖ ≤ C·(1 + 1e-6) with the same params.

``S`` is the library's clipped sum; D holds benign rows (N(0, 1) features and labels) and one
attacker row drawn from the adversarial patterns (magnitudes 1e-3…1e6, alternating / nearly
cancelling positions). This is the neighbouring relation of the guarantee itself (add/remove-one),
so it also catches rounding that a batch of one would hide. Both sums are widened to float64 by
NumPy before the difference.

On main (C = 1): seq8 float32 ghost/auto 1.404 (Gram cancellation; also with microbatches of 3),
dense float64 with int64 features ghost/auto 1.109; vmap holds in float32/float64.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from tests.dp_sgd import adv_harness as H

# rounding claims of compiled code: run on the users' -O3 code (tests/conftest.py)
pytestmark = pytest.mark.codegen

_SLOW = pytest.mark.slow  # "auto" searches: the slow suite (H.METHODS_DEFAULT explains why)
CASES = [
    pytest.param(kind, p_dtype, x_dtype, method, marks=_SLOW if method == "auto" else ())
    for kind, p_dtype, x_dtype in [("dense", "f64", "i64"), ("smallseq", "f32", "f32")]
    for method in H.METHODS
] + [
    ("seq8", "f32", "f32", "ghost"),
    pytest.param("seq8", "f32", "f32", "auto", marks=_SLOW),
]  # seq8 vmap: slow sweep


def _neighbour_batches(target: H.Target, seed: int, trials: int, rows: int = 4):
    rng = np.random.default_rng(seed)
    t, k = target.x_shape
    for i in range(trials):
        x = rng.standard_normal((rows, t, k))
        y = rng.standard_normal(rows)
        row = int(rng.integers(rows))
        x[row] = H.pattern(rng, H.PATTERNS[i % len(H.PATTERNS)], (t, k), 10.0 ** rng.uniform(-3, 6))
        y[row] = H.random_label(rng)
        yield x, y, row


@pytest.mark.parametrize("kind, p_dtype, x_dtype, method", CASES)
def test_add_remove_difference_within_clip(kind, p_dtype, x_dtype, method):
    _check_neighbours(kind, p_dtype, x_dtype, method, microbatch_size=None)


@pytest.mark.parametrize(
    "kind, p_dtype, x_dtype, method",
    [
        ("seq8", "f32", "f32", "ghost"),
        pytest.param("seq8", "f32", "f32", "auto", marks=_SLOW),
        ("dense", "f64", "i64", "vmap"),
    ],
)
def test_add_remove_with_microbatches(kind, p_dtype, x_dtype, method):
    """Chunks of 3 rows (``lax.scan``, padded last chunk): the same bound on the summed chunks."""
    _check_neighbours(kind, p_dtype, x_dtype, method, microbatch_size=3)


def _check_neighbours(kind, p_dtype, x_dtype, method, microbatch_size):
    target = H.make_target(kind, p_dtype, x_dtype)
    fn = H.jitted_grad_fn(target, method, H.C, microbatch_size)
    worst, worst_row = 0.0, None
    for x, y, row in _neighbour_batches(target, seed=21, trials=21):
        xb = H.as_input(x, target.input_dtype)
        diff, finite = H.add_remove_difference(
            fn, target.params, xb, jnp.asarray(y, target.out_dtype), row
        )
        assert finite, f"{kind} {method}: non-finite sum for attacker row {x[row][:1]!r}"
        if diff > worst:
            worst, worst_row = diff, x[row][:1]
    assert worst <= H.bound(), f"{kind} {p_dtype}/{x_dtype} {method}: ‖ΔS‖ = {worst} ({worst_row})"
