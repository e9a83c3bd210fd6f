"""`fa4-aot certify` (run the store's kernels on this GPU and keep a verdict for each: certify/driver.py) and
`fa4-aot certifier` (on-demand certification of what builders publish, on a GPU host: certify/certifier.py)."""

from __future__ import annotations

import functools
import logging
import os
import socket
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import click

from ..errors import Fa4AotError
from ..store import Store
from . import stopping
from .build_cmds import explicit_work
from .common import NoGpu, emit, existing, json_option, load_matrix, pass_store, remote_for, variants_option
from .progress import Progress, quiet_option
from .stopping import on_signals

if TYPE_CHECKING:
    from ..certify.driver import Report
    from ..certify.pool import Outcome
    from ..domain.skus import Sku
    from ..domain.verdicts import DeviceClass

NO_GPU = 2  # exit status on a host without a usable GPU: nothing there can certify


@click.command()
@click.option("--server", required=True, envvar="FA4_AOT_SERVER", help="The server whose certify jobs to run "
              "($FA4_AOT_SERVER).")
@click.option("--token", envvar="FA4_AOT_TOKEN", help="A publish token allowed this GPU's SKU ($FA4_AOT_TOKEN): "
              "claims jobs, records verdicts.")
@click.option("--lease", default=120.0, show_default=True, type=click.FloatRange(min=10, max=3600),
              help="Seconds a claimed job stays this certifier's without renewal; renewed every third of it. A "
                   "certifier that dies loses its job to the next claim after this long.")
@click.option("--poll", default=2.0, show_default=True, type=click.FloatRange(min=0.05),
              help="Seconds between claims while the queue is empty.")
@click.option("--name", default=lambda: f"{socket.gethostname()}-{os.getpid()}", show_default="host-pid",
              help="This certifier's name in the jobs it holds.")
@click.option("--once", is_flag=True, help="Certify at most one job (none when none is queued), then exit.")
@variants_option("The SKU table (default: variants.toml): this GPU's SKU must be in it.")
@pass_store
def certifier(store: Store, server: str, token: str | None, lease: float, poll: float, name: str, once: bool,
              variants_file: Path | None) -> None:
    """Certify what builders publish before clients run it: claim the server's certify jobs for this GPU's SKU (a
    job per published kernel), pull each job's kernels and recipe files into this store, run them on this GPU
    against an fp32 reference (as `fa4-aot certify` does) and record the verdicts on the server. Clients with
    FA4_AOT_CERTIFIED=require and FA4_AOT_BUILD_WAIT get a built kernel once it passed. Needs a GPU of the SKU
    (exit 2 without one) and a publish token allowed it. Stops on SIGINT/SIGTERM, giving back the job it holds."""
    from ..certify.certifier import Certifier
    from ..remote.credentials import token_for
    from ..remote.http import Remote

    sku, device = gpu_sku(variants_file)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per claim would bury the jobs' lines
    first = remote_for(server, token)
    check_trust(store, sku, first)
    # remotes are made again in other threads (lease renewals), where there is no click context to ask
    again = functools.partial(Remote, first.url, token=token or token_for(server), advice=first.advice)
    worker = Certifier(again, store, sku, device, name, lease=lease, poll=poll)
    click.echo(f"certifier {name}: certifying {server}'s {sku.name} jobs on {device} into {store.root}", err=True)
    with on_signals() as stop:
        try:
            if once:
                worker.run_one()
            else:
                worker.run(threading.Event())
        except KeyboardInterrupt:
            click.echo(f"certifier {name}: stopped after {worker.done} job(s)", err=True)
            sys.exit(stop.exit_code)


def gpu_sku(variants_file: Path | None) -> tuple[Sku, DeviceClass]:
    """(the SKU row of this host's GPU, its device class: domain/devices.certifying); exits NO_GPU with why when
    there is no GPU, or the GPU is not exactly of a row of the table (a verdict holds only for the GPU that
    measured it)."""
    from ..domain import devices

    try:
        return devices.certifying(load_matrix(variants_file).skus)
    except Fa4AotError as e:
        _no_gpu(f"a certifier runs kernels on a GPU of the SKU it certifies: {e}")


def check_trust(store: Store, sku: Sku, remote: object) -> None:
    """Refuse at start what every job would fail on: remote kernels the client's trust policy refuses."""
    from ..trust.policy import Trust

    refusal = Trust.from_env(sku, store, remote).refuse_remote()
    if refusal:
        raise Fa4AotError(f"the certifier fetches the kernels it certifies from the server, and {refusal}")


def _no_gpu(why: str) -> NoReturn:
    raise NoGpu(why)


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
@click.option("--no-oracle", is_flag=True, help="Do not run failing checks through FA4's own JIT (which tells FA4's "
              "bugs from fa4-aot's: only FA4's become known-bad entries); every failure then counts as FA4's.")
