"""How a long command stops: SIGINT, SIGTERM and SIGHUP alike.

While a build runs, each of the three becomes KeyboardInterrupt in the main thread, so a terminal's Ctrl-C, a
scheduler's or CI's SIGTERM and a closed terminal's SIGHUP all stop it the same way: queued work cancelled,
workers ended (compile.orchestrator, compile.executors), a summary printed, exit 128 + the signal number. It also holds
when the shell started the process with SIGINT ignored (nohup, a background job), where Python installs no
KeyboardInterrupt handler of its own. A second signal while stopping is ignored, so the cleanup that ends the
workers is not itself cut short. (Workers also end with the process that started them: executors._init.)
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass
class Stop:
    signum: int | None = None  # the first stopping signal received, if any

    @property
    def exit_code(self) -> int:
        return 128 + (self.signum or signal.SIGINT)


@contextmanager
def on_signals() -> Iterator[Stop]:
    """Within the block, the first of SIGNALS raises KeyboardInterrupt (see the module); handlers are restored
    after it. Main thread only (Python's signal handlers run there)."""
    stop = Stop()

    def handler(signum: int, _frame: FrameType | None) -> None:
        if stop.signum is None:
            stop.signum = signum
            raise KeyboardInterrupt

    saved = {s: signal.signal(s, handler) for s in SIGNALS}
    try:
        yield stop
    finally:
        for s, previous in saved.items():
            signal.signal(s, previous)
