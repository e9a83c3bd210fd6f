"""Object GETs per second and latency: the fa4-aot server vs nginx serving the same files, side by side.

Both serve the store's objects under the same URL shape (/v1/objects/<digest>); wrk (Debian package
`wrk`) requests random objects of the store at 1, 16, 64 and 256 concurrent connections for each. Then
the time for `fa4-aot pull` to mirror the whole SKU into an empty cache. Everything runs on 127.0.0.1.
With --kernels N the store is N synthetic h200 kernels (bench/cluster_start.make_store: random bytes of the real
objects' sizes; serving never looks inside) in a temporary folder, for a host with no build; else FA4_AOT_CACHE's.

    python bench/serve_load.py --sku h200 [--kernels 40] [--seconds 8] [--workers 1] [--out FILE]
    (needs nginx and wrk)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.netutil import free_port, wait_up  # noqa: E402
from bench.proctree import stop_tree  # noqa: E402
from fa4_aot import config  # noqa: E402
from fa4_aot.store import Store  # noqa: E402

LUA = """
local paths = {}
for line in io.lines("%s") do paths[#paths + 1] = line end
math.randomseed(os.time())
request = function() return wrk.format("GET", paths[math.random(#paths)]) end
"""
NGINX = """
daemon off; worker_processes %(workers)d; pid %(tmp)s/nginx.pid; error_log %(tmp)s/error.log; user root;
events { worker_connections 1024; }
http {
  access_log off; sendfile on; tcp_nopush on;
  client_body_temp_path %(tmp)s; proxy_temp_path %(tmp)s; fastcgi_temp_path %(tmp)s;
  uwsgi_temp_path %(tmp)s; scgi_temp_path %(tmp)s;
  server {
    listen 127.0.0.1:%(port)d;
    location ~ "^/v1/objects/([0-9a-f]{2})([0-9a-f]{62})$" {
      alias %(root)s/objects/$1/$2;
      default_type application/octet-stream;
      add_header Cache-Control "public, max-age=31536000, immutable";
    }
  }
}
"""


def wrk(url: str, script: Path, connections: int, seconds: int) -> dict[str, float]:
    threads = min(2, connections)
    out = subprocess.run(
        ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", str(script), url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    lat = {p: _ms(re.search(rf"^\s+{p}%\s+([\d.]+\w+)", out, re.M).group(1)) for p in ("50", "99")}  # type: ignore
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {"rps": rps, "p50_ms": lat["50"], "p99_ms": lat["99"], "non_2xx": int(errors.group(1)) if errors else 0}


def _ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(\w+)", text).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}[unit]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sku", default="h200")
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--workers", type=int, default=1, help="processes for each server (nginx workers too)")
    parser.add_argument("--kernels", type=int, default=0, help="serve this many synthetic h200 kernels from a "
                        "temporary store instead of FA4_AOT_CACHE's (--sku h200)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    for tool in ("nginx", "wrk"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is not on PATH: apt-get install {tool}")
    tmp = Path(tempfile.mkdtemp(prefix="fa4-aot-bench-"))
    if args.kernels:
        from bench.cluster_start import make_store

        make_store(tmp / "store", args.kernels)
        args.sku = "h200"
    store = Store(tmp / "store" if args.kernels else config.default_cache_dir())
    digests = sorted({e.object_digest for e in store.entries(args.sku)})
    if not digests:
        sys.exit(f"no {args.sku} kernels in {store.root}: run `fa4-aot build --sku {args.sku}` first, or pass "
                 "--kernels N for a synthetic store")
    (tmp / "paths").write_text("".join(f"/v1/objects/{d}\n" for d in digests))
    script = tmp / "random.lua"
    script.write_text(LUA % (tmp / "paths"))
    ours_port, nginx_port = free_port(), free_port()
    (tmp / "nginx.conf").write_text(
        NGINX % {"tmp": tmp, "port": nginx_port, "root": store.root.resolve(), "workers": args.workers}
    )
    env = {**os.environ, "FA4_AOT_CACHE": str(store.root)}
    ours = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fa4_aot",
            "serve",
            "--port",
            str(ours_port),
            "--db",
            f"sqlite:///{tmp}/bench.db",
            "--workers",
            str(args.workers),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    nginx = subprocess.Popen(
        ["nginx", "-p", str(tmp), "-c", str(tmp / "nginx.conf")], stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )
    try:
        wait_up(f"http://127.0.0.1:{ours_port}/healthz", ours)
        wait_up(f"http://127.0.0.1:{nginx_port}/", nginx)
        rows = []
        for c in (1, 16, 64, 256):
            a = wrk(f"http://127.0.0.1:{ours_port}", script, c, args.seconds)
            b = wrk(f"http://127.0.0.1:{nginx_port}", script, c, args.seconds)
            rows.append({"connections": c, "fa4_aot": a, "nginx": b})
        started = time.perf_counter()
        pull = subprocess.run(
            [
                sys.executable,
                "-m",
                "fa4_aot",
                "--cache-dir",
                str(tmp / "pulled"),
                "pull",
                "--server",
                f"http://127.0.0.1:{ours_port}",
                "--sku",
                args.sku,
                "--json",
            ],
            capture_output=True,
            text=True,
            # a synthetic store has no signed manifest: its pull trusts the server, as an unsigned store needs
            env={**os.environ, **({"FA4_AOT_INSECURE": "1"} if args.kernels else {})},
        )
        pull_s = time.perf_counter() - started
        if pull.returncode:
            sys.exit(f"fa4-aot pull failed ({pull.returncode}): {pull.stderr[-2000:]}\nrows: {json.dumps(rows)}")
    finally:  # each master first, then its group (workers killed first are replaced by their master)
        stop_tree(ours, signal.SIGTERM)
        stop_tree(nginx, signal.SIGQUIT)
        shutil.rmtree(tmp, ignore_errors=True)
    report(rows, json.loads(pull.stdout), pull_s, len(digests), args)


def report(rows: list[dict], pulled: dict, pull_s: float, objects: int, args: argparse.Namespace) -> None:
    print(
        f"{'conns':>5} | {'fa4-aot req/s':>13} {'p50 ms':>8} {'p99 ms':>8} | {'nginx req/s':>11} {'p50 ms':>8} "
        f"{'p99 ms':>8} | {'fa4-aot/nginx':>13}"
    )
    for r in rows:
        a, b = r["fa4_aot"], r["nginx"]
        print(
            f"{r['connections']:>5} | {a['rps']:>13.0f} {a['p50_ms']:>8.2f} {a['p99_ms']:>8.2f} | {b['rps']:>11.0f} "
            f"{b['p50_ms']:>8.2f} {b['p99_ms']:>8.2f} | {a['rps'] / b['rps']:>13.2f}"
        )
    print(
        f"pull of {args.sku}: {pulled['fetched']} kernels, {pulled['bytes']} bytes in {pull_s:.2f} s "
        f"({objects} objects served)"
    )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps(
                {
                    "sku": args.sku,
                    "workers": args.workers,
                    "rows": rows,
                    "pull": pulled,
                    "pull_seconds": pull_s,
                    "cpus": os.cpu_count(),
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
