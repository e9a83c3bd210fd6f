"""End to end on a CPU: real builds for h200 and b200, pushed to a real server, pulled back, fetched by clients.

Runs against both databases (the `server` fixture is parametrized over SQLite and PostgreSQL).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from fa4_aot import fa4
from fa4_aot.client import Installation
from fa4_aot.domain import kernel_keys
from fa4_aot.domain.calls import Call
from fa4_aot.domain.skus import Sku
from fa4_aot.errors import KernelMissing
from fa4_aot.remote.http import Remote, server_from_env
from fa4_aot.store import Store, maintenance
from fa4_aot.trust.policy import Trust
from tests.conftest import ROOT, TINY_VARIANTS, run_cli
from tests.helpers.servers import Server, free_port, kernel_doc

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store holding a deterministic-backward set for h200 and a persistent forward for b200 (real compiles)."""
    store = tmp_path_factory.mktemp("built")
    for sku, only in (("h200", "det-bwd"), ("b200", "full-fwd")):
        result = run_cli("build", "--sku", sku, "--variants", str(TINY_VARIANTS), "--only", only, "--json",
                         cache=store)
        assert result.returncode == 0, result.stderr[-2000:]
    return store


def push(server: Server, store: Path) -> dict:
    result = run_cli("push", "--server", server.url, "--token", server.tokens["publish"], "--json", cache=store)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


def object_gets(server: Server) -> float:
    text = httpx.get(f"{server.url}/metrics").text
    pattern = r'fa4_aot_http_requests_total\{method="GET",route="/v1/objects/\{digest\}",status="200"\} ([\d.e+]+)'
    return sum(float(m) for m in re.findall(pattern, text))


UNSIGNED = {"FA4_AOT_INSECURE": "1"}  # these builds are unsigned: pull takes them only when told to


def test_push_then_pull_into_an_empty_cache_is_byte_identical(server: Server, built: Path, tmp_path: Path) -> None:
    local = list(Store(built).entries())
    first = push(server, built)
    # kernels, not entries: a kernel's base-key signpost is not counted (issue 22, point 3)
    assert first["failures"] == [] and first["kernels"] == sum(not e.is_signpost for e in local) < len(local)
    assert push(server, built)["objects_sent"] == 0  # HEAD first: nothing is uploaded twice
    mirror = tmp_path / "mirror"
    for sku in ("h200", "b200"):
        result = run_cli("pull", "--server", server.url, "--sku", sku, "--json", cache=mirror,
                         env=UNSIGNED)
        assert result.returncode == 0 and json.loads(result.stdout)["failures"] == []
    pulled = Store(mirror)
    assert {e.kernel_key for e in pulled.entries()} == {e.kernel_key for e in local}
    for entry in local:
        assert pulled.get_entry(entry.kernel_key).object_digest == entry.object_digest
        assert pulled.read_object(entry.object_digest) == Store(built).read_object(entry.object_digest)
    assert maintenance.verify(pulled).ok


def test_eight_processes_pulling_one_sku_download_each_object_once(server: Server, built: Path,
                                                                   tmp_path: Path) -> None:
    push(server, built)
    objects = {e.object_digest for e in Store(built).entries("h200")}
    # every object once: kernel objects, their linked libraries and the runtime library they share
    referenced = set().union(*(e.digests() for e in Store(built).entries("h200")))
    assert len(referenced) > len(objects)
    before = object_gets(server)
    cache = tmp_path / "shared-node-cache"
    cmd = [sys.executable, "-m", "fa4_aot", "--cache-dir", str(cache), "pull", "--server", server.url,
           "--sku", "h200", "--json"]
    procs = [subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env={**os.environ, **UNSIGNED}) for _ in range(8)]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
    assert object_gets(server) - before == len(referenced)
    store = Store(cache)
    assert maintenance.verify(store).ok and {e.object_digest for e in store.entries()} == objects
    assert not [p for p in cache.rglob(".*") if p.is_file()]  # no temp file left behind


