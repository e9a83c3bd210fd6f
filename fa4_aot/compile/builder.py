"""`fa4-aot builder --server URL`: the process that turns clients' misses into published kernels.

The server keeps the build jobs (service/crud/builds.py: one per SKU and missed key, however many clients miss
it, persisted in its database); a builder claims the oldest with a lease, renews the lease while it works, and
on its end tells the server how it went. A builder killed mid-job loses nothing: its lease runs out and the next
claim (its restart, or another builder) takes the job over. A job is `build --from-misses` of its one miss
(rebuild.build_misses) on the builder's executor (a local pool kept warm between jobs, or Ray), then published
exactly as `push` does (objects, libraries, recipe files), with a manifest signed by the builder's key when one
is given. A call FA4 rejects, or the known-bad registry refuses (refusals.py), ends "rejected" with the reason,
which the server answers every later report with; it is not built again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..domain import kernel_keys
from ..domain.misses import BuildJob
from ..errors import Fa4AotError, RemoteError
from ..matrix.variants import Matrix
from ..remote.http import Remote
from ..remote.leases import JobRunner
from ..remote.push_pull import push
from ..store import Store
from ..trust import signing, signing_keys
from .executors import Executor
from .orchestrator import Report
from .rebuild import build_misses

log = logging.getLogger("fa4_aot.compile.builder")
MAX_DETAIL = 8000  # characters of a job's detail sent to the server (it accepts 16 KiB)
FINISH_TRIES = 5  # sends of one job's result (after a server error, a refused done)


@dataclass
class Outcome:
    status: str  # "done", "failed" or "rejected"
    detail: str
    compile_seconds: float = 0.0
    built: int = 0

    def to_dict(self, builder: str) -> dict[str, Any]:
        # NUL and lone surrogates cannot be stored (PostgreSQL): the server refuses a detail with them (422), and an
        # error text from FA4 or the OS may carry them
        detail = self.detail.replace("\x00", "\\x00").encode("utf-8", "replace").decode()[:MAX_DETAIL]
        return {"builder": builder, "status": self.status, "detail": detail,
                "compile_seconds": round(self.compile_seconds, 3), "built": self.built}


def outcome_of(reports: list[Report], sku: str) -> Outcome:
    """Pure: how a job ended, from its build reports. FA4 or the known-bad registry refusing the call wins
    (rejected, with the reason: FA4's error, or the registry entry's id, symptom and source; no build serves
    it), then any failure (failed), else done."""
    if not reports:
        return Outcome("failed", f"this builder's variants file has no SKU {sku!r}; start the builder with the "
                                 "server's variants file (--variants)")
    report = reports[0]
    seconds = sum(r.seconds for r in report.results if r.status == "built")
    built = report.count("built")
    refused = report.refused + report.call_failures
    if refused:
        return Outcome("rejected", "; ".join(dict.fromkeys(f.error for f in refused)), seconds, built)
    failed = [f"{r.family} {r.kernel_key[:16]}: {r.error}" for r in report.results if r.status == "failed"]
    if failed:
        return Outcome("failed", "; ".join(failed), seconds, built)
    return Outcome("done", f"{built} kernel(s) built, {report.count('present')} present, {report.recipes} recipe "
                           "region(s) recorded", seconds, built)


def published_keys(report: Report, store: Store) -> set[str]:
    """Every key the job's kernels are held under (full keys and base-key signposts): what it publishes."""
    keys: set[str] = set()
    for r in report.results:
        entry = store.get_entry(r.kernel_key) if r.status in ("built", "present") else None
        if entry is not None:
            keys.update(kernel_keys.entry_keys(entry))
    return keys


