"""The MNIST CNN experiment: the paper's architecture, never run by `all`, never a silent skip."""

from __future__ import annotations

import jax
import jax.numpy as jnp

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
