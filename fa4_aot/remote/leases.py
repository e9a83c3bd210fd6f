"""What a process that runs a server's jobs shares, whatever the job (compile/builder.py's Builder builds clients'
misses, certify/certifier.py's Certifier certifies published kernels): the loop that claims jobs until stopped,
a new Remote after the server could not be reached, and the job's lease renewed on a thread while it runs."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ..errors import Fa4AotError
from .http import Remote

log = logging.getLogger("fa4_aot.remote.leases")


class JobRunner:
    """Subclasses set remote_factory, remote, lease and poll, and define run_one."""

    remote_factory: Callable[[], Remote]
    remote: Remote
    lease: float  # seconds a claim holds a job; renewed every third of it
    poll: float  # seconds to wait when no job is queued, or after the server failed
    done: int  # jobs this process finished
    max_backoff: float = 60.0  # seconds: the longest wait after the server failed several times in a row

    def run_one(self) -> bool:
        """Claim and run one job; False when none was queued."""
        raise NotImplementedError

    def run(self, stop: threading.Event, max_jobs: int | None = None) -> None:
        """Run jobs until `stop` is set (or `max_jobs` are finished); waits `poll` seconds when none is queued,
        and after the server could not be reached or answered something malformed (a claim that is not a job:
        logged) twice as long each time in a row, at most `max_backoff`."""
        failures = 0
        while not stop.is_set() and (max_jobs is None or self.done < max_jobs):
            try:
                ran, failures = self.run_one(), 0
            except Fa4AotError as e:
                wait = self.backoff(failures)
                failures += 1
                log.warning("server %s: %s; retrying in %.1f s", self.remote.url, e, wait)
                self.remote.close()
                self.remote = self.remote_factory()
                stop.wait(wait)
                continue
            if not ran:
                stop.wait(self.poll)

    def backoff(self, failures: int) -> float:
        """Pure: seconds to wait after `failures` + 1 failures in a row: `poll`, doubling, at most `max_backoff`."""
        return float(min(self.poll * 2 ** min(failures, 30), self.max_backoff))

    @contextmanager
    def leased(self, job_id: int, renew: Callable[[Remote], bool]) -> Iterator[threading.Event]:
        """Within the block, `renew(remote)` every third of the lease on a thread (True: still this process's
        claim); the event it yields is set once the claim was lost to another runner, whose result then counts."""
        lost, done = threading.Event(), threading.Event()
        renewer = threading.Thread(target=self._renew, args=(job_id, renew, done, lost), daemon=True)
        renewer.start()
        try:
            yield lost
        finally:
            done.set()
            renewer.join()

    def _renew(self, job_id: int, renew: Callable[[Remote], bool], stop: threading.Event,
               lost: threading.Event) -> None:
        """Renew until `stop`, on a Remote of its own (made again after a failure: a Remote gives up on its server
        for good); set `lost` when the claim is no longer this runner's."""
        leases = self.remote_factory()
        try:
            while not stop.wait(self.lease / 3):
                try:
                    if not renew(leases):
                        lost.set()
                        return
                except Fa4AotError as e:  # the server is away: the next renewal may still come in time
                    log.warning("job %s: could not renew its lease: %s", job_id, e)
                    leases.close()
                    leases = self.remote_factory()
        finally:
            leases.close()
