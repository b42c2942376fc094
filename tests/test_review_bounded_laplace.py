"""Adversarial review of ``bounded_laplace`` on its float32 output grid (review 1).

The release is the inverse CDF of the restricted Laplace law evaluated at one float32 uniform,
and ``jax.random.uniform`` in float32 takes exactly the 2²³ values j·2⁻²³ (j = 0…2²³ − 1), each
with probability 2⁻²³. Evaluating the sampler at all of them gives the *exact* output law of the
code as it runs, so δ(ε) = Σ_v (P_q(v) − e^ε P_q′(v))₊ is computed exactly (no sampling).

What holds: every output lies in [l, u] (the final clip), and NaN / ±inf never reach it.
What breaks: the claimed pure ε-DP (δ = 0). The float32 law is porous (Mironov 2012): at
ε = 1, Δ = 1 on [0, 10], δ(ε) = 0.80 for q = 0 vs q′ = 1 and 0.44 for q = 5 vs 6. The support is
also truncated at the 1 − 2⁻²³ quantile: from q = 0 (Δ = 0.1, b = 0.161) no output exceeds
2.5709, while q′ = 0.1 reaches 2.67–2.78. Unlike ``laplace`` and ``gaussian`` (which say that
float noise is porous and for research only), ``bounded_laplace`` carries no such caveat.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpjax import mechanisms as M
from dpjax.mechanisms.bounded_laplace import _truncated_laplace

LOWER, UPPER = 0.0, 10.0
GRID_BITS = 23  # float32 uniforms: mantissa bits


def float32_uniform_grid():
    return jnp.arange(2**GRID_BITS, dtype=jnp.int32).astype(jnp.float32) * jnp.float32(
        2.0**-GRID_BITS
    )


def exact_law(q, b):
    """(support, probabilities) of the float32 release for f(D) = q: one value per uniform."""
    release = jax.jit(lambda u: _truncated_laplace(jnp.asarray(q, jnp.float32), u, b, LOWER, UPPER))
    values, counts = np.unique(np.asarray(release(float32_uniform_grid())), return_counts=True)
    return values, counts / 2.0**GRID_BITS


def hockey_stick(law_p, law_q, eps):
    """Σ_v (P(v) − e^ε Q(v))₊ over the union of the two finite supports."""
    (vp, pp), (vq, pq) = law_p, law_q
    index = np.clip(np.searchsorted(vq, vp), 0, vq.size - 1)
    q_at_p = np.where(vq[index] == vp, pq[index], 0.0)
    return float(np.sum(np.maximum(pp - np.exp(eps) * q_at_p, 0.0)))


def test_public_release_is_the_sampler_at_one_float32_uniform(key):
    # Control: the public function draws one float32 uniform per coordinate (first subkey of
    # the split) and applies _truncated_laplace, so the enumerated law is the release's law.
    b = M.bounded_laplace_scale(sensitivity=1.0, epsilon=1.0, lower=LOWER, upper=UPPER)
    for q in (0.0, 3.0, 10.0):
        got = M.bounded_laplace(
            key, jnp.float32(q), sensitivity=1.0, epsilon=1.0, lower=LOWER, upper=UPPER
        )
        u = jax.random.uniform(jax.random.split(key, 1)[0], (), jnp.float32)
        assert float(got) == float(_truncated_laplace(jnp.float32(q), u, b, LOWER, UPPER))
        assert got.dtype == jnp.float32


@pytest.mark.slow
def test_float32_outputs_stay_in_range_and_are_finite():
    b = M.bounded_laplace_scale(sensitivity=1.0, epsilon=1.0, lower=LOWER, upper=UPPER)
    for q in (LOWER, 5.0, UPPER):
        values, probabilities = exact_law(q, b)
        assert np.all(np.isfinite(values))
        assert LOWER <= values.min() and values.max() <= UPPER
        assert probabilities.sum() == pytest.approx(1.0, abs=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("q, q2", [(LOWER, LOWER + 1.0), (5.0, 6.0)])
def test_float32_release_is_pure_epsilon_dp(q, q2):
    # Fails on the reviewed code: δ(1) = 0.80 (q = 0 vs 1) and 0.44 (q = 5 vs 6) where the
    # documented guarantee is (1, 0)-DP: most float32 outputs of one data set are impossible on
    # its neighbour (porosity, Mironov 2012).
    eps, sensitivity = 1.0, 1.0
    b = M.bounded_laplace_scale(sensitivity=sensitivity, epsilon=eps, lower=LOWER, upper=UPPER)
    law, law2 = exact_law(q, b), exact_law(q2, b)
    delta = max(hockey_stick(law, law2, eps), hockey_stick(law2, law, eps))
    assert delta <= 1e-9, delta


def test_float32_support_reaches_the_same_top_for_neighbours():
    # Fails on the reviewed code: the inverse CDF at the largest float32 uniform 1 − 2⁻²³ is the
    # top of the support; from q = 0 it is 2.5709, from q′ = 0.1 it is 2.7827 (2.6709 when the
    # sampler is compiled over the whole grid: the extreme tail is the rounding of −log1p(−2m)
    # near m = ½, which depends on how XLA compiles it), so the outputs in
    # between (probability > 0 on q′) are impossible on q.
    eps, sensitivity = 1.0, 0.1
    b = M.bounded_laplace_scale(sensitivity=sensitivity, epsilon=eps, lower=LOWER, upper=UPPER)
    top = np.float32(1.0 - 2.0**-GRID_BITS)
    sampler = jax.jit(lambda q, u: _truncated_laplace(q, u, b, LOWER, UPPER))
    tops = [float(sampler(jnp.float32(q), jnp.asarray(top))) for q in (LOWER, LOWER + sensitivity)]
    assert tops[1] <= tops[0], tops
