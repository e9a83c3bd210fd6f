"""Building TIRx FA4 kernels for a SKU into the store: the same objects and index entries as FA4's kernels, so
`fa4-aot verify`, sign, push, pull and serve handle them unchanged.

Per problem: its schedule on the SKU (problem.schedule), its keys (base, and full with the one constant it
consumed), nothing to do when the store holds the full key, else one compile in the TIRx environment
(compiler.py, a subprocess: TVM is never imported here) and a commit through compile/commit.py, the commit every
builder shares (object first, entry last, under the kernel's lock, compiled outside it).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .. import config
from ..compile.commit import commit_kernel
from ..domain.skus import Sku
from ..errors import BuildError
from ..store import Entry, Store
from . import toolenv
from .kernel_file import KernelFile
from .problem import ARCHS, FAMILY, Problem, Schedule, keys, schedule

COMPILE_TIMEOUT_S = 900  # one trace + tvm.compile + nvcc takes 5 to 70 s on a busy 2-core host


@dataclass
class Report:
    sku: str
    built: list[str] = field(default_factory=list)  # kernel keys
    present: list[str] = field(default_factory=list)
    failed: list[dict[str, str]] = field(default_factory=list)  # {"problem", "error"}


def check_sku(sku: Sku) -> None:
    """BuildError unless the TIRx kernel can be built for `sku` (its arch, CUDA 13: nvcc 13 makes the cubin)."""
    if sku.arch not in ARCHS:
        raise BuildError(f"the TIRx FA4 kernel is an {'/'.join(ARCHS)} kernel; SKU {sku.name} is {sku.arch}: "
                         "build --family tirx for a Blackwell sm_100a SKU (`fa4-aot skus`), e.g. b200 or gb200")
    if sku.cuda_major != 13:
        raise BuildError(f"SKU {sku.name} targets CUDA {sku.cuda_major}; TIRx cubins are made by nvcc "
                         f"{toolenv.TOOLCHAIN['nvcc']} and need a CUDA 13 driver: build the CUDA 13 row instead")


def build(store: Store, sku: Sku, work: list[tuple[Problem, str]],
          progress: Callable[[str], None] | None = None) -> Report:
    """Build the kernel of every (problem, variant name) of `work` for `sku` that the store lacks (a problem twice
    is built once, filed under its first variant). A failed compile is reported, not raised; BuildError when the
    SKU or the TIRx environment cannot build at all."""
    check_sku(sku)
    report = Report(sku.name)
    first: dict[Problem, str] = {}
    for problem, variant in work:
        first.setdefault(problem, variant)
    for problem, variant in first.items():
        sched = schedule(problem, sku.constants())
        base, full = keys(problem, sku, sched)
        if store.has_entry(full):
            report.present.append(full)
            continue
        try:
            data, seconds = compile_one(problem, sku, sched)
        except BuildError as e:
            report.failed.append({"problem": str(problem), "error": str(e)})
            continue
        entry = make_entry(problem, sku, sched, data, seconds, variant, full)
        entries = [entry, dataclasses.replace(entry, kernel_key=base)]
        if commit_kernel(store, entries, data) == "corrupt":
            report.failed.append({"problem": str(problem), "error": "the stored bytes did not hash to their digest"})
            continue
        report.built.append(full)
        if progress:
            progress(f"{sku.name} {problem}: {entry.object_digest[:12]} ({seconds:.1f} s)")
    return report


def make_entry(problem: Problem, sku: Sku, sched: Schedule, data: bytes, seconds: float, variant: str,
               full: str) -> Entry:
    return Entry(kernel_key=full, object_digest=hashlib.sha256(data).hexdigest(), size=len(data), family=FAMILY,
                 compile_key=problem.compile_key(), sku=sku.name, arch=sku.arch, sm_count=sku.sm_count,
                 l2_bytes=sku.l2_bytes, cuda_major=sku.cuda_major, toolchain=dict(toolenv.TOOLCHAIN),
                 variant=variant, call=str(problem), compile_seconds=round(seconds, 3),
                 hardware_queries=[[name, value] for name, value in sched.consumed.items()], host=sku.host)


def compile_one(problem: Problem, sku: Sku, sched: Schedule) -> tuple[bytes, float]:
    """The kernel file of one compile in the TIRx environment, and its seconds. BuildError with the compiler's
    last words when it fails, or when the environment's toolchain is not the pinned one."""
    request = {"problem": str(problem), "grid": sched.grid, "l2_swizzle": sched.l2_swizzle, "arch": sku.arch}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(config.CHECKOUT_DIR), os.environ.get("PYTHONPATH", "")])}
    start = time.monotonic()
    try:
        done = subprocess.run([toolenv.python(), "-m", "fa4_aot.tirx.compiler"], input=json.dumps(request),
                              capture_output=True, text=True, env=env, timeout=COMPILE_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        raise BuildError(f"compiling TIRx {problem} for {sku.name} took over {COMPILE_TIMEOUT_S} s") from e
    if done.returncode != 0:
        raise BuildError(f"compiling TIRx {problem} for {sku.name} failed: {done.stderr.strip()[-1500:]}")
    answer = json.loads(done.stdout)
    drift = toolenv.drift(answer["toolchain"])
    if drift:
        raise BuildError(f"the TIRx environment ({toolenv.python()}) is not the pinned toolchain ({'; '.join(drift)});"
                         f" reinstall it: {toolenv.MAKE_ENV}")
    kernel = KernelFile.from_launch(base64.b64decode(answer["cubin"]), answer["launch"])
    return kernel.to_bytes(), time.monotonic() - start
