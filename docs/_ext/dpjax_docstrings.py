"""dpjax's docstring dialect for Sphinx: plain-text math next to reStructuredText.

dpjax's docstrings write their math in Unicode plain text, readable in ``help()`` and in an
editor: ``|x|`` is an absolute value, ``‖g‖`` a norm, ``coef_`` a scikit-learn attribute. In
reStructuredText ``|x|`` is a substitution and ``coef_`` a hyperlink reference, so before the
docstrings are parsed this extension escapes ``|`` and a word's trailing ``_`` everywhere except
where reST markup is meant: inside backticks (literals, roles such as ``:math:`...```), in
doctest lines, and in literal and directive blocks (``::``, ``.. math::``). It also leaves out
the members that scikit-learn generates on estimators (``set_fit_request``, ...), whose
docstrings point into scikit-learn's own documentation.
"""

from __future__ import annotations

import re

_BACKTICKED = re.compile(r"(``.*?``|:[\w:.-]+:`[^`]*`|`[^`]*`_{0,2})")
_TRAILING_UNDERSCORE = re.compile(r"(?<=\w)_(?=$|[\s.,;:!?)\]}'\"/])")


def _escape_text(text: str) -> str:
    """Escape ``|`` and trailing ``_`` outside backticked segments of one line."""
    parts = _BACKTICKED.split(text)
    for i in range(0, len(parts), 2):  # even indices: outside backticks
        parts[i] = _TRAILING_UNDERSCORE.sub(r"\\_", parts[i].replace("|", r"\|"))
    return "".join(parts)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def escape_plain_math(lines: list[str]) -> list[str]:
    """The docstring's lines with plain-text ``|`` and ``_`` escaped (markup left as is)."""
    out = []
    block_indent = None  # indentation of the line that opened a literal/directive block
    in_doctest = False  # a doctest block runs from a ">>>" line to the next blank line
    for line in lines:
        stripped = line.strip()
        if block_indent is not None:
            if not stripped or _indent(line) > block_indent:
                out.append(line)
                continue
            block_indent = None
        in_doctest = bool(stripped) and (in_doctest or stripped.startswith(">>>"))
        if in_doctest:
            out.append(line)
            continue
        if stripped.startswith(".. ") or stripped.endswith("::"):
            block_indent = _indent(line)
            out.append(line if stripped.startswith(".. ") else _escape_text(line))
            continue
        out.append(_escape_text(line))
    return out


def _process_docstring(app, what, name, obj, options, lines):
    lines[:] = escape_plain_math(lines)


def _skip_foreign_members(app, what, name, obj, skip, options):
    module = getattr(obj, "__module__", None) or ""
    if module.startswith("sklearn."):
        return True
    return None


def setup(app):
    # Before napoleon (priority 500) turns the Google sections into reST fields.
    app.connect("autodoc-process-docstring", _process_docstring, priority=400)
    app.connect("autodoc-skip-member", _skip_foreign_members)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
