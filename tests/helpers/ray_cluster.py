"""A real Ray cluster on loopback for tests and benches: a head and extra nodes, each a `ray start --block` child
with its own temp dir and ports, stopped (every process it started, and its temp dirs) by stop(). Never
`ray stop`, which would end every Ray process on the machine, other people's included."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAY = str(Path(sys.executable).with_name("ray"))
# Drivers of this cluster need these too: no usage stats, no token (a loopback test cluster; Ray's token mode would
# need the head's token handed to every node and driver).
CLUSTER_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
PORT_FLAGS = ("--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
              "--dashboard-agent-grpc-port", "--runtime-env-agent-port", "--metrics-export-port")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RayCluster:
    """Started with fresh ports up to `attempts` times: a port found free can be taken before Ray binds it (by
    another process, or by the last cluster's processes still going away), and a node that cannot bind exits."""

    def __init__(self, cpus_per_node: tuple[int, ...] = (1, 1), env: dict[str, str] | None = None,
                 attempts: int = 3) -> None:
        self.env = {**os.environ, **CLUSTER_ENV, **(env or {})}
        for attempt in range(attempts):
            self.nodes: list[subprocess.Popen[bytes]] = []
            self.dirs: list[str] = []
            self.taken: set[int] = set()
            self.port = self._port()
            # 127.0.1.1, not 127.0.0.1: Ray swaps "127.0.0.1" for the host's network address; traffic stays on
            # loopback
            self.address = f"127.0.1.1:{self.port}"
            try:
                for i, cpus in enumerate(cpus_per_node):
                    self._start_node(head=i == 0, cpus=cpus)
                self.wait_for_nodes(len(cpus_per_node))
                return
            except RuntimeError:
                self.stop()
                if attempt == attempts - 1:
                    raise
            except BaseException:
                self.stop()
                raise

    def _port(self, span: int = 1) -> int:
        """A free port (the first of `span` consecutive ones) that no other node of this cluster was given."""
        while True:
            port = free_port()
            wanted = set(range(port, port + span))
            if port + span < 65536 and not wanted & self.taken:
                self.taken |= wanted
                return port

    def _start_node(self, head: bool, cpus: int) -> None:
        temp = tempfile.mkdtemp(prefix="rayf-", dir="/tmp")  # short: Ray's socket paths have a length limit
        self.dirs.append(temp)
        args = [RAY, "start", "--block", "--disable-usage-stats", f"--num-cpus={cpus}", f"--temp-dir={temp}",
                "--node-ip-address=127.0.0.1"]
        args += [f"{flag}={self._port()}" for flag in PORT_FLAGS]
        low = self._port(span=201)
        args += [f"--min-worker-port={low}", f"--max-worker-port={low + 200}"]
        if head:
            args += [f"--port={self.port}", "--head", "--include-dashboard=false"]
        else:
            args += [f"--address={self.address}"]
        log = open(Path(temp) / "ray-start.log", "wb")  # noqa: SIM115  (closed with the process)
        self.nodes.append(subprocess.Popen(args, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True))

    def wait_for_nodes(self, count: int, timeout: float = 120.0) -> None:
        code = ("import ray, sys; ray.init(address=sys.argv[1], _node_ip_address='127.0.0.1', log_to_driver=False); "
                "print(sum(n['Alive'] for n in ray.nodes())); ray.shutdown()")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.nodes):
                raise RuntimeError(f"a Ray node exited: {self.logs()}")
            out = subprocess.run([sys.executable, "-c", code, self.address], capture_output=True, text=True,
                                 env=self.env, timeout=120)
            if out.returncode == 0 and out.stdout.strip().splitlines()[-1:] == [str(count)]:
                return
            time.sleep(1.0)
        raise RuntimeError(f"Ray cluster at {self.address} did not reach {count} nodes: {self.logs()}")

    def logs(self) -> str:
        return " | ".join((Path(d) / "ray-start.log").read_text(errors="replace")[-1500:] for d in self.dirs)

    def worker_pids(self, title: str = "ray::_run") -> list[int]:
        """Ray worker processes of this cluster whose process title starts with `title` (a running task)."""
        return [pid for pid in self._descendants() if _cmdline(pid).startswith(title)]

    def stop(self) -> None:
        """SIGTERM each node (ray start --block stops its processes), then SIGKILL whatever of them is left."""
        doomed = self._descendants()
        for proc in self.nodes:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.nodes:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        for pid in doomed + self._descendants() + [p.pid for p in self.nodes]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for temp in self.dirs:
            shutil.rmtree(temp, ignore_errors=True)

    def _descendants(self) -> list[int]:
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                children.setdefault(ppid, []).append(int(entry))
        found, todo = [], [p.pid for p in self.nodes]
        while todo:
            pid = todo.pop()
            for child in children.get(pid, []):
                found.append(child)
                todo.append(child)
        return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
