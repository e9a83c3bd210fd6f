"""Honest keys (issue 20, point 5): the toolchain a kernel key names covers the code that makes a kernel's bytes,
not only version strings. Editing one of fa4-aot's FA4 patches, or one FA4 source file under an unchanged
version, changes every key; identical installs, wherever they are, give identical keys.

The edits are made on copies: a copy of fa4_aot or of flash_attn overlaid on the real install through
PYTHONPATH in a fresh interpreter (the installed packages are never touched), or a copied tree handed to the
digest function itself."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fa4_aot.domain import kernel_keys
from fa4_aot.domain.skus import Sku
from fa4_aot.fa4 import versions
from fa4_aot.store import migrate
from tests.conftest import ROOT

SKUS = (Sku(name="h200", arch="sm_90a", sm_count=132, l2_bytes=62914560, cuda_major=13),
        Sku(name="b200", arch="sm_100a", sm_count=148, l2_bytes=132644864, cuda_major=13))
COMPILE_KEYS = (("fwd", 128, True, None, 0.125), ("bwd", 64, False, "x", 1.0))
# A fresh interpreter prints its toolchain and the keys of a few kernels (base keys and keys with constants)
PROBE = f"""
import json
from fa4_aot.domain import kernel_keys
from fa4_aot.fa4 import versions
from fa4_aot.domain.skus import Sku
skus = [Sku(**s) for s in {[s.__dict__ for s in SKUS]!r}]
tools = versions.toolchain()
keys = [kernel_keys.kernel_key("_flash_attn_fwd", k, s, tools, consumed) for k in {COMPILE_KEYS!r} for s in skus
        for consumed in (None, {{"sm_count": s.sm_count}})]
print(json.dumps({{"tools": tools, "keys": keys}}))
"""


def probe(*overlay: Path) -> dict:
    """The toolchain and keys a fresh interpreter computes with `overlay` folders first on its path."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, overlay), str(ROOT)])}
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=300,
                          cwd=overlay[0] if overlay else ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def real() -> dict:
    return probe()


def _all_differ(a: dict, b: dict) -> bool:
    return len(a["keys"]) == 8 and not set(a["keys"]) & set(b["keys"])


def _copy_fa4_aot(to: Path) -> Path:
    shutil.copytree(ROOT / "fa4_aot", to / "fa4_aot", ignore=shutil.ignore_patterns("__pycache__"))
    return to


def _copy_flash_attn(to: Path) -> Path:
    root = versions.package_root("flash_attn.cute")
    assert root is not None
    shutil.copytree(root, to / "flash_attn" / "cute", ignore=shutil.ignore_patterns("__pycache__"))
    return to


def test_the_toolchain_names_versions_distributions_and_sources(real: dict) -> None:
    tools = real["tools"]
    assert {d for d in versions.TOOLCHAIN_DISTRIBUTIONS} <= set(tools)
    assert {"nvidia-cutlass-dsl-libs-base", "nvidia-cutlass-dsl-libs-core"} <= set(tools)
    assert f"nvidia-cutlass-dsl-libs-{tools['cutlass-dsl-cuda']}" in tools  # the flavour loaded is installed
    for name in ("source:flash_attn.cute", "source:cutlass", "source:quack", "source:fa4-aot"):
        assert len(tools[name]) == 64 and int(tools[name], 16) >= 0, name
    assert tools == versions.toolchain()  # this process computes what a fresh one does


@pytest.mark.parametrize("patch", versions.PATCHES)
def test_editing_a_patch_file_changes_every_key(tmp_path: Path, real: dict, patch: str) -> None:
    overlay = _copy_fa4_aot(tmp_path)
    with open(overlay / "fa4_aot" / "fa4" / patch, "a") as f:
        f.write("\n_EDITED = True\n")  # code: comments and docstrings change no key (test_prose_edits_...)
    edited = probe(overlay)
    assert _all_differ(edited, real)
    assert kernel_keys.toolchain_drift(edited["tools"], real["tools"]) == ["source:fa4-aot"]


def test_an_identical_copy_of_fa4_aot_gives_identical_keys(tmp_path: Path, real: dict) -> None:
    """Another folder (another absolute path), no __pycache__, new mtimes: the same keys."""
    assert probe(_copy_fa4_aot(tmp_path)) == real


