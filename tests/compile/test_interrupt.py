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

from fa4_aot.domain import kernel_keys
from fa4_aot.store import Entry, Store, kernels, maintenance
from tests.conftest import ROOT, TINY_VARIANTS

pytestmark = pytest.mark.slow


def _build_past_its_first_kernel(store: Path) -> subprocess.Popen[str]:
    """A build of the tiny variants into `store`, in a process group of its own (the CLI and its workers, as a
    terminal or a service manager signals them), returned once it has stored its first kernel."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "fa4_aot", "build", "--sku", "h200", "--variants", str(TINY_VARIANTS), "-j", "1"],
        cwd=ROOT, env={**os.environ, "FA4_AOT_CACHE": str(store)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and not _kernels(store):
        time.sleep(0.05)
    assert _kernels(store), "the build never stored a kernel"
    return proc


def _kernels(store: Path) -> list[Entry]:
    """The kernels `store` holds: entries that are not signposts (a kernel's base-key signpost is written before
    its own entry, so a signpost alone is a kernel not yet built)."""
    return kernels(Store(store).entries()) if (store / "index").is_dir() else []


def test_ctrl_c_stops_a_build_with_a_summary_and_no_partial_entry(tmp_path: Path) -> None:
    store = tmp_path / "store"
    proc = _build_past_its_first_kernel(store)
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


def test_i30_11_sigterm_while_compiling_stops_quietly(tmp_path: Path) -> None:
    """A build stopped by SIGTERM while a worker was inside CuTe's compiler printed "terminate called after
    throwing an instance of 'nanobind::python_error'" and a 40-line traceback (the worker's handler raised
    inside a native callback). Signalled while compiling, with its workers (`kill -TERM -PGID`, as docker stop
    and systemd do), the build ends with its summary, exit 143, and nothing else on stderr. A guard, not yet a
    reproduction: this passed on the code of the report too (SIGTERM 0.3 to 4 s after the first kernel, 6 runs
    on 2 cores); the report's timing inside the compiler was not hit here."""
    store = tmp_path / "store"
    proc = _build_past_its_first_kernel(store)
    time.sleep(1.5)  # the worker is compiling the next kernel
    os.killpg(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    assert any(line.startswith("INTERRUPTED") for line in out.splitlines()), out[-2000:]
    for noise in ("Traceback", "terminate called", "nanobind", "Error"):
        assert noise not in err, err[-3000:]
    assert not list(store.glob("**/.*.tmp")), "a stopped worker left a temp file"


def test_build_json_streams_kernel_events_on_stderr_and_the_summary_on_stdout(tmp_path: Path) -> None:
    import json

    from tests.conftest import run_cli

    done = run_cli("build", "--sku", "h200", "--variants", str(TINY_VARIANTS), "--only", "full-fwd", "--json",
                   cache=tmp_path / "store")
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout)
    every = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    events = [e for e in every if e["event"] == "build"]
    planning = [e for e in every if e["event"] == "plan"]  # issue 22, point 4: planning reports progress too
    assert planning and planning[-1]["done"] == planning[-1]["total"] == summary["calls"]
    assert [e["done"] for e in planning] == sorted(e["done"] for e in planning)
    assert len(events) == summary["built"] >= 1
    assert {e["kernel_key"] for e in events} == set(summary["kernel_keys"])
    assert all(e["event"] == "build" and e["status"] == "built" and e["seconds"] > 0 for e in events)
    quiet = run_cli("build", "--sku", "h200", "--variants", str(TINY_VARIANTS), "--only", "full-fwd", "--quiet",
                    cache=tmp_path / "store")
    assert quiet.returncode == 0 and "already present" in quiet.stdout and not quiet.stderr.strip()


# Issue 22, point 1: a build stops within seconds on SIGINT (even when the shell started it with SIGINT
# ignored), SIGTERM and SIGHUP, in any phase, planning included; stops its workers, reports, and nothing is
# written after its process has exited, even when it is killed with SIGKILL. Before: SIGTERM ended only the CLI
# (no summary) and its workers went on compiling into the store; SIGINT under a shell that ignores it did nothing.
MODEL_BUILD = ["build", "--sku", "h200", "--model", "llama-3.1-8b", "--tp", "1", "-j", "2"]


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and " Z " not in Path(f"/proc/{pid}/stat").read_text()


def _start(store: Path, ignore_sigint: bool = False) -> tuple[subprocess.Popen[str], list[int]]:
    """The build in a session of its own; returns once its workers exist (it is planning then)."""
    def preexec() -> None:
        os.setsid()
        if ignore_sigint:  # as nohup and a non-interactive shell's background jobs start a process
            signal.signal(signal.SIGINT, signal.SIG_IGN)

    proc = subprocess.Popen([sys.executable, "-m", "fa4_aot", *MODEL_BUILD], cwd=ROOT,
                            env={**os.environ, "FA4_AOT_CACHE": str(store)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=preexec)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(_children(proc.pid)) < 2:
        time.sleep(0.05)
    workers = _children(proc.pid)
    assert workers, "the build started no worker"
    return proc, workers


def _entries(store: Path) -> set[str]:
    return {p.name for p in (store / "index").glob("??/*.json")}


@pytest.mark.parametrize(("signum", "to_group", "ignore_sigint"), [
    (signal.SIGTERM, False, False),  # `kill PID`, as schedulers and CI stop jobs
    (signal.SIGHUP, False, False),  # the terminal went away
    (signal.SIGINT, True, True),  # Ctrl-C to a build its shell started with SIGINT ignored
], ids=["sigterm", "sighup", "sigint-ignored-by-the-shell"])
def test_a_signal_stops_a_planning_build_its_workers_and_all_writes(tmp_path: Path, signum: int, to_group: bool,
                                                                     ignore_sigint: bool) -> None:
    store = tmp_path / "store"
    proc, workers = _start(store, ignore_sigint)
    time.sleep(2)  # the workers import FA4 and plan
    if to_group:
        os.killpg(proc.pid, signum)
    else:
        proc.send_signal(signum)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, err[-2000:]
    assert any(line.startswith("INTERRUPTED") for line in out.splitlines()), out + err[-2000:]
    held = _entries(store)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_alive(w) for w in workers):
        time.sleep(0.1)
    assert not [w for w in workers if _alive(w)], "a worker outlived the build"
    time.sleep(3)
    assert _entries(store) == held, "something was written after the build exited"
    assert "Traceback" not in err


def test_workers_of_a_killed_build_end_and_write_nothing_more(tmp_path: Path) -> None:
    store = tmp_path / "store"
    proc, workers = _start(store)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and not _entries(store):
        time.sleep(0.05)
    proc.kill()  # SIGKILL: no handler runs in the CLI; the kernel tells the workers (PR_SET_PDEATHSIG)
    proc.communicate(timeout=60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_alive(w) for w in workers):
        time.sleep(0.1)
    assert not [w for w in workers if _alive(w)], "a worker outlived the killed build"
    held = _entries(store)
    time.sleep(5)
    assert _entries(store) == held, "an orphaned worker wrote into the store"
    assert maintenance.verify(Store(store)).ok
