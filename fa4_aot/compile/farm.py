"""The Ray executor: `fa4-aot build --executor ray [--ray-address ADDR]` (optional extra `fa4-aot[farm]`).

Each Ray task plans a chunk of calls or compiles one kernel, in a Ray worker process configured for the task's
SKU exactly as local workers are (worker.configure). Ray keeps a separate pool of worker processes per
runtime_env, so every SKU gets its own runtime_env (FA4_AOT_WORKER_SKU), and a SKU of another CUDA flavour
names that flavour's interpreter as py_executable (flavours.python_for). Workers link each kernel's lean-runtime
library as local workers do; the object and library bytes come back to the driver, whose orchestrator writes
them (objects first, entries last; the CuTe runtime library they need is fetched once per SKU), or the workers
publish them straight to a server (`--push URL`). A task whose worker dies is retried by Ray (max_retries); a
kernel that fails to compile is an outcome, not an exception, so the rest go on. Only the driver side imports
ray; `import fa4_aot` never does.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any, NamedTuple

from ..domain.known_bad import Registry
from ..domain.skus import Sku
from ..errors import BuildError
from ..store import Entry, Store
from . import flavours, refusals
from .executors import CompileTask, LocalExecutor, Outcome, Work
from .worker import PlanOut

MAX_RETRIES = 3  # attempts after a worker dies (a kernel that fails to compile is not retried)


class RayExecutor:
    """Ray tasks on the cluster at `address` (None: a local one of `num_cpus` CPUs on 127.0.0.1, stopped by close()).
    `node_ip` is this driver's address as the cluster knows its node (Ray guesses the host's network address)."""

    name = "ray"

    def __init__(self, address: str | None = None, num_cpus: int | None = None, push: str | None = None,
                 token: str | None = None, max_retries: int = MAX_RETRIES, node_ip: str | None = None) -> None:
        try:
            import ray
        except ImportError as e:
            raise BuildError("--executor ray needs Ray: pip install 'fa4-aot[farm]' (ray==2.60.0)") from e
        try:
            ray.init(address=address, num_cpus=None if address else num_cpus, include_dashboard=False,
                     log_to_driver=False, configure_logging=False,
                     _node_ip_address=node_ip or (None if address else "127.0.0.1"))
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise BuildError(f"cannot connect to the Ray cluster at {address or 'a new local instance'}: {e}; "
                             "start one with `ray start --head` or check --ray-address / RAY_ADDRESS") from e
        self._ray = ray
        self._task = ray.remote(_run)
        self._retries = max_retries
        self._push = (push, token) if push else None
        self._envs: dict[Sku, dict[str, Any]] = {}

    def plan_chunks(self, calls: int) -> int:
        """One chunk per CPU of the cluster, as the local pool has one per process: a work item costs from 1.5 ms
        (a call) to seconds (a model signature, planned at every shape, with its recipes recorded), against
        about 1 ms of Ray's own cost per task, so even a chunk of one item is worth a task."""
        cpus = self._ray.cluster_resources().get("CPU", 1)  # type: ignore[no-untyped-call]  # (ray's own hints)
        return max(1, min(int(cpus), calls))

    def plan(self, sku: Sku, store: Store, chunks: list[Work], record: bool = True) -> Iterator[tuple[int, PlanOut]]:
        registry = refusals.in_force(store, sku)  # the driver's: Ray workers have no store to read measured entries
        refs = [self._submit(sku, PlanJob(chunk, record, registry)) for chunk in chunks]
        for i, ref in enumerate(refs):
            try:
                yield i, self._ray.get(ref)
            except self._ray.exceptions.RayError as e:
                raise BuildError(f"planning {sku.name} on Ray failed: {_reason(e)}") from e

    def compile(self, sku: Sku, store: Store, tasks: list[CompileTask]) -> Iterator[tuple[int, list[Outcome]]]:
        runtime = self._submit(sku, None) if tasks and not self._push else None
        index = {self._submit(sku, task): i for i, task in enumerate(tasks)}
        pending = list(index)
        try:
            if runtime is not None:
                self._store_runtime(runtime, store)
            while pending:
                ready, pending = self._ray.wait(pending, num_returns=1)
                for ref in ready:
                    yield index[ref], self._outcomes(ref, tasks[index[ref]])
        finally:
            for ref in pending:  # the orchestrator stopped early (DiskFull, an interrupt): drop the rest
                self._ray.cancel(ref, force=True)

    def _store_runtime(self, ref: Any, store: Store) -> None:
        """Store the runtime libraries the workers' linked libraries need (43 MB, from a task submitted before the
        compiles, so that it runs first, on a worker that then compiles), before any entry naming them is
        committed. If this fails, those entries are stored without libraries and the driver links them afterwards
        (relink)."""
        try:
            for data in self._ray.get(ref).values():
                store.put_object(data)
        except self._ray.exceptions.RayError:
            pass

    def relink(self, sku: Sku, store: Store, keys: list[str]) -> list[str]:
        """On the driver, for entries stored without this host's library (built before linking existed, or by
        workers of another host arch): link them against this host's CuTe runtime into the driver's store."""
        linker = LocalExecutor(1)
        try:
            return linker.relink(sku, store, keys)
        finally:
            linker.close()

    def close(self, stop: bool = False) -> None:
        self._ray.shutdown()  # in-flight tasks were cancelled by compile() when the orchestrator stopped

    def _submit(self, sku: Sku, payload: PlanJob | CompileTask | None) -> Any:
        return self._task.options(num_cpus=1, max_retries=self._retries, retry_exceptions=False,
                                  runtime_env=self._env(sku)).remote(sku, payload, self._push)

    def _env(self, sku: Sku) -> dict[str, Any]:
        if sku not in self._envs:
            python = flavours.python_for(sku.cuda_major)
            env_vars = {**flavours.worker_env(), "FA4_AOT_WORKER_SKU": sku.name, "TORCH_CPP_LOG_LEVEL": "ERROR"}
            self._envs[sku] = {"env_vars": env_vars, **({} if flavours.is_own(python) else {"py_executable": python})}
        return self._envs[sku]

    def _outcomes(self, ref: Any, task: CompileTask) -> list[Outcome]:
        try:
            outcomes: list[Outcome] = self._ray.get(ref)
            return outcomes
        except self._ray.exceptions.RayError as e:  # retries exhausted, or the task itself broke
            return [Outcome(w.kernel_key, w.family, "failed", error=f"Ray task failed: {_reason(e)}")
                    for w in task.wanted]