def test_editing_an_fa4_source_file_under_its_version_changes_every_key(tmp_path: Path, real: dict) -> None:
    overlay = _copy_flash_attn(tmp_path)
    same = probe(overlay)
    assert same == real  # the copy is an identical install: FA4 found at another path, no __pycache__
    with open(overlay / "flash_attn" / "cute" / "tile_scheduler.py", "a") as f:
        f.write("\n# installed from a commit: same version string, other code\n")
    edited = probe(overlay)
    assert edited["tools"]["flash-attn-4"] == real["tools"]["flash-attn-4"]
    assert kernel_keys.toolchain_drift(edited["tools"], real["tools"]) == ["source:flash_attn.cute"]
    assert _all_differ(edited, real)


def test_another_cutlass_dsl_distribution_changes_every_key(tmp_path: Path, real: dict) -> None:
    """FlashInfer keys on the exact set of nvidia-cutlass-dsl* distributions: one more installed (or another
    version of one, found first on the path) is another toolchain."""
    info = tmp_path / "nvidia_cutlass_dsl_libs_extra-4.8.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: nvidia-cutlass-dsl-libs-extra\nVersion: 4.8.1\n")
    edited = probe(tmp_path)
    assert kernel_keys.toolchain_drift(edited["tools"], real["tools"]) == ["nvidia-cutlass-dsl-libs-extra"]
    assert _all_differ(edited, real)


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


BASE = {"__init__.py": "", "a.py": "x = 1\n", "sub/b.py": "y = 2\n", "README.md": "text"}


@pytest.mark.parametrize(("change", "differs"), [
    ({"__pycache__/a.cpython-311.pyc": "bytecode"}, False),
    ({"sub/__pycache__/b.cpython-312.pyc": "bytecode"}, False),
    ({"notes.txt": "not source"}, False),
    ({"_mlir/_cutlass_ir_version_cu13.py": "DSO_SHA256 = {'cpython-312': '...'}\n"}, False),
    ({"a.py": "x = 2\n"}, True),
    ({"sub/c.py": ""}, True),
    ({"_cutlass_ir_version.py": ""}, True),
], ids=repr)
def test_source_digest_covers_python_source_only(tmp_path: Path, change: dict[str, str], differs: bool) -> None:
    base = versions.source_digest(_tree(tmp_path / "base", BASE))
    assert (versions.source_digest(_tree(tmp_path / "changed", {**BASE, **change})) != base) is differs


def test_a_moved_file_changes_the_digest(tmp_path: Path) -> None:
    moved = {**{k: v for k, v in BASE.items() if k != "sub/b.py"}, "b.py": BASE["sub/b.py"]}
    assert versions.source_digest(_tree(tmp_path / "a", BASE)) != versions.source_digest(_tree(tmp_path / "b", moved))


def test_a_copy_of_the_installed_cutlass_source_digests_the_same(tmp_path: Path) -> None:
    """Identical installs give identical digests: the CuTe DSL's .py files copied elsewhere (new mtimes, no
    binaries, no __pycache__) digest as the installed package does."""
    root = versions.package_root("cutlass")
    assert root is not None
    shutil.copytree(root, tmp_path / "cutlass", ignore=lambda _d, names: [n for n in names if n.endswith(".so")
                                                                          or n == "__pycache__"])
    assert versions.source_digest(tmp_path / "cutlass") == versions.sources()["source:cutlass"]


def test_patches_digest_reads_the_patch_files(tmp_path: Path) -> None:
    for name in versions.PATCHES:
        shutil.copy(Path(versions.__file__).parent / name, tmp_path / name)
    assert versions.patches_digest(tmp_path) == versions.patches_digest()
    objects = tmp_path / "object_files.py"
    objects.write_text(objects.read_text().replace("OPT_LEVEL = 3", "OPT_LEVEL = 2"))
    assert versions.patches_digest(tmp_path) != versions.patches_digest()


def _patched(tmp_path: Path, name: str, old: str, new: str) -> str:
    """patches_digest of a copy of the patches with `old` replaced by `new` (once) in patch `name`."""
    for patch in versions.PATCHES:
        shutil.copy(Path(versions.__file__).parent / patch, tmp_path / patch)
    text = (tmp_path / name).read_text()
    assert text.count(old) == 1, old
    (tmp_path / name).write_text(text.replace(old, new))
    return versions.patches_digest(tmp_path)


@pytest.mark.parametrize(("name", "old", "new"), [
    ("l2.py", "FA4 hard-codes two L2 budgets", "FA4 hard-codes its two L2 budgets"),  # the module docstring
    ("l2.py", '"""FA4\'s L2 budgets', '"""A docstring line added.\n\nFA4\'s L2 budgets'),
    ("object_files.py", "OPT_LEVEL = 3", "OPT_LEVEL = 3  # a comment added"),
    ("object_files.py", "OPT_LEVEL = 3", "# a comment line added\n\n\nOPT_LEVEL = 3"),
], ids=["docstring-words", "docstring-lines", "comment", "comment-line-and-blank-lines"])
def test_prose_edits_of_a_patch_change_no_key(tmp_path: Path, name: str, old: str, new: str) -> None:
    """A patch's comments, docstrings and blank lines make no kernel byte, so editing them changes no key."""
    assert _patched(tmp_path, name, old, new) == versions.patches_digest()


