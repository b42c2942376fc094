"""``import dpjax`` is cheap, and every public name still resolves.

The top level loads its rooms (``dpjax.accounting``, ``dpjax.dp_sgd``, ...) and ``os_key`` on
first access (PEP 562), so ``import dpjax`` (and a console script's ``--help``) imports neither
JAX nor dp-accounting, SciPy, scikit-learn or flax; ``dpjax.erm`` loads scikit-learn only for
``PrivateLogisticRegression``. The checks run in fresh interpreters (this process has imported
everything already). Timing is the benchmark's (``python -m benchmarks --startup``), not a test's.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import types

import pytest

import dpjax

ROOT = pathlib.Path(__file__).resolve().parents[2]
HEAVY = ("jax", "dp_accounting", "scipy", "sklearn", "flax", "optax")


def _loaded_after(code: str) -> list[str]:
    """The modules of HEAVY loaded after running ``code`` in a fresh interpreter."""
    probe = (
        f"{code}\nimport json, sys\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_dpjax_loads_no_heavy_dependency():
    """Catches a top-level import that pulls JAX, dp-accounting, SciPy or scikit-learn back in."""
    assert _loaded_after("import dpjax") == []


def test_every_public_name_resolves_to_its_room():
    """Each name of ``dpjax.__all__`` is there; the rooms are the imported modules and the
    DP-SGD entry points are ``dpjax.dp_sgd``'s own objects."""
    import dpjax.dp_sgd

    for name in dpjax.__all__:
        value = getattr(dpjax, name)
        if isinstance(value, types.ModuleType):
            assert value is sys.modules[f"dpjax.{name}"], name
        elif name in dpjax.dp_sgd.__all__:
            assert value is getattr(dpjax.dp_sgd, name), name
    rooms = {"accounting", "auditing", "dp_sgd", "erm", "events", "mechanisms", "tuning"}
    assert rooms <= set(dpjax.__all__)


@pytest.mark.slow  # a fresh interpreter importing every room (~4 s of CPU); the default suite
# checks the names in-process (above) and the light import (first test)
def test_lazy_names_resolve_in_a_fresh_interpreter():
    """As a user writes them, before anything else imported the rooms: ``import dpjax.erm``
    without scikit-learn, then ``from dpjax import make_private, os_key``,
    ``from dpjax.accounting import ...`` and the estimator (which brings scikit-learn)."""
    code = (
        "import sys\n"
        "import dpjax.erm\n"
        "assert 'sklearn' not in sys.modules, 'import dpjax.erm loaded scikit-learn'\n"
        "import dpjax\n"
        "from dpjax import make_private, os_key\n"
        "from dpjax.accounting import dp_sgd_epsilon\n"
        "from dpjax.erm import PrivateLogisticRegression\n"
        "assert make_private is dpjax.dp_sgd.make_private\n"
        "assert dp_sgd_epsilon is dpjax.accounting.dp_sgd_epsilon\n"
        "assert os_key.__module__ == 'dpjax._random'\n"
        "assert PrivateLogisticRegression.__module__ == 'dpjax.erm.estimator'\n"
        "assert set(dpjax.__all__) <= set(dir(dpjax))\n"
    )
    assert {"dp_accounting", "sklearn"} <= set(_loaded_after(code))


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'make_privat'"):
        dpjax.make_privat  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute 'Estimator'"):
        dpjax.erm.Estimator  # noqa: B018
