"""The `fa4-aot` CLI through click's CliRunner on a store in tmp_path: every command's text and --json output,
exit codes, and one-line errors without tracebacks."""

from __future__ import annotations

import hashlib
import json
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from fa4_aot.cli import main
from fa4_aot.matrix import variants
from fa4_aot.store import Entry, Miss, Store
from tests.conftest import proven

ROOT = Path(__file__).resolve().parents[2]
KNOWN = ("h100-sxm", "h100-sxm-cu12", "h100-pcie", "h200", "h200-cu12", "b200", "b200-cu12", "gb200", "b300",
         "rtx-pro-6000")


@pytest.fixture(autouse=True)
def _defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    # The CLI reads these through click envvars and config; tests pass everything explicitly.
    monkeypatch.delenv("FA4_AOT_CACHE", raising=False)
    monkeypatch.delenv("FA4_AOT_VARIANTS", raising=False)
    monkeypatch.delenv("FA4_AOT_SKU", raising=False)


def cli(cache: Path, *args: str) -> Result:
    return CliRunner().invoke(main, ["--cache-dir", str(cache), *args])


def put_entry(store: Store, data: bytes, sku: str = "h200") -> Entry:
    entry = proven(Entry(
        kernel_key="", object_digest=store.put_object(data),
        size=len(data), family="FlashAttentionForwardSm90", compile_key=["fwd", 128, hashlib.sha256(data).hexdigest()],
        sku=sku, arch="sm_90a", sm_count=132, l2_bytes=62914560, cuda_major=13, toolchain={"flash-attn-4": "4.0.0b36"},
        variant="train", call="fwd dense bf16 d=128 causal b=1 sq=512 sk=512 h=16/16", compile_seconds=0.5,
    ))
    store.put_entry(entry)
    return entry


def assert_one_line_error(result: Result) -> str:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)
    (line,) = result.output.strip().splitlines()
    assert line.startswith("Error: ")
    return line


def test_skus_table(tmp_path: Path) -> None:
    result = cli(tmp_path, "skus")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.strip().splitlines() if not line.lstrip().startswith("source:")]
    assert lines[0].split()[:5] == ["sku", "arch", "SMs", "L2", "MiB"]
    assert [line.split()[0] for line in lines[1:]] == list(KNOWN)
    h200 = {line.split()[0]: line.split() for line in lines[1:]}["h200"]
    assert h200[1:5] == ["sm_90a", "132", "60.0", "13"]
    assert {line.split()[0]: line.split() for line in lines[1:]}["h200-cu12"][1:5] == ["sm_90a", "132", "60.0", "12"]


