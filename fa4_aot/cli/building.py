"""Running what `fa4-aot build` was asked for: the executor (a process pool here, or Ray), then one SKU after another
into the store or, with --push, a server, each with its progress; a signal ends the build after the SKU it
interrupted (stopping.py). `fa4-aot builder` makes its executor here too."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import stopping
from .common import remote_for
from .progress import Progress
from .reporting import kernel_progress, planning_progress

if TYPE_CHECKING:
    from ..compile import orchestrator as build_mod
    from ..compile.executors import Executor
    from ..domain.skus import Sku
    from ..matrix.call_variants import Variant
    from ..matrix.model_variants import ModelVariant
    from ..matrix.variants import Matrix
    from ..store import Store

# seconds between planning's progress lines while no work item finishes (a signature takes seconds to minutes)
PLAN_EVERY = 5.0


def executor_for(kind: str, jobs: int, address: str | None, node_ip: str | None, push_url: str | None,
                 token: str | None) -> Executor:
    """The executor --executor names: "ray" (tasks on the cluster at `address`, or a new local one; with
    `push_url`, workers publish there), else a local pool of `jobs` compiler processes."""
    if kind == "ray":
        from ..compile.farm import RayExecutor

        return RayExecutor(address, num_cpus=jobs, push=push_url, token=token, node_ip=node_ip)
    from ..compile.executors import LocalExecutor

    return LocalExecutor(jobs)


@dataclass(frozen=True)
class Run:
    """What every SKU of one `fa4-aot build` shares: the work (the explicit (label, call or signature) pairs of
    --model/--calls, or None for the chosen [[variants]] entries), the store, the executor, and the server built
    kernels go to instead of the store (--push)."""

    matrix: Matrix
    store: Store
    work: build_mod.Work | None
    chosen: list[Variant | ModelVariant]
    executor: Executor
    dry_run: bool
    push_url: str | None
    token: str | None

    def each(self, targets: list[Sku], quiet: bool, as_json: bool) -> tuple[list[build_mod.Report], stopping.Stop]:
        """Build for each SKU in turn, then close the executor: a report per SKU built (an interrupted SKU is the
        last) and the signal that stopped the build, if one did."""
        reports: list[build_mod.Report] = []
        # stdout carries only the result: what an executor prints (Ray reports dead workers there) goes to stderr
        with contextlib.redirect_stdout(sys.stderr), stopping.on_signals() as stop:
            try:
                for t in targets:  # an interrupted SKU ends the build: the others are not started
                    with Progress("build", quiet=quiet, as_json=as_json) as bar:
                        reports.append(self.one(t, bar))
                    if reports[-1].interrupted:
                        break
            finally:
                self.executor.close()
        return reports, stop

    def one(self, target: Sku, bar: Progress) -> build_mod.Report:
        """Build for `target` the explicit work of --model/--calls, or else the chosen variants."""
        from ..compile import orchestrator as build_mod

        present = None
        if self.push_url:  # the server, not this store, is where built kernels go: ask it what it has
            present = _on_server(remote_for(self.push_url, self.token, param="push_url").kernel_keys(target.name))
        work = build_mod.work_of(self.matrix, target, self.chosen) if self.work is None else self.work
        with Progress("plan", quiet=bar.mode == "quiet", as_json=bar.mode == "json", every=PLAN_EVERY) as plan_bar:
            return build_mod.build_calls(target, self.store, work, progress=kernel_progress(bar),
                                         dry_run=self.dry_run, executor=self.executor, present=present,
                                         planning=planning_progress(plan_bar))


def _on_server(held: set[str]) -> Callable[[str], str | None]:
    """`present` for a build that pushes: a kernel counts as held when the server lists its base key (its
    signpost, or the kernel itself when it consumed no constant). The server's manifest gives keys, not the
    constants a signpost names, so a kernel held only for other constant values is not rebuilt here: build it
    without --push, or with --push after the SKU's manifest lists it."""

    def present(base_key: str) -> str | None:
        return base_key if base_key in held else None

    return present
