"""`fa4-aot hosts`, `fa4-aot skus` and `fa4-aot build`: what can be built, and building it (no GPU needed). The
commands read their options here; building.py runs a build over its SKUs, reporting.py says what it did."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ..store import Store
from . import reporting
from .building import Run, executor_for
from .common import cpu_count, emit, json_option, load_matrix, pass_store, plural, remote_for, variants_option
from .progress import quiet_option

if TYPE_CHECKING:
    from ..domain.skus import Sku
    from ..matrix.variants import Matrix


@click.command()
@json_option()
def hosts(as_json: bool) -> None:
    """List the host targets a SKU's `host` can name: the CPU its GPU hosts run, which every object's host code
    and every lean library is built for (whatever the build machine's CPU), and whether this machine's CPU
    runs code built for each."""
    from ..domain import hosts as host_targets

    cpu = host_targets.detect()
    doc = [{"name": t.name, "arch": t.arch, "llvm_triple": t.triple, "llvm_cpu": t.cpu, "needs": list(t.needs),
            "description": t.description, "runs_here": not host_targets.lacks(t, cpu)}
           for t in host_targets.TARGETS.values()]
    rows = [f"{'host':<13}{'arch':<9}{'runs here':<11}description"]
    rows += [f"{d['name']:<13}{d['arch']:<9}{'yes' if d['runs_here'] else 'no':<11}{d['description']}" for d in doc]
    emit(as_json, doc, "\n".join(rows))


@click.command()
@variants_option("Variants file holding the SKU table (default: variants.toml).")
@click.option("--detect", is_flag=True, help="On a GPU host: the table row for the local device, with sources, "
                                             "and which row serves it now.")
@json_option()
def skus(variants_file: Path | None, detect: bool, as_json: bool) -> None:
    """List the GPU SKUs: arch target, SM count, L2 size, CUDA major, and where each figure comes from (the
    comments beside each [skus.NAME] in variants.toml)."""
    from ..domain.sku_table import sources
    from ..domain.tomlsrc import TomlSource

    matrix = load_matrix(variants_file)
    if detect:
        _detect(matrix, as_json)
        return
    found = sources(TomlSource(matrix.path).lines)  # by table: NAME-cu12 comes from [skus.NAME]
    source = {s.name: found.get(s.name) or found.get(s.name.removesuffix(f"-cu{s.cuda_major}"), "")
              for s in matrix.skus.values()}
    rows = [f"{'sku':<14}{'arch':<9}{'SMs':>5}{'L2 MiB':>9}{'CUDA':>6}  {'host':<13}description"]
    for s in matrix.skus.values():
        rows.append(f"{s.name:<14}{s.arch:<9}{s.sm_count:>5}{s.l2_bytes / 2**20:>9.1f}{s.cuda_major:>6}  "
                    f"{s.host:<13}{s.description}")
        rows += [f"{'':14}source: {source[s.name]}"] if source.get(s.name) else []
    doc = [{**s.target_facts(), "name": s.name, "description": s.description, "source": source.get(s.name, "")}
           for s in matrix.skus.values()]
    emit(as_json, doc, "\n".join(rows))


def _detect(matrix: Matrix, as_json: bool) -> None:
    from ..domain.devices import detect_device, row_for
    from ..domain.matching import select

    device = detect_device()
    row = row_for(device)
    sku, constants, trace = select(matrix.skus, device)
    doc = {"row": row, "served_by": sku.name, "constants": constants.__dict__, "trace": trace}
    lines = [f"[skus.{row['name']}]"]
    lines += [f"{k} = {v!r}".replace("'", '"') + f"  # {row['sources'].get(k, '')}".rstrip(" #")
              for k, v in row.items() if k not in ("name", "sources")]
    lines += ["", f"served now by [skus.{sku.name}]:", *(f"  {t}" for t in trace)]
    emit(as_json, doc, "\n".join(lines))


@click.command()
@click.option("--sku", help="Target SKU(s) from `fa4-aot skus`: h200, several as h200,b200-cu12, or all "
              "(required unless --from-misses).")
@variants_option()
@click.option("--only", multiple=True, metavar="NAME", help="Build only these [[variants]] entries (repeatable).")
@click.option("--jobs", "-j", default=lambda: min(256, cpu_count()), show_default="this host's CPU count",
              type=click.IntRange(1, 256),
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
@click.option("--dry-run", is_flag=True, help="Plan only: kernels per variant, the estimated build time, the "
              "calls FA4 rejects and those the known-bad registry refuses.")
@click.option("--from-misses", is_flag=True, help="Build the kernels clients reported missing: to --server (then "
              "push), else those recorded in the local store (`fa4-aot misses`).")
@click.option("--server", envvar="FA4_AOT_SERVER", help="Server for --from-misses ($FA4_AOT_SERVER).")
@click.option("--token", envvar="FA4_AOT_TOKEN", help="Publish token for --from-misses and --push ($FA4_AOT_TOKEN).")
@click.option("--model", "model_arg", metavar="NAME_OR_CONFIG_JSON",
              help="Build what this model runs instead of the matrix: a catalog name (`fa4-aot models`) or a "
                   "Hugging Face config.json.")
@click.option("--tp", "tp_arg", default="1", show_default=True, help="TP degrees for --model, e.g. 1,2,4,8.")
@click.option("--workload", "workload_arg", default="train,prefill,decode", show_default=True,
              help="Workloads for --model: train, prefill, decode.")
@click.option("--calls", "calls_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Build exactly these calls: JSON lines as FA4_AOT_RECORD writes them (see `fa4-aot coverage`).")
@click.option("--family", type=click.Choice(["fa4", "tirx"]), default="fa4", show_default=True,
              help="fa4: FA4's CuTe DSL kernels; tirx: the TIRx FA4 kernels of the variants file's [[tirx]] entries "
                   "(--only picks entries), compiled in .venv-tirx (docs/tirx.md).")
@json_option("Print one JSON document on stdout: counts, kernel keys, failures (a list of them, one per SKU, when "
             "several SKUs are built); per-kernel JSON lines on stderr.")
@quiet_option
@pass_store
def build(store: Store, sku: str | None, variants_file: Path | None, only: tuple[str, ...], jobs: int,
          executor: str, ray_address: str | None, ray_node_ip: str | None, push_url: str | None, dry_run: bool,
          from_misses: bool, server: str | None, token: str | None, model_arg: str | None, tp_arg: str,
          workload_arg: str, calls_file: Path | None, family: str, as_json: bool, quiet: bool) -> None:
    """Cross-compile FA4 kernels for one or more SKUs into the store (no GPU needed).

    Every [[variants]] entry is planned through FA4's own dispatch on fake tensors: at every batch and
    sequence length (shape-complete, no `shapes`) or at the points of its shape grid. Each distinct
    kernel is compiled once. Kernels already in the store are not rebuilt. With --model, the model's
    signatures per TP degree (shape-complete) replace the matrix; with --calls, exactly those calls.
    Exits 1 if any call or kernel failed; the rest are still built. Calls the known-bad registry names
    (`fa4-aot known-bad`) are refused, with the reason, and are no failure (FA4_AOT_CERTIFIED=off builds them).
    """
    matrix = load_matrix(variants_file)
    if from_misses:
        _build_misses(store, matrix, server, token, jobs, as_json, dry_run)
        return
    targets = _targets(matrix, sku, executor, push_url)
    if family == "tirx":
        from .tirx_build import build_tirx, refuse_options

        refuse_options(dry_run=dry_run, model=model_arg, calls=calls_file, executor=executor != "local")

        build_tirx(store, matrix, targets, list(only), as_json, quiet)
        return
    chosen, work = matrix.select(list(only)), explicit_work(model_arg, tp_arg, workload_arg, calls_file)
    ex = executor_for(executor, jobs, ray_address, ray_node_ip, push_url, token)
    if not (as_json or quiet):
        click.echo(reporting.banner(targets, push_url or store.root, executor, ray_address, jobs, dry_run), err=True)
    reports, stop = Run(matrix, store, work, chosen, ex, dry_run, push_url, token).each(targets, quiet, as_json)
    docs, lines = reporting.documents(reports, store, targets, jobs, dry_run)
    emit(as_json, docs[0] if len(docs) == 1 else docs, "\n".join(lines))
    if any(r.interrupted for r in reports):
        sys.exit(stop.exit_code)
    if any(r.failed for r in reports):
        sys.exit(1)


def _targets(matrix: Matrix, sku: str | None, executor: str, push_url: str | None) -> list[Sku]:
    """The SKUs --sku names (all: every row of the table), once --sku and --push are known to make sense."""
    if not sku:
        raise click.UsageError("--sku is required (or --from-misses)")
    if push_url and executor != "ray":
        raise click.UsageError("--push needs --executor ray; with the local executor, run `fa4-aot push` after it")
    return list(matrix.skus.values()) if sku == "all" else [matrix.sku(s.strip()) for s in sku.split(",")]


def explicit_work(model_arg: str | None, tp_arg: str, workload_arg: str,
                  calls_file: Path | None) -> list[Any] | None:
    """(label, call or signature) pairs for --model or --calls; None to build the variants matrix."""
    if model_arg and calls_file:
        raise click.UsageError("give at most one of --model and --calls")
    if calls_file:
        from ..compile.coverage import read_calls

        return [(calls_file.name, c) for c in read_calls(calls_file)]
    if not model_arg:
        return None
    from ..matrix import models, modelwork
    from .model_cmds import parse_tps, parse_workloads

    model, tps = models.resolve(model_arg), parse_tps(tp_arg)
    modelwork.check_tps(model, tps)
    return modelwork.work(model, tps, parse_workloads(workload_arg))


def _build_misses(store: Store, matrix: Matrix, server: str | None, token: str | None, jobs: int,
                  as_json: bool, dry_run: bool) -> None:
    """--from-misses: build the kernels the server's clients missed (--server; pushed there) or those this store
    recorded, and say per SKU what was built; exit 1 if any failed. With --dry-run, plan only: nothing is
    written to the store and nothing is pushed. Misses are counted as `fa4-aot misses` counts them."""
    from ..compile.rebuild import build_misses, rebuild_misses

    if server:
        reports = rebuild_misses(matrix, store, remote_for(server, token), jobs=jobs, dry_run=dry_run)
    else:
        reports = build_misses(matrix, store, store.misses(), jobs=jobs, dry_run=dry_run)
    docs = [{**r.to_dict(), "dry_run": dry_run} for r in reports]
    done = "to build" if dry_run else "built"
    lines = [f"{d['sku']}: {plural(d['misses'], 'miss', 'misses')} ({plural(d['calls'], 'call')} and "
             f"signatures), {d['planned' if dry_run else 'built']} {done}, {d['present']} present, "
             f"{d['failed']} failed, {d['refused']} refused" + (f"; pushed to {server}" if server and not dry_run
                                                                 else "") for d in docs]
    lines += [f"FAILED {f['kernel_key'][:16]} {f['family']}: {f['error']}" for d in docs for f in d["failures"]]
    lines += [f"REFUSED {r['call']}: {r['error']}" for d in docs for r in d["refusals"]]
    lines += ["dry run: nothing was built or written; run it again without --dry-run to build"] if docs and dry_run \
        else []
    emit(as_json, docs, "\n".join(lines) or f"{server or store.root} reports no misses")
    if any(d["failed"] for d in docs):
        sys.exit(1)
