"""The worker side of a build: runs in a process configured for one SKU (target.configure), never in the driver.

Both executors (executors.py: a local process pool; farm.py: Ray) run these functions. `plan_calls` lists the
kernels of some calls; `compile_kernels` compiles the wanted kernels of one call and hands each one, as an index
Entry plus its object bytes, to a sink: the local pool's sink writes the shared store under a lock, Ray's returns
the bytes to the driver or publishes them to a server.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .calls import Call
from .errors import DiskFull
from .skus import Sku
from .store import Entry

EXPORT_FUNCTION = "func"  # the symbol name FA4's own persistent cache uses; loaders look it up
Wanted = tuple[str, str, str]  # (family, canonical compile-key JSON, kernel key)
PlanOut = tuple[list[tuple[str, str, str, int]], list[tuple[int, str]]]
Sink = Callable[[Entry, bytes], None]

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
    from . import target

    target.configure(sku)
    _configured.append(sku)


def plan_calls(sku: Sku, work: list[tuple[str, Call]]) -> PlanOut:
    """(family, ident, kernel key, index into work) of every kernel the calls need, and the calls FA4 rejects."""
    configure(sku)  # first: planning imports FA4, which must see the SKU's arch
    from . import keys, plan

    kernels, failures = [], []
    for i, (_name, call) in enumerate(work):
        try:
            seen = plan.kernels_for(call)
        except Exception as e:  # FA4 rejects the call for this SKU: report it, go on
            failures.append((i, one_line(e)))
            continue
        for (family, ident), key in seen.items():
            kernels.append((family, ident, keys.kernel_key(family, key, sku), i))
    return kernels, failures


def compile_kernels(sku: Sku, variant: str, call: Call, wanted: list[Wanted], sink: Sink) -> dict[str, str]:
    """Compile the `wanted` kernels of `call` and give each to `sink` (entry, object bytes).
    Returns {kernel key: error} for the wanted kernels that did not reach the sink; raises DiskFull only."""
    configure(sku)  # first: caches imports FA4, which must see the SKU's arch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from . import caches, calls, keys, target

    by_ident = {(f, ident): kk for f, ident, kk in wanted}
    sunk: set[str] = set()
    asked = [len(target.hardware_calls())]  # kernels compile one after another: later queries are the next one's

    def done(family: str, key: Any, fn: Any, seconds: float) -> None:
        kk = by_ident[(family, keys.dumps(keys.canonical(key)))]
        queries = target.hardware_calls()[asked[0]:]
        asked[0] += len(queries)
        data = export(fn)
        sink(Entry(
            kernel_key=kk, object_digest=hashlib.sha256(data).hexdigest(), size=len(data), family=family,
            compile_key=keys.canonical(key),
            sku=sku.name, arch=sku.arch, sm_count=sku.sm_count, l2_bytes=sku.l2_bytes, cuda_major=sku.cuda_major,
            toolchain=keys.toolchain(), variant=variant, call=call.describe(), compile_seconds=round(seconds, 3),
            hardware_queries=[list(q) for q in queries],
        ), data)
        sunk.add(kk)

    try:
        with FakeTensorMode(), caches.swapped(lambda family, _old: caches.Compiler(family, set(by_ident), done)):
            calls.run(call)
        error = "FA4 did not ask for this kernel when the call was re-run"
    except DiskFull:  # not this kernel's fault: every later write fails too, so the build stops
        raise
    except Exception as e:
        error = one_line(e)
    return {kk: error for kk in by_ident.values() if kk not in sunk}


def export(fn: Any) -> bytes:
    with tempfile.TemporaryDirectory(prefix="fa4-aot-export-") as tmp:
        path = Path(tmp) / "kernel.o"
        fn.export_to_c(object_file_path=str(path), function_name=EXPORT_FUNCTION)
        data = path.read_bytes()
    if not data:
        raise RuntimeError("export_to_c wrote an empty object file")
    return data


def one_line(e: BaseException) -> str:
    where = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    at = f" (at {Path(where.filename).name}:{where.lineno})" if where else ""
    text = " ".join(str(e).split())[:300] or "no message"
    return f"{type(e).__name__}: {text}{at}"
