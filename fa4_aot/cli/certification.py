"""`fa4-aot certify`: run the store's kernels on this host's GPU and keep a verdict for each (fa4_aot/certify/)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..store import Store
from . import stopping
from .build_cmds import explicit_work
from .common import emit, existing, json_option, load_matrix, pass_store, variants_option
from .progress import Progress, quiet_option

if TYPE_CHECKING:
    from ..certify.driver import Report
    from ..certify.pool import Outcome


@click.command()
@click.option("--sku", required=True, help="The SKU whose kernels to certify: this host's GPU must be one of it "
                                           "(`fa4-aot skus --detect`).")
@variants_option()
@click.option("--model", "model_arg", metavar="NAME_OR_CONFIG_JSON", help="Certify what this model runs (a catalog "
              "name or a Hugging Face config.json) instead of the whole matrix.")
@click.option("--tp", "tp_arg", default="1", show_default=True, help="TP degrees for --model, e.g. 1,2,4,8.")
@click.option("--workload", "workload_arg", default="train,prefill,decode", show_default=True,
              help="Workloads for --model: train, prefill, decode.")
@click.option("--calls", "calls_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Certify the kernels of these calls' signatures (JSON lines as FA4_AOT_RECORD writes them).")
@click.option("--keys", "keys_arg", metavar="KEY,...", help="Only these kernel keys (comma-separated).")
@click.option("--jobs", "-j", default=2, show_default=True, type=click.IntRange(1, 32),
              help="Worker processes per GPU (each holds its own CUDA context).")
@click.option("--gpus", metavar="N,...", help="GPU indices to use (default: every visible GPU).")
@click.option("--deadline", default=120.0, show_default=True, type=click.FloatRange(1, 3600),
              help="Seconds one check may run before its worker counts as hung and is replaced.")
@click.option("--again", is_flag=True, help="Check kernels that already have a verdict for this GPU too.")
@click.option("--recheck-known-bad", is_flag=True, help="Run the kernels the known-bad registry names instead of "
              "refusing them (to see whether a new FA4 fixed them; they may crash their worker).")
@click.option("--no-lean", is_flag=True, help="Do not compare the lean runtime with FA4 on each check.")
@json_option("Print one JSON document: counts, every verdict, measured known-bad entries, what was not reached.")
@quiet_option
@pass_store
def certify(store: Store, sku: str, variants_file: Path | None, model_arg: str | None, tp_arg: str,
            workload_arg: str, calls_file: Path | None, keys_arg: str | None, jobs: int, gpus: str | None,
            deadline: float, again: bool, recheck_known_bad: bool, no_lean: bool, as_json: bool,
            quiet: bool) -> None:
    """Run every kernel of the store for SKU on this GPU and keep a verdict per kernel and GPU class.

    Every signature whose recipe regions the store holds for SKU is certified, or only those of --model or
    --calls, or only the kernels --keys names.

    Each kernel is run at sizes drawn from its recipe regions (a typical, a small, a boundary and a large
    size) with random inputs, through FA4 itself and through the lean runtime, and checked against an fp32
    reference: out, lse and, for training kernels, dq, dk and dv; a deterministic backward must repeat
    bitwise; the lean runtime must equal FA4. Each check runs in a worker process under a deadline: a crash
    or a hang costs one verdict, never the run. Verdicts (pass, wrong, crash, hang, refused) go into the
    store, and every failure into the SKU's measured known-bad entries: both runtimes then refuse those
    kernels, and the planner their calls. Then `fa4-aot sign` and `fa4-aot push` carry them to a cluster.
    Resumable: a second run checks only what has no verdict yet. Exits 1 if any kernel failed.
    """
    from ..certify.driver import Options, default_journal, signatures_of
    from ..certify.driver import certify as run
    from ..spec.devices import device_class

    store = existing(store)
    target = load_matrix(variants_file).sku(sku)
    work = explicit_work(model_arg, tp_arg, workload_arg, calls_file)
    items = signatures_of(work) if work is not None else None  # None: every signature the store recorded
    keys = {k.strip() for k in keys_arg.split(",") if k.strip()} if keys_arg else None
    device = device_class()
    journal = default_journal(store, target, device) if device is not None else None
    options = Options(jobs=jobs, gpus=tuple(int(g) for g in gpus.split(",")) if gpus else (), deadline=deadline,
                      again=again, recheck_known_bad=recheck_known_bad, lean=not no_lean, journal=journal)
    with Progress("certify", quiet=quiet, as_json=as_json) as bar, stopping.on_signals() as stop:
        try:
            report = run(store, target, items, keys=keys, options=options, progress=_progress(bar),
                         stop=lambda: stop.signum is not None)
        except KeyboardInterrupt:
            click.echo(f"certify: stopped; a second run resumes ({journal})", err=True)
            sys.exit(stop.exit_code)
    emit(as_json, report.to_dict(), _summary(report))
    if any(v.status in ("wrong", "crash", "hang") for v in report.verdicts):
        sys.exit(1)


def _progress(bar: Progress):  # type: ignore[no-untyped-def]
    def update(done: int, total: int, outcome: Outcome) -> None:
        line = "" if outcome.status == "pass" else f"{outcome.check.describe()}: {outcome.detail or outcome.status}"
        bar.update(done, total, "ok" if outcome.status == "pass" else outcome.status, line,
                   check=outcome.check.describe(), seconds=round(outcome.seconds, 3))

    return update


def _summary(report: Report) -> str:
    counts = ", ".join(f"{n} {s}" for s, n in sorted(report.counts().items())) or "no verdicts"
    lines = [f"{report.sku} on {report.device}: {counts} ({report.checks} checks, {report.skipped} already "
             f"certified, {report.seconds:.0f}s)"]
    for v in report.verdicts:
        if v.status != "pass":
            lines.append(f"{v.status.upper():8} {v.kernel_key[:16]} {v.describe()}")
    lines += [f"measured known-bad: {b.id}: {b.symptom}" for b in report.measured]
    lines += [f"not checked: {u}" for u in report.unreached[:20]]
    if len(report.unreached) > 20:
        lines.append(f"... and {len(report.unreached) - 20} more not checked (--json lists them)")
    lines += [f"error: {e}" for e in report.errors[:20]]
    return "\n".join(lines)
