"""Where a build's work runs. The orchestrator (orchestrator.py) plans, triages, reports progress and writes the store;
an executor only runs its tasks in worker processes configured for the task's SKU and says how each ended.

- LocalExecutor (default): a process pool on this host, one SKU at a time; its workers write the store
  themselves, compiling with no lock held and taking a kernel's lock only to re-check and commit it
  (commit.py), so several builders may share one store and none waits for another's compile.
- farm.RayExecutor (`--executor ray`, extra `fa4-aot[farm]`): Ray tasks on a cluster; objects travel back to
  the driver, which writes them, or go straight to a server.

A SKU whose CUDA major differs from this interpreter's compiler runs in workers of that flavour's interpreter
(flavours.python_for): the local pool spawns them from it, Ray gives the tasks a runtime_env with it.
"""

from __future__ import annotations

import functools
import multiprocessing
import multiprocessing.spawn
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, ParamSpec, Protocol, TypeVar

from ..domain.calls import Call
from ..domain.exact import ExactCall
from ..domain.signature import Signature
from ..domain.skus import Sku
from ..store import Entry, Store
from . import flavours
from .commit import commit_kernel, stored_key
from .worker import PlanOut, Wanted

# (label, a concrete call, a client's exact record of one, or a shape-complete signature): the callers' input
Work = list[tuple[str, Call | ExactCall | Signature]]


@dataclass(frozen=True)
class CompileTask:
    variant: str
    call: Call | ExactCall
    wanted: tuple[Wanted, ...]


Status = Literal["built", "present", "failed"]


@dataclass(frozen=True)
class Outcome:
    """How one kernel of a task ended. `entries` (full key first, then the base key's signpost if any), `data`
    and `objects` (its linked libraries, {digest: bytes}) come back when the executor's workers do not write the
    store themselves; the orchestrator then commits them (objects first, entries last). "present": the store
    had it, before the compile or, for a builder that lost the race to commit it, after (its bytes discarded)."""

    kernel_key: str
    family: str
    status: Status
    error: str = ""
    seconds: float = 0.0
    size: int = 0
    entries: tuple[Entry, ...] = ()
    data: bytes | None = None
    objects: dict[str, bytes] = field(default_factory=dict)


class Executor(Protocol):
    name: str

    def plan_chunks(self, calls: int) -> int:
        """How many tasks to cut the planning of `calls` calls into."""
        ...

    def plan(self, sku: Sku, store: Store, chunks: list[Work], record: bool = True) -> Iterator[tuple[int, PlanOut]]:
        """Plan each chunk in a worker for `sku`; yield (chunk index, its kernels, rejected calls and, with
        `record`, the lean runtime's recipe regions)."""
        ...

    def compile(self, sku: Sku, store: Store, tasks: list[CompileTask]) -> Iterator[tuple[int, list[Outcome]]]:
        """Compile each task's kernels for `sku`; yield (task index, outcomes) as tasks finish, in any order.
        Raises DiskFull (and stops) when the store is full; any other failure is an outcome."""
        ...

    def relink(self, sku: Sku, store: Store, keys: list[str]) -> list[str]:
        """Link this host's lean-runtime library for the stored entries `keys` (lean.relink); errors."""
        ...

    def close(self, stop: bool = False) -> None:
        """Release the workers; with `stop` (Ctrl-C), drop queued and running work at once."""
        ...


