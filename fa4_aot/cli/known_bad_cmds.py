"""`fa4-aot known-bad`: the known-bad registry in force for a store and SKU (domain/known_bad.py): the project's
file and the entries the store's certification measured for the SKU (trust.certified.registry_for)."""

from __future__ import annotations

import json
from typing import Any

import click

from ..store import Store
from .common import check_sku, emit, json_option, pass_store, plural


@click.command(name="known-bad")
@click.option("--sku", help="Add the entries this store's certification measured for this SKU (`fa4-aot certify`).")
@json_option("Print one JSON document: the policy, the registry's revision and every entry with its origin.")
@pass_store
def known_bad_(store: Store, sku: str | None, as_json: bool) -> None:
    """List the known-bad registry: per entry its id, where it holds (flash-attn-4 and nvidia-cutlass-dsl
    versions, arch, parts, SKUs, kernels, the signature predicate), the symptom and its source, whether it is the
    project's (fa4_aot/domain/known_bad.toml) or this store's (measured by `fa4-aot certify`), and whether it holds
    for the installed toolchain. Builds refuse the calls it names, and both runtimes refuse to launch their
    kernels, unless FA4_AOT_CERTIFIED=off."""
    if sku is not None:
        check_sku(sku)
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
    entries = [{**b.to_dict(), "origin": "project" if b.id in ours else "store",
                "applies": _applies(b.flash_attn, tools.get("flash-attn-4", ""))
                and _applies(b.cutlass_dsl, tools.get("nvidia-cutlass-dsl", ""))} for b in registry.entries]
    return {"policy": policy, "revision": registry.revision, "file": str(known_bad.default_file()),
            "store": str(store.root), "sku": sku, "measured": sum(e["origin"] == "store" for e in entries),
            "toolchain": {k: tools.get(k, "") for k in ("flash-attn-4", "nvidia-cutlass-dsl")}, "entries": entries}


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
    tools = ", ".join(f"{k} {v}" for k, v in doc["toolchain"].items())
    measured = f"{doc['measured']} measured in {doc['store']} for {doc['sku']}" if doc["sku"] else \
        "give --sku to add what this store's certification measured"
    entries = plural(len(doc["entries"]), "entry", "entries")
    lines.append(f"registry revision {doc['revision']} ({doc['file']}): {entries}, {measured}; installed: {tools}; "
                 f"FA4_AOT_CERTIFIED={doc['policy']}")
    return lines
