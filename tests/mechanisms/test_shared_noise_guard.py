"""pmap/shard_map with one replicated key: not guarded, so documented where users read it.

The vmap guard sees a vmap's batching rule; ``jax.pmap`` and ``shard_map`` have no such hook
this JAX exposes, so a key replicated to every device gives every device the SAME noise. The
tests pin what the docs tell users: the replicated key shares one draw (the hazard is real),
the documented remedy (``fold_in(key, axis_index)``) gives each device its own draw, and the
README, the mechanisms guide and the mechanisms' docstrings say so.
"""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from dpjax import mechanisms

ROOT = pathlib.Path(__file__).resolve().parents[2]

_PMAP_PROBE = textwrap.dedent(
    """
    import json, sys
    import jax, jax.numpy as jnp
    from dpjax import mechanisms
    key = jax.random.key(0)
    rows = jnp.array([0.0, 1.0], jnp.float32)
    lap = lambda k, v: mechanisms.laplace(k, v, sensitivity=1.0, epsilon=1.0)
    shared = jax.pmap(lap, in_axes=(None, 0))(key, rows)
    own = jax.pmap(lambda v: lap(jax.random.fold_in(key, jax.lax.axis_index("d")), v),
                   axis_name="d")(rows)
    json.dump({"shared": [float(x) for x in shared], "own": [float(x) for x in own]},
              sys.stdout)
    """
)


@pytest.fixture(scope="module")
def pmap_release():
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
    }
    run = subprocess.run(
        [sys.executable, "-c", _PMAP_PROBE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_replicated_key_under_pmap_shares_one_noise_draw(pmap_release):
    # the hazard the docs warn about: rows 0 and 1 released exactly 1 apart (noise-free)
    a, b = pmap_release["shared"]
    assert b - a == pytest.approx(1.0, abs=1e-6)


def test_one_key_per_device_gives_independent_noise(pmap_release):
    a, b = pmap_release["own"]
    assert b - a != pytest.approx(1.0, abs=1e-3)


def test_users_are_told_where_they_read():
    readme = (ROOT / "README.md").read_text()
    guide = (ROOT / "docs" / "guides" / "mechanisms.md").read_text()
    for text in (readme, guide):
        assert "pmap" in text and "shard_map" in text
        assert "axis_index" in text
    for fn in (
        mechanisms.laplace,
        mechanisms.gaussian,
        mechanisms.discrete_gaussian,
        mechanisms.discrete_laplace,
    ):
        assert "shard_map" in fn.__doc__ and "one key per device" in fn.__doc__
