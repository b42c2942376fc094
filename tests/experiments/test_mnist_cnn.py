"""The MNIST CNN experiment: the paper's architecture, never run by `all`, never a silent skip."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.models import max_pool_2x2_stride1
from experiments import mnist_cnn, registry


def test_missing_mnist_files_give_a_skipped_section_with_the_hint(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DPJAX_DATA", str(tmp_path / "empty"))
    summary = mnist_cnn.run(tmp_path / "out")
    assert summary["verdict"].startswith("SKIPPED")
    assert "make data" in summary["report_md"]
    assert "SKIPPED" in capsys.readouterr().err


def test_run_by_name_only():
    assert "mnist_cnn" in registry.EXPERIMENTS and "mnist_cnn" not in registry.ORDER


def test_the_model_has_the_papers_shapes():
    """Tramèr & Boneh's MNIST_CNN: 26 010 parameters (16·64+16, 32·256+32, 512·32+32, 330)."""
    from flax import nnx

    model = mnist_cnn.build_model(jax.random.key(0))
    params = nnx.state(model, nnx.Param)
    count = sum(x.size for x in jax.tree_util.tree_leaves(params))
    assert count == 16 * 64 + 16 + 32 * 16 * 16 + 32 + 512 * 32 + 32 + 32 * 10 + 10
    assert model(jnp.zeros((3, 28, 28, 1), jnp.float32)).shape == (3, 10)


def test_the_shifted_max_pool_is_flaxs_max_pool_in_value_and_gradient():
    """Both CNNs pool by four shifted maxima instead of ``nnx.max_pool`` (whose CPU gradient is
    slow): the same values, and the same gradient wherever no window holds a tie (up to the
    float32 rounding of summing an input's windows in another order)."""
    from flax import nnx

    h = jax.random.normal(jax.random.key(3), (2, 9, 7, 4), jnp.float32)
    weights = jax.random.normal(jax.random.key(4), (2, 8, 6, 4), jnp.float32)
    flax_pool = lambda a: nnx.max_pool(a, (2, 2), strides=(1, 1))  # noqa: E731
    assert max_pool_2x2_stride1(h).shape == flax_pool(h).shape == (2, 8, 6, 4)
    assert jnp.array_equal(max_pool_2x2_stride1(h), flax_pool(h))
    grad = lambda pool: jax.grad(lambda a: jnp.sum(weights * pool(a)))(h)  # noqa: E731
    np.testing.assert_allclose(grad(max_pool_2x2_stride1), grad(flax_pool),
                               rtol=0, atol=1e-6)  # fmt: skip
    assert float(jnp.abs(grad(flax_pool)).sum()) > 0
