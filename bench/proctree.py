"""Process trees of the benches' servers: their CPU seconds from Linux /proc (the fair measure of what a build or a
server costs on a machine shared with other work: bench/farm_speed.py, bench/cluster_start.py), and stopping one
master first (stop_tree: bench/cluster_start.py, bench/serve_load.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path
from typing import Any


def tree_cpu(root: int, include_root: bool = False) -> dict[int, float]:
    """{pid: user + system CPU seconds} of `root`'s descendants (and `root` itself with `include_root`)."""
    tick, kids, cpu = os.sysconf("SC_CLK_TCK"), {}, {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        kids.setdefault(int(fields[1]), []).append(int(entry))
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    out: dict[int, float] = {}
    todo = [root] if include_root else list(kids.get(root, []))
    while todo:
        pid = todo.pop()
        out[pid] = cpu.get(pid, 0.0)
        todo += kids.get(pid, [])
    return out


def stop_tree(proc: subprocess.Popen[Any], graceful: int = signal.SIGTERM, wait: float = 10.0) -> None:
    """Stop a server started with `start_new_session=True` (its own process group): its master first, with
    `graceful` (nginx: SIGQUIT; uvicorn: SIGTERM), which stops its workers itself; then, after at most `wait`
    seconds, SIGKILL to the group, for whatever is left. Killing workers before their master makes nginx (and
    uvicorn's supervisor) start new ones, left behind as orphans."""
    if proc.poll() is None:
        proc.send_signal(graceful)
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=wait)
