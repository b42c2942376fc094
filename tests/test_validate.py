import math

import pytest

from dpjax import _validate
from dpjax.relation import ADD_OR_REMOVE_ONE, REPLACE_ONE, as_relation


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, "x", None])
def test_epsilon_rejects(bad):
    with pytest.raises(ValueError, match="epsilon must be in \\(0, inf\\)"):
        _validate.epsilon(bad)


@pytest.mark.parametrize("bad", [-0.1, 1.0, 2.0, math.nan])
def test_delta_rejects(bad):
    with pytest.raises(ValueError, match="delta must be in \\[0.0, 1.0\\)"):
        _validate.delta(bad)


def test_accepts_good_values():
    assert _validate.epsilon(0.5) == 0.5
    assert _validate.delta(0.0) == 0.0
    assert _validate.positive_int("steps", 3) == 3
    assert _validate.probability(1.0, "q") == 1.0


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "3"])
def test_positive_int_rejects(bad):
    with pytest.raises(ValueError, match="steps must be a positive integer"):
        _validate.positive_int("steps", bad)


def test_message_names_value():
    with pytest.raises(ValueError, match="got -3"):
        _validate.positive("sensitivity", -3)


def test_relation_parsing():
    assert as_relation("replace_one") is REPLACE_ONE
    assert as_relation(ADD_OR_REMOVE_ONE) is ADD_OR_REMOVE_ONE
    with pytest.raises(ValueError, match="relation must be one of"):
        as_relation("swap")
