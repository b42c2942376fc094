"""The registry of experiments: name -> module with ``add_arguments(parser)`` and ``run(args)``.

Each experiment module defines

* ``DESCRIPTION``: one line for ``--help``;
* ``run(out_dir: pathlib.Path, *, full: bool, seed: int) -> dict``: runs, writes its JSON and
  plots under ``out_dir`` and returns a summary dict (``{"report_md": "...markdown..."}`` at least).

``ORDER`` lists what ``python -m experiments all`` runs (the main job, ``make reproduce``).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import pathlib
import sys
import time
from types import ModuleType
from typing import Any

# name -> module path. Add new experiments here.
EXPERIMENTS: dict[str, str] = {
    "rates": "experiments.rates",
    "audit": "experiments.audit",
    "composition": "experiments.composition",
    "utility": "experiments.utility",
    "tuning": "experiments.tuning",
    "finetune": "experiments.finetune",
    "auto_clip": "experiments.auto_clip",
    "correlated": "experiments.correlated",
    "erm_adult": "experiments.erm_adult",
    "mnist_cnn": "experiments.mnist_cnn",
    "scatternet": "experiments.scatternet",
    "published": "experiments.published",
    "opacus_mnist": "experiments.opacus_mnist",
    "finetune_lm": "experiments.finetune_lm",
}

# Run by name only, never by `all` (`make reproduce`): their data need npm/apt (`make data`);
# opacus_mnist also needs torch and opacus (the bench-torch extra). Their measured rows reach
# REPORT.md through the committed results file that `published` reads.
BY_NAME_ONLY: tuple[str, ...] = ("mnist_cnn", "opacus_mnist")

# Submitted first when `--jobs` > 1 (the longest at the quick scale: rates ~460 s, utility ~470,
# finetune ~150 with its text half, audit ~120; finetune_lm ~500 s, ~300 CPU-s, when `make data`
# has put the model file in place, else it is skipped at once), so no core idles at the end.
LONGEST_FIRST: tuple[str, ...] = ("rates", "finetune_lm", "utility", "finetune", "audit")

# The rate reproduction is the main job: it runs first and its table heads REPORT.md.
ORDER: tuple[str, ...] = ("rates",) + tuple(
    n for n in EXPERIMENTS if n != "rates" and n not in BY_NAME_ONLY
)


def load(name: str) -> ModuleType:
    """Import the module of experiment ``name``."""
    if name not in EXPERIMENTS:
        raise ValueError(f"experiment must be one of {sorted(EXPERIMENTS)!r}; got {name!r}")
    return importlib.import_module(EXPERIMENTS[name])


def description(name: str) -> str:
    """The ``DESCRIPTION`` line of experiment ``name``, read from its source without importing
    it (importing every experiment would load JAX, dp-accounting and scikit-learn just to print
    ``--help``); an experiment whose line is not a plain string literal is imported."""
    module_path = EXPERIMENTS[name]
    loaded = sys.modules.get(module_path)
    if loaded is not None:
        return loaded.DESCRIPTION
    spec = importlib.util.find_spec(module_path)
    if spec is not None and spec.origin and spec.origin.endswith(".py"):
        tree = ast.parse(pathlib.Path(spec.origin).read_text(encoding="utf-8"))
        for node in tree.body:
            if (
                isinstance(node, ast.Assign)
                and [getattr(t, "id", None) for t in node.targets] == ["DESCRIPTION"]
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
            ):
                return node.value.value
    return load(name).DESCRIPTION


def run_module(module_path: str, out: pathlib.Path, full: bool, seed: int, size: Any) -> dict:
    """Run the experiment module ``module_path`` (in a worker process of ``--jobs`` > 1: this
    function lives here, not in ``__main__``, so that spawned workers can import it); returns
    its report section, verdict and wall seconds."""
    module = importlib.import_module(module_path)
    kwargs: dict[str, Any] = {"full": full, "seed": seed}
    if size is not None and "size" in inspect.signature(module.run).parameters:
        kwargs["size"] = size
    start = time.perf_counter()
    summary = module.run(out, **kwargs)
    keep = {k: summary[k] for k in ("report_md", "verdict") if summary.get(k)}
    return keep | {"seconds": time.perf_counter() - start}
