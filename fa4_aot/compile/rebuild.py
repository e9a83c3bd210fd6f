"""Rebuilding what clients missed (`fa4-aot build --from-misses`, and the on-demand builder): each reported miss
becomes the work item that makes its kernel again (its exact FA4 arguments, else its Call; a lean miss: its Call
and its whole signature, whose build records the recipe regions of every size and makes every kernel they name),
built per SKU like any other work, and every miss the build did not close is a failure in its SKU's report,
unless the known-bad registry refused its call (the report's refusals).

Why a lean miss builds its whole signature: the recipe file its build records names the
kernels of every size, and a client holding that file (`pull --model`, a lean runtime at other sizes) can only
ask for the rest one call at a time. Built with its call alone, a model's set took a round of misses per region;
built whole, one miss per signature completes it. The cost: a client waiting for that miss waits for all the
signature's kernels (a few more compiles), not just those of its call."""

from __future__ import annotations

from collections.abc import Callable

from ..domain import kernel_keys
from ..domain.calls import Call
from ..domain.exact import ExactCall
from ..domain.misses import Miss
from ..domain.recipe_format import call_sizes
from ..domain.signature import Signature
from ..domain.skus import Sku
from ..matrix.variants import Matrix
from ..remote.http import Remote
from ..remote.push_pull import push
from ..store import Store, recipes
from .executors import Executor
from .orchestrator import Report, Result, Work, build_calls, describe


def rebuild_misses(matrix: Matrix, store: Store, remote: Remote, jobs: int = 1,
                   progress: Callable[..., None] | None = None, dry_run: bool = False) -> list[Report]:
    """Build the kernels clients reported missing to `remote`, per SKU, and push the results; with `dry_run`,
    plan them only: nothing is written to `store` and nothing is pushed."""
    reports = build_misses(matrix, store, remote.misses(), jobs=jobs, progress=progress, dry_run=dry_run)
    for report in reports if not dry_run else []:
        push(store, remote, report.sku)
    return reports


def build_misses(matrix: Matrix, store: Store, misses: list[Miss], jobs: int = 1,
                 progress: Callable[..., None] | None = None, executor: Executor | None = None,
                 dry_run: bool = False) -> list[Report]:
    """Build every kernel in `misses` for the SKUs `matrix` knows: a miss that carries the exact
    FA4 arguments of its call (`args`, domain/exact.py) is replayed through FA4 with them, an older one re-plans the
    Call it carries; a lean runtime's miss (Miss.is_lean, runtime/on_miss.py) plans its Call and its whole
    signature, which records its recipe regions with every kernel and library they name. A missed kernel the
    rebuild does not produce (no call recorded, or the call no longer selects it), or a lean call no region then
    serves, is a failure in its SKU's report, so nothing is left out silently. `executor` (default: a local
    pool of `jobs`) is left open for its owner. With `dry_run`, plan only: the kernels the store lacks are
    reported as "planned", nothing is written, and no miss is judged unreproduced (nothing was built to judge)."""
    by_sku: dict[str, dict[str, Miss]] = {}
    for miss in misses:
        if miss.sku in matrix.skus:
            by_sku.setdefault(miss.sku, {})[miss.kernel_key] = miss
    reports = []
    for name, wanted in sorted(by_sku.items()):
        items = [each for m in wanted.values() for each in _work_items(m)]
        work: Work = list(dict.fromkeys(("from-misses", c) for c in items))
        report = build_calls(matrix.sku(name), store, work, jobs=jobs, progress=progress, executor=executor,
                             dry_run=dry_run)
        report.misses = len(wanted)
        _set_aside(report, {describe(item) for _label, item in work if isinstance(item, Signature)})
        if not dry_run:
            _unreproduced(report, wanted, store, matrix.sku(name))
        reports.append(report)
    return reports


def _work_items(miss: Miss) -> list[Call | ExactCall | Signature]:
    """The work items that close `miss`: its item (see _item), and for a lean miss its call's whole signature
    (see the module); none for a miss without a readable call."""
    item = _item(miss)
    if item is None:
        return []
    whole = [Signature.of(item)] if miss.is_lean and isinstance(item, Call) else []
    return [item, *whole]


def _set_aside(report: Report, wholes: set[str]) -> None:
    """A lean miss's whole signature is built beyond what the miss asked for: FA4 or the known-bad registry
    refusing it (a kernel of other sizes, say) refuses not the miss, whose own call is judged alone, and is
    said among the report's lean failures instead (`wholes`: the signatures' descriptions)."""
    for where in (report.refused, report.call_failures):
        report.lean_failures += [f"the other sizes of {r.call} were not built: {r.error}" for r in where
                                 if r.call in wholes]
        where[:] = [r for r in where if r.call not in wholes]


def _item(miss: Miss) -> Call | ExactCall | None:
    """What rebuilds a miss: its exact record when it carries a readable one, else its Call, else None (none
    recorded, or one this fa4-aot cannot read: a server may hold misses from other clients): that miss is then
    reported as not reproduced, and the others still build."""
    call = miss.parsed_call()
    if miss.args:
        try:
            return ExactCall.from_dict(miss.args, call)
        except ValueError:
            pass
    return call


def _unreproduced(report: Report, wanted: dict[str, Miss], store: Store, sku: Sku) -> None:
    done = _done_keys(report, store)
    refused = {r.call for r in report.refused}  # the known-bad registry says why: no failure of the rebuild
    for key, miss in sorted(wanted.items()):
        item = _item(miss)
        if key in done or _lean_served(miss, store, sku) or (item is not None and item.describe() in refused):
            continue
        why = ("no recipe region the build recorded serves this lean call (see the report's lean failures)"
               if miss.is_lean and item is not None else
               "the client could not describe the call (score_mod, block sparsity...)" if item is None
               else "replaying the recorded arguments did not ask for it (was FA4 or the SKU table changed?)"
               if isinstance(item, ExactCall) else
               "re-planning the recorded call did not select it (an older client's miss, without its exact "
               "arguments: run the workload again with this fa4-aot)")
        report.results.append(Result("failed", miss.family, key, "from-misses", item.describe() if item else "",
                                     error=f"missed kernel not rebuilt: {why}"))


def _lean_served(miss: Miss, store: Store, sku: Sku) -> bool:
    """A lean miss is closed when the store serves its call (a region and every kernel it launches)."""
    call = miss.parsed_call()
    return miss.is_lean and call is not None and served(store, sku, call)


def _done_keys(report: Report, store: Store) -> set[str]:
    """Keys of the kernels the report built or found, under both names a kernel may have: a client's miss names
    the base key, while a kernel that consumed SKU constants is reported under its full key."""
    done = set()
    for r in report.results:
        if r.status in ("built", "present"):
            done.add(r.kernel_key)
            entry = store.get_entry(r.kernel_key)
            if entry is not None:
                done.update(kernel_keys.entry_keys(entry))
    return done


def served(store: Store, sku: Sku, call: Call) -> bool:
    """Whether `store` holds a recipe region (of any file the lean runtime reads for the call's signature) that
    serves `call` and every kernel it launches: what a lean miss's build must leave behind. Reads only the store."""
    sig = Signature.of(call)
    sizes = call_sizes(call)
    regions = [r for source in recipes.sources(sig, sku) for r in source.serve(recipes.load(store, source.key))]
    found = recipes.find(regions, sizes)
    return found is not None and all(store.has_entry(k.kernel_key) for k in found.kernels)
