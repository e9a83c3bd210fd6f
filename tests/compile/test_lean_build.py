"""A real build (FA4 cross-compiling on this CPU host) produces, per kernel, a linked library for the lean runtime
that needs only libtvm_ffi.so and libcute_dsl_runtime.so, opens with tvm_ffi alone (no cutlass, FA4 or quack in
the process; no GPU needed to open it), is kept by gc, and a recipe region that covers the call. Entries written
before linking existed still parse, and a rebuild links them without compiling."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fa4_aot.config import host_arch
from fa4_aot.domain import recipe_file, recipe_format
from fa4_aot.domain.signature import Signature
from fa4_aot.store import Entry, Store, maintenance, recipes
from tests.conftest import ROOT, TINY_VARIANTS, run_cli

pytestmark = pytest.mark.slow

OPEN_LEAN = r"""
import json, sys
from pathlib import Path
from fa4_aot.runtime.libraries import Libraries
from fa4_aot.store import Store
store = Store(Path(sys.argv[1]))
libs = Libraries(store, "h200")
names = [type(libs.function(e.kernel_key, e.family)).__name__ for e in store.entries()]
print(json.dumps({"functions": names, "imported": sorted({m.split(".")[0] for m in sys.modules}
                                                         & {"cutlass", "flash_attn", "quack"})}))
"""


def _build(store: Path) -> dict:
    done = run_cli("build", "--sku", "h200", "--variants", str(TINY_VARIANTS), "--only", "full-fwd", "--json",
                   cache=store)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    store = tmp_path_factory.mktemp("lean-store")
    return store, _build(store)


def test_each_kernel_gets_a_library_linking_only_the_runtime_libraries(built: tuple[Path, dict]) -> None:
    root, doc = built
    assert doc["failed"] == 0 and doc["built"] >= 1 and doc["lean_failures"] == []
    store = Store(root)
    for entry in store.entries():
        lib = entry.shared_libs[host_arch()]
        assert set(lib["needs"]) == {"libtvm_ffi.so", "libcute_dsl_runtime.so"}
        assert lib["needs"]["libtvm_ffi.so"] == ""
        assert store.object_state(lib["needs"]["libcute_dsl_runtime.so"]) == "ok"
        dynamic = subprocess.run(["readelf", "-d", str(store.verified_object_path(lib["digest"]))],
                                 capture_output=True, text=True, check=True).stdout
        needed = {line.split("[")[1].rstrip("]") for line in dynamic.splitlines() if "(NEEDED)" in line}
        assert needed == {"libtvm_ffi.so", "libcute_dsl_runtime.so"}, needed
        assert "RPATH" not in dynamic and "RUNPATH" not in dynamic


def test_library_opens_with_tvm_ffi_alone(built: tuple[Path, dict]) -> None:
    root, _ = built
    done = subprocess.run([sys.executable, "-c", OPEN_LEAN, str(root)], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["imported"] == [] and report["functions"] and set(report["functions"]) == {"Function"}


def test_recipe_region_covers_the_built_call_and_names_its_kernels(built: tuple[Path, dict]) -> None:
    root, doc = built
    store = Store(root)
    from fa4_aot.matrix import variants

    matrix = variants.load(TINY_VARIANTS)
    [call] = matrix.variants[[v.name for v in matrix.variants].index("full-fwd")].calls(matrix.shapes["one"])
    regions = recipes.load(store, recipes.recipe_key(Signature.of(call), matrix.skus["h200"]))
    sizes = recipe_format.sizes_of_call(call.layout, call.batch, call.seqlen_q, call.seqlen_k)
    region = recipes.find(regions, {**sizes, recipe_format.HEADS: call.heads_kv})
    assert region is not None and doc["recipes"] >= 1
    assert {k.kernel_key for k in region.kernels} <= set(doc["kernel_keys"])


def test_gc_keeps_libraries_and_runtime(built: tuple[Path, dict]) -> None:
    root, _ = built
    store = Store(root)
    assert maintenance.gc(store, min_age=0).removed_objects == []
    assert maintenance.verify(store).ok


def test_entries_from_before_linking_parse_and_a_rebuild_links_them(tmp_path: Path) -> None:
    _build(tmp_path)
    store = Store(tmp_path)
    for entry in list(store.entries()):
        old = json.loads(entry.to_json())
        del old["shared_libs"]  # what fa4-aot wrote before the lean runtime
        store._write(store.entry_path(entry.kernel_key), json.dumps(old).encode())
        assert Entry.from_json(json.dumps(old)).shared_libs == {}
    doc = _build(tmp_path)
    assert doc["built"] == 0 and doc["present"] >= 1 and doc["lean_failures"] == []
    assert all(host_arch() in e.shared_libs for e in store.entries())


DECODE_OPEN = r"""
import json, sys
from pathlib import Path
import torch
from fa4_aot import config
from fa4_aot.matrix import variants
from fa4_aot.runtime import api, runner
from fa4_aot.store import Store
rt = runner.Runtime(Store(Path(sys.argv[1])), variants.load(config.default_variants_file()).skus["h200"])
sizes = {"seqused": {"batch": 4, "seqlen_q": 1, "seqlen_k": 2048, "max_seqlen_q": 1, "max_seqlen_k": 1000},
         "paged": {"batch": 4, "seqlen_q": 1, "num_pages": 600, "pages_per_seq": 128, "max_seqlen_q": 1,
                   "max_seqlen_k": 2048}}
found = {}
for layout, at in sizes.items():
    attn = rt.attention(api.signature(layout, "torch.bfloat16", 32, 128, 8, 128, causal=True, page_size=16))
    bound = attn.bound(at, torch.device("cpu"), None)
    kernels = attn.region(attn.sizes(at)).kernels
    found[layout] = {"inputs": sorted(bound.expected), "functions": sorted(
        type(rt.libraries.function(k.kernel_key, k.family)).__name__ for k in kernels)}
found["imported"] = sorted({m.split(".")[0] for m in sys.modules} & {"cutlass", "flash_attn", "quack"})
print(json.dumps(found))
"""


def test_decode_build_records_seqused_and_paged_recipes_the_lean_runtime_binds(tmp_path: Path) -> None:
    """A build of the GPU suite's decode variant stores, per signature, a region that holds at other sizes than
    the planned call (a larger shared page pool, a caller's max_seqlen_k) and kernels that open with tvm_ffi."""
    done = run_cli("build", "--sku", "h200", "--variants", str(ROOT / "tests" / "data" / "lean_variants.toml"),
                   "--only", "lean-decode", "--json", cache=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(done.stdout)
    files = sorted(tmp_path.glob("recipes/*/*.json"))  # one recipe file per signature, its regions covering every size
    regions = sum(len(recipe_file.decode(f.read_bytes())["regions"]) for f in files)
    assert doc["failed"] == 0 and doc["lean_failures"] == [] and len(files) == 4 and doc["recipes"] == regions >= 4
    opened = subprocess.run([sys.executable, "-c", DECODE_OPEN, str(tmp_path)], capture_output=True, text=True,
                            cwd=ROOT, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert opened.returncode == 0, opened.stderr[-3000:]
    report = json.loads(opened.stdout.strip().splitlines()[-1])
    assert report.pop("imported") == []
    assert report == {"seqused": {"inputs": ["k", "q", "seqused_k", "v"], "functions": ["Function"]},
                      "paged": {"inputs": ["k", "page_table", "q", "seqused_k", "v"], "functions": ["Function"]}}
