"""No import circles in fa4_aot or service (issue 7), checked on the source with ast, no import executed.

What counts as an edge:
- module-level imports only, including those inside module-level `if`/`try`/`with` blocks and class bodies (they
  run when the module is imported). Imports inside functions are left out: they run after every module involved
  has finished loading, and the tree uses them on purpose to keep FA4, httpx and the server off the import path.
- `if TYPE_CHECKING:` imports are left out of the runtime graph (they never run), but they are a dependency of
  the design all the same: a second test checks the graph with them, so that a circle hidden behind
  TYPE_CHECKING (a module that holds two concepts) is caught too.
- `from . import name` is an edge to the submodule `name` when one exists, else to the package (`name` is then
  an attribute of its __init__). Importing `a.b.c` also runs `a/__init__` and `a/b/__init__`, but those implicit
  edges are not drawn: a package's __init__ importing its own submodules is the normal layout, not a circle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("fa4_aot", "service")


def module_files(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under the given top-level packages."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(body: list[ast.stmt], type_checking: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements that run when the module is imported (plus TYPE_CHECKING ones if asked)."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            if type_checking:
                yield from _import_nodes(node.body, type_checking)
            yield from _import_nodes(node.orelse, type_checking)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        else:  # if/try/with/for/while/class bodies at module level run at import
            for field in ("body", "orelse", "finalbody", "handlers"):
                children = getattr(node, field, None) or []
                stmts = [s for c in children for s in (c.body if isinstance(c, ast.ExceptHandler) else [c])]
                yield from _import_nodes(stmts, type_checking)


def _targets(name: str, is_package: bool, node: ast.Import | ast.ImportFrom, known: set[str]) -> Iterator[str]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name in known:
                yield alias.name
        return
    if node.level:
        base = name.split(".") if is_package else name.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    for alias in node.names:
        sub = f"{target}.{alias.name}"
        if sub in known:
            yield sub
        elif target in known:
            yield target


def import_graph(root: Path, packages: tuple[str, ...], type_checking: bool = False) -> dict[str, set[str]]:
    """Module -> the modules of `packages` it imports when it is imported."""
    files = module_files(root, packages)
    known = set(files)
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        graph[name] = {t for node in _import_nodes(tree.body, type_checking)
                       for t in _targets(name, is_package, node, known) if t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted; sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
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
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _describe(graph: dict[str, set[str]], component: list[str]) -> str:
    inside = set(component)
    return "; ".join(f"{m} -> {', '.join(sorted(graph[m] & inside))}" for m in component)


# -- the checker itself, on small made-up packages ----------------------------------------------------------

def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


CASES = {
    "relative circle": ({"p/__init__.py": "", "p/a.py": "from .b import x\n", "p/b.py": "from . import a\n"},
                        [["p.a", "p.b"]], [["p.a", "p.b"]]),
    "absolute circle through a package": (
        {"p/__init__.py": "", "p/sub/__init__.py": "from p.sub import c\n", "p/sub/c.py": "from p.sub import x\n"},
        [["p.sub", "p.sub.c"]], [["p.sub", "p.sub.c"]]),
    "function-level import is no circle": (
        {"p/__init__.py": "", "p/a.py": "import p.b\n", "p/b.py": "def f():\n    from . import a\n"}, [], []),
    "TYPE_CHECKING import counts only for the design graph": (
        {"p/__init__.py": "", "p/a.py": "import p.b\n",
         "p/b.py": "import typing\nif typing.TYPE_CHECKING:\n    from .a import A\nelse:\n    pass\n"},
        [], [["p.a", "p.b"]]),
    "import inside try at module level counts": (
        {"p/__init__.py": "", "p/a.py": "try:\n    from .b import x\nexcept ImportError:\n    pass\n",
         "p/b.py": "from .a import y\n"}, [["p.a", "p.b"]], [["p.a", "p.b"]]),
    "package __init__ importing its submodules is fine": (
        {"p/__init__.py": "from . import a, b\n", "p/a.py": "from .b import x\n", "p/b.py": "import os\n"}, [], []),
    "submodule importing the package __init__ back is a circle": (
        {"p/__init__.py": "from .a import x\n", "p/a.py": "from . import main\n"},
        [["p", "p.a"]], [["p", "p.a"]]),
}


@pytest.mark.parametrize("case", CASES)
def test_checker_finds_circles(tmp_path: Path, case: str) -> None:
    files, runtime, design = CASES[case]
    _write(tmp_path, files)
    assert cycles(import_graph(tmp_path, ("p",))) == runtime
    assert cycles(import_graph(tmp_path, ("p",), type_checking=True)) == design


# -- the tree ------------------------------------------------------------------------------------------------

def test_no_import_circles() -> None:
    """The imports that run: no module of fa4_aot or service is imported, directly or not, by its own import."""
    graph = import_graph(ROOT, PACKAGES)
    assert len(graph) > 40  # the walk found the tree
    found = cycles(graph)
    assert not found, "import circles: " + " | ".join(_describe(graph, c) for c in found)


def test_no_design_circles() -> None:
    """The same with TYPE_CHECKING imports: a circle there means one concept split over two modules."""
    graph = import_graph(ROOT, PACKAGES, type_checking=True)
    found = cycles(graph)
    assert not found, "circles through TYPE_CHECKING imports: " + " | ".join(_describe(graph, c) for c in found)
