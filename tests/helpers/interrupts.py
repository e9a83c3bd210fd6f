"""Stopping the suite (issue 30, item 10): Ctrl-C and SIGTERM end a run with its summary and its session
fixtures torn down (the tests' PostgreSQL stopped), even when the test in flight swallowed the signal.

Code under test takes these signals itself: a build in-process (`stopping.on_signals`) turns them into its own
summary and exit status, the on-demand builder and the certifier catch KeyboardInterrupt. So pytest's own
KeyboardInterrupt never came, and the suite went on for as long as it had tests. A wakeup fd (signal.set_wakeup_fd)
sees every signal a Python handler receives, whichever handler that is: after each test the plugin reads it,
and a SIGINT or SIGTERM seen stops the session there (session.shouldstop: the summary, then the teardown of
session fixtures). SIGTERM, which ended pytest at once with neither, raises KeyboardInterrupt as SIGINT does.
A plugin of tests/conftest.py (pytest_plugins)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from types import FrameType

import pytest

STOPPING = {signal.SIGINT, signal.SIGTERM}
_wakeup: tuple[int, int] | None = None  # the pipe's (read end, write end) while the session runs


def _on_sigterm(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # pytest's own path for Ctrl-C: summary, session teardown, exit status 2


def pytest_sessionstart(session: pytest.Session) -> None:
    global _wakeup
    if _wakeup is not None:  # a pytest run inside a test (pytester): the outer run keeps its own
        return
    try:
        signal.signal(signal.SIGTERM, _on_sigterm)
        read, write = os.pipe()
        os.set_blocking(read, False), os.set_blocking(write, False)
        signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    except ValueError:  # not the main thread: signals are not ours to watch
        return
    _wakeup = (read, write)


def _received() -> set[int]:
    """The signals Python handled since the last call (the wakeup fd holds one byte per signal)."""
    got: set[int] = set()
    if _wakeup is None:
        return got
    try:
        while chunk := os.read(_wakeup[0], 512):
            got.update(chunk)
    except BlockingIOError:
        pass
    return got


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield
    stopping = STOPPING & _received()
    if stopping:
        names = ", ".join(signal.Signals(s).name for s in sorted(stopping))
        item.session.shouldstop = f"{names} received during {item.nodeid} (which took it itself); stopped"


def pytest_sessionfinish(session: pytest.Session) -> None:
    global _wakeup
    if _wakeup is not None:
        signal.set_wakeup_fd(-1)
        for fd in _wakeup:
            os.close(fd)
        _wakeup = None