@json_option("Print one JSON document: counts, every verdict, measured known-bad entries, what was not reached.")
@quiet_option
@pass_store
def certify(store: Store, sku: str, variants_file: Path | None, model_arg: str | None, tp_arg: str,
            workload_arg: str, calls_file: Path | None, keys_arg: str | None, jobs: int, gpus: str | None,
            deadline: float, again: bool, recheck_known_bad: bool, no_lean: bool, no_oracle: bool, as_json: bool,
            quiet: bool) -> None:
    """Run every kernel of the store for SKU on this GPU and keep a verdict per kernel and GPU class.

    Every signature whose recipe regions the store holds for SKU is certified, or only those of --model or
    --calls, or only the kernels --keys names.

    A failing check runs four more times with new inputs and a float64 reference: only a failure that
    reproduces is a verdict (a miss by rounding at a degenerate size is reported as marginal), and then FA4's
    own JIT runs the same check: a failure it reproduces is FA4's (a known-bad entry), one it does not is
    fa4-aot's (reported as ours, to fix).

    Each kernel is run at sizes drawn from its recipe regions (a typical, a small, a boundary and a large size; a
    paged kernel also over a KV pool past 32-bit offsets, last, alone on its GPU) with random inputs, through FA4
    itself and through the lean runtime, and checked against an fp32 reference: out, lse and, for training kernels,
    dq, dk and dv; a deterministic backward must repeat bitwise; the lean runtime must equal FA4. Each check runs in a
    worker process under a deadline: a crash or a hang costs one verdict, never the run. Verdicts (pass, wrong, crash,
    hang, refused) go into the store, and every failure into the SKU's measured known-bad entries: both runtimes then
    refuse those kernels, and the planner their calls. Then `fa4-aot sign` and `fa4-aot push` carry them to a cluster.
    Resumable: a second run checks only what has no verdict yet. Exits 1 if any kernel failed.
    """
    from ..certify.driver import Options, default_journal, signatures_of
    from ..certify.driver import certify as run
    from ..domain import devices

    store = existing(store)
    target = load_matrix(variants_file).sku(sku)
    work = explicit_work(model_arg, tp_arg, workload_arg, calls_file)
    items = signatures_of(work) if work is not None else None  # None: every signature the store recorded
    keys = {k.strip() for k in keys_arg.split(",") if k.strip()} if keys_arg else None
    device = devices.probe().device_class
    if device is None:  # nothing here can run a kernel: "no GPU" (2), as `certifier` says it, not "a kernel failed"
        _no_gpu(f"no CUDA device is visible here, and certify runs kernels: run it on a GPU host of SKU {sku} "
                "(`fa4-aot skus --detect` there names its SKU)")
    journal = default_journal(store, target, device)
    options = Options(jobs=jobs, gpus=tuple(int(g) for g in gpus.split(",")) if gpus else (), deadline=deadline,
                      again=again, recheck_known_bad=recheck_known_bad, lean=not no_lean, journal=journal,
                      variants=variants_file, oracle=not no_oracle)
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
        if outcome.status == "pass":
            bar.update(done, total, "ok", "", check=outcome.check.describe(), seconds=round(outcome.seconds, 3))
            return
        # what failed, as it comes: a run stopped before its end (a lease, Ctrl-C) still says what it found
        found = "; ".join(f"{f.get('tensor')} {f.get('error')} > {f.get('bound')}" for f in outcome.failures)
        bar.update(done, total, outcome.status,
                   f"{outcome.check.describe()} ({outcome.part}): {found or outcome.detail or outcome.status}",
                   check=outcome.check.describe(), seconds=round(outcome.seconds, 3), part=outcome.part,
                   failures=outcome.failures, detail=outcome.detail[:500],
                   kernels=[u.kernel_key for u in outcome.check.kernels])

    return update


def _summary(report: Report) -> str:
    counts = ", ".join(f"{n} {s}" for s, n in sorted(report.counts().items())) or "no verdicts"
    spent = ", ".join(f"{name} {s:.0f}s" for name, s in report.phases.items())
    lines = [f"{report.sku} on {report.device}: {counts} ({report.checks} checks, {report.skipped} already "
             f"certified, {report.seconds:.0f}s{': ' + spent if spent else ''})"]
    for v in report.verdicts:
        if v.status != "pass":
            lines.append(f"{v.status.upper():8} {v.kernel_key[:16]} {v.describe()}")
    lines += [f"measured known-bad: {b.id}: {b.symptom}" for b in report.measured]
    if report.measured:
        lines.append(f"each with a one-file repro for FA4: fa4-aot known-bad --sku {report.sku} --repro ID > repro.py")
    by_origin = report.to_dict()["findings_by_origin"]
    lines.append(f"findings: {len(report.findings)} failing check(s): {by_origin['fa4']} reproduced by FA4's own JIT "
                 f"(FA4's bugs), {by_origin['ours']} not (fa4-aot's: no known-bad entry), {by_origin['unknown']} "
                 f"not put to the JIT; {len(report.marginal)} marginal miss(es) that did not reproduce (no verdict)")
    lines += [f"OURS     {f.check}: {f.detail or f.failures}"[:300] for f in report.findings if f.origin == "ours"]
    lines += [f"not checked: {u}" for u in report.unreached[:20]]
    if len(report.unreached) > 20:
        lines.append(f"... and {len(report.unreached) - 20} more not checked (--json lists them)")
    if report.errors:  # no verdict from these: the 20 below may be a small part of them
        lines.append(f"{len(report.errors)} check(s) ended in an error, no verdict from them; "
                     f"{report.out_of_memory} ran out of GPU memory (not a kernel fault; try fewer --jobs)")
    lines += [f"error: {e}" for e in report.errors[:20]]
    return "\n".join(lines)