class LocalExecutor:
    """A spawn-started process pool on this host, kept for one SKU at a time."""

    name = "local"

    def __init__(self, jobs: int = 1) -> None:
        self.jobs = max(1, jobs)
        self._pool: ProcessPoolExecutor | None = None
        self._key: tuple[Sku, str] | None = None
        self._stack = ExitStack()

    def plan_chunks(self, calls: int) -> int:
        # several tasks per worker, so that planning reports progress as it goes: a task per 4 work
        # items, as a signature takes seconds to minutes to plan (the whole matrix's 8 tasks a worker counted
        # hundreds of items each, and said nothing for minutes); a task's results travel back in one message
        return max(self.jobs, calls // 4)

    def plan(self, sku: Sku, store: Store, chunks: list[Work], record: bool = True) -> Iterator[tuple[int, PlanOut]]:
        pool = self._pool_for(sku, store)
        futures = [pool.submit(_plan_task, chunk, record) for chunk in chunks]
        for i, future in enumerate(futures):
            yield i, future.result()

    def compile(self, sku: Sku, store: Store, tasks: list[CompileTask]) -> Iterator[tuple[int, list[Outcome]]]:
        pool = self._pool_for(sku, store)
        futures: dict[Future[list[Outcome]], int] = {pool.submit(_compile_task, t): i for i, t in enumerate(tasks)}
        try:
            for future in as_completed(futures):
                yield futures[future], future.result()
        finally:
            for future in futures:
                future.cancel()

    def relink(self, sku: Sku, store: Store, keys: list[str]) -> list[str]:
        relinked: list[str] = self._pool_for(sku, store).submit(_relink_task, keys).result()
        return relinked

    def close(self, stop: bool = False, grace: float = 5.0) -> None:
        """Shut the pool down; with `stop`, cancel what is queued and end the workers: SIGTERM first (a worker
        exits through its finally blocks, removing its temp files and releasing its locks), SIGKILL after `grace`."""
        pool, self._pool, self._key = self._pool, None, None
        if pool is not None and not stop:
            pool.shutdown(cancel_futures=True)
        elif pool is not None:
            workers = list((getattr(pool, "_processes", None) or {}).values())  # the stdlib has no public handle
            pool.shutdown(wait=False, cancel_futures=True)
            for proc in workers:
                proc.terminate()
            deadline = time.monotonic() + grace
            for proc in workers:
                proc.join(max(0.0, deadline - time.monotonic()))
                if proc.is_alive():
                    proc.kill()
                    proc.join()
        self._stack.close()

    def _pool_for(self, sku: Sku, store: Store) -> ProcessPoolExecutor:
        root = str(store.root)
        if self._pool is not None and self._key == (sku, root):
            return self._pool
        self.close()
        python = flavours.python_for(sku.cuda_major)
        sys_path: tuple[str, ...] = ()
        if not flavours.is_own(python):
            sys_path = flavours.sys_path_of(python)
            self._stack.enter_context(_spawning_with(python))
        context = multiprocessing.get_context("spawn")
        self._pool = ProcessPoolExecutor(self.jobs, mp_context=context, initializer=_init,
                                         initargs=(sku, root, sys_path))
        self._key = (sku, root)
        return self._pool


class _spawning_with:
    """Spawn new processes from another interpreter while the block runs (multiprocessing's setting is global;
    workers of a ProcessPoolExecutor are spawned while tasks are submitted, so the pool's whole life)."""

    def __init__(self, python: str) -> None:
        self.python = python
        self.saved = ""

    def __enter__(self) -> None:
        self.saved = multiprocessing.spawn.get_executable() or sys.executable
        multiprocessing.spawn.set_executable(self.python)

    def __exit__(self, *exc: object) -> None:
        multiprocessing.spawn.set_executable(self.saved)


P = ParamSpec("P")
R = TypeVar("R")


# -- in the pool's workers --------------------------------------------------------------------------
@dataclass
class WorkerState:
    """What a pool worker serves, set once by _init; `stopping` once a SIGTERM arrived; `in_compiler` while FA4
    compiles a kernel (see _on_sigterm)."""

    sku: Sku
    store: Store
    stopping: bool = False
    in_compiler: bool = False


_worker: WorkerState | None = None  # set by _init in a pool worker; None in the driver


def _state() -> WorkerState:
    if _worker is None:
        raise RuntimeError("executors' worker functions run in LocalExecutor's pool workers only")
    return _worker


def _init(sku: Sku, store_root: str, sys_path: tuple[str, ...]) -> None:
    # Ctrl-C reaches the whole process group: the parent decides (LocalExecutor.close), workers do not die
    # mid-write. Its SIGTERM then unwinds the worker through its finally blocks (temp files, locks), and ends it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _on_sigterm)
    sys.unraisablehook = _sigterm_again
    _end_with_parent(signal.SIGTERM)
    # configure() runs in the first task, so that a wrong environment fails that task with a BuildError
    if sys_path:  # a worker of another flavour's interpreter: multiprocessing gave it the driver's sys.path
        sys.path[:] = sys_path
    global _worker
    _worker = WorkerState(sku, Store(Path(store_root)))


def _on_sigterm(*_: object) -> None:
    """Unwind the worker (SystemExit through its finally blocks), or, inside FA4's compiler, end it at once.
    CuTe's compiler calls back into Python from native frames that cannot carry a Python exception: a
    SystemExit raised in such a callback ended the worker in std::terminate ("terminate called after throwing
    an instance of 'nanobind::python_error'", CI, test_i30_11). While it compiles, a worker holds no lock,
    temp file or open file of the store (commit.py takes them after the compile), so there is nothing to unwind."""
    if _worker is not None:
        _worker.stopping = True
        if _worker.in_compiler:
            os._exit(143)
    raise SystemExit(143)


@contextmanager
def _compiling(state: WorkerState) -> Iterator[None]:
    """The block in which FA4 compiles: a SIGTERM ends the worker at once (_on_sigterm)."""
    state.in_compiler = True
    try:
        yield
    finally:
        state.in_compiler = False


@contextmanager
def _handling(state: WorkerState) -> Iterator[None]:
    """A compiled kernel's export and commit, inside _compiling: a SIGTERM unwinds them (temp files, the
    kernel's lock) as anywhere outside the compiler."""
    state.in_compiler = False
    try:
        yield
    finally:
        state.in_compiler = True


def _sigterm_again(unraisable: sys.UnraisableHookArgs) -> None:
    """A SIGTERM that lands in a weakref or GC callback (an import's module-lock callback, while a worker imports
    FA4) raises its SystemExit where Python cannot propagate it: it printed a traceback and the worker went on.
    Deliver the signal again, so that the handler runs at the next ordinary bytecode and the worker ends."""
    if isinstance(unraisable.exc_value, SystemExit):  # a moment later: sent at once, it would land in this hook
        timer = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGTERM))
        timer.daemon = True
        timer.start()
        return
    sys.__unraisablehook__(unraisable)


