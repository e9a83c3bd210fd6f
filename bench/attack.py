"""Outside-in attack on a live `fa4-aot serve` (issue 9): starts the real CLI server on a throwaway store and
SQLite database, mints tokens with `fa4-aot token create`, then tries what an adversary would, over HTTP and
through the client against hostile servers of its own. Prints one line per attempt (PASS when the attack was
refused as it should be) and exits 1 if any attack got through.

    /work/main/.venv/bin/python bench/attack.py [--keep]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.netutil import free_port, wait_up  # noqa: E402
from fa4_aot.domain import kernel_keys  # noqa: E402
from fa4_aot.domain.skus import Sku  # noqa: E402
from fa4_aot.errors import Fa4AotError, IntegrityError, RemoteError, TrustError  # noqa: E402
from fa4_aot.remote.http import Remote  # noqa: E402
from fa4_aot.store import Store  # noqa: E402
from fa4_aot.trust import signing, signing_keys  # noqa: E402
from fa4_aot.trust.policy import Trust  # noqa: E402
from tests.helpers.raw_server import RawServer, reply  # noqa: E402

# the facts of variants.toml's rows, host included: a kernel key names the host target (domain/kernel_keys.py)
H200 = {"sku": "h200", "arch": "sm_90a", "sm_count": 132, "l2_bytes": 62914560, "cuda_major": 13, "host": "x86-64-v3"}
B200 = {"sku": "b200", "arch": "sm_100a", "sm_count": 148, "l2_bytes": 132120576, "cuda_major": 13,
        "host": "x86-64-v3"}
CALL = {"layout": "dense", "pass_": "fwd", "dtype": "bf16", "head_dim": 128, "head_dim_v": 128, "mask": "causal",
        "window": [-1, -1], "softcap": 0.0, "sink": False, "num_splits": 1, "batch": 1, "seqlen_q": 128,
        "seqlen_k": 128, "heads_q": 8, "heads_kv": 8, "page_size": 0}
RESULTS: list[tuple[str, bool, str]] = []


def attempt(name: str, refused: Callable[[], tuple[bool, str]]) -> None:
    try:
        ok, detail = refused()
    except Exception as e:  # an attack that crashes the harness counts as not refused cleanly
        ok, detail = False, f"{type(e).__name__}: {e}"
    RESULTS.append((name, ok, detail))
    print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail[:160]}", flush=True)


def cli(cache: Path, *args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "fa4_aot", "--cache-dir", str(cache), *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, check=True)
    return out.stdout.strip().splitlines()[-1].split()[-1]


def doc_for(data: bytes, **overrides: Any) -> dict[str, Any]:
    doc = {"object_digest": hashlib.sha256(data).hexdigest(), "size": len(data), "family": "FlashAttentionForwardSm90",
           "compile_key": ["fwd", 128, hashlib.sha256(data).hexdigest()[:16]], **H200,
           "toolchain": {"flash-attn-4": "4.0.0b36"}, "variant": "attack", "call": "fwd", "compile_seconds": 1.0,
           "hardware_queries": []}
    doc.update(overrides)
    return {"kernel_key": kernel_keys.entry_key(SimpleNamespace(**doc)), **doc}


def serve(cache: Path, db: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "fa4_aot", "--cache-dir", str(cache), "serve", "--port",
                             str(port), "--db", db], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_up(f"{url}/healthz", proc)
    except SystemExit as e:  # main() reports a harness failure as a RuntimeError, with the server stopped
        proc.kill()
        raise RuntimeError(f"fa4-aot serve did not come up: {e}") from None
    return proc, url


def http_attacks(url: str, cache: Path, tokens: dict[str, str]) -> None:
    def client(token: str | None = None) -> httpx.Client:
        return httpx.Client(base_url=url, timeout=30, headers={"Authorization": f"Bearer {token}"} if token else {})

    pub, sku_only, admin = client(tokens["publish"]), client(tokens["b200"]), client(tokens["admin"])
    victim_data = os.urandom(4000)
    victim = doc_for(victim_data)
    pub.put(f"/v1/objects/{victim['object_digest']}", content=victim_data)
    assert pub.post("/v1/kernels", json=victim).status_code == 201
    evil = os.urandom(4000)
    evil_digest = hashlib.sha256(evil).hexdigest()
    sku_only.put(f"/v1/objects/{evil_digest}", content=evil)
    relabel = {**victim, **B200, "object_digest": evil_digest}
    code = lambda r: (r.status_code, r.text[:100])  # noqa: E731
    attempt("D1 b200 token relabels an h200 key as b200", lambda: _is(code(sku_only.post("/v1/kernels", json=relabel)),
                                                                      422, 409))
    attempt("D1 same key, other object, same facts", lambda: _is(code(pub.post("/v1/kernels", json={
        **victim, "object_digest": evil_digest})), 409))
    attempt("forged kernel key (fields hash elsewhere)", lambda: _is(code(pub.post("/v1/kernels", json={
        **victim, "kernel_key": "f" * 64})), 422))
    held = pub.get(f"/v1/kernels/{victim['kernel_key']}").json()["object_digest"]
    attempt("victim kernel still serves its object", lambda: (held == victim["object_digest"], held))
    miss = {"kernel_key": "a" * 64, "sku": "h200", "family": "f", "compile_key": [1]}
    deep = "[" * 260 + "1" + "]" * 260
    attempt("D3 miss with compile_key nested 260 deep", lambda: _is(code(client().post(
        "/v1/misses", content=json.dumps(miss).replace("[1]", deep), headers={"Content-Type": "application/json"})),
        422))
    attempt("D3 miss call with an extra field", lambda: _is(code(client().post("/v1/misses", json={
        **miss, "call": {**CALL, "evil": 1}})), 422))
    attempt("D3 GET /v1/misses still answers", lambda: _is(code(client().get("/v1/misses")), 200))
    attempt("D4 1 MB miss report", lambda: _is(code(client().post("/v1/misses", json={
        **miss, "compile_key": ["x" * (1 << 20)]})), 413))
    attempt("D4 miss for an unknown SKU", lambda: _is(code(client().post("/v1/misses", json={
        **miss, "sku": "nowhere"})), 404))
    attempt("D4 GET /v1/misses limit=100000", lambda: _is(code(client().get("/v1/misses?limit=100000")), 400))
    attempt("D13 chunked 2 MB JSON body", lambda: _is(code(pub.post("/v1/kernels", content=_chunks(2 << 20),
                                                                     headers={"Content-Type": "application/json"})),
                                                      413))
    attempt("D13 manifest nested 995 deep", lambda: _is(code(pub.put("/v1/skus/h200/manifests", content=(
        '{"format": "fa4-aot-manifest/1", "manifest": ' + "[" * 995 + "1" + "]" * 995 + "}").encode(),
        headers={"Content-Type": "application/json"})), 422))
    gone = os.urandom(3000)
    gone_doc = doc_for(gone)
    pub.put(f"/v1/objects/{gone_doc['object_digest']}", content=gone)
    Store(cache).remove_object(gone_doc["object_digest"])
    attempt("D9 publish after the object file vanished", lambda: _is(code(pub.post("/v1/kernels", json=gone_doc)),
                                                                     409))
    attempt("D9 ... and no row was written", lambda: _is(code(pub.get(f"/v1/kernels/{gone_doc['kernel_key']}")),
                                                         404))
    keys_dir = Path(tempfile.mkdtemp())
    facts = {"name": "h200", **{k: H200[k] for k in ("arch", "sm_count", "l2_bytes", "cuda_major", "host")}}

    def envelope(kernels: dict[str, str], n: int, key: Any, **extra: Any) -> dict[str, Any]:
        return signing.sign({"sku": facts, "kernels": kernels, "toolchain": [], "created": f"2026-01-01T00:00:{n:02d}Z",
                             "expires": "2099-01-01T00:00:00Z", **extra}, key)

    flood_key = signing_keys.load_private(signing_keys.generate(keys_dir, "flood")[0])
    listed = {victim["kernel_key"]: victim["object_digest"]}
    attempt("D14 empty manifest", lambda: _is(code(pub.put("/v1/skus/h200/manifests", json=envelope({}, 0, flood_key))),
                                              422))
    attempt("D14 manifest padded to 1 MB", lambda: _is(code(pub.put("/v1/skus/h200/manifests", json=envelope(
        listed, 1, flood_key, pad="x" * 900_000))), 422, 413))
    codes = [pub.put("/v1/skus/h200/manifests", json=envelope(listed, 10 + n, signing_keys.load_private(
        signing_keys.generate(keys_dir, f"k{n}")[0]))).status_code for n in range(10)]
    attempt("D14 manifests by 10 fresh keys (publish token)", lambda: (codes.count(429) == 2, str(codes)))
    attempt("admin may add a ninth key", lambda: _is(code(admin.put("/v1/skus/h200/manifests", json=envelope(
        listed, 40, signing_keys.load_private(signing_keys.generate(keys_dir, "adm")[0])))), 201))
    for target in ("/v1/objects/..%2F..%2Fetc%2Fpasswd", "/v1/objects/" + "A" * 64, "/v1/kernels/../../x"):
        attempt(f"traversal {target}", lambda t=target: _is(code(client().get(t)), 400, 404))
    link = "5" * 64
    (cache / "objects" / "55").mkdir(mode=0o700, exist_ok=True)
    (cache / "objects" / "55" / link[2:]).symlink_to("/etc/passwd")
    attempt("D12 symlink planted in the store", lambda: _is(code(client().get(f"/v1/objects/{link}")), 400, 404))
    attempt("no token publishes nothing", lambda: _is(code(client().post("/v1/kernels", json=victim)), 401))
    attempt("read token cannot delete misses", lambda: _is(code(client(tokens["read"]).delete(
        f"/v1/misses/{'a' * 64}")), 403))
    attempt("D12 SQLite file is owner-only", lambda: (oct((cache / "fa4-aot.db").stat().st_mode & 0o777) == "0o600",
                                                      oct((cache / "fa4-aot.db").stat().st_mode & 0o777)))


def _is(got: tuple[int, str], *wanted: int) -> tuple[bool, str]:
    return got[0] in wanted, f"{got[0]} {got[1]}"


def _chunks(total: int) -> Iterator[bytes]:
    for _ in range(total // (64 << 10)):
        yield b" " * (64 << 10)


def client_attacks(tmp: Path) -> None:
    os.environ["FA4_AOT_FETCH_DEADLINE"] = "2"
    data = os.urandom(67_288)
    entry = doc_for(data)
    box: list[RawServer] = []

    def flood(path: str, conn: socket.socket) -> None:
        if path.startswith("/v1/kernels/"):
            box[0].send(conn, reply(200, json.dumps({**entry, "created": "2026-01-01T00:00:00Z"}).encode()))
            return
        box[0].send(conn, reply(200, data, "application/octet-stream", length=len(data) + (64 << 20)))
        for _ in range(64):
            box[0].send(conn, b"\0" * (1 << 20))

    box.append(RawServer(flood))
    with box[0]:
        def d6() -> tuple[bool, str]:
            try:
                Remote(box[0].url, retries=0).fetch_object(entry["object_digest"], Store(tmp / "c6"), entry["size"])
            except IntegrityError as e:
                return box[0].sent < (64 << 20), f"{e} (server sent {box[0].sent} bytes)"
            return False, "accepted"
        attempt("D6 server streams 64 MiB for a 67 KB object", d6)
    box.clear()
    box.append(RawServer(lambda path, conn: [box[0].stop.wait(0.5 * 40)]))  # accepts, never answers
    with box[0]:
        remote = Remote(box[0].url)

        def d5() -> tuple[bool, str]:
            start = time.monotonic()
            for _ in range(5):
                try:
                    remote.kernel("a" * 64)
                except RemoteError:
                    pass
            took = time.monotonic() - start
            return box[0].connections == 1, f"5 lookups took {took:.1f}s, {box[0].connections} connection(s)"
        attempt("D5 hung server, 5 missing kernels", d5)
    box.clear()
    box.append(RawServer(lambda path, conn: box[0].send(conn, reply(200, b"<html>login</html>", "text/html"))))
    _, public = signing_keys.generate(tmp / "keys", "client")
    with box[0]:
        def d11() -> tuple[bool, str]:
            trust = Trust(Sku("h200", "sm_90a", 132, 62914560, 13), Store(tmp / "c11"), Remote(box[0].url),
                          {public.key_id: public})
            return trust.allowed() == {}, "; ".join(trust.rejected)[:150]
        attempt("D11 proxy answers 200 HTML", d11)
    empty = tmp / "empty.pub"
    empty.write_text("# nothing\n")

    def d7() -> tuple[bool, str]:
        try:
            signing_keys.trusted_keys(str(empty))
        except TrustError as e:
            return True, str(e)
        return False, "trust silently off"
    attempt("D7 FA4_AOT_TRUSTED_KEYS names an empty file", d7)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="keep the temp folder")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="fa4-aot-attack-"))
    cache, db = tmp / "cache", f"sqlite:///{tmp / 'cache' / 'fa4-aot.db'}"
    proc = None
    try:
        cache.mkdir(mode=0o700)
        tokens = {scope: cli(cache, "token", "create", "--scope", scope, "--name", scope, "--db", db)
                  for scope in ("read", "publish", "admin")}
        tokens["b200"] = cli(cache, "token", "create", "--scope", "publish", "--name", "b200-only", "--sku", "b200",
                             "--db", db)
        proc, url = serve(cache, db)
        http_attacks(url, cache, tokens)
        client_attacks(tmp)
    except (Fa4AotError, subprocess.CalledProcessError, RuntimeError) as e:
        print(f"harness failed: {e}", file=sys.stderr)
        return 2
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    failed = [name for name, ok, _ in RESULTS if not ok]
    print(f"{len(RESULTS)} attacks, {len(RESULTS) - len(failed)} refused, {len(failed)} got through: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
