"""`fa4-aot`: a thin click shell over the library. Fa4AotError becomes one line on stderr and exit 1."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

import click

from . import config
from .errors import Fa4AotError
from .store import Store, VerifyReport


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except Fa4AotError as e:
            raise click.ClickException(str(e)) from e


def _store(ctx: click.Context) -> Store:
    return Store(ctx.obj["cache_dir"])


def _matrix(path: Path | None) -> Any:
    from . import variants

    return variants.load(path or config.default_variants_file())


def _emit(as_json: bool, doc: Any, text: str) -> None:
    click.echo(json.dumps(doc, indent=1, sort_keys=True) if as_json else text)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path), envvar="FA4_AOT_CACHE",
              help="Kernel store (default: $FA4_AOT_CACHE, else cache/ of this checkout, else ~/.cache/fa4-aot).")
@click.pass_context
def main(ctx: click.Context, cache_dir: Path | None) -> None:
    """Ahead-of-time FlashAttention-4 kernels.

    \b
    Typical use:
      fa4-aot skus                      # the GPU SKUs variants.toml knows
      fa4-aot build --sku h200 -j 2     # cross-compile the default matrix (no GPU needed)
      fa4-aot list --sku h200           # what the store holds
      fa4-aot verify                    # re-hash every object
    Then on a GPU host: import fa4_aot; fa4_aot.install()  (or fa4_aot.load(q.shape, causal=True)).
    """
    ctx.obj = {"cache_dir": cache_dir or config.default_cache_dir()}


@main.command()
@click.option("--variants", "variants_file", type=click.Path(dir_okay=False, path_type=Path), envvar="FA4_AOT_VARIANTS",
              help="Variants file holding the SKU table (default: variants.toml).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def skus(variants_file: Path | None, as_json: bool) -> None:
    """List the GPU SKUs: arch target, SM count, L2 size, CUDA major."""
    matrix = _matrix(variants_file)
    rows = [f"{'sku':<14}{'arch':<9}{'SMs':>5}{'L2 MiB':>9}{'CUDA':>6}  description"]
    rows += [f"{s.name:<14}{s.arch:<9}{s.sm_count:>5}{s.l2_bytes / 2**20:>9.1f}{s.cuda_major:>6}  {s.description}"
             for s in matrix.skus.values()]
    doc = [{**s.target_facts(), "name": s.name, "description": s.description} for s in matrix.skus.values()]
    _emit(as_json, doc, "\n".join(rows))


@main.command()
@click.option("--sku", help="Target SKU(s) from `fa4-aot skus`: h200, several as h200,b200-cu12, or all "
              "(required unless --from-misses).")
@click.option("--variants", "variants_file", type=click.Path(dir_okay=False, path_type=Path), envvar="FA4_AOT_VARIANTS",
              help="Variant matrix (default: variants.toml).")
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
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document: counts, kernel keys, failures "
              "(a list of them, one per SKU, when several SKUs are built).")
@click.pass_context
def build(ctx: click.Context, sku: str | None, variants_file: Path | None, only: tuple[str, ...], jobs: int,
          executor: str, ray_address: str | None, ray_node_ip: str | None, push_url: str | None, dry_run: bool,
          from_misses: bool, server: str | None, token: str | None, as_json: bool) -> None:
    """Cross-compile FA4 kernels for one or more SKUs into the store (no GPU needed).

    Every [[variants]] entry is crossed with its shape grid and run through FA4's own dispatch on fake
    tensors; each distinct kernel is compiled once. Kernels already in the store are not rebuilt.
    Exits 1 if any call or kernel failed; the rest are still built.
    """
    from . import build as build_mod

    matrix = _matrix(variants_file)
    if from_misses:
        _build_misses(ctx, matrix, server, token, jobs, as_json)
        return
    if not sku:
        raise click.UsageError("--sku is required (or --from-misses with --server)")
    if push_url and executor != "ray":
        raise click.UsageError("--push needs --executor ray; with the local executor, run `fa4-aot push` after it")
    targets = list(matrix.skus.values()) if sku == "all" else [matrix.sku(s.strip()) for s in sku.split(",")]
    chosen = matrix.select(list(only))
    store = _store(ctx)
    ex = _executor(executor, jobs, ray_address, ray_node_ip, push_url, token)
    if not as_json:
        where = f"Ray ({ray_address or 'local'})" if executor == "ray" else f"{jobs} job(s)"
        click.echo(f"building {', '.join(t.name for t in targets)} into {push_url or store.root} on {where}", err=True)
    # stdout carries only the result: what an executor prints (Ray reports dead workers there) goes to stderr
    with contextlib.redirect_stdout(sys.stderr):
        try:
            reports = [_build_one(build_mod, matrix, t, store, chosen, ex, dry_run, as_json, push_url, token)
                       for t in targets]
        finally:
            ex.close()
    docs = [r.to_dict() for r in reports]
    _emit(as_json, docs[0] if len(docs) == 1 else docs, "\n".join(_build_lines(reports, dry_run)))
    if any(r.failed for r in reports):
        sys.exit(1)


def _executor(kind: str, jobs: int, address: str | None, node_ip: str | None, push_url: str | None,
              token: str | None) -> Any:
    if kind == "ray":
        from .farm import RayExecutor

        return RayExecutor(address, num_cpus=jobs, push=push_url, token=token, node_ip=node_ip)
    from .executors import LocalExecutor

    return LocalExecutor(jobs)


def _build_one(build_mod: Any, matrix: Any, target: Any, store: Store, chosen: Any, ex: Any, dry_run: bool,
               as_json: bool, push_url: str | None, token: str | None) -> Any:
    def progress(done: int, total: int, result: Any) -> None:
        if as_json:
            return
        mark = {"built": "ok", "present": "--", "failed": "FAIL"}[result.status]
        line = f"[{target.name} {done}/{total}] {mark} {result.family} {result.seconds:.1f}s  {result.call}"
        click.echo(line + (f"\n    {result.error}" if result.error else ""), err=True)

    present = None
    if push_url:  # the server, not this store, is where built kernels go: ask it what it has
        from .remote import Remote

        present = Remote(push_url, token=token).kernel_keys(target.name).__contains__
    work = build_mod.matrix_work(matrix, target, chosen)
    return build_mod.build_calls(target, store, work, progress=progress, dry_run=dry_run, executor=ex,
                                 present=present)


def _build_lines(reports: list[Any], dry_run: bool) -> list[str]:
    lines = []
    for report in reports:
        lines += [f"FAILED {r.variant}: {r.call}: {r.error}" for r in report.call_failures]
        lines.append(f"{report.sku}: {report.calls} calls, {len(report.results)} kernels: {report.count('built')} "
                     f"built, {report.count('present')} already present, "
                     + (f"{report.count('planned')} to build, " if dry_run else "")
                     + f"{report.failed} failed ({report.seconds:.0f}s)")
    return lines


def _build_misses(ctx: click.Context, matrix: Any, server: str | None, token: str | None, jobs: int,
                  as_json: bool) -> None:
    from .remote import Remote
    from .transfer import rebuild_misses

    if not server:
        raise click.UsageError("--from-misses needs --server (or FA4_AOT_SERVER)")
    reports = rebuild_misses(matrix, _store(ctx), Remote(server, token=token), jobs=jobs)
    docs = [r.to_dict() for r in reports]
    lines = [f"{d['sku']}: {d['calls']} missed call(s), {d['built']} built, {d['present']} present, "
             f"{d['failed']} failed; pushed to {server}" for d in docs] or [f"{server} reports no buildable misses"]
    _emit(as_json, docs, "\n".join(lines))
    if any(d["failed"] for d in docs):
        sys.exit(1)


@main.command(name="list")
@click.option("--sku", help="Only this SKU.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document with every entry.")
@click.pass_context
def list_(ctx: click.Context, sku: str | None, as_json: bool) -> None:
    """List the kernels in the store."""
    from dataclasses import asdict

    entries = list(_store(ctx).entries(sku))
    rows = [f"{e.kernel_key[:16]}  {e.sku:<10} {e.family:<26} {e.size:>9} B  {e.call}" for e in entries]
    rows.append(f"{len(entries)} kernel(s), {sum(e.size for e in entries)} bytes")
    _emit(as_json, [asdict(e) for e in entries], "\n".join(rows))


@main.command()
@click.option("--quarantine/--no-quarantine", default=True, show_default=True,
              help="Move every bad object, bad or dangling entry and symlink to <cache>/quarantine/<time>/ so no "
                   "load sees it (--no-quarantine: only report).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def verify(ctx: click.Context, quarantine: bool, as_json: bool) -> None:
    """Re-hash every object and check every index entry; quarantine what fails. Exits 1 on any problem."""
    store = _store(ctx)
    report = store.verify(quarantine=quarantine)
    doc = {"objects": report.objects_checked, "entries": report.entries_checked, "ok": report.ok,
           "bad_objects": [{"expected": e, "actual": a} for e, a in report.bad_objects],
           "dangling_entries": report.dangling_entries,
           "bad_entries": [{"path": p, "reason": r} for p, r in report.bad_entries],
           "symlinks": report.symlinks, "unexpected": report.unexpected,
           "quarantined": [{"path": p, "to": to} for p, to in report.quarantined.items()],
           "quarantine_dir": report.quarantine_dir}
    _emit(as_json, doc, "\n".join(_verify_lines(store, report)))
    if not report.ok:
        sys.exit(1)


def _verify_lines(store: Store, report: VerifyReport) -> list[str]:
    def rel(path: Path) -> str:
        return str(path.relative_to(store.root))

    def went(path: str) -> str:
        return f" -> quarantined to {report.quarantined[path]}" if path in report.quarantined else ""

    lines = [f"CORRUPT object {exp}: bytes hash to {act}{went(rel(store.object_path(exp)))}"
             for exp, act in report.bad_objects]
    lines += [f"DANGLING entry {k}: its object is missing{went(rel(store.entry_path(k)))}"
              for k in report.dangling_entries]
    lines += [f"BAD entry {p}: {why}{went(p)}" for p, why in report.bad_entries]
    lines += [f"SYMLINK {p}: refused, never followed{went(p)}" for p in report.symlinks]
    problems = len(lines)
    lines += [f"UNEXPECTED {p}: not a store name; no reader opens it (ignored)" for p in report.unexpected]
    if report.ok:
        verdict = "ok"
    elif report.quarantine_dir:
        verdict = (f"{problems} problem(s), moved to {report.quarantine_dir}; rebuild (`fa4-aot build`) or pull "
                   "what they held")
    else:
        verdict = f"{problems} problem(s); `fa4-aot verify` quarantines them, then rebuild with `fa4-aot build`"
    lines.append(f"{report.objects_checked} objects, {report.entries_checked} entries checked: {verdict}")
    return lines


@main.command()
@click.option("--dry-run", is_flag=True, help="Only say what would be removed.")
@click.option("--min-age", default=3600.0, show_default=True, type=click.FloatRange(0),
              help="Keep unreferenced objects younger than this many seconds: a running build writes each "
                   "object just before its index entry.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def gc(ctx: click.Context, dry_run: bool, min_age: float, as_json: bool) -> None:
    """Remove objects no index entry references, and temp files of dead writers (quarantine/ is left alone)."""
    report = _store(ctx).gc(dry_run=dry_run, min_age=min_age)
    verb = "would remove" if dry_run else "removed"
    doc = {"dry_run": dry_run, "objects": report.removed_objects, "temp_files": report.removed_temp_files,
           "bytes": report.bytes_freed}
    _emit(as_json, doc, f"{verb} {len(report.removed_objects)} object(s) ({report.bytes_freed} bytes) "
                        f"and {report.removed_temp_files} temp file(s)")


@main.command()
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def misses(ctx: click.Context, as_json: bool) -> None:
    """Kernels that clients in fallback mode needed and compiled themselves: add them to variants.toml."""
    from dataclasses import asdict

    found = _store(ctx).misses()
    rows = [f"{m.when}  {m.sku:<10} {m.family:<26} {m.kernel_key[:16]}" for m in found]
    rows.append(f"{len(found)} miss(es)")
    _emit(as_json, [asdict(m) for m in found], "\n".join(rows))


from . import cli_server, cli_trust  # noqa: E402,F401  (register serve, token, push, pull, keys, sign, revoke)
