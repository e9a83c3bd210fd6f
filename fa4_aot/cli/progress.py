"""Progress of long commands (build, push, pull): a rich bar with elapsed time and ETA when stderr is a
terminal, one plain line per item otherwise, nothing with --quiet, and with --json one JSON line per item on
stderr (the summary document still goes to stdout). A failure said before is not said again: its count comes
once at the end (76 kernels refused for one reason are one line, not 76)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import click

F = Callable[..., Any]


def quiet_option(f: F) -> F:
    return click.option("--quiet", "-q", is_flag=True, help="No progress output; only the summary and errors.")(f)


class Progress:
    """`update(done, total, status, line, **fields)` per finished item; `close()` at the end (also on errors)."""

    def __init__(self, verb: str, *, quiet: bool, as_json: bool, tty: bool | None = None) -> None:
        self.verb = verb
        self.mode = "json" if as_json else "quiet" if quiet else \
            "bar" if (sys.stderr.isatty() if tty is None else tty) else "lines"
        self._bar: Any = None
        self._task: Any = None
        self._failures: dict[str, int] = {}  # a failure's text -> how often it came

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def update(self, done: int, total: int, status: str, line: str = "", **fields: Any) -> None:
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
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        for status, count in self._failures.items():
            if count > 1 and self.mode in ("bar", "lines"):
                click.echo(f"{self.verb}: {count} items failed alike: {status}", err=True)
        self._failures.clear()