def _ends_on_sigterm(task: Callable[P, R]) -> Callable[P, R]:
    """Make a worker task end the worker after a SIGTERM. The SystemExit the handler raises unwinds the task
    (finally blocks: temp files, locks), but the pool's worker loop catches BaseException from a task, reports
    it and takes the next queued task: a stopped or orphaned worker went on compiling and writing. So once the
    task has unwound, the process exits."""
    @functools.wraps(task)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return task(*args, **kwargs)
        finally:
            if _worker is not None and _worker.stopping:
                os._exit(143)

    return run


def _end_with_parent(signum: int) -> None:
    """Have the kernel send `signum` to this worker when the process that started it dies, however it dies
    (SIGKILL included): an orphaned worker must not go on compiling and writing into the store. Linux only
    (prctl PR_SET_PDEATHSIG); elsewhere the parent's own shutdown is all there is."""
    import ctypes
    import ctypes.util

    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signum, 0, 0, 0)
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:  # the parent died before the request took effect
        sys.exit(143)


@_ends_on_sigterm
def _plan_task(work: Work, record: bool) -> PlanOut:
    from . import worker

    return worker.plan_calls(_state().sku, work, _state().store, record)


@_ends_on_sigterm
def _relink_task(keys: list[str]) -> list[str]:
    from . import worker

    return worker.relink(_state().sku, _state().store, keys)


@_ends_on_sigterm
def _compile_task(task: CompileTask) -> list[Outcome]:
    """Check, compile unlocked, then commit each kernel under its lock (commit.commit_kernel): a kernel another
    builder of this store holds already is not compiled; one it commits while this worker compiles is discarded.
    No lock is held while FA4 compiles: a compile of minutes would stall every builder waiting on the lock."""
    from . import worker

    state = _state()
    outcomes: list[Outcome] = []

    def sink(entries: list[Entry], data: bytes) -> None:  # no lock held: commit_kernel takes it to commit
        full = entries[0]
        status = commit_kernel(state.store, entries, data)  # not "corrupt": the digest is of these very bytes
        outcomes.append(Outcome(full.kernel_key, full.family, "failed" if status == "corrupt" else status,
                                error="the object does not hash to its digest" if status == "corrupt" else "",
                                seconds=full.compile_seconds, size=full.size))

    held = {w: stored_key(state.store, w.kernel_key, state.sku) for w in task.wanted}
    outcomes += [Outcome(key, w.family, "present") for w, key in held.items() if key is not None]
    pending = [w for w, key in held.items() if key is None]
    errors: dict[str, str] = {}
    if pending:
        with _compiling(state):
            errors = worker.compile_kernels(state.sku, task.variant, task.call, pending, sink, state.store,
                                            handling=lambda: _handling(state))
    family = {w.kernel_key: w.family for w in task.wanted}
    return outcomes + [Outcome(kk, family[kk], "failed", error=error) for kk, error in errors.items()]
