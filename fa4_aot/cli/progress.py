"""Progress of long commands (build, push, pull): a rich bar with elapsed time and ETA when stderr is a
terminal, one plain line per item otherwise, nothing with --quiet, and with --json one JSON line per item on
stderr (the summary document still goes to stdout). A failure said before is not said again: its count comes
once at the end (76 kernels refused for one reason are one line, not 76).

Work whose items each take long (planning a signature: seconds to minutes on a loaded host) says it is alive:
with `every`, the last update is said again, with the seconds since the start, whenever `every` seconds pass
without one (an interrupted whole-matrix build once printed nothing for 314 s while planning)."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import click

F = Callable[..., Any]


def quiet_option(f: F) -> F:
    return click.option("--quiet", "-q", is_flag=True, help="No progress output; only the summary and errors.")(f)


class Progress:
    """`update(done, total, status, line, **fields)` per finished item; `close()` at the end (also on errors)."""

    def __init__(self, verb: str, *, quiet: bool, as_json: bool, tty: bool | None = None,
                 every: float | None = None) -> None:
        self.verb = verb
        self.mode = "json" if as_json else "quiet" if quiet else \
            "bar" if (sys.stderr.isatty() if tty is None else tty) else "lines"
        self._bar: Any = None
        self._task: Any = None
        self._failures: dict[str, int] = {}  # a failure's text -> how often it came
        # the heartbeat (lines and JSON: a bar shows its own elapsed time): the last update, said again
        self._every = every if self.mode in ("lines", "json") else None
        self._started = time.monotonic()
        self._last: tuple[Any, ...] | None = None
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._beat: threading.Thread | None = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def update(self, done: int, total: int, status: str, line: str = "", **fields: Any) -> None:
        with self._lock:
            self._last = (done, total, status, line, fields, time.monotonic())
            self._say(done, total, status, line, **fields)
        if self._every and self._beat is None and not self._closed.is_set():
            self._beat = threading.Thread(target=self._heartbeat, name=f"{self.verb}-progress", daemon=True)
            self._beat.start()

    def _heartbeat(self) -> None:
        """Say the last update again (with the seconds since the start) while `every` seconds pass without one."""
        assert self._every is not None
        while not self._closed.wait(self._every / 4):
            with self._lock:
                if self._last is None or self._closed.is_set():
                    continue
                done, total, status, line, fields, when = self._last
                now = time.monotonic()
                if now - when < self._every:
                    continue
                self._last = (done, total, status, line, fields, now)
                elapsed = round(now - self._started)
                self._say(done, total, status, f"{line} ({elapsed} s)" if line else line, elapsed=elapsed, **fields)

    def _say(self, done: int, total: int, status: str, line: str = "", **fields: Any) -> None:
        repeated = False
        if self.mode != "json" and status not in ("ok", "built", "present") and not line:
            self._failures[status] = self._failures.get(status, 0) + 1
            repeated = self._failures[status] > 1  # said once; counted for close()
        if self.mode == "json":
            event = {"event": self.verb, "done": done, "total": total, "status": status, **fields}
            click.echo(json.dumps(event, sort_keys=True), err=True)
        elif self.mode == "lines" and not repeated:
            click.echo(f"[{done}/{total}] {line or f'{self.verb} {status}'}", err=True)
        elif self.mode == "bar":
            self._advance(done, total, "ok" if repeated else status, line)

    def _advance(self, done: int, total: int, status: str, line: str) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
        from rich.progress import Progress as Bar

        if self._bar is None:
            self._bar = Bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            TextColumn("ETA"), TimeRemainingColumn(), console=Console(stderr=True), transient=False)
            self._bar.start()
            self._task = self._bar.add_task(self.verb, total=total)
        if status not in ("ok", "built", "present"):  # failures stay on screen above the bar
            self._bar.console.print(f"{self.verb} {status}: {line}".rstrip(": "))
        self._bar.update(self._task, completed=done, total=total)

    def close(self) -> None:
        with self._lock:
            self._closed.set()
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        for status, count in self._failures.items():
            if count > 1 and self.mode in ("bar", "lines"):
                click.echo(f"{self.verb}: {count} items failed alike: {status}", err=True)
        self._failures.clear()
