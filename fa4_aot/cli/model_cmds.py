"""`fa4-aot models` and `fa4-aot coverage`: the model catalog, and "would this compile?" on a CPU host.

Also the --tp / --workload parsing that `fa4-aot build --model` shares."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..errors import Fa4AotError
from ..store import Store
from .common import emit, existing, json_option, load_matrix, pass_store, variants_option

if TYPE_CHECKING:
    from ..matrix.models import Model


def parse_tps(value: str) -> tuple[int, ...]:
    """'1,2,4,8' -> (1, 2, 4, 8). Raises click.BadParameter naming the bad part."""
    try:
        tps = tuple(int(x) for x in value.split(",") if x.strip())
    except ValueError as e:
        raise click.BadParameter(f"{value!r}: expected TP degrees such as 1,2,4,8") from e
    if not tps or any(t < 1 for t in tps):
        raise click.BadParameter(f"{value!r}: expected positive TP degrees such as 1,2,4,8")
    return tps


def parse_workloads(value: str) -> tuple[str, ...]:
    from ..matrix.models import WORKLOADS

    chosen = tuple(w.strip() for w in value.split(",") if w.strip())
    bad = [w for w in chosen if w not in WORKLOADS]
    if not chosen or bad:
        raise click.BadParameter(f"{value!r}: allowed workloads: {', '.join(WORKLOADS)} (comma-separated)")
    return chosen


@click.command(name="models")
@json_option()
def models_(as_json: bool) -> None:
    """List the model catalog: heads, KV heads, head dims, window, softcap, sinks and the source of the figures."""
    from ..matrix import models

    catalog = models.catalog()
    w = max([16, *map(len, catalog)]) + 2  # the name column fits the longest name
    rows = [f"{'model':<{w}}{'kind':<9}{'heads':>6}{'kv':>5}{'dims':>9}  {'dtype':<6}{'attention':<34}source"]
    for m in catalog.values():
        dims = f"{m.head_dim}" if m.head_dim == m.head_dim_v else f"{m.head_dim}/{m.head_dim_v}"
        rows.append(f"{m.name:<{w}}{m.kind:<9}{m.heads:>6}{m.kv_heads:>5}{dims:>9}  {m.dtype:<6}"
                    f"{_attention(m):<34}{m.source}")
    rows.append(f"{len(catalog)} models; `fa4-aot build --sku SKU --model NAME --tp 1,2,4,8` builds one")
    emit(as_json, [m.to_dict() for m in catalog.values()], "\n".join(rows))


def _attention(m: Model) -> str:
    layers = {"global": "causal", "local": "window", "mixed": "causal+window"}[m.layers]
    kind = "full" if m.kind == "encoder" else layers
    parts = [kind, f"w={m.window}" if m.window else "", f"softcap={m.softcap:g}" if m.softcap else "",
             "sink" if m.sink else ""]
    return " ".join(p for p in parts if p)


@click.command()
@click.option("--sku", required=True, help="SKU to judge against, e.g. h200 (`fa4-aot skus`).")
@click.option("--model", "model_arg", metavar="NAME_OR_CONFIG_JSON",
              help="A catalog model (`fa4-aot models`) or a Hugging Face config.json: judge its signatures.")
@click.option("--tp", "tp_arg", default="1", show_default=True, help="TP degrees for --model, e.g. 1,2,4,8 (the "
              "default is build's and pull's, so a model is judged as it was built).")
@click.option("--workload", "workload_arg", default="train,prefill,decode", show_default=True,
              help="Workloads for --model: train, prefill, decode.")
@click.option("--calls", "calls_file", type=click.Path(dir_okay=False, path_type=Path),
              help="JSON lines of calls, as FA4_AOT_RECORD writes them: judge each call.")
@click.option("--runtime", type=click.Choice(["fa4", "lean"]), default="fa4", show_default=True,
              help="Which runtime to judge: fa4 (FA4 over fa4_aot.install()) or lean (fa4_aot.flash_attn_func).")
@variants_option("Variants file holding the SKU table (default: variants.toml).")
@click.option("--jobs", "-j", default=1, show_default=True, type=click.IntRange(1, 256), help="Planning processes.")
@json_option()
@pass_store
def coverage(store: Store, sku: str, model_arg: str | None, tp_arg: str, workload_arg: str,
             calls_file: Path | None, runtime: str, variants_file: Path | None, jobs: int, as_json: bool) -> None:
    """Would these calls run from the store without compiling? No GPU needed.

    --runtime fa4 (default): runs FA4's dispatch on fake tensors for the SKU (as a build plans) and looks every
    kernel up in the store. --runtime lean: finds each call's recipe region in the store (as the lean runtime
    does; no FA4 needed) and looks up the kernels it names, with a library for the SKU's host; a model signature
    needs regions over its whole size space. Prints served, missing or refused (the known-bad registry names it:
    `fa4-aot known-bad`) per call (--calls) or per model signature (--model), what is missing and the command that
    adds it, and how many of the stored kernels are certified, failed or unchecked (`fa4-aot certify`). Exits 1
    when anything is missing or refused.
    """
    from ..compile import coverage as cov
    from ..matrix import models, modelwork

    if bool(model_arg) == bool(calls_file):
        raise click.UsageError("give exactly one of --model NAME_OR_CONFIG_JSON and --calls FILE")
    target = load_matrix(variants_file).sku(sku)
    if calls_file:
        calls = cov.read_calls(calls_file)  # the arguments' errors first, then the store's
        existing(store)  # a mistyped --cache-dir is no store, not one that serves nothing
        verdicts = cov.check_calls(target, store, calls, calls_file, jobs=jobs, runtime=runtime)
    else:
        assert model_arg is not None
        model = models.resolve(model_arg)
        tps, workloads = parse_tps(tp_arg), parse_workloads(workload_arg)
        modelwork.check_tps(model, tps)
        existing(store)
        verdicts = cov.check_model(target, store, model, tps, workloads, model_arg, jobs=jobs, runtime=runtime)
    doc = {"sku": sku, "runtime": runtime, "store": str(store.root), **cov.summary(verdicts)}
    if not verdicts:  # e.g. --calls of an empty file: nothing was checked
        raise Fa4AotError("nothing to check: the request selects no call (see the lines above); "
                          "`fa4-aot coverage --help` shows the options")
    emit(as_json, doc, "\n".join(cov.lines(verdicts)))
    if not doc["ok"]:
        sys.exit(1)
