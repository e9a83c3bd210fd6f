"""`fa4-aot known-bad`: the known-bad registry in force for a store and SKU (domain/known_bad.py): the project's
file and the entries the store's certification measured for the SKU (trust.certified.registry_for)."""

from __future__ import annotations

import json
from typing import Any

import click

from ..errors import Fa4AotError
from ..store import Store
from .common import check_sku, emit, json_option, pass_store, plural


@click.command(name="known-bad")
@click.option("--sku", help="Add the entries this store's certification measured for this SKU (`fa4-aot certify`).")
@click.option("--repro", "repro", metavar="ID", help="Print the one-file repro that certification wrote for the "
              "measured entry ID (needs --sku): a Python script needing only torch and flash-attn-4 on such a GPU, "
              "for an upstream issue. `fa4-aot known-bad --sku SKU --repro ID > repro.py && python repro.py`.")
@json_option("Print one JSON document: the policy, the registry's revision and every entry with its origin.")
@pass_store
def known_bad_(store: Store, sku: str | None, repro: str | None, as_json: bool) -> None:
    """List the known-bad registry: per entry its id, where it holds (flash-attn-4 and nvidia-cutlass-dsl
    versions, arch, parts, SKUs, kernels, the signature predicate), the symptom and its source, whether it is the
    project's (fa4_aot/domain/known_bad.toml) or this store's (measured by `fa4-aot certify`), and whether it holds
    for the installed toolchain. Builds refuse the calls it names, and both runtimes refuse to launch their
    kernels, unless FA4_AOT_CERTIFIED=off."""
    if sku is not None:
        check_sku(sku)
    if repro is not None:
        text = repro_of(store, sku, repro)
        emit(as_json, {"id": repro, "sku": sku, "repro": text}, text.rstrip("\n"))
        return
    doc = registry_doc(store, sku)
    emit(as_json, doc, "\n".join(_lines(doc)))


def registry_doc(store: Store, sku: str | None) -> dict[str, Any]:
    """The registry in force for `store` and `sku` (None: the project's file alone) as a JSON document."""
    from ..domain import known_bad
    from ..fa4 import toolchain
    from ..trust import certified

    policy = certified.policy_from_env()
    project = known_bad.load()
    registry = certified.registry_for(store, sku) if sku is not None else project
    tools, ours = toolchain(), {b.id for b in project.entries}
    written = certified.repros_for(store, sku) if sku is not None else {}
    entries = [{**b.to_dict(), "origin": "project" if b.id in ours else "store", "repro": b.id in written,
                "applies": _applies(b.flash_attn, tools.get("flash-attn-4", ""))
                and _applies(b.cutlass_dsl, tools.get("nvidia-cutlass-dsl", ""))} for b in registry.entries]
    return {"policy": policy, "revision": registry.revision, "file": str(known_bad.default_file()),
            "store": str(store.root), "sku": sku, "measured": sum(e["origin"] == "store" for e in entries),
            "toolchain": {k: tools.get(k, "") for k in ("flash-attn-4", "nvidia-cutlass-dsl")}, "entries": entries}


def repro_of(store: Store, sku: str | None, ident: str) -> str:
    """The repro certification wrote for measured entry `ident` of `sku` in `store`; Fa4AotError naming the ids
    that have one when it has none."""
    from ..trust import certified

    if sku is None:
        raise Fa4AotError("--repro needs --sku: repros are kept per SKU with the entries certification measured")
    written = certified.repros_for(store, sku)
    if ident not in written:
        have = ", ".join(sorted(written)) or "none"
        raise Fa4AotError(f"no repro for {ident!r} in {store.root} for SKU {sku} (entries with one: {have}); "
                          f"`fa4-aot known-bad --sku {sku}` lists the entries, `fa4-aot certify --sku {sku}` "
                          "writes them")
    return written[ident]


def _applies(allowed: tuple[str, ...], version: str) -> bool:
    return "*" in allowed or version in allowed


def _lines(doc: dict[str, Any]) -> list[str]:
    lines = []
    for e in doc["entries"]:
        where = [f"arch {','.join(e.get('arch', ['*']))}", f"flash-attn-4 {','.join(e.get('flash_attn', ['*']))}",
                 f"cutlass-dsl {','.join(e.get('cutlass_dsl', ['*']))}", f"parts {','.join(e.get('parts', []))}"]
        where += [f"sku {','.join(e['sku'])}"] if e.get("sku") else []
        where += [f"{len(e['kernel_keys'])} kernel(s)"] if e.get("kernel_keys") else []
        when = ", ".join(f"{name}={json.dumps(value)}" for name, value in sorted(e["when"].items()))
        lines += [f"{e['id']}  [{e['origin']}{'' if e['applies'] else ', not this toolchain'}]  {'  '.join(where)}",
                  f"    when: {when}", f"    symptom: {e['symptom']}", f"    source: {e['source']}"]
        if e.get("repro"):
            lines.append(f"    repro: fa4-aot known-bad --sku {doc['sku']} --repro {e['id']} > repro.py")
    tools = ", ".join(f"{k} {v}" for k, v in doc["toolchain"].items())
    measured = f"{doc['measured']} measured in {doc['store']} for {doc['sku']}" if doc["sku"] else \
        "give --sku to add what this store's certification measured"
    entries = plural(len(doc["entries"]), "entry", "entries")
    lines.append(f"registry revision {doc['revision']} ({doc['file']}): {entries}, {measured}; installed: {tools}; "
                 f"FA4_AOT_CERTIFIED={doc['policy']}")
    return lines
