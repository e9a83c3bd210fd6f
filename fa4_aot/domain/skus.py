"""GPU SKUs: the target facts a build bakes in, and the constants a compile can consume from them.

A SKU is one row of the table: the arch target and CUDA major (every kernel's identity: FA4 disables
2-CTA kernels on CUDA 12), and the figures FA4 reads from the device: the SM count (its dispatch sizes
split-KV and persistent grids from it; sm_100 persistent schedulers bake it into the kernel) and the L2
size (read only with `l2_budget`). A kernel's key holds only the constants its compile consumed
(`Constants`), so SKUs of one arch share every kernel that consumed none. The table is read by
sku_table.py; a device is matched to a row by matching.py (pure) after devices.py has probed it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from . import hosts

ARCH_RE = re.compile(r"sm_(\d+)(\d)a")
ARCHS = ("sm_90a", "sm_100a", "sm_103a", "sm_110a", "sm_120a")  # the arch targets FA4 has kernels for
MIB = 1 << 20
# FA4's hard-coded L2 budgets (flash_attn/cute/tile_scheduler.py head swizzle, prepare_scheduler.py): what a
# kernel consumes as l2_budget / prepare_l2_budget unless its SKU turns `l2_budget` on.
FA4_L2_BUDGET = 50 * MIB
FA4_PREPARE_L2_BUDGET = 32 * MIB


@dataclass(frozen=True)
class Sku:
    name: str
    arch: str  # CuTe DSL target, e.g. "sm_90a"
    sm_count: int  # multiProcessorCount: FA4's max CTAs for persistent kernels
    l2_bytes: int
    cuda_major: int
    description: str = ""
    l2_budget: bool = False  # FA4's L2 budgets follow this SKU's L2 (off: FA4's 50 / 32 MiB)
    host: str = hosts.DEFAULT  # the host target (hosts.py) of its GPU hosts' CPUs: what host code is built for

    @property
    def host_target(self) -> hosts.HostTarget:
        return hosts.get(self.host)

    @property
    def capability(self) -> tuple[int, int]:
        major, minor = ARCH_RE.fullmatch(self.arch).groups()  # type: ignore[union-attr]
        return int(major), int(minor)

    @property
    def fa4_arch(self) -> str:
        """FLASH_ATTENTION_ARCH: the kernel path FA4 takes (sm_90, sm_100, sm_103, sm_120)."""
        return self.arch.removesuffix("a")

    def target_facts(self) -> dict[str, Any]:
        """What goes into recipe keys and signed manifests: the facts, not the name (two names with equal facts
        share kernels). `host` is left out only when "" (SKUs of stores built before host targets existed)."""
        return {"arch": self.arch, "sm_count": self.sm_count, "l2_bytes": self.l2_bytes, "cuda_major": self.cuda_major,
                **({"host": self.host} if self.host else {})}

    def constants(self) -> Constants:
        return Constants(self.sm_count, self.l2_bytes, self.l2_budget)


@dataclass(frozen=True)
class Constants:
    """The SKU constants a compile can consume, by the names hardware_queries record. The build's stand-in
    HardwareInfo answers from a SKU's Constants, the client computes the same names from the device's own
    figures: one derivation, so a kernel built for a SKU loads exactly where the device's values equal it."""

    sm_count: int
    l2_bytes: int
    l2_budget: bool = False

    def value(self, name: str) -> int:
        """The value of constant `name`; ValueError for a name this version does not know."""
        cluster = re.fullmatch(r"max_active_clusters\((\d+)\)", name)
        if cluster:  # one CTA per SM at maximum shared memory, as FA4's kernels run (see fa4/target.py)
            return self.sm_count // int(cluster.group(1))
        tirx = re.fullmatch(r"(persistent_ctas|l2_swizzle)\((\d+)\)", name)
        if tirx:  # the TIRx FA4 family's schedule (fa4_aot/tirx/problem.py names the kernel source they stand for)
            return self._tirx(tirx.group(1), int(tirx.group(2)))
        if name in ("sm_count", "l2_bytes"):
            return int(getattr(self, name))
        if name == "l2_budget":
            return l2_budgets(self.l2_bytes)[0] if self.l2_budget else FA4_L2_BUDGET
        if name == "prepare_l2_budget":
            return l2_budgets(self.l2_bytes)[1] if self.l2_budget else FA4_PREPARE_L2_BUDGET
        raise ValueError(f"unknown SKU constant {name!r}; upgrade fa4-aot to load kernels that consumed it")

    def _tirx(self, name: str, n: int) -> int:
        """persistent_ctas(T): CTAs of a persistent grid of T tasks, one CTA per SM (the kernel's MAX_CTAS = 148 is
        the B200's SM count). l2_swizzle(S): how many heads of S bytes of K/V the head swizzle walks together, the
        largest power of two whose K/V fits the L2 budget (the kernel's L2_SIZE = 50 MiB is FA4's budget), else 1."""
        if name == "persistent_ctas":
            return min(self.sm_count, n)
        budget = self.value("l2_budget")
        return 1 if n < 1 or budget < n else 1 << ((budget // n).bit_length() - 1)

    def values(self, names: Iterable[str]) -> dict[str, int]:
        return {name: self.value(name) for name in names}


def l2_budgets(l2_bytes: int) -> tuple[int, int]:
    """(head-swizzle budget, prepare-scheduler budget) that follow an L2 of `l2_bytes`. FA4's 50 / 32 MiB were
    tuned on the H100 (50 MiB L2): the swizzle budget is the whole L2, the prepare budget keeps FA4's 32/50 of
    it; both rounded down to whole MiB."""
    return l2_bytes // MIB * MIB, l2_bytes * 32 // 50 // MIB * MIB

