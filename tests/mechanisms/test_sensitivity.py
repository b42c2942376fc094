import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpjax import ADD_OR_REMOVE_ONE, REPLACE_ONE
from dpjax import mechanisms as M

GRID = np.linspace(-1.0, 3.0, 5)  # contains both ends of [lower, upper] = [-1, 3]
LOWER, UPPER = -1.0, 3.0


def lower_median(x):
    x = np.sort(np.asarray(x))
    return x[(len(x) + 1) // 2 - 1]


STATS = {"mean": np.mean, "variance": np.var, "median": lower_median}


def brute_force(stat, n, relation):
    """max |f(D) − f(D')| over neighbouring data sets with values on GRID."""
    f = STATS[stat]
    best = 0.0
    for data in itertools.product(GRID, repeat=n):
        value = f(data)
        if relation == REPLACE_ONE:
            for i, v in itertools.product(range(n), GRID):
                other = list(data)
                other[i] = v
                best = max(best, abs(f(other) - value))
        else:  # add one record (removal is the same pair seen from the other side)
            for v in GRID:
                best = max(best, abs(f(list(data) + [v]) - value))
    return best


FUNCS = {
    "mean": lambda **kw: M.mean_sensitivity(**kw),
    "variance": lambda **kw: M.variance_sensitivity(**kw),
    "median": lambda n, **kw: M.median_sensitivity(**kw),
}


@pytest.mark.parametrize("stat", ["mean", "variance", "median"])
@pytest.mark.parametrize("relation", [REPLACE_ONE, ADD_OR_REMOVE_ONE])
@pytest.mark.parametrize("n", [3, 4])
def test_sensitivity_is_tight_by_brute_force(stat, relation, n):
    got = FUNCS[stat](n=n, lower=LOWER, upper=UPPER, relation=relation)
    assert got == pytest.approx(brute_force(stat, n, relation), rel=1e-12)


def test_closed_forms_and_lecture_values():
    lam, m = 2.0, 50
    # Lecture on advances in DP, Example 8: mean Λ/m, median Λ, variance at most Λ²/m (replace-one)
    assert M.mean_sensitivity(n=m, upper=lam, relation="replace_one") == pytest.approx(lam / m)
    assert M.median_sensitivity(upper=lam, relation="replace_one") == lam
    var = M.variance_sensitivity(n=m, upper=lam, relation="replace_one")
    assert var == pytest.approx((m - 1) * lam**2 / m**2)
    assert var <= lam**2 / m
    assert M.mean_sensitivity(n=m, upper=lam, relation="add_or_remove_one") == pytest.approx(
        lam / (m + 1)
    )
    assert M.variance_sensitivity(n=m, upper=lam, relation=ADD_OR_REMOVE_ONE) == pytest.approx(
        m * lam**2 / (m + 1) ** 2
    )


@pytest.mark.parametrize(
    "call",
    [
        lambda: M.mean_sensitivity(n=0, upper=1.0, relation=REPLACE_ONE),
        lambda: M.mean_sensitivity(n=10, lower=1.0, upper=1.0, relation=REPLACE_ONE),
        lambda: M.variance_sensitivity(n=10, lower=2.0, upper=1.0, relation=REPLACE_ONE),
        lambda: M.variance_sensitivity(n=2.5, upper=1.0, relation=REPLACE_ONE),
        lambda: M.median_sensitivity(upper=float("inf"), relation=REPLACE_ONE),
        lambda: M.median_sensitivity(upper=1.0, relation="swap_one"),
    ],
)
def test_bad_inputs_raise(call):
    with pytest.raises(ValueError, match="must be"):
        call()


# ------------------------------------------------------------------------------------------------
# the non-finite rule and of the clipped-mean sensitivity.
#
# What holds: under ``jit`` a NaN / ±inf / huge / −0.0 / out-of-range record is released exactly
# as its public value (NaN ↦ midpoint, clip) in float32, float16 and bfloat16 too (the existing
# tests cover float64 only), for ``smooth_median`` and ``bounded_laplace``.
#
# What breaks:
#
# * the eager ``ValueError`` of ``smooth_median`` prints the data's exact min and max (and the
#   refusal of non-finite values prints how many records are non-finite): a noiseless release
#   of private values through an exception message, which the ``jit`` path never makes;
# * ``refuse_non_finite`` crashes (``TracerBoolConversionError``) when concrete data are closed
#   over by a jitted function, so ``jax.jit(lambda k: smooth_median(k, data, ...))`` fails;
# * ``clipped_mean`` in float32 sums k clipped values in float32: when the range [l, u] is narrow
#   compared with |l| the mean of neighbours moves by up to 12.5× the declared (u − l)/k
#   (Casacuberta et al. 2022), so the Laplace noise calibrated to (u − l)/k is too small.
# ------------------------------------------------------------------------------------------------

# --- clipped_mean: float32 summation moves the mean by more than (u − l)/k -------------------


def _noiseless_mean(values, lower, upper):
    """The library's own pre-noise mean: at ε = 1e12 the Laplace noise (scale Δ/ε) is far below
    half an ulp of the mean, so the float32 release is the computed mean itself."""
    out = M.clipped_mean(
        jax.random.key(0), jnp.asarray(values), lower=lower, upper=upper, epsilon=1e12
    )
    return float(out)


@pytest.mark.parametrize(
    "lower, upper, k, seed", [(1e6, 1e6 + 1.0, 100, 0), (1000.0, 1001.0, 1000, 25)]
)
def test_clipped_mean_float32_mean_moves_at_most_the_sensitivity(lower, upper, k, seed):
    # The exact law of the float32 release is round(m + bZ) (b = Δ/ε); on every output cell its
    # log-ratio between neighbours is at most |m − m′|/b, with equality in the tails, so ε-DP
    # holds iff the computed means satisfy |m − m′| ≤ Δ = (u − l)/k.
    # Fails on the reviewed code: |m − m′| = 12.5Δ at [1e6, 1e6 + 1], k = 100 (one float32 ulp
    # of 1e6 is 0.0625 = 6.25Δ; after a one-ulp move the event {output = m} has probability
    # 0.956 on D and 0.022 on D′ with exact Laplace noise at ε = 1: log-ratio 3.78) and
    # 1.04Δ at [1000, 1001], k = 1000 (float32 summation; Casacuberta, Shoemate, Vadhan,
    # Wagaman 2022).
    """Catches a float32 clipped mean moving by more than (u - l)/k between neighbours."""
    sensitivity = (upper - lower) / k
    values = np.random.default_rng(seed).uniform(lower, upper, k).astype(np.float32)
    mean = _noiseless_mean(values, lower, upper)
    worst = 0.0
    for i, replacement in itertools.product(range(3), (lower, upper)):
        neighbour = values.copy()
        neighbour[i] = np.float32(replacement)
        worst = max(worst, abs(_noiseless_mean(neighbour, lower, upper) - mean) / sensitivity)
    assert worst <= 1.0 + 1e-6, worst
