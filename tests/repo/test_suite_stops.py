"""A person can stop the test suite (issue 30, item 10). Ctrl-C went unheeded for minutes: code under test
takes SIGINT and SIGTERM itself (a build's `stopping.on_signals` turns them into its own summary and exit
status, the on-demand builder and the certifier catch KeyboardInterrupt), so the test in flight swallowed the
signal and the suite went on; SIGTERM ended pytest with no summary and left the tests' PostgreSQL running.

Each case runs pytest on a generated module in a subprocess of its own session: a test that uses the suite's
PostgreSQL fixture and swallows the signal as the code under test does, then a minute and more of slow tests.
The bound on the exit is generous and only there against a hang (no timing is asserted)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULE = '''
import time
from pathlib import Path

from fa4_aot.cli.stopping import on_signals

READY = Path(__file__).with_name("ready")


def test_code_under_test_takes_the_signal(postgres):
    READY.write_text(str(postgres.port))
    with on_signals():  # as `fa4-aot build` does in-process: the signal becomes its summary, not the suite's
        try:
            time.sleep(60)
        except KeyboardInterrupt:
            pass
'''


def _postgres_of(tmp: Path) -> list[int]:
    """The PostgreSQL processes whose data folder is under `tmp` (the run's TMPDIR)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if words and words[0].endswith(b"postgres") and str(tmp).encode() in b" ".join(words):
            found.append(int(cmdline.parent.name))
    return found


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["sigint-to-the-group", "sigterm"])
def test_i30_10_a_signal_stops_the_suite_with_a_summary_and_stops_postgresql(tmp_path: Path, signum: int) -> None:
    module = tmp_path / "suite" / "test_generated.py"
    module.parent.mkdir()
    module.write_text(MODULE + "".join(f"\n\ndef test_slow_{i}():\n    time.sleep(3)\n" for i in range(30)))
    # the run's temp folder, where its PostgreSQL cluster lives: under /tmp, which the postgres user (the
    # cluster's owner when the tests run as root) can reach, unlike pytest's own temp folders
    tmp = Path(tempfile.mkdtemp(prefix="fa4-aot-suite-stops-"))
    os.chmod(tmp, 0o755)
    try:
        _interrupt(module, tmp, signum)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _interrupt(module: Path, tmp: Path, signum: int) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
         "--rootdir", str(module.parent), str(module)],
        cwd=ROOT, env={**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (module.parent / "ready").exists() and proc.poll() is None:
        time.sleep(0.1)
    if proc.poll() is not None:
        pytest.fail(proc.communicate()[0][-3000:])
    if not _postgres_of(tmp):
        proc.kill()
        pytest.skip("PostgreSQL could not start here: " + proc.communicate()[0][-1000:])
    time.sleep(1)
    os.killpg(proc.pid, signum) if signum == signal.SIGINT else proc.send_signal(signum)
    try:
        out = proc.communicate(timeout=45)[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out = proc.communicate()[0]
        pytest.fail("the suite went on after the signal:\n" + out[-3000:])
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out[-3000:]
    assert " passed" in out.splitlines()[-1] and "test_slow_29" not in out, out[-3000:]  # a summary, cut short
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _postgres_of(tmp):
        time.sleep(0.2)
    assert not _postgres_of(tmp), "the suite's PostgreSQL outlived it"
