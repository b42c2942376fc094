"""The mechanisms' vmap guard: a vmap over the values needs one distinct key per row.

Attack (review finding): ``jax.vmap(lambda q: mechanism(key, q, ...))(queries)`` with the key
closed over drew ONE noise sample that every row received, so the rows' differences were
released noise-free. Every public mechanism ``name(key, values, ...)`` now refuses it
(``ValueError`` naming ``key``), refuses a batch of repeated keys eagerly and voids the
release under ``jit``; distinct keys per row keep working and give distinct noise.
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpjax import mechanisms as M
from dpjax.mechanisms._vmap_guard import guarded_release, unguarded

ROWS = 3
KEY = jax.random.key(7)
UNMATCHED = "key must be batched by every jax.vmap that batches"
REPEATED = "key must be a batch of DISTINCT keys"

# name -> (mechanism(key, values), a batch of ROWS values)
CASES = {
    "gaussian": (
        lambda k, v: M.gaussian(k, v, sensitivity=1.0, epsilon=1.0, delta=1e-5),
        jnp.array([0.0, 5.0, 7.0]),
    ),
    "laplace": (
        lambda k, v: M.laplace(k, v, sensitivity=1.0, epsilon=1.0),
        jnp.array([0.0, 5.0, 7.0]),
    ),
    "mixed_noise": (
        lambda k, v: M.mixed_noise(k, v, sensitivity=1.0, epsilon=1.0, delta=1e-5),
        jnp.array([0.0, 5.0, 7.0]),
    ),
    "bounded_laplace": (
        lambda k, v: M.bounded_laplace(k, v, sensitivity=1.0, epsilon=1.0, lower=0.0, upper=8.0),
        jnp.array([0.0, 5.0, 7.0]),
    ),
    "discrete_laplace": (
        lambda k, v: M.discrete_laplace(k, v, sensitivity=1.0, epsilon=1.0, bound=8.0),
        jnp.array([0.0, 5.0, 7.0]),
    ),
    "discrete_gaussian": (
        lambda k, v: M.discrete_gaussian(k, v, sensitivity=1, sigma=3),
        jnp.array([0, 5, 7]),
    ),
    "noisy_counts": (
        lambda k, v: M.noisy_counts(k, v, sigma=3, clamp=False),
        jnp.array([[10, 0], [15, 2], [17, 4]]),
    ),
    "exponential_mechanism": (
        lambda k, v: M.exponential_mechanism(k, v, sensitivity=1.0, epsilon=1.0),
        jnp.zeros((ROWS, 4)),
    ),
    "report_noisy_max": (
        lambda k, v: M.report_noisy_max(k, v, sensitivity=1.0, epsilon=1.0),
        jnp.zeros((ROWS, 4)),
    ),
    "randomized_response": (
        lambda k, v: M.randomized_response(k, v, epsilon=1.0, num_categories=3),
        jnp.array([[0, 1], [2, 1], [1, 0]]),
    ),
    "coin_randomized_response": (
        M.coin_randomized_response,
        jnp.array([[True, False], [False, False], [True, True]]),
    ),
    "smooth_median": (
        lambda k, v: M.smooth_median(k, v, upper=1.0, epsilon=1.0),
        jnp.linspace(0.0, 1.0, ROWS * 9).reshape(ROWS, 9),
    ),
    "clipped_mean": (
        lambda k, v: M.clipped_mean(k, v, lower=0.0, upper=1.0, epsilon=1.0),
        jnp.linspace(0.0, 1.0, ROWS * 4).reshape(ROWS, 4),
    ),
    "subsample_and_aggregate": (
        lambda k, v: M.subsample_and_aggregate(
            k, v, jnp.mean, num_blocks=2, lower=0.0, upper=1.0, epsilon=1.0, shuffle=False
        ),
        jnp.linspace(0.0, 1.0, ROWS * 6).reshape(ROWS, 6),
    ),
}
# public functions that take a key but release no data: heavy_tailed_noise is a sampler
# (shape and dtype only; there are no values for a vmap to batch)
NOT_RELEASES = {"heavy_tailed_noise"}


def repeated_keys(n: int = ROWS) -> jax.Array:
    return jax.random.wrap_key_data(jnp.tile(jax.random.key_data(KEY)[None], (n, 1)))


def test_every_public_mechanism_with_a_key_is_guarded_and_tested():
    public = {n: getattr(M, n) for n in dir(M) if not n.startswith("_")}  # __all__ too narrow
    keyed = {
        name
        for name, obj in public.items()
        if inspect.isfunction(obj) and next(iter(inspect.signature(obj).parameters), None) == "key"
    }
    guarded = {n for n in keyed if hasattr(getattr(M, n), "__dpjax_guarded_values__")}
    assert guarded == keyed - NOT_RELEASES
    assert set(CASES) == guarded


def test_the_attack_one_key_releases_noise_free_differences_without_the_guard():
    """What the guard stops: the unguarded mechanism adds ONE draw to every row (this is what
    ``jax.vmap(lambda v: laplace(key, v, ...))`` released before the guard)."""
    values = CASES["laplace"][1]
    raw = unguarded(M.laplace)
    rows = jax.vmap(lambda v: raw(KEY, v, sensitivity=1.0, epsilon=0.1))(values)
    noise = np.asarray(rows - values)
    np.testing.assert_allclose(noise, np.full(ROWS, noise[0]), rtol=1e-6)
    assert noise[0] != 0.0  # noise was added, one draw: the differences are exact


@pytest.mark.parametrize("name", sorted(CASES))
def test_one_key_for_batched_values_is_refused(name):
    release, values = CASES[name]
    with pytest.raises(ValueError, match=UNMATCHED) as raised:
        jax.vmap(lambda v: release(KEY, v))(values)
    assert "jax.random.split(key, n)" in str(raised.value)


@pytest.mark.parametrize("name", ["gaussian", "exponential_mechanism", "randomized_response"])
def test_one_key_passed_with_in_axes_none_is_refused_under_jit(name):
    release, values = CASES[name]
    with pytest.raises(ValueError, match=UNMATCHED):
        jax.jit(jax.vmap(release, in_axes=(None, 0)))(KEY, values)


def test_a_raw_uint32_key_is_guarded_too():
    release, values = CASES["laplace"]
    with pytest.raises(ValueError, match=UNMATCHED):
        jax.vmap(lambda v: release(jax.random.PRNGKey(0), v))(values)


def test_a_vmap_over_rows_inside_a_vmap_over_runs_is_refused():
    """Each run has its own key, but the inner vmap gives the run's rows one key."""
    release, values = CASES["laplace"]
    keys = jax.random.split(KEY, 2)
    per_run = jax.vmap(lambda k, vs: jax.vmap(lambda v: release(k, v))(vs))
    with pytest.raises(ValueError, match=UNMATCHED):
        per_run(keys, jnp.stack([values, values]))


