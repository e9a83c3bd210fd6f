"""`fa4-aot certifier --server URL`: the GPU-host process that certifies what builders publish.

The server keeps one certify job per published kernel (service/crud/certify.py). A certifier on a GPU of a SKU
claims the oldest job of that SKU with a lease, renews the lease on a thread while it works, pulls the job's
kernels (with their libraries) and the SKU's recipe files into its own store under the client's trust policy,
runs the certification (fa4_aot.certify.driver) and finishes the job with its verdicts. Only its token, with the
claim id of its claim, can renew or finish the job. A certifier killed mid-job (perhaps by the kernel itself)
loses nothing: once its lease runs out the next claim takes the job over, and after 3 claims that died the server
ends the job failed with verdict `crash`. Stopped (SIGINT, SIGTERM), it releases the job it holds: queued again,
the attempt not counted. A malformed answer of the server is logged and the claim tried again, never a crash.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..config import host_arch
from ..domain import kernel_keys
from ..domain.skus import Sku
from ..domain.verdicts import DeviceClass, Verdict
from ..errors import Fa4AotError, RemoteError, TrustError
from ..remote import lean_files
from ..remote.certify_jobs import CertifyJob
from ..remote.http import Remote
from ..remote.leases import JobRunner
from ..store import Store
from ..trust.policy import Trust

log = logging.getLogger("fa4_aot.certify.certifier")
MAX_DETAIL = 8000  # characters of a job's detail sent to the server (it accepts 16 KiB)
SETTLE = 30.0  # seconds a job's kernels, recipe files and signatures may take to reach the server after its claim


class Certification(Protocol):
    """What a certifier runs for a job: `ready` says what is still missing from `store` to certify `keys` ('' when
    nothing), the call runs the checks on this GPU and returns the verdicts."""

    def ready(self, store: Store, sku: Sku, keys: list[str]) -> str: ...

    def __call__(self, store: Store, sku: Sku, keys: list[str]) -> list[Verdict]: ...


class OnGpu:
    """The certification of `fa4-aot certify` (certify/driver.py) over the signatures whose recipe regions launch
    the keys."""

    def ready(self, store: Store, sku: Sku, keys: list[str]) -> str:
        from .plan import signatures_in

        if signatures_in(store, sku, set(keys)):
            return ""
        return (f"no recipe file of {sku.name} names kernel {keys[0][:16]}…, so no check can be drawn for it: "
                "publish the build's recipe files with its kernels (`fa4-aot push`, as builders do)")

    def __call__(self, store: Store, sku: Sku, keys: list[str]) -> list[Verdict]:
        from . import driver

        driver.certify(store, sku, keys=set(keys))
        # the driver keeps every verdict in the store, those of an earlier run that it skipped too
        return [v for key in keys for v in store.verdicts(key)]


@dataclass
class Outcome:
    status: str  # "done", "failed" or "released"
    verdicts: list[Verdict] = field(default_factory=list)
    detail: str = ""
    seconds: float = 0.0

    def to_dict(self, certifier: str) -> dict[str, Any]:
        return {"certifier": certifier, "status": self.status, "verdicts": [v.to_dict() for v in self.verdicts],
                "detail": self.detail[:MAX_DETAIL], "seconds": round(self.seconds, 3)}


class Certifier(JobRunner):
    """Claims, runs and finishes the certify jobs of one server and SKU until stopped. `remote_factory` makes a
    fresh Remote (a Remote gives up on a server for good after it fails once; a certifier outlives restarts)."""

    def __init__(self, remote_factory: Callable[[], Remote], store: Store, sku: Sku, device: DeviceClass, name: str,
                 lease: float = 120.0, poll: float = 2.0, certification: Certification | None = None,
                 settle: float = SETTLE) -> None:
        self.remote_factory, self.store, self.sku, self.device = remote_factory, store, sku, device
        self.name, self.lease, self.poll, self.settle = name, lease, poll, settle
        self.certification = certification or OnGpu()
        self.remote = remote_factory()
        self.done = 0  # jobs this process finished

    def run_one(self) -> bool:
        """Claim and run one job; False when none was queued."""
        job = self.remote.claim_certify(self.name, self.sku.name, self.device.id, self.lease)
        if job is None:
            return False
        log.info("job %s: %s %s of %s (attempt %s)", job.id, job.family, job.kernel_key[:16], job.sku, job.attempts)
        with self.leased(job.id, lambda remote: remote.renew_certify(job, self.name, self.lease)) as lost:
            try:
                outcome = self.certify(job)
            except KeyboardInterrupt:  # stopped: give the job back at once rather than when its lease runs out
                self._finish(job, Outcome("released", detail="the certifier was stopped"))
                raise
        if lost.is_set():
            log.warning("job %s: its lease was lost to another certifier; this result is dropped", job.id)
        else:
            self._finish(job, outcome)
        self.done += 1
        return True

    def _finish(self, job: CertifyJob, outcome: Outcome) -> None:
        try:
            if self.remote.finish_certify(job, outcome.to_dict(self.name)):
                log.info("job %s: %s %s", job.id, outcome.status, (outcome.detail or _verdicts(outcome))[:300])
            else:
                log.warning("job %s: the server says its claim is no longer this certifier's; result dropped", job.id)
        except Fa4AotError as e:  # its lease runs out and the next claim takes it over
            log.warning("job %s: could not tell the server how it ended (%s): %s", job.id, outcome.status, e)

    def certify(self, job: CertifyJob) -> Outcome:
        """Fetch what the job needs and run its certification; never raises for the job's sake (KeyboardInterrupt
        aside): a failure is an Outcome `failed` with why, which the server queues again while attempts remain."""
        start = time.monotonic()
        try:
            self.fetch(job)
            verdicts = self.certification(self.store, self.sku, list(job.keys))
        except Exception as e:  # one job's failure (fetch, trust, the runner) must not stop the certifier
            log.exception("job %s failed", job.id)
            return Outcome("failed", detail=f"{type(e).__name__}: {e}", seconds=time.monotonic() - start)
        mine = [v for v in verdicts if v.kernel_key in job.keys and v.device == self.device.id]
        if not mine:
            return Outcome("failed", detail=f"the certification gave no verdict for kernel {job.kernel_key} on "
                                            f"{self.device} (no check reached it)", seconds=time.monotonic() - start)
        return Outcome("done", mine, seconds=time.monotonic() - start)

    def fetch(self, job: CertifyJob) -> None:
        """Make the store hold the job's kernels, their libraries and the SKU's recipe files, trying again for
        `settle` seconds while something is missing (a builder publishes kernels, then recipes, then its signed
        manifest); Fa4AotError naming what is still missing after that."""
        end = time.monotonic() + self.settle
        while True:
            problem = self._fetch_once(job)
            if not problem:
                return
            if time.monotonic() > end:
                raise Fa4AotError(f"certify job {job.id}: {problem}")
            log.info("job %s: %s; trying again", job.id, problem)
            time.sleep(min(2.0, max(0.1, self.settle / 10)))

    def _fetch_once(self, job: CertifyJob) -> str:
        trust = Trust.from_env(self.sku, self.store, self.remote)  # fresh: a manifest may have been signed since
        refusal = trust.refuse_remote()
        if refusal:
            return refusal
        try:
            for key in job.keys:
                self._fetch_kernel(key, trust)
        except (TrustError, RemoteError) as e:
            return str(e)
        failures: list[str] = []
        lean_files.pull_recipes(self.store, self.remote, self.sku.name, trust, failures)
        for failure in failures[:3]:  # another signature's file: not this job's concern unless it lacks its own
            log.warning("job %s: %s", job.id, failure)
        return self.certification.ready(self.store, self.sku, list(job.keys))

    def _fetch_kernel(self, key: str, trust: Trust) -> None:
        """Fetch kernel `key` with this host's library, and the base-key signpost a region names it by."""
        arches = lean_files.trusted_arches(trust)
        entry = self.store.get_entry(key)
        if entry is None or not self.store.has_library(entry, host_arch()):
            entry = self.remote.fetch_kernel(key, self.store, accept=trust.check, arches=arches)
            if entry is None:
                raise RemoteError(f"{self.remote.url} has no kernel {key} (published, then removed?)")
        base = kernel_keys.entry_keys(entry)[0]
        if base != key and not self.store.has_entry(base):
            self.remote.fetch_kernel(base, self.store, accept=trust.check, arches=arches)

def _verdicts(outcome: Outcome) -> str:
    return ", ".join(f"{v.kernel_key[:16]}… {v.describe()}" for v in outcome.verdicts)
