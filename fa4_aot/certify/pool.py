"""Worker processes for certification: `jobs` per GPU, each check under a deadline, a lost worker replaced.

A check that crashes its worker (a CUDA error poisons the process's context), kills it (a signal, an abort inside
the driver) or outlives its deadline (a hang: the worker's process group is killed) costs one outcome and a new
worker, never the run. Each outcome names the part (fwd or bwd) that was running, from the part lines the worker
prints before each part (checker.py). A worker that ran out of GPU memory and lost its context says so with an
error answer marked "restart": it is replaced as after a crash, and the outcome stays an error (no verdict).
Which check a free worker takes, and the GPU memory it may hold, is schedule.py's: a signature's checks stay with
one worker, and each check is granted memory after its estimated peak.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from . import plan
from .plan import Check
from .schedule import Schedule

STARTUP_SECONDS = 300.0  # importing torch and FA4 and the first kernels' loads, on a loaded host (a worker's
# first check gets this much more time than its deadline)
ORACLE = "FA4_AOT_CERTIFY_ORACLE"  # "jit": the worker checks FA4's own JIT, not the store's kernels
GPU_SHARED = 0.9  # of a GPU's memory, shared by its workers' PyTorch allocators (FA4's buffers are allocated
# through PyTorch too); the rest is for what no allocator sees: each worker's CUDA context (~0.5 GiB: 8 GiB, 6% of
# an H200's 141 GiB, at -j 16), the kernels' modules and the driver. An H200 worker's share is 127 GiB at -j 1,
# 7.9 GiB at -j 16: plan.MAX_BYTES (a check's estimated peak) keeps planned checks within the latter.


def memory_fraction(jobs: int) -> float:
    """The fraction of its GPU's memory that one of `jobs` workers on it may hold (GPU_SHARED split evenly): a
    worker's cap until its first check brings a grant (schedule.py)."""
    return GPU_SHARED / max(1, jobs)


def gpu_capacity(gpu: int) -> int:
    """Bytes the workers of `gpu` may hold in all: GPU_SHARED of its memory."""
    import torch

    return int(torch.cuda.get_device_properties(gpu).total_memory * GPU_SHARED)


@dataclass
class Outcome:
    """How one check went: the worker's answer, or what the pool saw (crash, hang)."""

    ident: str
    check: Check
    status: str  # pass, wrong, crash, hang, error
    part: str = "fwd"  # the part running when it failed
    failures: list[dict[str, Any]] = field(default_factory=list)
    detail: str = ""
    seconds: float = 0.0
    marginal: list[dict[str, Any]] = field(default_factory=list)  # misses that did not reproduce (reproduce.py)
    steps: dict[str, float] = field(default_factory=dict)  # the worker's seconds by step (checker.Clock)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.ident, "check": self.check.to_dict(), "status": self.status, "part": self.part,
                "failures": self.failures, "detail": self.detail, "seconds": round(self.seconds, 3),
                "marginal": self.marginal, "steps": self.steps}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Outcome:
        return cls(data["id"], Check.from_dict(data["check"]), data["status"], data["part"], data["failures"],
                   data["detail"], data["seconds"], data.get("marginal", []), data.get("steps", {}))


class _Worker:
    """One worker process on one GPU, with a thread reading its answers into the pool's queue."""

    def __init__(self, slot: int, gpu: int, env: dict[str, str], answers: queue.Queue[tuple[_Worker, Any]],
                 command: list[str]) -> None:
        self.slot, self.gpu = slot, gpu
        self.proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL if os.environ.get("FA4_AOT_CERTIFY_DEBUG") != "1" else None,
            env={**env, "CUDA_VISIBLE_DEVICES": str(gpu)}, text=True, start_new_session=True)
        self.started = time.monotonic()
        self.fresh = True  # no check answered yet: its first check gets the start-up time too
        self.job: tuple[str, Check] | None = None
        self.grant = 0  # bytes of GPU memory its check holds (schedule.py)
        self.part = "fwd"
        self.since = 0.0
        reader = threading.Thread(target=self._read, args=(self.proc.stdout, answers), daemon=True)
        reader.start()

    def _read(self, stream: IO[str] | None, answers: queue.Queue[tuple[_Worker, Any]]) -> None:
        assert stream is not None
        for line in stream:
            try:
                answers.put((self, json.loads(line)))
            except ValueError:
                continue  # not an answer: a library printed to stdout before the worker redirected it
        answers.put((self, None))  # the process ended

    def send(self, ident: str, check: Check, lean: bool, grant: int) -> None:
        assert self.proc.stdin is not None
        self.job, self.grant, self.part, self.since = (ident, check), grant, "fwd", time.monotonic()
        request = {"id": ident, "check": check.to_dict(), "lean": lean, "memory": grant}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()

    def overdue(self, deadline: float, startup: float) -> bool:
        allowed = deadline + (startup if self.fresh else 0.0)
        return self.job is not None and time.monotonic() - self.since > allowed

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


