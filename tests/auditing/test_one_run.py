"""Audit E: the one-run bound (Steinke, Nasr, Jagielski 2023) as a cheap smoke test.

m = 10^4 canaries, each included independently with probability ½; ONE release of the vector
of inclusions through the Gaussian mechanism; guesses fixed in advance (top/bottom 5%). The
correct mechanism stays below its claim in 20/20 runs; the "δ ignored" mutant (σ = Δ/ε) is
caught in ≥ 19/20.
"""

import jax
import numpy as np
import pytest

from dpjax import auditing
from experiments import audit as suite


@pytest.mark.parametrize("variant, caught", [("correct", False), ("delta_ignored", True)])
def test_one_run_audit(variant, caught):
    release = suite.ONE_RUN_RELEASES[variant]
    keys = jax.random.split(jax.random.key(646), suite.REPETITIONS)
    eps_lb = np.array([suite.one_run_audit(k, release).epsilon for k in keys])
    if caught:
        assert np.sum(eps_lb > 1.0) >= suite.CAUGHT_AT_LEAST, eps_lb
    else:
        assert np.all(eps_lb <= 1.0), eps_lb


def test_guesses_from_scores():
    g = auditing.guesses_from_scores(np.array([0.3, -1.0, 2.0, 0.0, 5.0]), k_in=2, k_out=1)
    np.testing.assert_array_equal(g, [0, -1, 1, 0, 1])
    with pytest.raises(ValueError, match="k_in, k_out"):
        auditing.guesses_from_scores(np.zeros(3), k_in=2, k_out=2)
