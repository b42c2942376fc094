"""White-box audit of make_private's DP-SGD with a Dirac gradient canary (Nasr et al. 2023).

The runs go through ``make_private``'s own ``step`` (vmapped over keys). The attack: a DP-SGD
whose noise is half of what its accountant assumes (σ/2, the claim of σ) must be caught by the
assumption-free (Clopper–Pearson) white-box bound; the correct run must not be flagged.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy import stats

import dpjax
from dpjax import auditing
from dpjax.accounting.dp_sgd import dp_sgd_epsilon
from dpjax.auditing import dp_sgd_audit as dsa
from dpjax.dp_sgd.private import SLACK_FRACTION

N, BATCH, STEPS, SIGMA, DELTA, RUNS = 32, 16, 10, 3.0, 1e-2, 4000


def _loss(w, ex):
    return jnp.logaddexp(0.0, -ex["y"] * (ex["x"] @ w))


def _layouts():
    x = jax.random.normal(jax.random.key(5), (N - 1, 2))
    data = {"x": x, "y": jnp.sign(x[:, 0])}
    return [dsa.add_gradient_canaries(_loss, jnp.zeros(2), data, [inc], l2_clip_norm=1.0)
            for inc in (False, True)]  # fmt: skip


def _private(loss, sigma, key):
    return dpjax.make_private(
        loss, optimizer=dsa.canary_optimizer(optax.sgd(0.5)), l2_clip_norm=1.0,
        dataset_size=N, batch_size=BATCH, steps=STEPS, noise_multiplier=sigma, delta=DELTA,
        key=key, clipping="vmap", accounting="rdp",
    )  # fmt: skip


def _white_box_scores(sigma_run, key):
    (loss, params, d_out), (_, _, d_in) = _layouts()
    private = _private(loss, sigma_run, jax.random.fold_in(key, 0))
    keys = [jax.random.split(jax.random.fold_in(key, i), RUNS) for i in (1, 2)]
    out, inn = dsa.canary_updates_many(private, params, [d_out, d_in], keys)
    return out.observations[..., 0], inn.observations[..., 0], private.sampling_rate


@pytest.mark.parametrize("sigma_run, caught", [(SIGMA, False), (SIGMA / 2, True)])
def test_white_box_audit_catches_halved_sigma(sigma_run, caught, key):
    x_out, x_in, q = _white_box_scores(sigma_run, key)
    # what make_private claims for σ (the mutant runs σ/2 under the same claim)
    claimed = dp_sgd_epsilon(noise_multiplier=SIGMA, sampling_rate=q, steps=STEPS,
                             delta=DELTA * (1 - SLACK_FRACTION), accounting="rdp")  # fmt: skip
    # the observations are the Gaussian mechanism on the canary: N(0, σ²) out, mean q in
    tol = 4.0 / np.sqrt(x_out.size)
    assert abs(np.std(x_out) / sigma_run - 1.0) < tol * 1.5
    assert abs(np.mean(x_out)) < 4.0 * sigma_run / np.sqrt(x_out.size)
    assert abs(np.mean(x_in) - q) < 4.0 * sigma_run / np.sqrt(x_in.size)
    llr = lambda x: dsa.gradient_canary_llr(x, noise_multiplier=SIGMA, sampling_rate=q)  # noqa: E731
    bound = auditing.direct_epsilon_lower_bound(llr(x_out), llr(x_in), delta=DELTA)
    assert (bound.epsilon > claimed) == caught, (bound, claimed)


def test_gradient_canary_llr_is_the_mixture_likelihood_ratio():
    x = np.linspace(-4.0, 6.0, 11)[None, :]
    for sigma, q in [(1.0, 0.3), (2.5, 1.0), (0.7, 0.01)]:
        mixture = (1 - q) * stats.norm.pdf(x, 0, sigma) + q * stats.norm.pdf(x, 1, sigma)
        expected = np.sum(np.log(mixture / stats.norm.pdf(x, 0, sigma)), axis=-1)
        got = dsa.gradient_canary_llr(x, noise_multiplier=sigma, sampling_rate=q)
        np.testing.assert_allclose(got, expected, rtol=1e-10)


def test_states_for_keys_are_make_private_inits():
    loss, params, _ = _layouts()[0]
    k = jax.random.key(7)
    own = _private(loss, SIGMA, k).init(params)
    stacked = dsa.states_for_keys(_private(loss, SIGMA, jax.random.key(8)).init(params), k[None])
    for a, b in zip(jax.tree.leaves(own), jax.tree.leaves(stacked), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b)[0])


def test_canary_rows_clip_to_a_dirac_of_norm_c():
    loss, params, data = _layouts()[1]
    grad_fn = dpjax.clipped_grad(loss, l2_clip_norm=1.0, backend="vmap")
    row = jax.tree.map(lambda a: a[:1], data)
    total, _ = grad_fn(params, row)
    np.testing.assert_allclose(np.asarray(total["canary"]), [1.0], rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(total["model"]), np.zeros(2))


def test_audit_run_rejects_bad_arguments():
    x = jnp.ones((10, 2))
    common = dict(key=jax.random.key(0), optimizer=optax.sgd(0.1), l2_clip_norm=1.0,
                  batch_size=5, delta=1e-5, steps=1, noise_multiplier=1.0)  # fmt: skip
    with pytest.raises(ValueError, match="guesses"):
        auditing.audit_run(_loss, jnp.zeros(2), {"x": x, "y": x[:, 0]}, num_canaries=4,
                           guesses=3, **common)  # fmt: skip
    with pytest.raises(ValueError, match="input_score"):
        auditing.audit_run(_loss, jnp.zeros(2), {"x": x, "y": x[:, 0]}, num_canaries=4,
                           input_canaries={"x": x[:2], "y": x[:2, 0]}, **common)  # fmt: skip
    with pytest.raises(ValueError, match="num_canaries"):
        auditing.audit_run(_loss, jnp.zeros(2), {"x": x, "y": x[:, 0]}, num_canaries=0, **common)
