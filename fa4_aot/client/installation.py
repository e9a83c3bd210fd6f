"""Installation state: which SKU, store, mode, trust policy and server this process serves FA4 from, and the
answer to FA4's one question, "is kernel (family, compile key) available?" (Installation.object_for).

install() hands the Installation to the FA4 seam, whose compile caches ask it (fa4_aot.fa4.caches.StoreCache).
A kernel missing from the local store is fetched from the server when FA4_AOT_SERVER is set (see remote/http.py).
Strict mode never compiles: a kernel neither has raises KernelMissing naming the SKU, the call and the command
that adds it; with FA4_AOT_BUILD_WAIT=SECONDS it first waits that long for the server's on-demand build of it
(remote/wait.py), then fetches and verifies it as any fetch. Fallback mode lets FA4 compile it, records the miss
(locally for `fa4-aot misses`, and on the server for `fa4-aot build --from-misses`) with the Call and the exact
FA4 arguments that needed it, and goes on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import config, fa4
from ..domain import devices, kernel_keys, narrow_build, scopes
from ..domain.kernel_keys import canonical, dumps, kernel_key
from ..domain.misses import Miss
from ..domain.signature import Signature
from ..domain.skus import Constants, Sku
from ..errors import Fa4AotError, KernelMissing, KernelRefused, TrustError
from ..remote import wait as build_wait
from ..store import Entry, Store
from ..store.migrate import foreign
from ..trust.certified import ENV, Gate
from ..trust.policy import Trust

if TYPE_CHECKING:  # httpx (through remote) is imported only when a server is configured: it costs cold starts
    from ..domain.calls import Call
    from ..remote.http import Remote

MODES = ("strict", "fallback")


@dataclass
class Stats:
    loaded: int = 0  # kernels read from the store into this process
    fetched: int = 0  # kernels downloaded from the server into the store
    compiled: int = 0  # kernels FA4 compiled itself (fallback mode only)
    misses: list[str] = field(default_factory=list)  # kernel keys the store lacked


@dataclass
class Installation:
    sku: Sku  # the table row serving this device (matching.select): manifests, messages, FA4's dispatch
    store: Store
    mode: str
    trace: list[str]
    trust: Trust
    tools: dict[str, str]  # the toolchain kernel keys name (fa4.toolchain())
    constants: Constants | None = None  # the device's own constants (default: the row's)
    remote: Remote | None = None
    remote_error: str = ""  # why the server could not help, for strict mode's message
    gate: Gate | None = None  # certification: known-bad and failed kernels are refused (trust/certified.py)
    stats: Stats = field(default_factory=Stats)

    def kernel_key(self, family: str, key: Any) -> str:
        """The base key of kernel (family, compile key) for this device's arch and CUDA major."""
        return kernel_key(family, key, self.sku, self.tools)

    def device_constants(self) -> Constants:
        return self.constants or self.sku.constants()

    def _entry(self, kk: str) -> Entry | None:
        entry = self.store.get_entry(kk)
        if entry is None and self.fetch(kk):
            entry = self.store.get_entry(kk)
        return entry

    def find(self, base_key: str) -> tuple[Entry | None, str]:
        """(the entry of the kernel with `base_key` for this device, or None; why not): that of
        kernel_keys.device_key, looked up locally, then on the server. The base entry is the kernel when it
        consumed no constant, and stands for it (a signpost of the same object) where the device's values are
        those it consumed."""
        base = self._entry(base_key)
        constants = self.device_constants()
        try:
            key = kernel_keys.device_key(base_key, base, constants)
            differing = kernel_keys.differing(base, constants) if base is not None else {}
        except ValueError as e:  # a constant this version cannot compute
            return None, str(e)
        if base is None or key == base_key or not differing:
            return base, ""
        variant = self._entry(key)
        if variant is not None:
            return variant, ""
        diff = ", ".join(f"{name} = {mine} (built: {theirs})" for name, (theirs, mine) in differing.items())
        return None, (f"It consumed SKU constants and no build has this device's values: {diff}; add a "
                      f"[skus.NAME] table with this device's figures (`fa4-aot skus --detect` prints it) and run "
                      "`fa4-aot build --sku NAME`")

    def fetch(self, kernel_key: str) -> bool:
        """Download `kernel_key` from the server into the store, if the trust policy accepts it. False (never
        raises) when there is no server, it lacks the kernel, cannot be reached or the kernel is not trusted;
        the reason is kept for error messages."""
        if self.remote is None:
            return False
        self.remote_error = self.trust.refuse_remote()
        if self.remote_error:
            return False
        try:
            if self.remote.fetch_kernel(kernel_key, self.store, accept=self.trust.check) is None:
                self.remote_error = f"{self.remote.url} has no kernel {kernel_key[:16]}… for {self.sku.name} either"
                return False
        except Fa4AotError as e:  # unreachable, untrusted, or bytes that failed their digest (IntegrityError)
            self.remote_error = str(e)
            return False
        self.stats.fetched += 1
        return True

    def fetch_many(self, kernel_keys: list[str], threads: int = 4) -> int:
        """fetch() for several kernels: one request (a bundle) when the server offers it, else one by one on
        `threads` threads. Returns how many were downloaded; never raises (reasons kept as in fetch())."""
        if self.remote is None or not kernel_keys:
            return 0
        from ..errors import RemoteError

        self.remote_error = self.trust.refuse_remote()
        if self.remote_error:
            return 0
        try:
            stored, skipped = self.remote.fetch_bundle(kernel_keys, self.store, accept=self.trust.check)
        except RemoteError:  # an older server without bundles, or a broken one: the per-kernel path retries
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(min(threads, len(kernel_keys))) as pool:
                return sum(pool.map(self.fetch, kernel_keys))
        except Fa4AotError as e:  # bytes that do not match their digest: nothing of them was stored
            self.remote_error = str(e)
            return 0
        if skipped:
            self.remote_error = next(iter(skipped.values()))
        self.stats.fetched += len(stored)
        return len(stored)

    # -- the KernelSource the seam's StoreCache asks (fa4_aot.fa4.caches) --------------------------------
    def object_for(self, family: str, key: Any) -> Path | None:
        """The verified object of kernel (family, compile key): local, else fetched. None in fallback mode when
        neither has it (the miss is recorded); strict mode raises KernelMissing, or TrustError for an
        untrusted kernel. Raises IntegrityError for an object whose bytes do not match its digest."""
        kk = self.kernel_key(family, key)
        entry, why = self.find(kk)
        if entry is not None and self._trusted(entry):
            self._admit(entry)
            return self.store.verified_object_path(entry.object_digest)
        return self._miss(family, key, kk, why)

    def _admit(self, entry: Entry) -> None:
        """KernelRefused when certification refuses `entry` for the call FA4 is running (trust/certified.py)."""
        if self.gate is not None:
            call = fa4.current()
            self.gate.admit(entry.kernel_key, Signature.of(call) if call else None, lambda _key: entry,
                            scopes.of_call(call) if call else None)

    def loaded(self, family: str, key: Any) -> None:
        self.stats.loaded += 1

    def compiled(self, family: str, key: Any) -> None:
        self.stats.compiled += 1

    def _trusted(self, entry: Entry) -> bool:
        """Strict mode raises TrustError for a kernel no trusted manifest lists; fallback treats it as a miss."""
        try:
            self.trust.check(entry)
        except TrustError:
            if self.mode == "strict":
                raise
            return False
        return True

    def _miss(self, family: str, key: Any, kk: str, why: str = "") -> Path | None:
        """Report the miss; strict mode with FA4_AOT_BUILD_WAIT waits for the server's build and returns the
        fetched kernel's object, else raises KernelMissing; fallback mode records it and returns None."""
        call = fa4.current()
        self._refuse_call(call, kk)
        what = call.describe() if call else f"{family} compile key {dumps(canonical(key))[:200]}"
        miss = Miss(kernel_key=kk, family=family, compile_key=canonical(key), sku=self.sku.name,
                    call=call.to_dict() if call else None, args=fa4.current_record())
        wait = build_wait.seconds() if self.mode == "strict" and self.remote is not None else 0.0
        if wait:
            found = self._built(miss, wait)
            if found is not None:
                return found
        elif self.remote is not None:
            self.remote.report_miss(miss)
        if self.mode == "strict":
            server = f" nor on the server ({self.remote_error})" if self.remote else ""
            fix = why or self._other_toolchain() or \
                f"Build it: {narrow_build.for_call(self.sku.name, call.to_dict() if call else None)}"
            raise KernelMissing(
                f"kernel {kk[:16]}… ({family}) for SKU {self.sku.name} is not in {self.store.root}"
                f"{server}; needed by: {what}. {fix}; or use fa4_aot.install(mode=\"fallback\")",
                sku=self.sku.name, family=family, kernel_key=kk, compile_key=dumps(canonical(key)),
            )
        self.stats.misses.append(kk)
        self.store.record_miss(miss)
        return None

    def _other_toolchain(self) -> str:
        """Why the store's kernels for this SKU are not found, when they were built by another toolchain (empty when
        none was): a kernel key names FA4, every installed CuTe DSL distribution and their sources, so a host with
        other versions computes other keys. A store built on a host with more CuTe libraries installed missed every
        kernel of its first certification on an H100 (9,230 misses) with "build it" for the reason."""
        counts, drift = foreign(self.store.entries(), self.tools)
        if not counts.get(self.sku.name):
            return ""
        return (f"the store holds {counts[self.sku.name]} {self.sku.name} kernel(s) built by another toolchain "
                f"({', '.join(drift[:6])} differ{'s' if len(drift) == 1 else ''} from this host's), whose keys this "
                f"host does not compute: install the versions they were built with (`fa4-aot doctor` compares "
                f"them), or build here: `fa4-aot build --sku {self.sku.name}`")

    def _refuse_call(self, call: Call | None, kk: str) -> None:
        """KernelRefused instead of a miss when the known-bad registry names `call` (in both modes: fallback would
        compile and run it): builds refuse such calls (compile/refusals.py), so no server or wait brings it."""
        registry = self.gate.registry if self.gate is not None else None
        bad = registry.find(Signature.of(call).to_dict(), arch=self.sku.arch, versions=self.tools,
                            sku=self.sku.name) if registry is not None and call is not None else None
        if bad is not None and call is not None:
            raise KernelRefused(f"{call.describe()} on SKU {self.sku.name} is refused: {bad.describe()}. No build "
                                "serves it; use another head dim or layout, or a FA4 release that fixes it "
                                f"({ENV}=off, where it is built and here, builds and runs it anyway)",
                                kernel_key=kk, reason=bad.id)

    def _built(self, miss: Miss, wait: float) -> Path | None:
        """The object of `miss`'s kernel once the server's build job for it is done and it is fetched, or None
        (the reason in remote_error): the job failed, FA4 rejected the call, `wait` seconds passed, or (with
        FA4_AOT_CERTIFIED=require) the kernel did not pass certification on this device within them."""
        assert self.remote is not None
        end = time.monotonic() + wait
        _job, problem = build_wait.wait(self.remote, miss, wait)
        if not problem:
            entry, why = self.find(miss.kernel_key)
            if entry is not None and self._trusted(entry) and not (problem := self._certified(entry, end)):
                self._admit(entry)
                return self.store.verified_object_path(entry.object_digest)
            problem = problem or why or \
                f"its build job is done, but {self.remote_error or 'the kernel could not be fetched'}"
        self.remote_error = problem
        return None

    def _certified(self, entry: Entry, end: float) -> str:
        """With FA4_AOT_CERTIFIED=require, wait (until time.monotonic() reaches `end`) for the certification of the
        built kernel `entry` on this device, its verdicts kept in the store: '' once it passed (or when the policy
        does not require it), else why not (remote/wait.py)."""
        gate = self.gate
        if gate is None or gate.policy != "require" or gate.device is None or self.remote is None:
            return ""
        kernel = kernel_keys.build_key(entry)  # the key its verdicts are kept under
        return build_wait.certified(self.remote, self.store, [kernel], gate.device.id, end)


