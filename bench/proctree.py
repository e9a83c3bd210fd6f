"""CPU seconds of a process tree from Linux /proc: the fair measure of what a build or a server costs on a machine
shared with other work (bench/farm_speed.py, bench/cluster_start.py)."""

from __future__ import annotations

import os
from pathlib import Path


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
