"""The one place that writes the `fa4-aot build` command suggested for what a store lacks: always the narrow
build of exactly what was asked for (a model's TP degrees and workloads, a calls file, or the one call that
missed), never the SKU's whole matrix (`fa4-aot build --sku h200` is 57 minutes on 2 cores for what one call
needs in seconds). KernelMissing from prepare() and the lean runtime, and `fa4-aot coverage`, all quote it."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

CALLS_FILE = "calls.jsonl"


def for_model(sku: str, model: str, tp: int, workloads: Iterable[str]) -> str:
    """The build of one model's signatures at one TP degree for `workloads`."""
    return f"fa4-aot build --sku {sku} --model {model} --tp {tp} --workload {','.join(workloads)}"


def for_calls_file(sku: str, calls_file: object) -> str:
    """The build of exactly the calls of a JSON-lines file (what FA4_AOT_RECORD writes)."""
    return f"fa4-aot build --sku {sku} --calls {calls_file}"


def for_call(sku: str, call: Mapping[str, Any] | None) -> str:
    """The build of one call (Call.to_dict()): append it to a calls file, then build that file. Without a call
    (a kernel FA4 asked for outside any known call) the way to a calls file is recording one."""
    if call is None:
        return (f"record the call with FA4_AOT_RECORD={CALLS_FILE}, then `{for_calls_file(sku, CALLS_FILE)}`")
    line = json.dumps(dict(call), sort_keys=True, separators=(",", ":"))
    return f"`echo '{line}' >> {CALLS_FILE} && {for_calls_file(sku, CALLS_FILE)}`"
