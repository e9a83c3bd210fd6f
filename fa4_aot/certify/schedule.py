"""Which waiting check a free certification worker runs next (pool.py's hand-out). Pure: no process, no GPU.

Two rules decide it.
- **Affinity.** Checks are grouped by a key (the pool's: the signature). A worker takes its own group's checks
  while the group has any; then it claims the next group nobody holds; once every group is held, it takes the
  last check of the group with the most left. So a signature's kernels are loaded by one worker, not by each of
  them, and under FA4's JIT (the oracle) compiled once, not once per worker.
- **Memory.** Each check is granted GPU memory: GRANT_FACTOR times its estimated peak plus GRANT_FLOOR, at most
  the GPU's capacity (all of it where one worker has the GPU to itself). The worker caps its allocator at the
  grant (checker.py). A check is handed out only while the grants running on its GPU leave room for it, or when
  nothing runs there. A check that does not fit reserves its grant: no other check is handed out on that GPU
  past the room the reservation leaves, so small checks cannot starve a large one.

Why grants and not an even share of the GPU per worker: the default h100-sxm build's certification at -j 16
gave each worker 4.4 GiB, and 375 checks ran out of memory at that share while 50 to 65 GiB of the GPU stood
free; each of them then ran again alone at the end of the run.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from .plan import Check

GRANT_FACTOR = 4  # the estimate's error: the H100 run's out-of-memory checks had asked for 0.9x to 3.6x their
# estimate (plan.peak_bytes) when they ran out, a lower bound of their need
GRANT_FLOOR = 1 << 30  # what no estimate counts: cuBLAS workspaces, FA4's small buffers, the allocator's rounding

Job = tuple[str, Check]


def grant(estimate: int, capacity: int) -> int:
    """The GPU memory a check estimated to peak at `estimate` bytes may hold, on a GPU whose workers share
    `capacity` bytes."""
    return min(capacity, GRANT_FACTOR * max(0, estimate) + GRANT_FLOOR)


@dataclass
class Schedule:
    """The checks still to hand out and the memory granted on each GPU (see the module). `capacity`: bytes the
    workers of each GPU share; `alone`: one worker per GPU, granted the whole capacity."""

    jobs: list[Job]
    key: Callable[[Check], Hashable]
    estimate: Callable[[Check], int]
    capacity: dict[int, int]
    alone: bool = False
    used: dict[int, int] = field(default_factory=dict)  # bytes granted to the checks running, by GPU
    reserved: dict[int, tuple[int, int]] = field(default_factory=dict)  # GPU: (slot, grant) of a check waiting

    def __post_init__(self) -> None:
        self._groups: dict[Hashable, deque[Job]] = {}
        for job in self.jobs:
            self._groups.setdefault(self.key(job[1]), deque()).append(job)
        self._unclaimed = deque(self._groups)
        self._held: dict[int, Hashable] = {}  # slot: the group it works through
        self._left = len(self.jobs)

    def __len__(self) -> int:
        return self._left

    def take(self, slot: int, gpu: int, skip: Callable[[Check], bool] = lambda _c: False
             ) -> tuple[str, Check, int] | None:
        """(id, check, grant) for the free worker `slot` on `gpu`, its grant counted as used; None when nothing is
        left for it or its next check waits for memory. Checks `skip` passes over are dropped here, at their turn."""
        if self.reserved.get(gpu, (slot,))[0] == slot:
            self.reserved.pop(gpu, None)  # this slot's own reservation: decided anew below
        while (group := self._next_group(slot)) is not None:
            ident, check = job = self._peek(slot, group)
            if skip(check):
                self._remove(group, job)
                continue
            need = self._grant(check, gpu)
            if not self._fits(gpu, need):
                if gpu not in self.reserved:
                    self.reserved[gpu] = (slot, need)
                return None
            self._remove(group, job)
            self.used[gpu] = self.used.get(gpu, 0) + need
            return ident, check, need
        return None

    def release(self, gpu: int, granted: int) -> None:
        """A check that held `granted` bytes on `gpu` ended."""
        self.used[gpu] = max(0, self.used.get(gpu, 0) - granted)

    def again(self, slot: int, job: Job, gpu: int, granted: int) -> None:
        """A check handed out that its worker never took (it died first): first in `slot`'s group again."""
        self.release(gpu, granted)
        group = self.key(job[1])
        if group not in self._groups:
            self._groups[group] = deque()
            self._unclaimed.appendleft(group)
        self._groups[group].appendleft(job)
        self._left += 1

    def _grant(self, check: Check, gpu: int) -> int:
        room = self.capacity[gpu]
        return room if self.alone else grant(self.estimate(check), room)

    def _fits(self, gpu: int, need: int) -> bool:
        used = self.used.get(gpu, 0)
        waiting = self.reserved.get(gpu, (None, 0))[1]
        return used == 0 or used + need + waiting <= self.capacity[gpu]

    def _next_group(self, slot: int) -> Hashable | None:
        """The group `slot` takes from: its own while it has checks, else the next unheld one it claims, else the
        group with the most checks left (None: nothing is left)."""
        own = self._held.get(slot)
        if own in self._groups:
            return own
        while self._unclaimed:
            group = self._unclaimed.popleft()
            if group in self._groups:
                self._held[slot] = group
                return group
        return max(self._groups, key=lambda g: len(self._groups[g]), default=None)

    def _peek(self, slot: int, group: Hashable) -> Job:
        """The group's next check for `slot`: its first for the slot that holds it, its last for one helping out."""
        checks = self._groups[group]
        return checks[0] if self._held.get(slot) == group else checks[-1]

    def _remove(self, group: Hashable, job: Job) -> None:
        self._left -= 1
        checks = self._groups[group]
        if checks[0] is job:
            checks.popleft()
        else:
            checks.pop()
        if not checks:
            del self._groups[group]
