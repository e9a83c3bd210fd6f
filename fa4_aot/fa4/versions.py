"""The toolchain a kernel key names: everything installed that generates a kernel's bytes. Changing any of it
changes every kernel key (fa4_aot.domain.kernel_keys), so a store never serves bytes of one toolchain under the keys
of another.

`toolchain()` is {name: value} of:
- the versions of the distributions that generate kernels (TOOLCHAIN_DISTRIBUTIONS), and the name and version
  of every installed `nvidia-cutlass-dsl*` distribution (the CuTe compiler's native libraries: its MLIR
  passes and code generators are binaries, named by their distribution's version);
- `cutlass-dsl-cuda`: the CUDA flavour of the CuTe compiler this process loaded (cu12 or cu13);
- `source:<package>`: a digest of the Python source of each package whose code runs while a kernel is traced
  and compiled (SOURCE_PACKAGES): FA4's kernels, the CuTe DSL, and quack, whose @cute.jit helpers FA4's
  kernels call. A version string does not name the code: FA4 or CuTe installed from a commit, or patched in
  place, keeps its version. FA4's own disk cache fingerprints its source the same way;
- `source:fa4-aot`: a digest of fa4-aot's own code that changes the bytes of a kernel with a given key
  (PATCHES, and the LLVM triple and CPU of each host target, see `patches_digest`). A patch is hashed with the
  names of fa4-aot's renamed packages spelled, and their imports ordered, as they were (RENAMED: spec/ and build/
  were renamed), so a rename, which changes no kernel, changes no key and stores built before it are still
  found; and as code only (`code_of`: no comment, docstring, blank line or trailing blank), so that editing a
  patch's prose changes no key either.

A source digest hashes each `.py` file's path relative to its package and its bytes, in path order: no
absolute path, mtime, `.pyc` or `__pycache__`, so identical installs anywhere give identical digests (a
build host and a GPU host, a venv and a copy of it). It leaves out the files the CuTe compiler's wheel
generates to fingerprint its binary (`_cutlass_ir_version_cu*.py`): they name the Python ABI (cpython-311 vs
-312), which does not change a kernel's bytes and must not change its key; that binary is named by its
distribution's version. Digests are computed once per process (bench/RESULTS.md: the cost, cold and warm).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import io
import json
import os
import re
import sys
import tokenize
from collections.abc import Iterable
from functools import cache, lru_cache
from importlib import metadata
from pathlib import Path

from ..domain.hosts import TARGETS

# The distributions whose code generates the kernels. Changing any of them changes the keys.
TOOLCHAIN_DISTRIBUTIONS = ("flash-attn-4", "nvidia-cutlass-dsl", "apache-tvm-ffi", "quack-kernels")
DSL_DISTRIBUTIONS = "nvidia-cutlass-dsl"  # every distribution whose name starts so: the CuTe compiler's parts
# Packages whose Python source runs while FA4 traces and compiles a kernel. Not `iket` (beside `cutlass` in the
# DSL's wheel): a trace decoder and profiler run on the host, which generates no kernel code.
SOURCE_PACKAGES = ("flash_attn.cute", "cutlass", "quack")
# fa4-aot's modules that change what FA4 compiles or the bytes kept of it, and why each:
PATCHES = (
    "l2.py",  # rewrites FA4's tile-scheduler source and FlashPrepareScheduler's L2 budgets
    "target.py",  # answers FA4's and CuTe's hardware questions, arch variables and FA4's CUDA-12 2-CTA switch
    "consumed.py",  # the SKU constants those answers (and l2.py's budgets) give, recorded as consumed
    "object_files.py",  # turns the compiled kernel into the object bytes stored (export module, host code, -O level)
)
# fa4-aot's packages renamed since stores were first built, {new name: old name}, and where a patch names one (an
# import from `..domain.`, a path `fa4_aot/domain/...`): patches_digest hashes the old spelling, see the module.
RENAMED = {b"domain": b"spec", b"compile": b"build"}
_RENAMED_NAME = re.compile(rb"(\.\.|fa4_aot[./])(domain|compile)(?=[./])")
_PARENT_IMPORTS = re.compile(rb"(?:^from \.\.\w[^\n]*\n)+", re.MULTILINE)  # consecutive one-line `from ..x import y`
_GENERATED = re.compile(r"_cutlass_ir_version_cu\d+\.py")  # see the module docstring
ABSENT = "absent"


@lru_cache(maxsize=1)
def toolchain() -> dict[str, str]:
    """What kernel keys name in this process (see the module). Imports cutlass (for its CUDA flavour), so call
    it only where FA4 is about to be used anyway, and after fa4.configure() in a build worker."""
    return {**distributions(), "cutlass-dsl-cuda": cutlass_cuda_flavor(), **sources()}


def distributions() -> dict[str, str]:
    """{distribution: version} of TOOLCHAIN_DISTRIBUTIONS ('absent' when not installed) and of every installed
    nvidia-cutlass-dsl* distribution."""
    versions = {dist: _version(dist) for dist in TOOLCHAIN_DISTRIBUTIONS}
    for dist in metadata.distributions():
        name = _normalise(dist.metadata["Name"] or "")
        if name.startswith(DSL_DISTRIBUTIONS):
            versions.setdefault(name, dist.version)  # first on sys.path wins, as for imports
    return versions


def sources() -> dict[str, str]:
    """{'source:<package>': digest} of SOURCE_PACKAGES as installed ('absent' for one that is not), and
    {'source:fa4-aot': patches_digest()}."""
    found = {f"source:{name}": _package_digest(name) for name in SOURCE_PACKAGES}
    return {**found, "source:fa4-aot": patches_digest()}


@cache
def _package_digest(name: str) -> str:
    root = package_root(name)
    return source_digest(root) if root is not None else ABSENT


def package_root(name: str) -> Path | None:
    """The folder of package `name` as this interpreter would import it, found without importing it (only a
    dotted name's parents are imported: `flash_attn` is a namespace package); None when it is not installed."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(locations[0]) if locations else None


def source_digest(root: Path) -> str:
    """sha256 over (path relative to `root`, sha256 of bytes) of every .py file below `root`, in path order;
    no __pycache__, no file the compiler's wheel generates (_GENERATED)."""
    digest = hashlib.sha256()
    for rel, path in sorted(_python_files(root)):
        digest.update(f"{rel}\0{hashlib.sha256(path.read_bytes()).hexdigest()}\n".encode())
    return digest.hexdigest()


def _python_files(root: Path) -> Iterable[tuple[str, Path]]:
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if name.endswith(".py") and not _GENERATED.fullmatch(name):
                path = Path(folder) / name
                yield path.relative_to(root).as_posix(), path


def patches_digest(folder: Path | None = None) -> str:
    """sha256 of fa4-aot's code that changes a kernel's bytes: the PATCHES in `folder` (default: this package)
    and, for each host target, the LLVM triple and CPU its host code is generated for (hosts.TARGETS; a key names
    its host target by name only). Not the rest of fa4-aot: which kernels a call needs is FA4's compile key,
    which the kernel key holds."""
    folder = folder or Path(__file__).parent
    digest = hashlib.sha256()
    for name in PATCHES:
        source = code_of(as_spelled_before((folder / name).read_bytes()))
        digest.update(f"{name}\0{hashlib.sha256(source).hexdigest()}\n".encode())
    hosts = {name: [t.triple, t.cpu] for name, t in sorted(TARGETS.items())}
    digest.update(json.dumps(hosts, sort_keys=True, separators=(",", ":")).encode())
    return digest.hexdigest()


def as_spelled_before(source: bytes) -> bytes:
    """`source` as it was spelled before the renames: each renamed package (RENAMED) named by its old name
    (`..domain.skus` -> `..spec.skus`), and each run of `from ..part` imports in the order the import sorter
    (ruff's isort, by module name) gives the old names (`..errors` before `..spec`, where `..domain` came first)."""
    renamed = _RENAMED_NAME.sub(lambda m: m.group(1) + RENAMED[m.group(2)], source)
    return _PARENT_IMPORTS.sub(lambda m: b"".join(sorted(m.group(0).splitlines(keepends=True))), renamed)


def code_of(source: bytes) -> bytes:
    """`source` (a Python file) as code only: its comments and docstrings blanked out, then each line's trailing
    blanks and every blank line dropped; everything else byte for byte. Comments are tokenize's and docstrings
    ast's (a module's, class's or function's first statement, a string literal), both found by position, so the
    result is the same under every Python version that parses the file."""
    text = source.decode()
    lines = [list(line) for line in text.splitlines()]
    spans = [(*t.start, *t.end) for t in tokenize.generate_tokens(io.StringIO(text).readline)
             if t.type == tokenize.COMMENT]
    spans += [_span(first, text) for first in _docstrings(ast.parse(text))]
    for row, col, end_row, end_col in spans:
        for r in range(row, end_row + 1):
            line = lines[r - 1]
            start, end = col if r == row else 0, end_col if r == end_row else len(line)
            line[start:end] = " " * (end - start)
    kept = ("".join(line).rstrip() for line in lines)
    return "".join(f"{line}\n" for line in kept if line).encode()


def _docstrings(tree: ast.Module) -> Iterable[ast.Expr]:
    """The docstring statements of a module and of every class and function in it."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and \
                    isinstance(first.value.value, str):
                yield first


def _span(node: ast.expr | ast.stmt, text: str) -> tuple[int, int, int, int]:
    """(row, column, end row, end column) of `node` in characters (ast counts columns in UTF-8 bytes)."""
    lines = text.splitlines()
    end_row, end_col = node.end_lineno or node.lineno, node.end_col_offset or 0

    def chars(row: int, col: int) -> int:
        return len(lines[row - 1].encode()[:col].decode())

    return node.lineno, chars(node.lineno, node.col_offset), end_row, chars(end_row, end_col)


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return ABSENT


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503


def cutlass_cuda_flavor() -> str:
    """'cu12' or 'cu13': the toolkit flavour the CuTe compiler loaded (it picks the newest one installed when
    no driver is present), 'absent' without the CuTe DSL. Imports cutlass, so call it only where FA4 is about
    to be used anyway."""
    try:
        import cutlass  # noqa: F401  (loads the flavoured _cutlass_ir module)
    except ImportError:  # a lean-runtime host: `fa4-aot doctor` still reports the toolchain
        return ABSENT

    module = sys.modules.get("cutlass._mlir._mlir_libs._cutlass_ir")
    name = getattr(module, "__file__", "") or ""
    for part in name.split("."):
        if part.startswith("cu") and part[2:].isdigit():
            return part
    return "unknown"
