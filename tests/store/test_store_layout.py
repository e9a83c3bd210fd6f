"""Only store/ (and store/beneath.py, its opens that follow no link) build paths under a store root: every other module
goes through the Store API, so the store's promises (atomic writes, owner-only modes, no link followed below the
root) cannot be broken by a neighbour. An AST scan of fa4_aot/ and service/ enforces it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ALLOWED = {f"fa4_aot/store/{part}.py" for part in ("root", "objects", "index", "side", "upkeep", "beneath")}
PATH_GETTERS = {"object_path", "entry_path", "verified_object_path"}
FILE_METHODS = {"open", "stat", "lstat", "is_file", "exists", "glob", "rglob", "iterdir", "unlink", "read_bytes",
                "read_text", "write_bytes", "write_text", "mkdir", "parent", "joinpath"}


def _is_root(node: ast.AST) -> bool:
    """`<anything>.root` or a bare name ending in `root` (store_root, root)."""
    return (isinstance(node, ast.Attribute) and node.attr == "root") or (
        isinstance(node, ast.Name) and node.id.endswith("root") and node.id != "ROOT")


def _is_store_path(node: ast.AST) -> bool:
    """A call to Store.object_path / entry_path / verified_object_path."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in PATH_GETTERS)


def violations(source: str) -> list[str]:
    """Each place `source` joins a path under a store root or opens, stats or globs a store path itself."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and _is_root(node.left):
            found.append(f"line {node.lineno}: `{ast.unparse(node)}` joins a path under the root")
        elif isinstance(node, ast.Attribute) and node.attr in FILE_METHODS and (
                _is_store_path(node.value) or (_is_root(node.value) and node.attr != "exists")):
            found.append(f"line {node.lineno}: `{ast.unparse(node)}` works on a store path directly")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "open"
              and node.args and _is_store_path(node.args[0])):
            found.append(f"line {node.lineno}: `{ast.unparse(node)}` opens a store file following links")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join"
              and node.args and _is_root(node.args[0])):
            found.append(f"line {node.lineno}: `{ast.unparse(node)}` joins a path under the root")
    return found


def _modules() -> list[Path]:
    return sorted(p for top in ("fa4_aot", "service") for p in (ROOT / top).rglob("*.py")
                  if p.relative_to(ROOT).as_posix() not in ALLOWED)


@pytest.mark.parametrize("snippet", [
    'path = store.root / "manifests" / sku',                  # trust/signing.py before the Store owned manifests
    'for p in (store.root / "index").glob("??/*.json"): ...',  # service/sync.py's glob
    'f = open(store.object_path(digest), "rb")',                 # service/routes/objects.py's plain open
    'size = store.object_path(digest).stat().st_size',
    'tmp = os.path.join(self.root, "objects", name)',
])
def test_the_scan_catches_each_way_a_module_built_store_paths(snippet: str) -> None:
    assert violations(snippet), snippet


def test_no_module_outside_store_builds_paths_under_the_store_root() -> None:
    modules = _modules()
    assert len(modules) > 30  # the scan saw the tree, not an empty folder
    found = {p.relative_to(ROOT).as_posix(): v for p in modules if (v := violations(p.read_text()))}
    assert found == {}, "use the Store API (fa4_aot/store/) instead: " + repr(found)
