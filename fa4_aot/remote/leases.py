"""What a process that runs a server's jobs shares, whatever the job (build/builder.py's Builder builds clients'
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

    def run_one(self) -> bool:
        """Claim and run one job; False when none was queued."""
        raise NotImplementedError

    def run(self, stop: threading.Event, max_jobs: int | None = None) -> None:
        """Run jobs until `stop` is set (or `max_jobs` are finished); waits `poll` seconds when none is queued,
        and as long again after the server could not be reached or answered something malformed."""
        while not stop.is_set() and (max_jobs is None or self.done < max_jobs):
            try:
                ran = self.run_one()
            except Fa4AotError as e:
                log.warning("server %s: %s; retrying in %.0f s", self.remote.url, e, self.poll)
                self.remote.close()
                self.remote = self.remote_factory()
                ran = False
            if not ran:
                stop.wait(self.poll)

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