@pytest.mark.parametrize("name", sorted(CASES))
def test_repeated_keys_in_a_batch_are_refused(name):
    release, values = CASES[name]
    with pytest.raises(ValueError, match=REPEATED):
        jax.vmap(release)(repeated_keys(), values)


def test_a_grid_whose_keys_repeat_across_levels_is_refused():
    release, values = CASES["gaussian"]
    k1, k2 = jax.random.split(KEY)
    grid = jnp.stack([jnp.stack([k1, k2]), jnp.stack([k2, k1])])  # distinct along each axis
    with pytest.raises(ValueError, match=REPEATED):
        jax.vmap(jax.vmap(release))(grid, jnp.stack([values[:2], values[1:]]))


@pytest.mark.parametrize(
    ("name", "void"),
    [
        ("gaussian", np.nan),
        pytest.param("smooth_median", np.nan, marks=pytest.mark.slow),
        pytest.param("exponential_mechanism", "min", marks=pytest.mark.slow),
        pytest.param("discrete_gaussian", "min", marks=pytest.mark.slow),
        ("randomized_response", "min"),
        ("coin_randomized_response", False),
    ],
)
def test_repeated_keys_under_jit_void_the_release(name, void):
    """NaN; integers the dtype's minimum (no mechanism releases it); bool False."""
    release, values = CASES[name]
    out = np.asarray(jax.jit(jax.vmap(release))(repeated_keys(), values))
    void = np.iinfo(out.dtype).min if void == "min" else void
    np.testing.assert_array_equal(out, np.full(out.shape, void, out.dtype))


