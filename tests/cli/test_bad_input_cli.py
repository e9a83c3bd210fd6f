"""Bad command lines: each gets one clear line on stderr (no traceback), a non-zero exit, and changes nothing
in the store. Part of the bad-input suite (marker `bad_input`; the run prints the suite's case counts)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fa4_aot.store import Entry, Store
from tests.conftest import ROOT, proven

pytestmark = pytest.mark.bad_input("CLI arguments")

CASES = [
    ("unknown-sku", ["build", "--sku", "nope"], "unknown SKU 'nope'"),
    ("build-without-sku", ["build"], "--sku is required"),
    ("zero-jobs", ["build", "--sku", "h200", "--jobs", "0"], "Invalid value for '--jobs'"),
    ("unknown-variant", ["build", "--sku", "h200", "--only", "nope"], "unknown variant(s) nope"),
    ("from-misses-unreachable-server", ["build", "--from-misses", "--server", "http://127.0.0.1:9"], "cannot reach"),
    ("negative-gc-age", ["gc", "--min-age", "-5"], "Invalid value for '--min-age'"),
    ("unreachable-server", ["pull", "--server", "http://127.0.0.1:9", "--sku", "h200"], "cannot reach"),
    ("bad-token-scope", ["token", "create", "--scope", "root"], "Invalid value for '--scope'"),
    ("missing-signing-key", ["sign", "--sku", "h200", "--key", "/nonexistent.key"], "cannot read signing key"),
    ("not-a-signing-key", ["sign", "--sku", "h200", "--key", "{junk}"], "cannot read signing key"),
    ("sign-unknown-sku", ["sign", "--sku", "nope", "--key", "{junk}"], "unknown SKU 'nope'"),
    ("sign-sku-without-kernels", ["sign", "--sku", "b300", "--key", "{key}"], "holds no kernels for b300"),
    ("revoke-needs-one-id", ["revoke", "--server", "http://127.0.0.1:9"], "exactly one of --key-id and --manifest"),
    ("variants-file-missing", ["skus", "--variants", "/nonexistent.toml"], "cannot read /nonexistent.toml"),
    ("list-sku-without-value", ["list", "--sku"], "requires an argument"),
    ("cache-dir-is-a-file", ["--cache-dir", "{junk}", "list"], "is a file"),
    ("unknown-command", ["compile"], "No such command 'compile'"),
]


def _snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and "locks" not in p.parts}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("store")
    s = Store(root)
    digest = s.put_object(b"not a real kernel")
    s.put_entry(proven(Entry(kernel_key="", object_digest=digest, size=17, family="_flash_attn_fwd", compile_key=[],
                             sku="h200", arch="sm_90a", sm_count=132, l2_bytes=62914560, cuda_major=13, toolchain={},
                             variant="v", call="c", compile_seconds=0.0)))
    return root


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("files")
    (folder / "junk").write_text("ssh-ed25519 AAAA not a pem key\n")
    out = subprocess.run([sys.executable, "-m", "fa4_aot", "keys", "generate", "--out", str(folder), "--name", "k"],
                         cwd=ROOT, capture_output=True, text=True, check=True)
    assert "key id" in out.stdout
    return {"junk": str(folder / "junk"), "key": str(folder / "k.key")}


@pytest.mark.parametrize("name,args,message", CASES, ids=[c[0] for c in CASES])
def test_bad_command_line(store: Path, files: dict[str, str], name: str, args: list[str], message: str) -> None:
    before = _snapshot(store)
    argv = [a.format(**files) for a in args]
    env = {**os.environ, "FA4_AOT_CACHE": str(store)}
    env.pop("FA4_AOT_SERVER", None)
    out = subprocess.run([sys.executable, "-m", "fa4_aot", *argv], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode != 0
    assert "Traceback" not in out.stderr and message in out.stderr, out.stderr[-1500:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("Error")]
    assert len(errors) == 1, out.stderr
    assert _snapshot(store) == before