def test_skus_json(tmp_path: Path) -> None:
    result = cli(tmp_path, "skus", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert [s["name"] for s in doc] == list(KNOWN)
    (h200,) = [s for s in doc if s["name"] == "h200"]
    assert "measured on our H200" in h200.pop("source")
    assert h200 == {"name": "h200", "arch": "sm_90a", "sm_count": 132, "l2_bytes": 62914560, "cuda_major": 13,
                    "host": "x86-64-v3", "description": "H200 SXM 141GB"}


def test_skus_reads_variants_option_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = tmp_path / "one.toml"
    table.write_text('[skus.only]\narch = "sm_100a"\nsm_count = 148\nl2_bytes = 1\ncuda_major = 12\n')
    assert [s["name"] for s in json.loads(cli(tmp_path, "skus", "--json", "--variants", str(table)).output)] == ["only"]
    monkeypatch.setenv("FA4_AOT_VARIANTS", str(table))
    assert [s["name"] for s in json.loads(cli(tmp_path, "skus", "--json").output)] == ["only"]


def test_list_empty_store(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir(mode=0o700)
    result = cli(tmp_path / "store", "list", "--json")
    assert (result.exit_code, json.loads(result.output)) == (0, [])
    assert cli(tmp_path / "store", "list").output.strip() == "0 kernel(s), 0 bytes"
    missing = cli(tmp_path / "absent", "list")  # a mistyped path is an error (issue 22), never "0 kernel(s)"
    assert missing.exit_code == 1 and "no store at" in missing.output
    assert not (tmp_path / "absent").exists()  # reading never creates the store


def test_list_filters_by_sku(tmp_path: Path) -> None:
    store = Store(tmp_path)
    h200, b200 = put_entry(store, b"one"), put_entry(store, b"two", sku="b200")
    assert {e["kernel_key"] for e in json.loads(cli(tmp_path, "list", "--json").output)} == {
        h200.kernel_key, b200.kernel_key}
    (only,) = json.loads(cli(tmp_path, "list", "--json", "--sku", "b200").output)
    assert only["kernel_key"] == b200.kernel_key and only["object_digest"] == b200.object_digest
    assert "1 kernel(s), 3 bytes" in cli(tmp_path, "list", "--sku", "h200").output


def test_verify_names_a_corrupt_object_and_exits_1(tmp_path: Path) -> None:
    store = Store(tmp_path)
    entry = put_entry(store, b"kernel bytes")
    assert cli(tmp_path, "verify").exit_code == 0
    path = store.object_path(entry.object_digest)
    path.write_bytes(b"kernel bytez")
    result = cli(tmp_path, "verify", "--no-quarantine")
    assert result.exit_code == 1
    actual = hashlib.sha256(b"kernel bytez").hexdigest()
    assert f"CORRUPT object {entry.object_digest}: bytes hash to {actual}\n" in result.output
    assert f"BAD entry index/{entry.kernel_key[:2]}/{entry.kernel_key}.json: its object" in result.output
    assert "2 problem(s)" in result.output and path.exists()
    doc = json.loads(cli(tmp_path, "verify", "--no-quarantine", "--json").stdout)  # per-object events go to stderr
    assert doc["ok"] is False and doc["bad_objects"] == [{"expected": entry.object_digest, "actual": actual}]
    assert doc["dangling_entries"] == [] and doc["quarantined"] == [] and doc["quarantine_dir"] is None
    assert [e["path"] for e in doc["bad_entries"]] == [f"index/{entry.kernel_key[:2]}/{entry.kernel_key}.json"]


def test_verify_quarantines_by_default_and_says_where(tmp_path: Path) -> None:
    store = Store(tmp_path)
    entry = put_entry(store, b"kernel bytes")
    store.object_path(entry.object_digest).write_bytes(b"kernel bytez")
    doc = json.loads(cli(tmp_path, "verify", "--json").stdout)
    qdir = Path(doc["quarantine_dir"])
    obj, idx = (f"objects/{entry.object_digest[:2]}/{entry.object_digest[2:]}",
                f"index/{entry.kernel_key[:2]}/{entry.kernel_key}.json")
    assert doc["ok"] is False and qdir.parent == tmp_path / "quarantine"
    assert doc["quarantined"] == [{"path": idx, "to": str(qdir / idx)}, {"path": obj, "to": str(qdir / obj)}]
    assert (qdir / obj).read_bytes() == b"kernel bytez" and not store.has_object(entry.object_digest)
    assert store.get_entry(entry.kernel_key) is None
    result = cli(tmp_path, "verify")
    assert result.exit_code == 0
    assert result.output.strip() == "0 kernels (0 index entries, signposts included; 0 objects) checked: ok"
    put_entry(store, b"other")
    store.object_path(hashlib.sha256(b"other").hexdigest()).unlink()
    result = cli(tmp_path, "verify")
    assert result.exit_code == 1 and " -> quarantined to " in result.output and "DANGLING entry" in result.output
    assert "1 problem(s), moved to " in result.output


def test_gc_dry_run_changes_nothing(tmp_path: Path) -> None:
    store = Store(tmp_path)
    put_entry(store, b"kept")
    orphan = store.put_object(b"orphan")
    # a fresh orphan may be a running build's object whose entry is not written yet: the default keeps it
    assert cli(tmp_path, "gc").output.strip() == "removed 0 object(s) (0 bytes) and 0 temp file(s)"
    result = cli(tmp_path, "gc", "--dry-run", "--min-age", "0")
    assert result.exit_code == 0
    assert result.output.strip() == "would remove 1 object(s) (6 bytes) and 0 temp file(s)"
    assert store.has_object(orphan)
    doc = json.loads(cli(tmp_path, "gc", "--dry-run", "--min-age", "0", "--json").output)
    assert doc == {"dry_run": True, "objects": [orphan], "temp_files": 0, "bytes": 6}
    assert cli(tmp_path, "gc", "--min-age", "0").output.strip() == "removed 1 object(s) (6 bytes) and 0 temp file(s)"
    assert not store.has_object(orphan)


def test_misses_json(tmp_path: Path) -> None:
    assert json.loads(cli(tmp_path, "misses", "--json").output) == []
    miss = Miss(kernel_key="c" * 64, family="FlashAttentionBackwardSm90", compile_key=["bwd", 64], sku="h200")
    Store(tmp_path).record_miss(miss)
    result = cli(tmp_path, "misses", "--json")
    assert result.exit_code == 0
    assert json.loads(result.output) == [{"kernel_key": "c" * 64, "family": "FlashAttentionBackwardSm90",
                                          "compile_key": ["bwd", 64], "sku": "h200", "call": None, "args": None,
                                          "when": miss.when}]
    assert "1 miss\n" in cli(tmp_path, "misses").output


def test_build_unknown_sku_is_one_line(tmp_path: Path) -> None:
    line = assert_one_line_error(cli(tmp_path, "build", "--sku", "nope"))
    assert "unknown SKU 'nope'" in line and all(name in line for name in KNOWN)
    assert not (tmp_path / "objects").exists()


def test_build_malformed_variants_names_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    text = (ROOT / "variants.toml").read_text() + '\n[[variants]]\nname = "x"\nshapes = "train"\npasses = ["fwd"]\n' \
        'head_dims = [128]\ndtypes = ["fp8"]\n'
    bad.write_text(text)
    line = assert_one_line_error(cli(tmp_path, "build", "--sku", "h200", "--variants", str(bad)))
    assert f"{bad}:{len(text.splitlines())}: field 'dtypes'" in line and "bf16, fp16" in line


def test_build_unknown_variant_is_one_line(tmp_path: Path) -> None:
    line = assert_one_line_error(cli(tmp_path, "build", "--sku", "h200", "--only", "nope"))
    assert "unknown variant(s) nope" in line and "train-fp16" in line


def test_build_dry_run_plans_without_compiling(tmp_path: Path) -> None:
    result = cli(tmp_path, "build", "--sku", "h200", "--dry-run", "--only", "train-fp16", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    matrix = variants.load(ROOT / "variants.toml")
    (variant,) = matrix.select(["train-fp16"])
    assert doc["sku"] == "h200" and doc["calls"] == len(variant.calls(matrix.shapes[variant.shapes])) > 0
    assert doc["planned"] > 0 and doc["failed"] == 0 and doc["failures"] == []
    assert doc["built"] == 0 and doc["present"] == 0 and len(doc["kernel_keys"]) == doc["planned"]
    assert list(Store(tmp_path).entries()) == [] and not (tmp_path / "objects").exists()


def test_version_is_the_package_version() -> None:
    result = CliRunner().invoke(main, ["--version"], prog_name="fa4-aot")
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert result.exit_code == 0 and result.output == f"fa4-aot, version {version}\n"


def test_error_in_a_nested_group_is_one_line(tmp_path: Path) -> None:
    # The Fa4AotError -> click error mapping lives on the top group only; it must cover `token ...` too.
    line = assert_one_line_error(cli(tmp_path, "token", "rotate", "--name", "nobody"))
    assert "no active token named 'nobody'" in line and "fa4-aot token list" in line
