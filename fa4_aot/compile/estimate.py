"""How long a build will take: kernels to compile times CPU seconds per kernel, over the jobs, assuming one idle
core per job (a busy build host takes longer by its load).

Index entries record each kernel's compile CPU seconds (fa4/caches.Compiler), not wall time, so an estimate does
not follow the load of the machine that built the store. The estimate uses the median over the store's entries
for the same arch when there are at least MIN_SAMPLES, else these defaults, measured on this project's 2-core CPU
machine on 2026-11-30 (bench/RESULTS.md): the default h200 matrix built at 67 kernels/min with 2 jobs (1.8 s a
kernel per job; 1.68 CPU-s measured by the farm bench) and the b200 one 94 kernels in 215 s with 2 jobs (4.6 s).
Entries built before this recorded wall seconds, which a loaded build host inflates.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from ..domain.skus import Sku
from ..store import Store, kernels

DEFAULT_SECONDS = {"sm_90a": 1.8}
DEFAULT_OTHER = 4.6  # sm_100a and newer compile slower; no figure for sm_110a / sm_120a yet
MIN_SAMPLES = 5
WORKER_START_SECONDS = 3.0  # importing FA4 and CuTe in each spawned worker


@dataclass(frozen=True)
class Estimate:
    kernels: int  # kernels to compile
    seconds_per_kernel: float
    source: str  # where seconds_per_kernel came from
    jobs: int

    @property
    def seconds(self) -> float:
        if not self.kernels:
            return 0.0
        return WORKER_START_SECONDS + self.kernels * self.seconds_per_kernel / max(1, self.jobs)

    def to_dict(self) -> dict[str, Any]:
        return {"kernels": self.kernels, "seconds_per_kernel": round(self.seconds_per_kernel, 2),
                "source": self.source, "jobs": self.jobs, "seconds": round(self.seconds, 1)}


def seconds_per_kernel(store: Store, sku: Sku) -> tuple[float, str]:
    """(median compile CPU seconds of the store's kernels for sku's arch, "median of N kernels in STORE"), or the
    documented default for the arch when the store holds fewer than MIN_SAMPLES."""
    # kernels, not index entries: a signpost shares its kernel's compile and would count it twice
    samples = [e.compile_seconds for e in kernels(store.entries()) if e.arch == sku.arch and e.compile_seconds > 0]
    if len(samples) >= MIN_SAMPLES:
        return (statistics.median(samples),
                f"median CPU seconds of {len(samples)} {sku.arch} kernels in {store.root}, one idle core a job")
    default = DEFAULT_SECONDS.get(sku.arch, DEFAULT_OTHER)
    return default, (f"default for {sku.arch} (bench/RESULTS.md, 2-core CPU), fewer than {MIN_SAMPLES} in the "
                     "store, one idle core a job")


def estimate(kernels: int, store: Store, sku: Sku, jobs: int) -> Estimate:
    per, source = seconds_per_kernel(store, sku)
    return Estimate(kernels=kernels, seconds_per_kernel=per, source=source, jobs=jobs)
