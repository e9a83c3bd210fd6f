"""A cluster coming up: N client processes (nodes, each with its own cache) fetch one model's kernel set at once
from `fa4-aot serve --workers W` on PostgreSQL, side by side with nginx serving the same store files.

Each client is a light process (no GPU, no FA4) running the client library's fetch path for a list of kernel keys:
  per-kernel   what install()/fetch() does for one kernel: GET /v1/kernels/<key>, then GET /v1/objects/<digest>,
               on client.FETCH_THREADS threads (4); against nginx the same URLs map to the store's files;
  bundle       what load() now does first: one POST /v1/bundles for all the keys (fa4-aot server only).
All N processes start first and wait; then they are released together and timed until every one holds every
kernel ("all ready"). Runs alternate between servers, so load from other work on the machine hits them alike.
The store is synthetic (random bytes, sizes around the real h200 objects' mean): serving never looks inside.

    python bench/cluster_start.py [--clients 256] [--kernels 40] [--workers 2] [--rounds 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "service")]

from bench.netutil import free_port, wait_up  # noqa: E402
from bench.proctree import stop_tree, tree_cpu  # noqa: E402

NGINX = """
daemon off; worker_processes %(workers)d; pid %(tmp)s/nginx.pid; error_log %(tmp)s/error.log; user root;
events { worker_connections 4096; }
http {
  access_log off; sendfile on; tcp_nopush on; keepalive_requests 100000;
  client_body_temp_path %(tmp)s; proxy_temp_path %(tmp)s; fastcgi_temp_path %(tmp)s;
  uwsgi_temp_path %(tmp)s; scgi_temp_path %(tmp)s;
  server {
    listen 127.0.0.1:%(port)d backlog=4096;
    location ~ "^/v1/objects/([0-9a-f]{2})([0-9a-f]{62})$" {
      alias %(root)s/objects/$1/$2; default_type application/octet-stream;
      add_header Cache-Control "public, max-age=31536000, immutable";
    }
    location ~ "^/v1/kernels/(([0-9a-f]{2})[0-9a-f]{62})$" {
      alias %(root)s/index/$2/$1.json; default_type application/json;
    }
    location = /healthz { return 200 "ok"; }
  }
}
"""


# -- client side: one process per node, kept across runs ----------------------------------------------
def client_loop() -> None:
    """Read one JSON job per line on stdin, fetch, answer one JSON line on stdout; exit on EOF."""
    from concurrent.futures import ThreadPoolExecutor

    from fa4_aot.client import FETCH_THREADS
    from fa4_aot.remote.http import Remote
    from fa4_aot.store import Store

    print("ready", flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        _configure(job.get("knobs", {}))
        remote, store = Remote(job["url"]), Store(Path(job["cache"]))
        started, latencies, error = time.perf_counter(), [], ""
        try:
            if job["mode"] == "bundle":
                stored, skipped = remote.fetch_bundle(job["keys"], store)
                assert not skipped and len(stored) == len(job["keys"]), skipped
                latencies = [time.perf_counter() - started] * len(job["keys"])
            else:
                threads = int(job.get("knobs", {}).get("threads", FETCH_THREADS))
                with ThreadPoolExecutor(threads) as pool:
                    latencies = list(pool.map(lambda k, r=remote, s=store: _timed(r, k, s), job["keys"]))
            assert all(store.has_entry(k) for k in job["keys"])
        except Exception as e:  # a node that gave up (the library's retries exhausted): counted, not fatal
            error = f"{type(e).__name__}: {e}"[:300]
        remote.close()
        print(json.dumps({"ready": time.perf_counter() - started, "latencies": latencies, "error": error}),
              flush=True)


_DEFAULTS: dict[str, Any] = {}  # transport constants as they were before a knob changed them


def _configure(knobs: dict[str, str]) -> None:
    """A path's client settings (--paths NAME@knob=value,...): `deadline` sets FA4_AOT_FETCH_DEADLINE, any other
    knob but `threads` (the node's fetch threads) a constant of fa4_aot.remote.transport, e.g. ATTEMPT_SHARE."""
    from fa4_aot.remote import transport

    os.environ.pop("FA4_AOT_FETCH_DEADLINE", None)
    for name, value in _DEFAULTS.items():
        setattr(transport, name, value)
    for name, value in knobs.items():
        if name == "deadline":
            os.environ["FA4_AOT_FETCH_DEADLINE"] = value
        elif name != "threads":
            _DEFAULTS.setdefault(name, getattr(transport, name))
            setattr(transport, name, type(getattr(transport, name))(float(value)))


def _timed(remote: Any, key: str, store: Any) -> float:
    t = time.perf_counter()
    remote.fetch_kernel(key, store)
    return time.perf_counter() - t


# -- driver -------------------------------------------------------------------------------------------
def make_store(root: Path, kernels: int, seed: int = 11) -> list[str]:
    """`kernels` synthetic h200 kernels (sizes 30-110 KB, mean about the real h200 objects' 66 KB)."""
    import dataclasses

    from fa4_aot.domain import kernel_keys
    from fa4_aot.store import Entry, Store

    rng, store, keys = random.Random(seed), Store(root), []
    for i in range(kernels):
        data = rng.randbytes(rng.randint(30_000, 110_000))
        digest = store.put_object(data)
        entry = Entry(kernel_key="", object_digest=digest, size=len(data), family="_flash_attn_fwd",
                      compile_key=[i], sku="h200", arch="sm_90a", sm_count=132, l2_bytes=62914560, cuda_major=13,
                      toolchain={"bench": "synthetic"}, variant="bench", call=f"synthetic {i}", compile_seconds=0.0,
                      host="x86-64-v3")
        entry = dataclasses.replace(entry, kernel_key=kernel_keys.entry_key(entry))  # clients check it (D17)
        store.put_entry(entry)
        keys.append(entry.kernel_key)
    return keys


def cpu_seconds(pid: int) -> float:
    """User + system CPU of `pid` and all its descendants (Linux /proc), in seconds."""
    return sum(tree_cpu(pid, include_root=True).values())


def run(clients: list[subprocess.Popen[str]], url: str, mode: str, keys: list[str], tmp: Path,
        server_pids: list[int], budget: float, knobs: dict[str, str] | None = None) -> dict[str, Any]:
    caches = tmp / "nodes"
    shutil.rmtree(caches, ignore_errors=True)
    cpu0 = sum(cpu_seconds(p) for p in server_pids)
    started = time.perf_counter()
    for i, c in enumerate(clients):
        assert c.stdin is not None
        c.stdin.write(json.dumps({"url": url, "mode": mode, "keys": keys, "cache": str(caches / str(i)),
                                     "knobs": knobs or {}}) + "\n")
        c.stdin.flush()
    answers = collect(clients, started + budget)
    wall = time.perf_counter() - started
    cpu = sum(cpu_seconds(p) for p in server_pids) - cpu0
    ok = [a for a in answers if a and not a["error"]]
    lat = sorted(x for a in ok for x in a["latencies"]) or [float("nan")]
    return {"mode": mode, "nodes_ready": len(ok), "nodes_failed": sum(1 for a in answers if a and a["error"]),
            "nodes_unfinished": sum(1 for a in answers if a is None), "all_ready_s": round(wall, 3),
            "slowest_node_s": round(max((a["ready"] for a in ok), default=float("nan")), 3),
            "median_node_s": round(statistics.median(a["ready"] for a in ok), 3) if ok else None,
            "object_p50_ms": round(1000 * lat[len(lat) // 2], 1),
            "object_p99_ms": round(1000 * lat[int(len(lat) * .99)], 1), "server_cpu_s": round(cpu, 2),
            "objects": len(lat), "first_error": next((a["error"] for a in answers if a and a["error"]), ""),
            "errors": dict(collections.Counter(a["error"][:80] for a in answers if a and a["error"]).most_common(4))}


def collect(clients: list[subprocess.Popen[str]], deadline: float) -> list[dict[str, Any] | None]:
    """Each client's answer line, or None for one still busy at `deadline` (it is then killed: a stuck node)."""
    import selectors

    answers: list[dict[str, Any] | None] = [None] * len(clients)
    sel = selectors.DefaultSelector()
    for i, c in enumerate(clients):
        sel.register(c.stdout, selectors.EVENT_READ, i)  # type: ignore[arg-type]
    while sel.get_map() and time.perf_counter() < deadline:
        for key, _ in sel.select(timeout=max(0.0, deadline - time.perf_counter())):
            line = clients[key.data].stdout.readline()  # type: ignore[union-attr]
            answers[key.data] = json.loads(line) if line else {"error": "client died", "ready": 0, "latencies": []}
            sel.unregister(key.fileobj)
    for key in list(sel.get_map().values()):
        clients[key.data].kill()
    return answers


def start_servers(tmp: Path, store_root: Path, workers: int) -> tuple[list[subprocess.Popen[Any]], Any, str, str]:
    """fa4-aot serve (on a fresh PostgreSQL) and nginx, each in its own process group (stop_servers)."""
    from tests.helpers.servers import Postgres

    if not shutil.which("nginx"):
        sys.exit("nginx is not on PATH: apt-get install nginx")
    pg = Postgres()
    pg.start()
    ours_port, nginx_port = free_port(), free_port()
    servers: list[subprocess.Popen[Any]] = []
    try:
        servers.append(subprocess.Popen(
            [sys.executable, "-m", "fa4_aot", "serve", "--port", str(ours_port), "--db", pg.new_database(),
             "--workers", str(workers)], cwd=ROOT, env={**os.environ, "FA4_AOT_CACHE": str(store_root)},
            stdout=subprocess.DEVNULL, stderr=open(tmp / "serve.log", "wb"), start_new_session=True))  # noqa: SIM115
        (tmp / "nginx.conf").write_text(NGINX % {"tmp": tmp, "port": nginx_port, "root": store_root,
                                                 "workers": workers})
        servers.append(subprocess.Popen(["nginx", "-p", str(tmp), "-c", str(tmp / "nginx.conf")],
                                        stderr=open(tmp / "nginx.log", "wb"), start_new_session=True))  # noqa: SIM115
        urls = f"http://127.0.0.1:{ours_port}", f"http://127.0.0.1:{nginx_port}"
        for url, proc in zip(urls, servers, strict=True):
            wait_up(f"{url}/healthz", proc)
    except BaseException:
        stop_servers(servers, pg)
        raise
    return servers, pg, *urls


def stop_servers(servers: list[subprocess.Popen[Any]], pg: Any) -> None:
    """Each server's master first (fa4-aot: SIGTERM, nginx: SIGQUIT), which stops its own workers; then its
    process group, for anything left; then PostgreSQL."""
    for proc in servers:
        stop_tree(proc, signal.SIGQUIT if proc.args[0] == "nginx" else signal.SIGTERM)
    pg.stop()


def start_clients(n: int) -> list[subprocess.Popen[str]]:
    procs = [subprocess.Popen([sys.executable, __file__, "--client"], cwd=ROOT, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
             for _ in range(n)]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return procs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=256)
    parser.add_argument("--kernels", type=int, default=40, help="kernels in one model's set (each node fetches all)")
    parser.add_argument("--workers", type=int, default=2, help="server processes (fa4-aot and nginx alike)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--budget", type=float, default=300.0, help="seconds a run may take; later nodes count as "
                        "unfinished (and their processes are replaced)")
    parser.add_argument("--paths", default="nginx,per-kernel,bundle",
                        help="what each round runs, in order: nginx (per-kernel against nginx), per-kernel and bundle "
                        "(against fa4-aot); NAME@knob=value@... sets a path's client knobs (deadline, threads, or a "
                        "constant of fa4_aot/remote/transport.py), e.g. per-kernel@ATTEMPT_SHARE=1")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        return client_loop()
    # SIGTERM (e.g. from `timeout`) ends the run through the finally below: servers stopped, rows so far written
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    tmp = Path(tempfile.mkdtemp(prefix="fa4-aot-cluster-"))
    keys = make_store(tmp / "store", args.kernels)
    servers, pg, ours, nginx = start_servers(tmp, tmp / "store", args.workers)
    clients: list[subprocess.Popen[str]] = []
    rows = []
    # side by side: nginx and both fa4-aot paths in each round, so load from other work hits them alike (the
    # per-kernel path ran once, last, while it failed under load: issue 18's D29 made it hold)
    plan = parse_paths(args.paths, (ours, servers[0]), (nginx, servers[1])) * args.rounds
    try:
        for r, (name, url, mode, proc, knobs) in enumerate(plan):
            clients = [c for c in clients if c.poll() is None]
            clients += start_clients(args.clients - len(clients))
            row = {"run": r, "server": name, "knobs": knobs,
                   **run(clients, url, mode, keys, tmp, [proc.pid, *pg_pids(pg, name)], args.budget, knobs)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        for c in clients:
            c.kill()
            c.wait()
        stop_servers(servers, pg)
        shutil.rmtree(tmp, ignore_errors=True)
        doc = {"date": time.strftime("%Y-%m-%d"), "machine": f"{os.cpu_count()}-core {os.uname().machine}, no GPU",
               "clients": args.clients, "kernels": args.kernels, "workers": args.workers, "runs": rows}
        if args.out:
            args.out.write_text(json.dumps(doc, indent=1))


def parse_paths(text: str, ours: tuple[str, Any], nginx: tuple[str, Any]) -> list[tuple[str, str, str, Any, dict]]:
    """(server name, URL, fetch mode, server process, client knobs) for each path of --paths."""
    plan = []
    for item in text.split(","):
        path, *knobs = item.strip().split("@")
        if path not in ("nginx", "per-kernel", "bundle"):
            raise SystemExit(f"invalid path {path!r} in --paths: expected nginx, per-kernel or bundle")
        url, proc = nginx if path == "nginx" else ours
        plan.append(("nginx" if path == "nginx" else "fa4-aot", url, "bundle" if path == "bundle" else "per-kernel",
                     proc, dict(k.split("=", 1) for k in knobs)))
    return plan


def pg_pids(pg: Any, server: str) -> list[int]:
    """PostgreSQL's postmaster (its backends are children): the fa4-aot server's database work is its CPU too."""
    if server != "fa4-aot":
        return []
    pid_file = pg.root / "data" / "postmaster.pid"
    return [int(pid_file.read_text().split()[0])] if pid_file.exists() else []


if __name__ == "__main__":
    main()