_installed: Installation | None = None


def installed() -> Installation | None:
    return _installed


def install(mode: str = "strict", *, cache_dir: Path | None = None, variants_file: Path | None = None) -> Installation:
    """Serve FA4's kernels from the store for this process's GPU. Idempotent for the same mode and store.
    With FA4_AOT_SKU=NAME it needs no GPU: on a host without CUDA it points FA4 at that SKU (as a build
    worker does), so prepare() can plan and check the store there.

    Raises UnknownSku when the device matches no SKU (the message lists them and how to add one).
    """
    global _installed
    if mode not in MODES:
        raise ValueError(f"invalid mode {mode!r}: expected one of {', '.join(MODES)}")
    from ..matrix import variants

    store = Store(cache_dir or config.default_cache_dir())
    if _installed and _installed.mode == mode and _installed.store.root == store.root:
        return _installed
    matrix = variants.load(variants_file or config.default_variants_file())
    here = devices.this_device(matrix.skus)
    sku, constants = here.sku, here.constants
    if here.device_class is None:  # a CPU host checking a SKU's store: FA4 plans for the SKU, as a build worker does
        fa4.configure(sku)
    remote = _remote_from_env()
    trust = Trust.from_env(sku, store, remote)
    gate = Gate(store, sku.name, here.device_class, trust)
    installation = Installation(sku=sku, store=store, mode=mode, trace=list(here.trace), remote=remote, trust=trust,
                                tools=fa4.toolchain(), constants=constants, gate=gate)
    fa4.capture()
    fa4.check_calls(gate.check_call if gate.policy != "off" else None)  # scoped refusals, judged per call
    fa4.install_store_caches(installation)
    _installed = installation
    return installation


def has_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _remote_from_env() -> Remote | None:
    if config.server_url() is None:
        return None
    from ..remote.http import server_from_env

    return server_from_env()
