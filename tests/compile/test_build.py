"""Real FA4 cross-compiles on a machine with no GPU, through the CLI, into temporary stores.

These run FA4's compiler for sm_90a and sm_100a (seconds per kernel); CI runs them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fa4_aot.store import Store, maintenance
from tests.conftest import ROOT, TINY_VARIANTS, build_json, run_cli

pytestmark = pytest.mark.slow



@pytest.fixture(scope="module")
def variants_file() -> Path:
    return TINY_VARIANTS


def build(store: Path, variants: Path, sku: str, *only: str) -> dict:
    return build_json(store, sku, *only, variants=variants)


def test_host_has_no_gpu() -> None:
    """What this module proves depends on it: every figure below came from the SKU table."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this host has a GPU; the cross-compile claims are about CPU-only hosts")


def test_sm90_deterministic_backward(tmp_path: Path, variants_file: Path) -> None:
    doc = build(tmp_path, variants_file, "h200", "det-bwd")
    assert doc["failed"] == 0 and doc["built"] == doc["kernels"] >= 3
    entries = list(Store(tmp_path).entries())
    assert {e.family for e in entries} >= {"_flash_attn_fwd", "_flash_attn_bwd", "_bwd_preprocess"}
    assert all(e.arch == "sm_90a" and e.sm_count == 132 and e.size > 0 for e in entries)
    assert maintenance.verify(Store(tmp_path)).ok


def test_sm100_persistent_forward_bakes_the_sku_sm_count(tmp_path: Path, variants_file: Path) -> None:
    doc = build(tmp_path, variants_file, "b200", "full-fwd")
    assert doc["failed"] == 0 and doc["built"] == 1
    # filed under its full key and, because it consumed a constant, under its base key too (same object)
    entry, signpost = sorted(Store(tmp_path).entries(), key=lambda e: e.kernel_key != doc["kernel_keys"][0])
    assert entry.kernel_key == doc["kernel_keys"][0] and signpost.object_digest == entry.object_digest
    assert entry.arch == "sm_100a" and entry.family == "_flash_attn_fwd"
    # the persistent tile scheduler asked HardwareInfo for the SM count at compile time: the SKU answered
    assert ["sm_count", 148] in entry.hardware_queries


def test_same_variant_same_key_in_fresh_processes_and_no_op_rebuild(tmp_path: Path, variants_file: Path) -> None:
    first = build(tmp_path / "a", variants_file, "b200", "full-fwd")
    second = build(tmp_path / "b", variants_file, "b200", "full-fwd")
    assert first["kernel_keys"] == second["kernel_keys"] and len(first["kernel_keys"]) == 1
    again = build(tmp_path / "a", variants_file, "b200", "full-fwd")
    assert again["built"] == 0 and again["present"] == 1 and again["kernel_keys"] == first["kernel_keys"]


def test_flipped_byte_is_caught_by_verify(tmp_path: Path, variants_file: Path) -> None:
    build(tmp_path, variants_file, "b200", "full-fwd")
    entry = next(Store(tmp_path).entries())
    path = Store(tmp_path).object_path(entry.object_digest)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    result = run_cli("verify", cache=tmp_path)
    assert result.returncode == 1 and f"CORRUPT object {entry.object_digest}" in result.stdout


def test_killed_build_leaves_no_partial_entry(tmp_path: Path, variants_file: Path) -> None:
    store = tmp_path / "store"
    env = {**os.environ, "FA4_AOT_CACHE": str(store)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "fa4_aot", "build", "--sku", "h200", "--variants", str(variants_file),
         "--only", "det-bwd"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not list((store / "objects").glob("??/*")):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the CLI and its compiler workers, mid-build
    proc.wait()
    s = Store(store)
    report = maintenance.verify(s)
    assert report.ok, report
    for entry in s.entries():  # every entry that exists is complete
        s.verified_object_path(entry.object_digest)
    # a kill during an entry's write may leave its temp file, which no reader lists and gc removes
    leftovers = list((store / "index").glob("**/.*")) if (store / "index").exists() else []
    assert all(p.name.endswith(".tmp") for p in leftovers)
    assert {e.kernel_key for e in s.entries()} == {p.stem for p in (store / "index").glob("??/*.json")}
    doc = build(store, variants_file, "h200", "det-bwd")
    assert doc["failed"] == 0 and doc["built"] + doc["present"] == doc["kernels"]
    assert maintenance.verify(s).ok


def test_unknown_variant_and_sku_are_one_line_errors(tmp_path: Path, variants_file: Path) -> None:
    result = run_cli("build", "--sku", "b200", "--variants", str(variants_file), "--only", "nope", cache=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "unknown variant(s) nope" in result.stderr and "det-bwd" in result.stderr