def _reason(e: BaseException) -> str:
    return " ".join(str(e).split())[:300] or type(e).__name__


# -- in Ray workers ----------------------------------------------------------------------------------
class PlanJob(NamedTuple):
    """The payload of a planning task."""

    work: Work
    record: bool
    registry: Registry | None = None  # the known-bad registry in force (refusals.in_force); None: the project's


def _run(sku: Sku, payload: PlanJob | CompileTask | None,
         push: tuple[str, str | None] | None) -> PlanOut | dict[str, bytes] | list[Outcome]:
    """A Ray task: plan (a PlanJob), compile (a CompileTask), or, for None, the runtime libraries' bytes."""
    from . import worker

    if isinstance(payload, PlanJob):
        return worker.plan_calls(sku, payload.work, None, payload.record, payload.registry)
    if payload is None:
        return worker.runtime_objects(sku)
    task = payload
    outcomes: list[Outcome] = []

    def sink(entries: list[Entry], data: bytes) -> None:
        full = entries[0]
        built = Outcome(full.kernel_key, full.family, "built", seconds=full.compile_seconds, size=full.size)
        libraries = [lib["digest"] for lib in full.shared_libs.values()]
        if push is None:
            built = replace(built, entries=tuple(entries), data=data, objects=worker.lean_objects(sku, libraries))
        else:
            needed = [d for arch in full.shared_libs for d in full.lib_digests(arch)]
            _publish(push, entries, data, worker.lean_objects(sku, needed))
        outcomes.append(built)

    errors = worker.compile_kernels(sku, task.variant, task.call, list(task.wanted), sink)
    families = {w.kernel_key: w.family for w in task.wanted}
    return outcomes + [Outcome(kk, families[kk], "failed", error=error) for kk, error in errors.items()]


def _publish(push: tuple[str, str | None], entries: list[Entry], data: bytes, libraries: dict[str, bytes]) -> None:
    """Each entry as Remote.push_entry publishes it (libraries, object, then the entry), the full key's first,
    then the base key's signpost (the server accepts either key: has_valid_key)."""
    from ..remote.http import Remote

    objects = {**libraries, entries[0].object_digest: data}
    remote = Remote(push[0], token=push[1])
    try:
        for entry in entries:
            remote.push_entry(entry, objects.__getitem__)
    finally:
        remote.close()
