"""Two builders racing on one store (issue 20, point 6): a kernel's lock is taken only to re-check and commit,
never while FA4 compiles, so neither builder waits for the other's compile holding a lock; both succeed, the
store holds one entry per key, the builder that commits second discards its bytes, and no temp file is left.

The test is the third process: it holds the kernel's lock from before the builders start. Each builder must
then compile and link the kernel anyway (its linked library reaches the store), and only then wait for the lock:
which this process sees as both builders' workers holding the lock file open. Holding the lock around the
compile, as before, the workers waited on it before compiling, and no library was there. No timing is measured.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fa4_aot.store import Store, maintenance
from fa4_aot.store.atomic import TMP_SUFFIX
from tests.conftest import ROOT, TINY_VARIANTS, run_cli

pytestmark = pytest.mark.slow
BUILD = ["build", "--sku", "b200", "--variants", str(TINY_VARIANTS), "--only", "full-fwd", "-j", "1", "--json"]
DEADLINE = 900.0  # seconds for both builders to plan, compile and reach the commit on a loaded 2-core host


def holders(path: Path) -> set[int]:
    """Processes other than this one with `path` open (as a FileLock does from opening it until it is released)."""
    found = set()
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        pid = int(fd_dir.parent.name)
        try:
            if pid != os.getpid() and any(os.readlink(fd) == str(path) for fd in fd_dir.iterdir()):
                found.add(pid)
        except OSError:  # a process that ended, or one we may not look into
            continue
    return found


def linked_libraries(store: Path) -> list[Path]:
    """Objects that are a kernel's linked lean-runtime library (they export the kernel's entry point)."""
    return [p for p in (store / "objects").rglob("*") if p.is_file() and b"__tvm_ffi_func" in p.read_bytes()]


def _wait_for_two_at_the_commit(lock: Path, builders: list[subprocess.Popen[str]]) -> None:
    deadline = time.monotonic() + DEADLINE
    while len(holders(lock)) < 2:
        for b in builders:
            assert b.poll() is None, f"a builder ended while this process held the lock: {b.communicate()}"
        assert time.monotonic() < deadline, f"the builders did not both reach the commit in {DEADLINE:g}s"
        time.sleep(0.5)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to see who holds the lock file")
def test_two_builders_compile_unlocked_and_one_commits(tmp_path: Path) -> None:
    plan = run_cli(*BUILD, "--dry-run", cache=tmp_path)
    assert plan.returncode == 0, plan.stderr[-2000:]
    (base,) = json.loads(plan.stdout)["kernel_keys"]
    store = Store(tmp_path)
    env = {**os.environ, "FA4_AOT_CACHE": str(tmp_path)}
    with store.lock(base) as held:
        builders = [subprocess.Popen([sys.executable, "-m", "fa4_aot", *BUILD], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT) for _ in range(2)]
        try:
            _wait_for_two_at_the_commit(held.path.resolve(), builders)
            # both compiled and linked the kernel while this process held its lock, and wait to commit it
            assert linked_libraries(tmp_path), "no kernel was compiled while the lock was held by another process"
            assert not store.has_entry(base)
        except BaseException:
            for b in builders:
                b.kill()
            raise
    done = [b.communicate(timeout=DEADLINE) for b in builders]
    assert [b.returncode for b in builders] == [0, 0], [err[-2000:] for _out, err in done]
    reports = [json.loads(out) for out, _err in done]
    # the first to commit stored it; the other found it under the lock and discarded its bytes
    assert sorted((r["built"], r["present"], r["failed"]) for r in reports) == [(0, 1, 0), (1, 0, 0)]
    assert reports[0]["kernel_keys"] == reports[1]["kernel_keys"]
    entries = list(store.entries())
    assert len(entries) == 2 and len({e.kernel_key for e in entries}) == 2  # the kernel and its base signpost
    assert {e.object_digest for e in entries} == {entries[0].object_digest}
    assert maintenance.verify(store).ok
    assert [p for p in tmp_path.rglob("*") if p.name.endswith(TMP_SUFFIX)] == []
    assert holders(held.path.resolve()) == set()
