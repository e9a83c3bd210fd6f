"""The house's plan, checked on the source with ast (no import executed): no import circles in fa4_aot or service
(issue 7), counted honestly (issue 20), and fa4_aot's packages layered as docs/architecture.md's "Where a change
belongs" says.

What counts as an edge: every import statement of a module, wherever it stands: at module level, inside
`if`/`try`/`with` blocks and class bodies, and inside functions. An import inside a function runs later than one at
the top, but a circle through it is a circle all the same (two modules that need each other hold one concept
between them), so it is counted (issue 20: 162 such imports had hidden three circles).
- `if TYPE_CHECKING:` imports never run: they are left out of the runtime graph, and a second test checks the
  graph with them (the design graph), so that a circle hidden behind TYPE_CHECKING is caught too.
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
    """Every import statement of `body`, in functions too; those under `if TYPE_CHECKING:` only if asked."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            if type_checking:
                yield from _import_nodes(node.body, type_checking)
            yield from _import_nodes(node.orelse, type_checking)
        else:  # function bodies, if/try/with/for/while/match, class bodies
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    yield from _import_nodes([child], type_checking)
                elif isinstance(child, ast.ExceptHandler | ast.match_case):
                    yield from _import_nodes(child.body, type_checking)


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
    """Module -> the modules of `packages` it imports (anywhere in it; TYPE_CHECKING imports only if asked)."""
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
    "function-level import is a circle too": (
        {"p/__init__.py": "", "p/a.py": "import p.b\n", "p/b.py": "def f():\n    from . import a\n"},
        [["p.a", "p.b"]], [["p.a", "p.b"]]),
    "an import in a method or an except clause counts": (
        {"p/__init__.py": "", "p/a.py": "import p.b\n",
         "p/b.py": "class C:\n    def m(self):\n        try:\n            pass\n        except OSError:\n"
                   "            from .a import x\n"}, [["p.a", "p.b"]], [["p.a", "p.b"]]),
    "TYPE_CHECKING inside a function counts only for the design graph": (
        {"p/__init__.py": "", "p/a.py": "import p.b\n",
         "p/b.py": "from typing import TYPE_CHECKING\ndef f():\n    if TYPE_CHECKING:\n        from .a import A\n"},
        [], [["p.a", "p.b"]]),
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


# -- the layers ----------------------------------------------------------------------------------------------

# What each part of fa4_aot may import (docs/architecture.md, "Where a change belongs"). errors and config are the
# ground floor every part stands on; a part never imports one listed above it. The lean runtime in particular never
# reaches FA4 (fa4/) nor the build side (compile/), and pure values (domain/) import nothing but errors and config.
BASE = {"errors", "config"}
LAYERS: dict[str, set[str]] = {
    "errors": set(),
    "config": set(),
    "domain": BASE,
    "matrix": BASE | {"domain"},
    "store": BASE | {"domain"},
    "trust": BASE | {"domain", "store"},
    "remote": BASE | {"domain", "store", "trust"},
    "fa4": BASE | {"domain", "store"},
    "runtime": BASE | {"domain", "store", "trust", "remote", "tirx"},  # load(family="tirx") reaches tirx/loading.py
    # the TIRx FA4 family: its problems, entries, TVM seam (a subprocess), store commits and launcher
    "tirx": BASE | {"domain", "matrix", "store", "compile"},
    # a serving node's setup: the FA4-backed path, and prefetching a model's kernels for either runtime
    "client": BASE | {"domain", "matrix", "store", "trust", "remote", "fa4", "runtime"},
    # the build reads what the lean runtime would find through the store (rebuild.served), never the runtime itself:
    # a miss and its job are domain values (domain/misses.py, issue 30)
    "compile": BASE | {"domain", "matrix", "store", "trust", "remote", "fa4"},
    # certification runs both runtimes on a GPU over what a build planned and recorded
    "certify": BASE | {"domain", "matrix", "store", "trust", "remote", "fa4", "runtime", "client", "compile"},
    "cli": BASE | {"domain", "matrix", "store", "trust", "remote", "fa4", "runtime", "client", "compile", "certify",
                   "tirx", "fa4_aot"},
    "fa4_aot": BASE | {"runtime", "client", "remote"},  # the package's face: lazy attributes over the parts
    "__main__": {"cli"},
}


def part_of(module: str) -> str:
    """fa4_aot.domain.calls -> domain; fa4_aot.errors -> errors; fa4_aot -> fa4_aot."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_every_part_has_a_layer() -> None:
    parts = {part_of(m) for m in module_files(ROOT, ("fa4_aot",))}
    assert parts == set(LAYERS), f"parts without a layer: {parts - set(LAYERS)}; layers without a part: " \
                                 f"{set(LAYERS) - parts}"


def test_parts_import_only_the_layers_below() -> None:
    graph = import_graph(ROOT, ("fa4_aot",), type_checking=True)
    wrong = sorted(f"{m} -> {t}" for m, targets in graph.items() for t in targets
                   if part_of(t) != part_of(m) and part_of(t) not in LAYERS[part_of(m)])
    assert wrong == [], "imports against the layers: " + "; ".join(wrong)


def test_the_layer_check_sees_a_wrong_import(tmp_path: Path) -> None:
    _write(tmp_path, {"fa4_aot/__init__.py": "", "fa4_aot/domain/__init__.py": "", "fa4_aot/fa4/__init__.py": "",
                      "fa4_aot/domain/a.py": "def f():\n    from ..fa4 import b\n", "fa4_aot/fa4/b.py": ""})
    graph = import_graph(tmp_path, ("fa4_aot",), type_checking=True)
    assert graph["fa4_aot.domain.a"] == {"fa4_aot.fa4.b"}
    assert "fa4" not in LAYERS[part_of("fa4_aot.domain.a")]


def test_no_module_name_twice() -> None:
    """A name says where a change belongs only if it is said once: no two modules (or a module and a package)
    of fa4_aot share a name."""
    seen: dict[str, list[str]] = {}
    for module in module_files(ROOT, ("fa4_aot",)):
        leaf = module.rsplit(".", 1)[-1]
        if leaf != "__main__":
            seen.setdefault(leaf, []).append(module)
    assert {leaf: found for leaf, found in seen.items() if len(found) > 1} == {}


def test_one_load() -> None:
    """fa4_aot.load is the one load() of the public face; the FA4-backed path names its own (client.prepare)."""
    faces = [ROOT / "fa4_aot" / "__init__.py", ROOT / "fa4_aot" / "client" / "__init__.py",
             ROOT / "fa4_aot" / "runtime" / "__init__.py"]
    exported = [str(path.relative_to(ROOT)) for path in faces if "load" in _public_names(path)]
    assert exported == ["fa4_aot/__init__.py"]


def _public_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            names |= set(ast.literal_eval(node.value))
    return names


def test_service_is_grouped_by_kind_as_fa4_aot_is() -> None:
    """issue 30: the service's database work and its wire models live in service/crud/ and service/schemas/, one
    module per resource (builds, certify, misses, ...), not as crud_*.py and *_schemas.py files at its root."""
    root = ROOT / "service"
    flat = sorted(p.name for p in root.glob("*.py") if p.stem.startswith("crud") or p.stem.endswith("schemas"))
    assert flat == []
    assert {p.stem for p in (root / "crud").glob("*.py")} >= {"__init__", "builds", "certify", "misses", "tokens"}
    assert {p.stem for p in (root / "schemas").glob("*.py")} >= {"__init__", "builds", "certify", "verdicts"}
