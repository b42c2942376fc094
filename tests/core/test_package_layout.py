"""The library's layout stays navigable: short modules, no import circle, every package shipped.

* No module under ``dpjax/`` is longer than :data:`MAX_LINES` lines.
* The import graph of ``dpjax/`` has no cycle. Every ``import`` statement counts, at the top
  of a module or inside a function (a lazy import still ties the two modules together); an
  import under ``if TYPE_CHECKING:`` does not (it never runs). ``from pkg import name`` is an
  edge to the submodule ``pkg.name`` when there is one, else to ``pkg``. The parent packages
  that Python initialises before a submodule are not edges (every module would otherwise
  depend on ``dpjax/__init__.py``, which imports the whole library).
* ``[tool.setuptools] packages`` in ``pyproject.toml`` lists every package of ``dpjax/``.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "dpjax"
MAX_LINES = 800


def module_name(path: Path, root: Path = ROOT) -> str:
    """``dpjax/dp_sgd/training/loop.py`` -> ``dpjax.dp_sgd.training.loop``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def library_modules(library: Path = LIBRARY) -> dict[str, Path]:
    """Every module of the library by dotted name (a package by its ``__init__.py``)."""
    return {module_name(p, library.parent): p for p in sorted(library.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of a module, at any depth, except under ``if TYPE_CHECKING:``."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _base_of(node: ast.ImportFrom, name: str, is_package: bool) -> str:
    """The absolute module a ``from ... import`` names (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    package = name.split(".") if is_package else name.split(".")[:-1]
    package = package[: len(package) - (node.level - 1)]
    return ".".join(package + ([node.module] if node.module else []))


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """``{module: {library modules it imports}}`` (see the module docstring for the rules)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges: set[str] = set()
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in _imports(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = _base_of(node, name, path.name == "__init__.py")
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                    for alias in node.names
                ]
            edges.update(t for t in targets if t in modules and t != name)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each as one
    circle through its modules, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(_circle(graph, set(component)))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(components)


def _circle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """One closed path inside a strongly connected component, from its first module back."""
    start = min(component)
    path, seen = [start], {start}
    while True:
        nxt = sorted(w for w in graph[path[-1]] if w in component)
        back = [w for w in nxt if w == start]
        if back and len(path) > 1:
            return path + [start]
        fresh = [w for w in nxt if w not in seen]
        if not fresh:  # dead end inside the component: fall back to listing it
            return sorted(component)
        path.append(fresh[0])
        seen.add(fresh[0])


def _packages(library: Path = LIBRARY) -> set[str]:
    return {module_name(p.parent, library.parent) for p in library.rglob("__init__.py")}


# ----------------------------------------------------------------------------- the claims


def test_no_module_of_the_library_is_longer_than_800_lines():
    """Catches a module grown past MAX_LINES (split it along its seams)."""
    long = {
        name: n
        for name, path in library_modules().items()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_the_library_has_no_import_circle():
    """Catches two library modules that import each other, directly or through others."""
    found = cycles(import_graph(library_modules()))
    assert not found, "import circles: " + "; ".join(" -> ".join(c) for c in found)


def test_pyproject_ships_every_package_of_the_library():
    """Catches a new sub-package missing from [tool.setuptools] packages (not installed)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    listed = set(config["tool"]["setuptools"]["packages"])
    missing = sorted(_packages() - listed)
    assert not missing, f"packages missing from pyproject.toml: {missing}"


# ----------------------------------------------------------------------------- the checker


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root / "pkg"


def test_the_circle_check_finds_a_lazy_import_circle(tmp_path):
    """The old private.py / user_level.py pair: a top-level import one way, a function-level
    import back; the check must name both modules."""
    library = _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/sub/__init__.py": "from pkg.sub.private import make\n",
            "pkg/sub/private.py": (
                "class Training: ...\n\n"
                "def make():\n    from pkg.sub import user_level\n    return user_level\n"
            ),
            "pkg/sub/user_level.py": "from pkg.sub.private import Training\n",
        },
    )
    found = cycles(import_graph(library_modules(library)))
    assert found == [["pkg.sub.private", "pkg.sub.user_level", "pkg.sub.private"]]


def test_the_circle_check_accepts_a_shared_lower_module_and_ignores_type_checking(tmp_path):
    """The split: both modules import a lower one; a TYPE_CHECKING import is not an edge."""
    library = _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/loop.py": "class Training: ...\n",
            "pkg/factory.py": "def make():\n    from . import user_level\n    return user_level\n",
            "pkg/user_level.py": (
                "from typing import TYPE_CHECKING\nfrom pkg.loop import Training\n"
                "if TYPE_CHECKING:\n    from pkg import factory\n"
            ),
        },
    )
    graph = import_graph(library_modules(library))
    assert graph["pkg.factory"] == {"pkg.user_level"}
    assert graph["pkg.user_level"] == {"pkg.loop"}
    assert cycles(graph) == []


def test_the_line_count_and_package_checks_see_the_real_tree():
    """The checks read the library itself (not an empty glob)."""
    modules = library_modules()
    assert "dpjax.dp_sgd.training.loop" in modules and "dpjax" in modules
    assert "dpjax.dp_sgd.training" in _packages()
