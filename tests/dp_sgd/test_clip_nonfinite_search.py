"""A NaN/inf example must not poison the release: finite sum, contribution 0 or ≤ C (issue 12).

For every method, an example with a NaN, +inf or −inf feature, a non-finite label, or features
whose squares overflow (3e38 in float32) is added to a batch of benign rows. Asserted on what the
library returns: the clipped sum stays finite, and it moves by ≤ C·(1 + 1e-6) in float64 norm
when the example is removed (add/remove neighbours, same params). A batch holding only that
example must give a finite sum of norm ≤ C.

On main these hold for every method (the poisoned row is zeroed; the ghost path recomputes with
zeroed rows when a dropped row leaked NaN): a regression gate for the certified-clipping fix.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from tests.dp_sgd import adv_harness as H

# rounding claims of compiled code: run on the users' -O3 code (tests/conftest.py)
pytestmark = pytest.mark.codegen

BAD_VALUES = {"nan": np.nan, "+inf": np.inf, "-inf": -np.inf, "overflow": 3e38}


def _bad_batches(target: H.Target, seed: int):
    """(name, x (4, T, K), y (4,), bad row) for each poison, benign rows N(0, 1)."""
    rng = np.random.default_rng(seed)
    t, k = target.x_shape
    for name, value in BAD_VALUES.items():
        for where in ("feature", "label", "all_features"):
            if where == "label" and name == "overflow":
                continue
            x = rng.standard_normal((4, t, k))
            y = rng.standard_normal(4)
            row = int(rng.integers(4))
            if where == "feature":
                x[row, rng.integers(t), rng.integers(k)] = value
            elif where == "all_features":
                x[row] = value
            else:
                y[row] = value
            yield f"{name}/{where}", x, y, row


# vmap's per-example gradient is model-agnostic: its dense cases guard it by default and its
# sequence twins run in the slow suite; ghost (per-layer norms) keeps every model by default.
_NONFINITE_CASES = [
    pytest.param(kind, dtype, method, marks=pytest.mark.slow if slow else ())
    for kind, dtype in [("dense", "f32"), ("seq8", "f32"), ("smallseq", "f32"), ("dense", "bf16")]
    for method, slow in [
        ("vmap", kind != "dense"),
        ("ghost", False),
        ("auto", True),  # H.METHODS_DEFAULT: "auto" searches run in the slow suite
    ]
]


@pytest.mark.parametrize("kind, dtype, method", _NONFINITE_CASES)
def test_nonfinite_example_does_not_poison_the_sum(kind, dtype, method):
    target = H.make_target(kind, dtype, dtype)
    fn = H.jitted_grad_fn(target, method)
    failures = []
    for name, x, y, row in _bad_batches(target, seed=5):
        xb = H.as_input(x, target.input_dtype)
        yb = jnp.asarray(y, target.out_dtype)
        diff, finite = H.add_remove_difference(fn, target.params, xb, yb, row)
        alone, _ = fn(target.params, xb[row : row + 1], yb[row : row + 1])
        alone_norm = H.tree_norm64(alone)
        if not (finite and H.tree_finite(alone) and diff <= H.bound() and alone_norm <= H.bound()):
            failures.append((name, finite, diff, alone_norm))
    assert not failures, f"{kind} {dtype} {method}: (poison, sum finite, ‖ΔS‖, ‖S(x)‖) {failures}"