class Pool:
    """`jobs` workers on each GPU of `gpus`, for one store and SKU (see the module)."""

    def __init__(self, store_root: Path, sku: str, gpus: list[int], jobs: int, deadline: float,
                 lean: bool = True, command: list[str] | None = None, startup: float = STARTUP_SECONDS, *,
                 variants: Path | None = None, oracle: bool = False,
                 capacity: Callable[[int], int] = gpu_capacity) -> None:
        """`variants`: the SKU table the workers read (FA4_AOT_VARIANTS), the one the run was given. `oracle`:
        the workers run FA4's own JIT, with no kernel of the store and no lean runtime (checker.ORACLE).
        `capacity`: the bytes of GPU memory the workers of a GPU may hold in all, by GPU index."""
        self.deadline, self.lean, self.startup = deadline, lean and not oracle, startup
        self.command = command or [sys.executable, "-m", "fa4_aot.certify.checker"]
        self.env = {k: v for k, v in os.environ.items() if k not in ("FA4_AOT_SERVER", "FA4_AOT_TRUSTED_KEYS")}
        # OMP_NUM_THREADS=1: the GPU does a check's work, and the CPU work left (lengths, page tables, the
        # reference's grouping of sequences) is small. With torch's default, a thread per CPU in each worker, every
        # CPU op over 32k elements ran on 16 threads in each of 16 workers: a varlen check of 65,535 sequences
        # spent 1 to 3 s making its inputs on the H200 (bench/RESULTS.md)
        self.env.update(FA4_AOT_CACHE=str(store_root), FA4_AOT_SKU=sku, FA4_AOT_CERTIFIED="off",
                        FA4_AOT_OFFLINE="1", PYTHONUNBUFFERED="1", FA4_AOT_CERTIFY_JOBS=str(jobs),
                        OMP_NUM_THREADS="1")
        if variants is not None:
            self.env["FA4_AOT_VARIANTS"] = str(Path(variants).resolve())
        if oracle:
            self.env[ORACLE] = "jit"
        self.answers: queue.Queue[tuple[_Worker, Any]] = queue.Queue()
        self.slots = [(gpu, n) for gpu in gpus for n in range(jobs)]
        self.workers: dict[int, _Worker] = {}
        self.capacity = {gpu: capacity(gpu) for gpu in gpus}
        self.alone = jobs == 1
        self.schedule = Schedule([], _signature, plan.peak_bytes, self.capacity, self.alone)

    def run(self, checks: list[tuple[str, Check]], stop: Callable[[], bool] = lambda: False,
            skip: Callable[[Check], bool] = lambda _c: False) -> Iterator[Outcome]:
        """The outcome of every check, as each ends (in no particular order), but of those `skip` passes over when
        their turn comes; stops handing out checks once `stop()` is true. Workers are closed when the iterator is."""
        self.schedule = Schedule(list(checks), _signature, plan.peak_bytes, self.capacity, self.alone)
        try:
            while self.schedule or any(w.job for w in self.workers.values()):
                self._hand_out(skip, stop)
                yield from self._collect()
                if stop() and not any(w.job for w in self.workers.values()):
                    return
        finally:
            self.close()

    def _hand_out(self, skip: Callable[[Check], bool], stop: Callable[[], bool]) -> None:
        for slot, (gpu, _n) in enumerate(self.slots):
            if not self.schedule or stop():
                return
            worker = self.workers.get(slot)
            if worker is not None and worker.job is not None:
                continue  # busy, or dead with its check's outcome still to come from its reader
            job = self.schedule.take(slot, gpu, skip)
            if job is None:
                continue  # nothing left for it, or its next check waits for GPU memory
            ident, check, grant = job
            if worker is None or worker.proc.poll() is not None:
                worker = self.workers[slot] = _Worker(slot, gpu, self.env, self.answers, self.command)
            try:
                worker.send(ident, check, self.lean, grant)
            except OSError:  # it died before taking the check: the check goes back, the worker is replaced
                self.schedule.again(slot, (ident, check), gpu, grant)
                worker.job = None
                worker.kill()
                self.workers.pop(slot, None)

    def _collect(self) -> Iterator[Outcome]:
        try:
            worker, answer = self.answers.get(timeout=1.0)
        except queue.Empty:
            yield from self._overdue()
            return
        if self.workers.get(worker.slot) is not worker or worker.job is None:
            return  # a worker already replaced, or one between checks
        ident, check = worker.job
        if answer is None:  # the process ended in the middle of a check
            code = worker.proc.wait()
            yield self._end(worker, Outcome(ident, check, "crash", worker.part,
                                            detail=f"the worker process died ({_exit(code)})"))
        elif answer.get("id") == ident and "part" in answer and "status" not in answer:
            worker.part = answer["part"]
        elif answer.get("id") == ident:
            worker.fresh = False
            outcome = Outcome(ident, check, answer["status"], worker.part, answer.get("failures", []),
                              answer.get("detail", ""), time.monotonic() - worker.since, answer.get("marginal", []),
                              answer.get("steps", {}))
            self._free(worker)
            if outcome.status == "crash" or answer.get("restart"):
                worker.kill()  # its context is lost: the next hand-out starts another
            yield outcome
        yield from self._overdue()

    def _overdue(self) -> Iterator[Outcome]:
        for worker in list(self.workers.values()):
            if worker.overdue(self.deadline, self.startup) and worker.job is not None:
                ident, check = worker.job
                yield self._end(worker, Outcome(ident, check, "hang", worker.part,
                                                detail=f"no answer within {self.deadline:.0f} s; the worker was "
                                                       "killed"))

    def _end(self, worker: _Worker, outcome: Outcome) -> Outcome:
        outcome.seconds = time.monotonic() - worker.since
        self._free(worker)
        worker.kill()
        self.workers.pop(worker.slot, None)
        return outcome

    def _free(self, worker: _Worker) -> None:
        """The worker's check ended: its memory grant goes back to its GPU."""
        self.schedule.release(worker.gpu, worker.grant)
        worker.job, worker.grant = None, 0

    def close(self) -> None:
        for worker in self.workers.values():
            worker.kill()
        self.workers.clear()


def _signature(check: Check) -> Any:
    """The schedule's affinity: a signature's checks go to one worker, which loads (or compiles) its kernels once."""
    return check.sig


def _exit(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"
