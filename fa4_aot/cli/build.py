"""`fa4-aot skus` and `fa4-aot build`: what can be built, and building it (no GPU needed)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..store import Store
from .common import emit, json_option, load_matrix, pass_store, variants_option

if TYPE_CHECKING:
    from .. import build as build_mod
    from ..executors import Executor
    from ..skus import Sku
    from ..variants import Matrix, Variant


@click.command()
@variants_option("Variants file holding the SKU table (default: variants.toml).")
@json_option()
def skus(variants_file: Path | None, as_json: bool) -> None:
    """List the GPU SKUs: arch target, SM count, L2 size, CUDA major."""
    matrix = load_matrix(variants_file)
    rows = [f"{'sku':<14}{'arch':<9}{'SMs':>5}{'L2 MiB':>9}{'CUDA':>6}  description"]
    rows += [f"{s.name:<14}{s.arch:<9}{s.sm_count:>5}{s.l2_bytes / 2**20:>9.1f}{s.cuda_major:>6}  {s.description}"
             for s in matrix.skus.values()]
    doc = [{**s.target_facts(), "name": s.name, "description": s.description} for s in matrix.skus.values()]
    emit(as_json, doc, "\n".join(rows))


@click.command()
@click.option("--sku", help="Target SKU(s) from `fa4-aot skus`: h200, several as h200,b200-cu12, or all "
              "(required unless --from-misses).")
@variants_option()
@click.option("--only", multiple=True, metavar="NAME", help="Build only these [[variants]] entries (repeatable).")
@click.option("--jobs", "-j", default=1, show_default=True, type=click.IntRange(1, 256),
              help="Compiler processes (local executor; a new local Ray instance gets this many CPUs); each "
                   "needs about 1.5 GB of memory.")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="local: a process pool here; ray: tasks on a Ray cluster (pip install 'fa4-aot[farm]').")
@click.option("--ray-address", envvar="RAY_ADDRESS", help="Ray cluster to use ($RAY_ADDRESS; default: start a "
              "local one for this build).")
@click.option("--ray-node-ip", envvar="FA4_AOT_RAY_NODE_IP", help="This host's address in the Ray cluster, when "
              "Ray's guess is wrong (e.g. 127.0.0.1 for a cluster started with --node-ip-address=127.0.0.1).")
@click.option("--push", "push_url", metavar="URL", help="With --executor ray: workers publish each kernel to this "
              "server (needs --token) instead of sending it back to this store.")
@click.option("--dry-run", is_flag=True, help="Plan only: count the kernels and show the calls FA4 rejects.")
@click.option("--from-misses", is_flag=True, help="Build the calls clients reported missing to --server, then push.")
@click.option("--server", envvar="FA4_AOT_SERVER", help="Server for --from-misses ($FA4_AOT_SERVER).")
@click.option("--token", envvar="FA4_AOT_TOKEN", help="Publish token for --from-misses and --push ($FA4_AOT_TOKEN).")
@json_option("Print one JSON document: counts, kernel keys, failures (a list of them, one per SKU, when several "
             "SKUs are built).")
@pass_store
def build(store: Store, sku: str | None, variants_file: Path | None, only: tuple[str, ...], jobs: int,
          executor: str, ray_address: str | None, ray_node_ip: str | None, push_url: str | None, dry_run: bool,
          from_misses: bool, server: str | None, token: str | None, as_json: bool) -> None:
    """Cross-compile FA4 kernels for one or more SKUs into the store (no GPU needed).

    Every [[variants]] entry is crossed with its shape grid and run through FA4's own dispatch on fake
    tensors; each distinct kernel is compiled once. Kernels already in the store are not rebuilt.
    Exits 1 if any call or kernel failed; the rest are still built.
    """
    matrix = load_matrix(variants_file)
    if from_misses:
        _build_misses(store, matrix, server, token, jobs, as_json)
        return
    if not sku:
        raise click.UsageError("--sku is required (or --from-misses with --server)")
    if push_url and executor != "ray":
        raise click.UsageError("--push needs --executor ray; with the local executor, run `fa4-aot push` after it")
    targets = list(matrix.skus.values()) if sku == "all" else [matrix.sku(s.strip()) for s in sku.split(",")]
    chosen = matrix.select(list(only))
    ex = _executor(executor, jobs, ray_address, ray_node_ip, push_url, token)
    if not as_json:
        where = f"Ray ({ray_address or 'local'})" if executor == "ray" else f"{jobs} job(s)"
        click.echo(f"building {', '.join(t.name for t in targets)} into {push_url or store.root} on {where}", err=True)
    # stdout carries only the result: what an executor prints (Ray reports dead workers there) goes to stderr
    with contextlib.redirect_stdout(sys.stderr):
        try:
            reports = [_build_one(matrix, t, store, chosen, ex, dry_run, as_json, push_url, token) for t in targets]
        finally:
            ex.close()
    docs = [r.to_dict() for r in reports]
    emit(as_json, docs[0] if len(docs) == 1 else docs, "\n".join(_build_lines(reports, dry_run)))
    if any(r.failed for r in reports):
        sys.exit(1)


def _executor(kind: str, jobs: int, address: str | None, node_ip: str | None, push_url: str | None,
              token: str | None) -> Executor:
    if kind == "ray":
        from ..farm import RayExecutor

        return RayExecutor(address, num_cpus=jobs, push=push_url, token=token, node_ip=node_ip)
    from ..executors import LocalExecutor

    return LocalExecutor(jobs)


def _build_one(matrix: Matrix, target: Sku, store: Store, chosen: list[Variant], ex: Executor, dry_run: bool,
               as_json: bool, push_url: str | None, token: str | None) -> build_mod.Report:
    from .. import build as build_mod

    present = None
    if push_url:  # the server, not this store, is where built kernels go: ask it what it has
        from ..remote import Remote

        present = Remote(push_url, token=token).kernel_keys(target.name).__contains__
    work = build_mod.matrix_work(matrix, target, chosen)
    return build_mod.build_calls(target, store, work, progress=_progress(as_json, target.name), dry_run=dry_run,
                                 executor=ex, present=present)


def _build_lines(reports: list[build_mod.Report], dry_run: bool) -> list[str]:
    lines = []
    for report in reports:
        lines += [f"FAILED {r.variant}: {r.call}: {r.error}" for r in report.call_failures]
        lines.append(f"{report.sku}: {report.calls} calls, {len(report.results)} kernels: {report.count('built')} "
                     f"built, {report.count('present')} already present, "
                     + (f"{report.count('planned')} to build, " if dry_run else "")
                     + f"{report.failed} failed ({report.seconds:.0f}s)")
    return lines


def _progress(as_json: bool, sku: str) -> Callable[[int, int, build_mod.Result], None]:
    """One line per kernel on stderr (none with --json)."""

    def progress(done: int, total: int, result: build_mod.Result) -> None:
        if as_json:
            return
        mark = {"built": "ok", "present": "--", "failed": "FAIL"}[result.status]
        line = f"[{sku} {done}/{total}] {mark} {result.family} {result.seconds:.1f}s  {result.call}"
        click.echo(line + (f"\n    {result.error}" if result.error else ""), err=True)

    return progress


def _build_misses(store: Store, matrix: Matrix, server: str | None, token: str | None, jobs: int,
                  as_json: bool) -> None:
    from ..remote import Remote
    from ..transfer import rebuild_misses

    if not server:
        raise click.UsageError("--from-misses needs --server (or FA4_AOT_SERVER)")
    reports = rebuild_misses(matrix, store, Remote(server, token=token), jobs=jobs)
    docs = [r.to_dict() for r in reports]
    lines = [f"{d['sku']}: {d['calls']} missed call(s), {d['built']} built, {d['present']} present, "
             f"{d['failed']} failed; pushed to {server}" for d in docs] or [f"{server} reports no buildable misses"]
    emit(as_json, docs, "\n".join(lines))
    if any(d["failed"] for d in docs):
        sys.exit(1)
