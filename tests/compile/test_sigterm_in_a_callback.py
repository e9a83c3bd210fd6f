"""Regression (full run, 2026-12-01): a build's SIGTERM reached a worker while it imported FA4, inside an import's
module-lock weakref callback. The SystemExit its handler raises cannot leave such a callback: Python printed
"Exception ignored ... Traceback ... SystemExit: 143" and the worker went on. Workers now deliver the signal again
(executors._sigterm_again), so it ends at the next ordinary bytecode, quietly."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

PROBE = r"""
import gc, signal, sys, time, weakref
from fa4_aot.compile import executors

signal.signal(signal.SIGTERM, executors._on_sigterm)
sys.unraisablehook = executors._sigterm_again


class Thing:
    pass


def callback(_ref):  # what the handler does when SIGTERM lands inside a weakref callback
    executors._on_sigterm()


thing = Thing()
ref = weakref.ref(thing, callback)
del thing
gc.collect()
for _ in range(100):  # the worker's import goes on for seconds
    time.sleep(0.05)
print("the worker went on after SIGTERM")
"""


def test_a_sigterm_inside_a_weakref_callback_still_ends_the_worker_quietly() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 143, (done.returncode, done.stdout, done.stderr[-2000:])
    assert "went on" not in done.stdout and "Traceback" not in done.stderr, done.stderr[-2000:]