class Builder(JobRunner):
    """Claims, runs and publishes jobs of one server until stopped. `remote_factory` makes a fresh Remote (a
    Remote gives up on a server for good after it fails once; a builder outlives server restarts)."""

    def __init__(self, remote_factory: Callable[[], Remote], matrix: Matrix, store: Store, executor: Executor,
                 name: str, lease: float = 60.0, poll: float = 1.0, signing_key: Path | None = None) -> None:
        self.remote_factory, self.matrix, self.store, self.executor = remote_factory, matrix, store, executor
        self.name, self.lease, self.poll, self.signing_key = name, lease, poll, signing_key
        self.remote = remote_factory()
        self.done = 0  # jobs this process finished

    def run_one(self) -> bool:
        """Claim a job of the SKUs this builder's variants hold and run it; False when none was queued."""
        job = self.remote.claim_build(self.name, self.lease, sorted(self.matrix.skus))
        if job is None:
            return False
        log.info("job %s: %s %s for %s (attempt %s)", job.id, job.family, job.kernel_key[:16], job.sku,
                 job.attempts)
        with self.leased(job.id, lambda remote: remote.renew_build(job, self.name, self.lease)) as lost:
            outcome = self.build(job)
            if not lost.is_set():
                self.report(job, outcome, lost)
        if lost.is_set():
            log.warning("job %s: lease lost to another builder; its result is dropped", job.id)
        self.done += 1
        return True

    def report(self, job: BuildJob, outcome: Outcome, lost: threading.Event) -> None:
        """Send `outcome` while the claim holds, again after a server error (its database busy or out of space
        answers 503), so a job is not left running until its lease lapses. A done the server refuses
        (what the job asked for is not published) is sent as failed, with the server's reason: queued again."""
        for attempt in range(FINISH_TRIES):
            try:
                status, why = self.remote.finish_build(job, outcome.to_dict(self.name))
            except Fa4AotError as e:
                wait = self.backoff(attempt)
                log.warning("job %s: could not send its result (%s); again in %.1f s", job.id, e, wait)
                if lost.wait(wait):
                    return
                self.remote.close()
                self.remote = self.remote_factory()
                continue
            if status == 409:
                lost.set()
            elif status == 422 and outcome.status != "failed":
                outcome = Outcome("failed", f"the server refused the result {outcome.status}: {why}",
                                  outcome.compile_seconds, outcome.built)
                continue
            if status == 200:
                log.info("job %s: %s (%s)", job.id, outcome.status, outcome.detail[:300])
            return
        log.error("job %s: its result was not recorded after %d tries; its lease lapses and it is built again",
                  job.id, FINISH_TRIES)

    def build(self, job: BuildJob) -> Outcome:
        """Build the job's miss into the builder's store and publish it; never raises for the build's sake."""
        try:
            reports = build_misses(self.matrix, self.store, [job.miss], executor=self.executor)
            if any(r.interrupted for r in reports):  # stopped: the job stays leased, the next claim takes it
                raise KeyboardInterrupt
            outcome = outcome_of(reports, job.sku)
            if outcome.status == "done":
                self.publish(reports[0])
        except Exception as e:  # one job's failure (FA4, the store, the push) must not stop the builder
            log.exception("job %s failed", job.id)
            return Outcome("failed", f"{type(e).__name__}: {e}")
        return outcome

    def publish(self, report: Report) -> None:
        """Push the job's kernels (objects, libraries), the SKU's recipe files, and a signed manifest of the
        builder's store when it has a key; BuildError-like Fa4AotError when any of it fails."""
        result = push(self.store, self.remote, report.sku, keys=published_keys(report, self.store))
        if result.failures:
            raise RemoteError(f"publishing to {self.remote.url} failed: {'; '.join(result.failures[:3])}")
        if self.signing_key is not None:
            sku = self.matrix.sku(report.sku)
            key = signing_keys.load_private(self.signing_key)
            envelope = signing.sign(signing.manifest_of(self.store, sku), key, self.signing_key.stem)
            self.remote.push_manifest(sku.name, envelope)


def wait_for_server(remote: Remote, deadline: float) -> None:
    """Block until `remote` answers (a builder started with its server), at most `deadline` seconds."""
    end = time.monotonic() + deadline
    while True:
        try:
            remote.skus()
            return
        except Fa4AotError:
            if time.monotonic() > end:
                raise
            time.sleep(1.0)
