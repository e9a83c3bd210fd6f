"""The worker side of a build: runs in a process configured for one SKU (fa4.configure), never in the driver.

Both executors (executors.py: a local process pool; farm.py: Ray) run these functions. `plan_calls` lists the
kernels of some work items (calls, or signatures planned at every shape); `compile_kernels` compiles the wanted
kernels of one call and hands each one, as its index entries (full key first, then the base key's signpost when
the kernel consumed SKU constants) plus its object bytes, to a sink: the local pool's sink writes the shared
store under a lock, Ray's returns the bytes to the driver or publishes them to a server. FA4 is reached only
through the seam, fa4_aot.fa4.
"""

from __future__ import annotations

import hashlib
import os
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from . import fa4, kernel_keys
from .calls import Call
from .errors import DiskFull
from .signature import Signature
from .skus import Sku
from .store import Entry

Wanted = tuple[str, str, str]  # (family, canonical compile-key JSON, kernel key)
# (family, ident, base kernel key, index into the work, a concrete call that makes FA4 choose it), rejected items
PlanOut = tuple[list[tuple[str, str, str, int, Call]], list[tuple[int, str]]]
Sink = Callable[[list[Entry], bytes], None]

_configured: list[Sku] = []


def configure(sku: Sku) -> None:
    """Point this process at `sku` once, before FA4 is imported. Raises BuildError if it already serves another."""
    if _configured:
        if _configured[0] != sku:
            from .errors import BuildError

            raise BuildError(f"worker {os.getpid()} is configured for {_configured[0].name}, not {sku.name}")
        return
    import warnings

    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # before torch loads: silences FakeTensor data_ptr notices
    warnings.filterwarnings("ignore")  # CuTe's per-argument notices and torch's FakeTensor data_ptr notice
    fa4.configure(sku)
    _configured.append(sku)


def plan_calls(sku: Sku, work: list[tuple[str, Call | Signature]]) -> PlanOut:
    """Every kernel the work items need (a Call: at its shapes; a Signature: at every shape), and the items FA4
    rejects."""
    configure(sku)  # first: planning imports FA4, which must see the SKU's arch
    tools = fa4.toolchain()
    kernels, failures = [], []
    for i, (_name, item) in enumerate(work):
        try:
            if isinstance(item, Call):
                found = {ident: (key, item) for ident, key in fa4.plan(item).items()}
            else:
                found = fa4.plan_signature(item, sku)
        except Exception as e:  # FA4 rejects the item for this SKU: report it, go on
            failures.append((i, one_line(e)))
            continue
        for (family, ident), (key, call) in found.items():
            kernels.append((family, ident, kernel_keys.kernel_key(family, key, sku, tools), i, call))
    return kernels, failures


def compile_kernels(sku: Sku, variant: str, call: Call, wanted: list[Wanted], sink: Sink) -> dict[str, str]:
    """Compile the `wanted` kernels of `call` and give each to `sink` (entry, object bytes).
    Returns {kernel key: error} for the wanted kernels that did not reach the sink; raises DiskFull only."""
    configure(sku)  # first: FA4 must see the SKU's arch when it is imported
    by_ident = {(f, ident): kk for f, ident, kk in wanted}
    sunk: set[str] = set()
    asked = [len(fa4.hardware_calls())]  # kernels compile one after another: later queries are the next one's

    def done(family: str, key: Any, fn: Any, seconds: float) -> None:
        kk = by_ident[(family, kernel_keys.dumps(kernel_keys.canonical(key)))]
        queries = fa4.hardware_calls()[asked[0]:]
        asked[0] += len(queries)
        data = fa4.export(fn)
        base = Entry(
            kernel_key=kk, object_digest=hashlib.sha256(data).hexdigest(), size=len(data), family=family,
            compile_key=kernel_keys.canonical(key),
            sku=sku.name, arch=sku.arch, sm_count=sku.sm_count, l2_bytes=sku.l2_bytes, cuda_major=sku.cuda_major,
            toolchain=fa4.toolchain(), variant=variant, call=call.describe(), compile_seconds=round(seconds, 3),
            hardware_queries=[list(q) for q in queries],
        )
        full = kernel_keys.entry_keys(base)[1]
        # stored under the full key (the constants it consumed); the base entry is the signpost saying which
        sink([replace(base, kernel_key=full), base] if full != kk else [base], data)
        sunk.add(kk)

    try:
        fa4.compile_call(call, set(by_ident), done)
        error = "FA4 did not ask for this kernel when the call was re-run"
    except DiskFull:  # not this kernel's fault: every later write fails too, so the build stops
        raise
    except Exception as e:
        error = one_line(e)
    return {kk: error for kk in by_ident.values() if kk not in sunk}


def one_line(e: BaseException) -> str:
    where = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    at = f" (at {Path(where.filename).name}:{where.lineno})" if where else ""
    text = " ".join(str(e).split())[:300] or "no message"
    return f"{type(e).__name__}: {text}{at}"