@pytest.mark.parametrize(
    "name",
    [
        "laplace",
        *(
            pytest.param(name, marks=pytest.mark.slow)
            for name in ("gaussian", "bounded_laplace", "discrete_gaussian", "clipped_mean")
        ),
    ],
)
def test_distinct_keys_per_row_are_each_one_release(name):
    """A vmap over runs with one key per row: row i is the unbatched release with key i, and
    rows of equal values get different noise."""
    release, values = CASES[name]
    keys = jax.random.split(KEY, ROWS)
    same = jnp.stack([values[0]] * ROWS)
    batched = np.asarray(jax.jit(jax.vmap(release))(keys, same))
    singles = np.stack([np.asarray(release(k, v)) for k, v in zip(keys, same, strict=True)])
    np.testing.assert_allclose(batched, singles, rtol=1e-6)
    assert len({row.tobytes() for row in batched}) == ROWS


def test_many_runs_of_one_data_set_pass():
    """The auditing harness's pattern: keys batched, the data not (no check, no void)."""
    release, values = CASES["laplace"]
    keys = jax.random.split(KEY, 16)
    draws = np.asarray(jax.jit(jax.vmap(release, in_axes=(0, None)))(keys, values[0]))
    assert np.all(np.isfinite(draws)) and len(set(draws.tolist())) == 16


def test_grad_through_a_mechanism_is_unchanged():
    release = CASES["laplace"][0]
    np.testing.assert_allclose(jax.grad(lambda v: release(KEY, v))(2.0), 1.0)


@pytest.mark.slow
def test_jvp_and_per_row_grad_through_a_vmapped_mechanism_are_unchanged():
    release, values = CASES["laplace"]
    _, tangent = jax.jvp(lambda v: release(KEY, v), (values,), (jnp.ones(ROWS),))
    np.testing.assert_allclose(tangent, np.ones(ROWS))
    keys = jax.random.split(KEY, ROWS)
    per_row = jax.vmap(jax.grad(lambda v, k: release(k, v)))(values, keys)
    np.testing.assert_allclose(per_row, np.ones(ROWS))


def test_lax_map_with_a_batch_size_is_refused():
    """``lax.map(..., batch_size=)`` vmaps inside: one key for the batch's rows is refused."""
    release, values = CASES["laplace"]
    with pytest.raises(ValueError, match=UNMATCHED):
        jax.lax.map(lambda v: release(KEY, v), values, batch_size=ROWS)


def test_a_release_guarded_on_several_values_checks_each():
    """``guarded_release("X", "y")`` (a data set of two arrays): batching either is a row."""

    @guarded_release("X", "y")
    def release(key, X, y, *, scale):
        return jnp.sum(X) + jnp.sum(y) + scale * jax.random.normal(key)

    X, y = jnp.ones((ROWS, 2)), jnp.ones(ROWS)
    for in_axes in [(0, None), (None, 0)]:
        with pytest.raises(ValueError, match=r"batches X and y"):
            jax.vmap(lambda a, b: release(KEY, a, b, scale=1.0), in_axes=in_axes)(X, y)
    keys = jax.random.split(KEY, ROWS)
    out = jax.vmap(lambda k, a, b: release(k, a, b, scale=1.0))(keys, X, y)
    assert len(set(np.asarray(out).tolist())) == ROWS