def _h200(facts: dict) -> Sku:
    return Sku(name="h200", arch="sm_90a", sm_count=132, l2_bytes=62914560, cuda_major=13)


def test_client_fetches_verified_kernels_and_degrades_when_the_server_is_down(
        server: Server, built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    push(server, built)
    entry = next(Store(built).entries("h200"))
    sku = _h200({})
    remote, store = Remote(server.url), Store(tmp_path / "a")
    refused = Installation(sku=sku, store=store, mode="strict", trace=[], remote=remote,
                           trust=Trust(sku, store, remote, {}), tools=fa4.toolchain())
    assert not refused.fetch(entry.kernel_key) and "FA4_AOT_TRUSTED_KEYS" in refused.remote_error  # the default
    inst = Installation(sku=sku, store=store, mode="strict", trace=[], remote=remote,
                        trust=Trust(sku, store, remote, {}, insecure=True), tools=fa4.toolchain())
    assert inst.fetch(entry.kernel_key) and inst.stats.fetched == 1
    assert Store(tmp_path / "a").verified_object_path(entry.object_digest).is_file()
    assert not inst.fetch("f" * 64) and "has no kernel" in inst.remote_error

    down = Remote(f"http://127.0.0.1:{free_port()}", retries=0)
    inst = Installation(sku=sku, store=Store(tmp_path / "b"), mode="strict", trace=[], remote=down,
                        trust=Trust(sku, Store(tmp_path / "b"), down, {}, insecure=True),
                        tools=fa4.toolchain())
    key = ("no", "such", "kernel")
    with pytest.raises(KernelMissing) as info:
        key in fa4.store_cache("_flash_attn_fwd", inst)  # noqa: B015
    assert "cannot reach http://127.0.0.1" in str(info.value) and "SKU h200" in str(info.value)
    assert info.value.kernel_key == kernel_keys.kernel_key("_flash_attn_fwd", key, sku, fa4.toolchain())

    monkeypatch.setenv("FA4_AOT_SERVER", server.url)
    assert server_from_env() is not None
    monkeypatch.setenv("FA4_AOT_OFFLINE", "1")
    assert server_from_env() is None


def test_build_from_misses_builds_the_reported_call_and_pushes_it(server: Server, tmp_path: Path) -> None:
    call = Call(layout="dense", pass_="fwd", dtype="bf16", head_dim=64, head_dim_v=64, mask="full", window=(0, 0),
                softcap=0.0, sink=False, num_splits=1, batch=1, seqlen_q=512, seqlen_k=512, heads_q=16, heads_kv=16)
    [(family, kernel_key)] = planned_keys(call, "b200")  # a real miss names a kernel its call selects
    # the service takes misses only for SKUs it holds (issue 9, D4): give it one b200 kernel first
    data = os.urandom(64)
    held = kernel_doc(data, sku="b200", arch="sm_100a", sm_count=148, l2_bytes=132644864, cuda_major=13)
    with server.client("publish") as c:
        assert c.put(f"/v1/objects/{held['object_digest']}", content=data).status_code in (200, 201)
        assert c.post("/v1/kernels", json=held).status_code in (200, 201)
    miss = {"kernel_key": kernel_key, "family": family, "compile_key": [], "sku": "b200", "call": call.to_dict()}
    assert httpx.post(f"{server.url}/v1/misses", json=miss).status_code == 202
    result = run_cli("build", "--from-misses", "--server", server.url, "--token", server.tokens["publish"],
                     "--variants", str(TINY_VARIANTS), "--json", cache=tmp_path / "builder")
    assert result.returncode == 0, result.stderr[-2000:]
    [report] = [r for r in json.loads(result.stdout) if r["sku"] == "b200"]
    assert report["failed"] == 0 and report["kernels"] >= 1
    manifest = httpx.get(f"{server.url}/v1/skus/b200/manifest").json()
    assert set(report["kernel_keys"]) <= {k["kernel_key"] for k in manifest["kernels"]}
    # the miss names the base key; a kernel that consumed SKU constants is reported under its full key (issue 13)
    built = Store(tmp_path / "builder")
    assert any(kernel_key in kernel_keys.entry_keys(built.get_entry(k)) for k in report["kernel_keys"])


def test_build_from_misses_replays_the_exact_record_through_the_server(server: Server, tmp_path: Path) -> None:
    """A miss that carries only the exact FA4 arguments (a float32 sink: a Call would re-plan a bf16 one) travels
    through the server and `build --from-misses` replays it into exactly the missed kernel."""
    def tensor(*shape: int, dtype: str = "bfloat16") -> dict:
        stride = [64 * 16 * 512, 64 * 16, 64, 1][-len(shape):] if len(shape) > 1 else [1]
        return {"tensor": dtype, "shape": list(shape), "stride": stride, "offset": 0, "grad": False}

    record = {"format": 1, "entry": "FlashAttnFunc", "backward": None,
              "forward": {"q": tensor(1, 512, 16, 64), "k": tensor(1, 512, 16, 64), "v": tensor(1, 512, 16, 64),
                          "learnable_sink": tensor(16, dtype="float32"), "causal": True}}
    [(family, kernel_key)] = planned_keys(record, "h200")
    sink_call = Call(layout="dense", pass_="fwd", dtype="bf16", head_dim=64, head_dim_v=64, mask="causal",
                     window=(0, 0), softcap=0.0, sink=True, num_splits=1, batch=1, seqlen_q=512, seqlen_k=512,
                     heads_q=16, heads_kv=16)
    assert (family, kernel_key) not in planned_keys(sink_call, "h200")  # what re-planning a Call could not build
    data = os.urandom(64)
    with server.client("publish") as c:  # the service takes misses only for SKUs it holds
        held = kernel_doc(data)
        assert c.put(f"/v1/objects/{held['object_digest']}", content=data).status_code in (200, 201)
        assert c.post("/v1/kernels", json=held).status_code in (200, 201)
    miss = {"kernel_key": kernel_key, "family": family, "compile_key": [], "sku": "h200", "args": record}
    assert httpx.post(f"{server.url}/v1/misses", json=miss).status_code == 202
    result = run_cli("build", "--from-misses", "--server", server.url, "--token", server.tokens["publish"],
                     "--variants", str(TINY_VARIANTS), "--json", cache=tmp_path / "builder")
    assert result.returncode == 0, result.stderr[-2000:] + result.stdout[-2000:]
    [report] = [r for r in json.loads(result.stdout) if r["sku"] == "h200"]
    assert report["failed"] == 0 and report["built"] == 1 and Store(tmp_path / "builder").has_entry(kernel_key)


def planned_keys(call: Call | dict, sku: str) -> list[tuple[str, str]]:
    """(family, kernel key) of every kernel `call` (a Call, or an exact record) needs on `sku`, planned in a fresh
    process configured for it."""
    code = (
        "import json, sys\n"
        "from fa4_aot import fa4\nfrom fa4_aot.domain import kernel_keys\nfrom fa4_aot.matrix import variants\n"
        "from fa4_aot.domain.calls import Call\n"
        "from fa4_aot.domain.exact import ExactCall\n"
        f"sku = variants.load({str(TINY_VARIANTS)!r}).sku({sku!r})\n"
        "fa4.configure(sku)\n"
        "tools = fa4.toolchain()\n"
        "doc = json.loads(sys.argv[1])\n"
        "call = ExactCall.from_dict(doc) if 'entry' in doc else Call.from_dict(doc)\n"
        "print(json.dumps(sorted([f, kernel_keys.kernel_key(f, k, sku, tools)] for (f, _), k in "
        "fa4.plan(call).items())))\n"
    )
    doc = call.to_dict() if isinstance(call, Call) else call
    out = subprocess.run([sys.executable, "-c", code, json.dumps(doc)], capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return [tuple(p) for p in json.loads(out.stdout.strip().splitlines()[-1])]
