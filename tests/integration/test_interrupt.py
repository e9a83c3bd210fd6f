"""Issue 10.1: Ctrl-C stops a real build at once, drops the kernel in flight and says what was and was not built.

Before the fix the workers took SIGINT as a failed task and went on compiling everything queued, and the CLI
printed only `Aborted!`. The wait below is a bound against a hang, not a timing assertion."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fa4_aot import kernel_keys, maintenance
from fa4_aot.store import Store
from tests.conftest import ROOT, TINY_VARIANTS

pytestmark = pytest.mark.slow


def test_ctrl_c_stops_a_build_with_a_summary_and_no_partial_entry(tmp_path: Path) -> None:
    store = tmp_path / "store"
    proc = subprocess.Popen(
        [sys.executable, "-m", "fa4_aot", "build", "--sku", "h200", "--variants", str(TINY_VARIANTS), "-j", "1"],
        cwd=ROOT, env={**os.environ, "FA4_AOT_CACHE": str(store)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and not list((store / "index").glob("??/*.json")):
        time.sleep(0.05)
    assert list((store / "index").glob("??/*.json")), "the build never stored a kernel"
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the CLI and its workers
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    (summary,) = [line for line in out.splitlines() if line.startswith("INTERRUPTED")]
    built = int(summary.split(" built,")[0].rsplit(" ", 1)[-1])
    not_built = int(summary.split(" not built")[0].rsplit(" ", 1)[-1])
    assert built >= 1 and not_built >= 1, summary
    s = Store(store)
    assert maintenance.verify(s).ok
    # nothing built after the interrupt, and no partial entry (a kernel that consumed SKU constants is filed
    # under its full key and its base key: count each kernel once, by its full key)
    assert len([e for e in s.entries() if e.kernel_key == kernel_keys.entry_key(e)]) == built
    assert not list(store.glob("**/.*.tmp")), "a dropped kernel left a temp file"
    assert "Traceback" not in err


def test_build_json_streams_kernel_events_on_stderr_and_the_summary_on_stdout(tmp_path: Path) -> None:
    import json

    from tests.conftest import run_cli

    done = run_cli("build", "--sku", "h200", "--variants", str(TINY_VARIANTS), "--only", "full-fwd", "--json",
                   cache=tmp_path / "store")
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout)
    events = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    assert len(events) == summary["built"] >= 1
    assert {e["kernel_key"] for e in events} == set(summary["kernel_keys"])
    assert all(e["event"] == "build" and e["status"] == "built" and e["seconds"] > 0 for e in events)
    quiet = run_cli("build", "--sku", "h200", "--variants", str(TINY_VARIANTS), "--only", "full-fwd", "--quiet",
                    cache=tmp_path / "store")
    assert quiet.returncode == 0 and "already present" in quiet.stdout and not quiet.stderr.strip()
