"""Real builders and clients for the on-demand build tests: `fa4-aot builder` processes against a real uvicorn
server, and lean-runtime clients that miss, wait for the build and load what it published (CPU: the decision
whether a call is served and every kernel it launches fetched, without launching)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from fa4_aot.domain import recipe_format
from fa4_aot.domain.calls import Call
from fa4_aot.domain.region import Region
from fa4_aot.domain.signature import Signature
from fa4_aot.matrix.variants import load
from fa4_aot.remote.http import Remote
from fa4_aot.runtime import runner
from fa4_aot.runtime.fetch import Fetcher
from fa4_aot.store import Store
from fa4_aot.trust.policy import Trust
from tests.conftest import ROOT, TINY_VARIANTS
from tests.helpers.servers import Server, kernel_doc

SKU = load(TINY_VARIANTS).skus["h200"]
# one forward kernel, the cheapest FA4 compiles (seconds on a CPU); each test varies the batch, so each misses
TINY = {"layout": "dense", "pass_": "fwd", "dtype": "bf16", "head_dim": 64, "head_dim_v": 64, "mask": "full",
        "window": [0, 0], "softcap": 0.0, "sink": False, "num_splits": 1, "batch": 1, "seqlen_q": 128,
        "seqlen_k": 128, "heads_q": 2, "heads_kv": 2, "page_size": 0}


def tiny(**changes: Any) -> Call:
    return Call.from_dict({**TINY, **changes})


def hold_sku(server: Server) -> None:
    """Make the server hold SKU h200 (it takes misses only for SKUs it holds): one synthetic kernel."""
    data = os.urandom(64)
    with server.client("publish") as c:
        doc = kernel_doc(data)
        assert c.put(f"/v1/objects/{doc['object_digest']}", content=data).status_code in (200, 201)
        assert c.post("/v1/kernels", json=doc).status_code in (200, 201)


@dataclass
class BuilderProcess:
    """`fa4-aot builder` in its own process group (so a SIGKILL reaches its compile workers too)."""

    server: Server
    cache: Path
    log: Path
    lease: float = 60.0
    signing_key: Path | None = None
    extra: tuple[str, ...] = ()  # more options, e.g. the Ray executor's
    env: dict[str, str] | None = None
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> BuilderProcess:
        env = {**os.environ, **(self.env or {}), "PYTHONPATH": str(ROOT), "FA4_AOT_CACHE": str(self.cache)}
        cmd = [sys.executable, "-m", "fa4_aot", "builder", "--server", self.server.url, "--token",
               self.server.tokens["publish"], "--variants", str(TINY_VARIANTS), "-j", "1", "--poll", "0.2",
               "--lease", str(self.lease), *(["--signing-key", str(self.signing_key)] if self.signing_key else []),
               *self.extra]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        return self

    def kill(self) -> None:
        """SIGKILL the builder and its workers, mid-job or not, and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.proc = None


def lean_client(server: Server, cache: Path, trusted: dict[str, Any] | None = None) -> runner.Runtime:
    """A lean runtime for h200 over `cache`, fetching from `server`: trusting only what manifests signed by
    `trusted` keys list, or without them everything (unsigned builds: FA4_AOT_INSECURE=1)."""
    store = Store(cache)
    remote = Remote(server.url, token=server.tokens["read"])
    trust = Trust(SKU, store, remote, trusted or {}, insecure=not trusted)
    return runner.Runtime(store, SKU, trust=trust, fetcher=Fetcher(remote, trust, store))


def served(rt: runner.Runtime, call: Call) -> Region:
    """What the lean runtime does for `call` short of launching: its region (a miss, then with FA4_AOT_BUILD_WAIT
    the wait for the build) and every kernel of it fetched into the store. KernelMissing when not served."""
    attn = rt.attention(Signature.of(call))
    sizes = attn.sizes(recipe_format.sizes_of_call(call.layout, call.batch, call.seqlen_q, call.seqlen_k))
    region = attn.region(sizes)
    keys = [k.kernel_key for k in region.kernels]
    rt.libraries.prefetch(keys)
    assert all(rt.store.has_entry(k) for k in keys), "the region's kernels were not fetched"
    return region


def jobs(server: Server) -> list[dict[str, Any]]:
    return httpx.get(f"{server.url}/v1/builds?limit=1000", timeout=30).json()  # type: ignore[no-any-return]


def wait_until(check: Any, timeout: float, what: str) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