@pytest.mark.parametrize(("name", "old", "new"), [
    ("object_files.py", "OPT_LEVEL = 3", "OPT_LEVEL = 2"),
    ("object_files.py", "OPT_LEVEL = 3", "OPT_LEVEL = 3; X = '# not a comment'"),
    ("l2.py", "from __future__ import annotations", "from __future__ import annotations\n'''a string statement'''"),
], ids=["code", "string-with-hash", "string-after-the-docstring"])
def test_code_edits_of_a_patch_change_every_key(tmp_path: Path, name: str, old: str, new: str) -> None:
    assert _patched(tmp_path, name, old, new) != versions.patches_digest()


@pytest.mark.parametrize(("source", "code"), [
    ('"""Doc."""\nimport x  # why\n', "import x\n"),
    ("def f(a):\n    '''Doc\n    more.'''\n    return a\n", "def f(a):\n    return a\n"),
    ("class C:\n    'doc'\n    s = '# kept'\n", "class C:\n    s = '# kept'\n"),
    ("x = 1\n'not a docstring'\n", "x = 1\n'not a docstring'\n"),
    ("x = f'{1} # kept'  # gone\n", "x = f'{1} # kept'\n"),
    ("def f():\n    'é'; return 'é'  # é\n", "def f():\n       ; return 'é'\n"),  # columns in characters
])
def test_code_of(source: str, code: str) -> None:
    assert versions.code_of(source.encode()) == code.encode()


def test_a_package_rename_changes_no_key(tmp_path: Path) -> None:
    """Issue 30 renamed spec/ to domain/ and build/ to compile/: patches spelled as before the rename digest as
    today's, so stores built before it are still found; any other edit of an import still counts."""
    for name in versions.PATCHES:
        text = (Path(versions.__file__).parent / name).read_text()
        (tmp_path / name).write_text(text.replace("..domain.", "..spec.").replace("fa4_aot/domain/", "fa4_aot/spec/"))
    assert "..spec.skus" in (tmp_path / "l2.py").read_text()
    assert versions.patches_digest(tmp_path) == versions.patches_digest()
    l2 = tmp_path / "l2.py"
    l2.write_text(l2.read_text().replace("..spec.skus", "..matrix.skus"))
    assert versions.patches_digest(tmp_path) != versions.patches_digest()


def test_a_package_that_is_not_installed_is_absent() -> None:
    assert versions.package_root("no_such_package_fa4_aot") is None


@pytest.mark.parametrize(("built", "tools", "drift"), [
    ({"a": "1"}, {"a": "1"}, []),
    ({"a": "1"}, {"a": "2"}, ["a"]),
    ({"a": "1"}, {"a": "1", "source:x": "f"}, ["source:x"]),  # an entry from before source digests
    ({"a": "1", "b": "2"}, {"a": "1"}, ["b"]),
])
def test_toolchain_drift(built: dict[str, str], tools: dict[str, str], drift: list[str]) -> None:
    assert kernel_keys.toolchain_drift(built, tools) == drift


def test_rebuild_advice_names_the_sku_the_difference_and_the_commands() -> None:
    (line,) = migrate.rebuild_advice({"h200": 5}, ["source:cutlass", "source:flash_attn.cute"])
    assert line.startswith("5 h200 kernel(s) built by another toolchain (source:cutlass, source:flash_attn.cute")
    assert "`fa4-aot build --sku h200`" in line and "`fa4-aot prune --toolchain old`" in line


def test_a_host_without_fa4_finds_no_kernel_of_another_toolchain(tmp_path: Path) -> None:
    """A lean-runtime host computes no keys: it has no toolchain to compare entries with, so it advises nothing."""
    from fa4_aot.store import Store
    from tests.store.test_store import make_entry

    entry = make_entry(Store(tmp_path), b"object")
    assert migrate.foreign([entry], {"flash-attn-4": "absent", "cutlass-dsl-cuda": "absent"}) == ({}, [])
    assert migrate.foreign([entry], {"flash-attn-4": "4.0.0b36", "source:cutlass": "f"}) == (
        {"h200": 1}, ["source:cutlass"])
