import itertools

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
