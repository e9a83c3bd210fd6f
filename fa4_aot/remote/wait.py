"""Strict clients wait for an on-demand build instead of failing (FA4_AOT_BUILD_WAIT=SECONDS, off by default).

A strict miss (either runtime) is reported to the server, which answers with the build job that builds it (one
per SKU and key, however many clients miss it; `fa4-aot builder` runs it on the build hosts' CPUs); the client
polls the job with backoff within the deadline, then fetches and verifies what it published as any fetch does.
The GPU host never compiles. wait() says why it could not help instead of raising, so each runtime raises its
own KernelMissing with that reason: the job's id on a timeout, FA4's own reason for a call FA4 rejects.

With FA4_AOT_CERTIFIED=require the client also waits, within the same deadline, for the certification of what
was built (certified(): the certify job a published kernel gets, run by `fa4-aot certifier` on a GPU of the SKU),
keeps the verdicts in its store, and takes the kernel only with a pass verdict for its own device class.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from ..errors import ConfigError, Fa4AotError, RemoteError
from .deadline import capped

if TYPE_CHECKING:  # httpx (through remote) is imported only when a server is configured
    from ..domain.misses import BuildJob, Miss
    from ..domain.verdicts import Verdict
    from ..store import Store
    from .certify_jobs import CertifyJob
    from .http import Remote

FIRST_POLL, MAX_POLL = 0.25, 2.0  # seconds between polls: from the first, growing 1.5x up to the most
LAST_LOOK = 0.5  # seconds of the deadline left to the last poll (the request needs time to be answered)


def seconds() -> float:
    """$FA4_AOT_BUILD_WAIT: the most seconds a strict miss waits for its build; 0 (the default): do not wait.
    Read at call time; ConfigError for a value that is not a number of seconds."""
    value = os.environ.get("FA4_AOT_BUILD_WAIT", "").strip()
    try:
        wait = float(value) if value else 0.0
    except ValueError:
        raise ConfigError(f"invalid FA4_AOT_BUILD_WAIT={value!r}: expected seconds, e.g. 60 (0 or unset: a "
                          "strict miss raises at once)") from None
    if wait < 0 or wait != wait:
        raise ConfigError(f"invalid FA4_AOT_BUILD_WAIT={value!r}: expected seconds >= 0")
    return wait


def wait(remote: Remote, miss: Miss, deadline_s: float) -> tuple[BuildJob | None, str]:
    """Report `miss` and wait until its job is done or `deadline_s` seconds have passed. Returns (the done job, '')
    or (the job or None, why the wait did not help); never raises for the server, and ends by the deadline however
    slow the server is: each request gets at most what is left of it."""
    end = time.monotonic() + deadline_s
    with capped(end):
        try:
            job, why = remote.request_build(miss)
        except Fa4AotError as e:
            return None, f"the server refused the miss report: {e}"
        if job is None:
            return None, f"the server queued no build for it: {why or 'no reason given'}"
        try:
            job = _poll(remote, job, end)
        except Fa4AotError as e:
            return job, f"build job {job.id} could not be followed: {e}"
    return job, _problem(job, deadline_s)


def _poll(remote: Remote, job: BuildJob, end: float) -> BuildJob:
    """Poll `job` until it ends or `end`; its last look starts while some of the deadline is left (LAST_LOOK)."""
    pause = FIRST_POLL
    while not job.ended and end - time.monotonic() > LAST_LOOK:
        time.sleep(max(0.0, min(pause, end - time.monotonic() - LAST_LOOK)))
        polled = remote.build(job.id)
        if polled.id != job.id:
            raise RemoteError(f"the server answered build job {polled.id} when asked for job {job.id}")
        job, pause = polled, min(MAX_POLL, pause * 1.5)
    return job


def _problem(job: BuildJob, deadline_s: float) -> str:
    if job.status == "done":
        return ""
    if job.status == "rejected":
        return f"FA4 rejects this call (build job {job.id}): {job.detail}"
    if job.status == "failed":
        return f"build job {job.id} failed: {job.detail}"
    return (f"build job {job.id} was still {job.status} after FA4_AOT_BUILD_WAIT={deadline_s:g} s (is a "
            "builder running? `fa4-aot builds` lists the queue); raise FA4_AOT_BUILD_WAIT or retry later")


def certified(remote: Remote, store: Store, keys: list[str], device: str, end: float) -> str:
    """Wait, until time.monotonic() reaches `end`, for the certify job of each of `keys` (kernels the store holds)
    to end, and keep the verdicts it recorded in `store`. Returns '' when each key has a pass verdict for device
    class `device`, else why not (the verdict and its source, or the job's state); never raises for the server,
    and each request gets at most what is left until `end`."""
    with capped(end):
        for key in keys:
            problem = _certified(remote, store, key, device, end)
            if problem:
                return problem
    return ""


def _certified(remote: Remote, store: Store, key: str, device: str, end: float) -> str:
    if any(v.device == device and v.passed for v in store.verdicts(key)):
        return ""
    try:
        jobs = remote.certify_jobs(kernel_key=key, limit=1)
        if not jobs:  # published before certify jobs (or certified by hand): the server's verdicts may say
            return _judged(store, key, device, remote.verdicts(kernel_key=key, device=device), "")
        job = _poll_certify(remote, jobs[0], end)
    except Fa4AotError as e:
        return f"the certification of kernel {key[:16]}… could not be followed: {e}"
    if not job.ended:
        return (f"{job.describe()}, still {job.status} when FA4_AOT_BUILD_WAIT ran out (is `fa4-aot certifier` "
                "running on a GPU of the SKU? `GET /v1/certify-jobs` lists the queue); raise FA4_AOT_BUILD_WAIT or "
                "retry later")
    return _judged(store, key, device, list(job.verdicts), f" (certify job {job.id}: {job.detail})")


def _poll_certify(remote: Remote, job: CertifyJob, end: float) -> CertifyJob:
    pause = FIRST_POLL
    while not job.ended and end - time.monotonic() > LAST_LOOK:
        time.sleep(max(0.0, min(pause, end - time.monotonic() - LAST_LOOK)))
        job = remote.certify_job(job.id)
        pause = min(MAX_POLL, pause * 1.5)
    return job


def _judged(store: Store, key: str, device: str, verdicts: list[Verdict], source: str) -> str:
    """Keep `verdicts` of `key` in `store`; '' when the one for `device` passed, else why not."""
    mine = [v for v in verdicts if v.kernel_key == key and v.device == device]
    try:
        store.put_verdicts(mine)  # what the runtime's certification gate reads (trust/certified.py)
    except (OSError, Fa4AotError) as e:
        return f"the verdicts of kernel {key[:16]}… could not be kept in {store.root}: {e}"
    if not mine:
        elsewhere = ", ".join(sorted({v.device for v in verdicts})) or "no device class"
        return (f"kernel {key[:16]}… has no certification for this device class ({device}; it has verdicts for "
                f"{elsewhere}){source}, and FA4_AOT_CERTIFIED=require: run `fa4-aot certifier` on a GPU like this "
                "one (same GPU, driver and CUDA)")
    verdict = mine[-1]
    if verdict.passed:
        return ""
    return f"kernel {key[:16]}… failed certification on {device}: {verdict.describe()}{source}"
