"""Sphinx configuration: the API reference from the docstrings, the guides in Markdown.

Built by ``make docs`` (warnings are errors) into ``docs/_build/html``; the test suite builds it
too (``tests/docs/test_docs_build.py``).
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)  # document this checkout's dpjax, not another installed one
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "_ext"))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import dpjax  # noqa: E402

project = "dpjax"
author = "the dpjax authors"
copyright = "the dpjax authors, Apache-2.0"  # noqa: A001
release = dpjax.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "myst_parser",
    "dpjax_docstrings",  # docs/_ext: plain-text math (|x|, coef_) in the docstrings
]

# Guides are Markdown (MyST): $...$ and $$...$$ are math, rendered by MathJax.
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
myst_enable_extensions = ["dollarmath", "colon_fence", "deflist"]
myst_heading_anchors = 3
exclude_patterns = ["_build"]

# Google-style docstrings; "Formal guarantees" (the theorem behind each privacy claim) and
# "Security" are dpjax's own sections.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_custom_sections = ["Formal guarantees", "Security"]
napoleon_attr_annotations = True
napoleon_use_ivar = True  # "Attributes:" as fields: the members are documented by autodoc

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
autodoc_default_options = {"members": True, "undoc-members": True, "show-inheritance": False}
autodoc_type_aliases = {"PRNGKey": "dpjax.typing.PRNGKey", "PyTree": "dpjax.typing.PyTree"}

# Type hints name third-party classes (jax.Array, optax.GradientTransformation, ...) that this
# offline build cannot link (no intersphinx): they stay plain text, never a warning.
nitpicky = False
smartquotes = False  # primes and quotes in the plain-text math stay as written

html_theme = "alabaster"
html_title = f"dpjax {release}"
html_theme_options = {
    "description": "Differentially private optimization in JAX",
    "fixed_sidebar": True,
    "page_width": "1100px",
    "sidebar_width": "230px",
}
html_static_path: list[str] = []
