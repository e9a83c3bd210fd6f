"""GPU SKUs: the target facts a build bakes in, and the pure matching of a detected device to one of them.

A SKU is one row of the table: the arch target and CUDA major (every kernel's identity: FA4 disables
2-CTA kernels on CUDA 12), and the figures FA4 reads from the device: the SM count (its dispatch sizes
split-KV and persistent grids from it; sm_100 persistent schedulers bake it into the kernel) and the L2
size (read only with `l2_budget`). A kernel's key holds only the constants its compile consumed
(`Constants`), so SKUs of one arch share every kernel that consumed none. `select()` is pure and
table-tested; `detect_device()` is the only code here that touches CUDA.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import HostMismatch, UnknownSku
from . import hosts
from .tomlsrc import TomlSource

_ARCH = re.compile(r"sm_(\d+)(\d)a")
ARCHS = ("sm_90a", "sm_100a", "sm_103a", "sm_110a", "sm_120a")  # the arch targets FA4 has kernels for
MIB = 1 << 20
SKU_FIELDS = {"arch": str, "sm_count": int, "l2_bytes": int, "cuda_major": int, "description": str,
              "l2_budget": bool, "host": str}
_OPTIONAL = {"description": "", "l2_budget": False, "host": hosts.DEFAULT}
CUDA_MAJORS = (12, 13)
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
        major, minor = _ARCH.fullmatch(self.arch).groups()  # type: ignore[union-attr]
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
        if name in ("sm_count", "l2_bytes"):
            return int(getattr(self, name))
        if name == "l2_budget":
            return l2_budgets(self.l2_bytes)[0] if self.l2_budget else FA4_L2_BUDGET
        if name == "prepare_l2_budget":
            return l2_budgets(self.l2_bytes)[1] if self.l2_budget else FA4_PREPARE_L2_BUDGET
        raise ValueError(f"unknown SKU constant {name!r}; upgrade fa4-aot to load kernels that consumed it")

    def values(self, names: Iterable[str]) -> dict[str, int]:
        return {name: self.value(name) for name in names}


def l2_budgets(l2_bytes: int) -> tuple[int, int]:
    """(head-swizzle budget, prepare-scheduler budget) that follow an L2 of `l2_bytes`. FA4's 50 / 32 MiB were
    tuned on the H100 (50 MiB L2): the swizzle budget is the whole L2, the prepare budget keeps FA4's 32/50 of
    it; both rounded down to whole MiB."""
    return l2_bytes // MIB * MIB, l2_bytes * 32 // 50 // MIB * MIB


@dataclass(frozen=True)
class DeviceInfo:
    """What a CUDA device reports about itself, plus the CUDA major of the runtime (torch.version.cuda)."""

    name: str
    capability: tuple[int, int]
    sm_count: int
    l2_bytes: int
    cuda_major: int


def table(path: Path) -> dict[str, Sku]:
    """The SKU table of a variants file (its `[skus.NAME]` tables; its variants are not read): what a client
    needs to match its device. Raises ConfigError naming file, line and field."""
    return parse_skus(TomlSource(path))


def parse_skus(src: TomlSource) -> dict[str, Sku]:
    """The `[skus.NAME]` tables of a variants file. Raises ConfigError naming file, line and field.

    `cuda_major = [13, 12]` makes one table several SKUs: the first CUDA major keeps NAME, each further one is
    NAME-cu<major> (h200 and h200-cu12), since FA4 and the CuTe compiler differ per CUDA major."""
    skus: dict[str, Sku] = {}
    for name, table in src.data.get("skus", {}).items():
        majors = _check_table(src, name, table)
        for i, major in enumerate(majors):
            full = name if i == 0 else f"{name}-cu{major}"
            if full in skus or (i and full in src.data.get("skus", {})):
                raise src.fail(f"[skus.{name}]", "cuda_major", f"SKU {full!r} is defined twice")
            skus[full] = Sku(name=full, arch=table["arch"], sm_count=table["sm_count"], l2_bytes=table["l2_bytes"],
                             cuda_major=major, description=table.get("description", ""),
                             l2_budget=table.get("l2_budget", False), host=table.get("host", hosts.DEFAULT))
    return skus


def _check_table(src: TomlSource, name: str, table: dict[str, Any]) -> list[int]:
    """Validate one [skus.NAME] table; return its CUDA majors, first one first."""
    header = f"[skus.{name}]"
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", name):
        raise src.fail(header, None, "SKU names are lowercase letters, digits and '-'")
    for key in table:
        if key not in SKU_FIELDS:
            raise src.fail(header, key, f"unknown field; allowed: {', '.join(SKU_FIELDS)}")
    for key, typ in SKU_FIELDS.items():
        if key not in table:
            if key in _OPTIONAL:
                continue
            raise src.fail(header, None, f"missing field {key!r}")
        wrong = not isinstance(table[key], typ) or (typ is not bool and isinstance(table[key], bool))
        if key != "cuda_major" and wrong:
            raise src.fail(header, key, f"expected {typ.__name__}, got {table[key]!r}")
    if not _ARCH.fullmatch(table["arch"]):
        raise src.fail(header, "arch", f"{table['arch']!r} is not an arch target like 'sm_90a' or 'sm_100a'")
    if table["arch"] not in ARCHS:
        raise src.fail(header, "arch", f"{table['arch']!r}: FA4 targets {', '.join(ARCHS)}")
    if table.get("host", hosts.DEFAULT) not in hosts.TARGETS:
        raise src.fail(header, "host", f"{table['host']!r} is not a host target; known: {', '.join(hosts.TARGETS)}")
    for key in ("sm_count", "l2_bytes"):
        if table[key] <= 0:
            raise src.fail(header, key, "must be positive")
    majors = table["cuda_major"] if isinstance(table["cuda_major"], list) else [table["cuda_major"]]
    if any(not isinstance(m, int) or isinstance(m, bool) for m in majors):
        raise src.fail(header, "cuda_major", f"expected int or a list of ints, got {table['cuda_major']!r}")
    if not majors or any(m not in CUDA_MAJORS for m in majors) or len(set(majors)) < len(majors):
        raise src.fail(header, "cuda_major", f"got {table['cuda_major']!r}; allowed values: 12, 13, or a list of "
                       "them such as [13, 12] (the first keeps the name, the others are NAME-cu12...)")
    return majors


def sources(lines: list[str]) -> dict[str, str]:
    """Where each SKU's figures come from: the comment lines just above or just below its `[skus.NAME]`
    header in variants.toml, joined (pure: takes the file's lines)."""
    found: dict[str, str] = {}
    for i, line in enumerate(lines):
        m = re.fullmatch(r"\s*\[skus\.([A-Za-z0-9-]+)\]\s*(#.*)?", line)
        if not m:
            continue
        above: list[str] = []
        for prev in reversed(lines[:i]):
            if not prev.lstrip().startswith("#") or prev.lstrip().startswith("# ---"):
                break
            above.insert(0, prev)
        below = []
        for nxt in lines[i + 1:]:
            if not nxt.lstrip().startswith("#"):
                break
            below.append(nxt)
        found[m.group(1)] = " ".join(c.strip().lstrip("#").strip() for c in above + below)
    return found


def unknown(name: str, known: Iterable[str], what: str = "SKU") -> UnknownSku:
    """UnknownSku for `name`, listing `known` with a "did you mean" (case-insensitive, close spellings)."""
    names = sorted(set(known))
    folded = {n.lower(): n for n in names}
    low = name.lower()
    close = ([folded[low]] if low in folded else [n for n in names if n.lower().startswith(low)][:2]
             or [folded[n] for n in difflib.get_close_matches(low, list(folded), n=1, cutoff=0.6)])
    hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
    return UnknownSku(f"unknown {what} {name!r}; {hint}known: {', '.join(names) or 'none'} "
                      "(`fa4-aot skus` lists them; names are lowercase)")


def check_name(name: str, *known: Iterable[str]) -> None:
    """Refuse a SKU name found in none of `known` (the SKU table's names, a store's, a server's) with unknown()'s
    "did you mean" over all of them: a typo must not select nothing and exit 0 (issue 22, point 7)."""
    names = {n for group in known for n in group}
    if name not in names:
        raise unknown(name, names)


def select(skus: dict[str, Sku], device: DeviceInfo | None, forced: str | None = None,
           cpu: hosts.HostCpu | None = None) -> tuple[Sku, Constants, list[str]]:
    """Match `device` by need: (the table row whose manifests and dispatch the client uses, the constants
    kernels must have consumed to load here, a trace). Any row of the device's arch and CUDA major serves:
    kernels that consumed no constant are shared by all of them, and a kernel that consumed one loads only
    where the device's own value (in the returned Constants) equals it. The row with the device's exact
    figures is preferred, then one with its SM count, then the first by name. `forced` (FA4_AOT_SKU) picks a
    row by name and takes its figures as the device's (no device needed). Raises UnknownSku with the fix when
    no row has the device's arch and CUDA major, or when several rows have its exact figures. With `cpu` (a
    host that will load kernels) only rows whose host target that CPU runs are candidates; HostMismatch names
    the host target when none is (it would die of SIGILL, or not load at all)."""
    if forced:
        if forced not in skus:
            raise UnknownSku(f"FA4_AOT_SKU={forced!r}: {unknown(forced, skus)}")
        if cpu is not None:
            check_host(skus[forced], cpu)
        return skus[forced], skus[forced].constants(), [f"{forced}: forced by FA4_AOT_SKU"]
    if device is None:
        raise UnknownSku("no CUDA device is visible to torch: set FA4_AOT_SKU=NAME (`fa4-aot skus`) to plan and "
                         "check the store for a SKU on this host; loading kernels needs the GPU")
    trace = [f"{sku.name}: {_mismatch(sku, device) or 'match'}" for sku in skus.values()]
    same = sorted((s for s in skus.values() if _mismatch(s, device, figures=False) == ""), key=lambda s: s.name)
    if not same:
        _raise_cuda_mismatch(skus, device)
        raise UnknownSku(
            f"no SKU has this device's arch and CUDA major ({_described(device)}); known: "
            f"{', '.join(sorted(skus))}. Add a [skus.NAME] table to variants.toml with these figures and run "
            "`fa4-aot build --sku NAME`, or set FA4_AOT_SKU to use one anyway")
    if cpu is not None:
        same = _runnable(same, cpu)
    exact = [s for s in same if not _mismatch(s, device)]
    if len(exact) > 1:
        names = ", ".join(s.name for s in exact)
        raise UnknownSku(f"several SKUs match this device ({names}); give their figures apart or set FA4_AOT_SKU")
    row = (exact or [s for s in same if s.sm_count == device.sm_count] or same)[0]
    if not exact:
        trace.append(f"{row.name}: serves this device by arch and CUDA major ({_described(device)}); kernels "
                     "that consumed a constant load only where the device's value equals it")
    return row, Constants(device.sm_count, device.l2_bytes, row.l2_budget), trace


def check_host(sku: Sku, cpu: hosts.HostCpu) -> None:
    """Raise HostMismatch when `cpu` cannot run the host code of `sku`'s kernels."""
    _runnable([sku], cpu)


def _runnable(rows: list[Sku], cpu: hosts.HostCpu) -> list[Sku]:
    """The rows whose host target `cpu` runs; HostMismatch, naming each row's target and what it lacks, if none."""
    fine = [s for s in rows if not hosts.lacks(s.host_target, cpu)]
    if rows and not fine:
        why = "; ".join(f"{s.name} is built for host {s.host} ({s.host_target.description}), which needs "
                        f"{', '.join(hosts.lacks(s.host_target, cpu))}" for s in rows)
        raise HostMismatch(
            f"this host's CPU ({cpu.arch}) cannot run the kernels built for this device: {why}. Add a SKU row "
            f"with the same figures and host = \"{_host_for(cpu)}\" to variants.toml and build it "
            "(`fa4-aot hosts` lists host targets), or run on a host of the SKU's host target")
    return fine


def _host_for(cpu: hosts.HostCpu) -> str:
    """The most capable known host target `cpu` runs (a suggestion for error messages)."""
    fits = [t.name for t in hosts.TARGETS.values() if not hosts.lacks(t, cpu)]
    return fits[-1] if fits else "?"


def _raise_cuda_mismatch(skus: dict[str, Sku], device: DeviceInfo) -> None:
    """Raise UnknownSku naming the SKUs that match this device in everything but the CUDA major of torch."""
    near = [s for s in skus.values() if _mismatch(s, device).startswith("CUDA ")]
    if not near:
        return
    names = ", ".join(f"{s.name} (CUDA {s.cuda_major})" for s in near)
    base = near[0].name.removesuffix(f"-cu{near[0].cuda_major}")
    raise UnknownSku(
        f"this device ({device.name}) matches {names}, but this torch is built for CUDA {device.cuda_major} "
        f"(torch.version.cuda) and kernels are built per CUDA major; add {device.cuda_major} to cuda_major of "
        f"[skus.{base}] in variants.toml and run `fa4-aot build --sku {base}-cu{device.cuda_major}`, or install "
        f"a torch built for CUDA {near[0].cuda_major}"
    )


def _described(device: DeviceInfo) -> str:
    return (f"{device.name}: sm_{device.capability[0]}{device.capability[1]}, {device.sm_count} SMs, "
            f"L2 {device.l2_bytes} B, CUDA {device.cuda_major}")


def _mismatch(sku: Sku, device: DeviceInfo, figures: bool = True) -> str:
    if sku.capability != device.capability:
        return f"arch {sku.arch} != sm_{device.capability[0]}{device.capability[1]}"
    if sku.cuda_major != device.cuda_major:
        return f"CUDA {sku.cuda_major} != {device.cuda_major}"
    if figures and sku.sm_count != device.sm_count:
        return f"{sku.sm_count} SMs != {device.sm_count}"
    if figures and sku.l2_bytes != device.l2_bytes:
        return f"L2 {sku.l2_bytes} B != {device.l2_bytes} B"
    return ""


def row_for(device: DeviceInfo, name: str = "") -> dict[str, Any]:
    """The [skus.NAME] table row for `device`, as `fa4-aot skus --detect` prints it, with where each figure
    came from."""
    arch = f"sm_{device.capability[0]}{device.capability[1]}a"
    return {
        "name": name or re.sub(r"[^a-z0-9]+", "-", device.name.lower().removeprefix("nvidia ")).strip("-"),
        "arch": arch, "sm_count": device.sm_count, "l2_bytes": device.l2_bytes, "cuda_major": device.cuda_major,
        "description": device.name,
        "sources": {
            "arch": "torch.cuda.get_device_properties().major/minor (compute capability), 'a' target",
            "sm_count": "torch.cuda.get_device_properties().multi_processor_count (cudaDevAttrMultiProcessorCount)",
            "l2_bytes": "torch.cuda.get_device_properties().L2_cache_size (cudaDevAttrL2CacheSize)",
            "cuda_major": "torch.version.cuda (the CUDA runtime FA4 runs with)",
        },
    }


def detect_device(index: int | None = None) -> DeviceInfo:
    """Probe the current (or given) CUDA device through torch. Raises UnknownSku when there is none."""
    import torch

    if not torch.cuda.is_available():
        raise UnknownSku("no CUDA device is visible to torch: fa4_aot loads kernels on a GPU host; to plan and "
                         "check the store for a SKU here, set FA4_AOT_SKU=NAME (`fa4-aot skus`)")
    index = torch.cuda.current_device() if index is None else index
    props = torch.cuda.get_device_properties(index)
    cuda = torch.version.cuda or "0"
    return DeviceInfo(
        name=props.name,
        capability=(props.major, props.minor),
        sm_count=props.multi_processor_count,
        l2_bytes=props.L2_cache_size,
        cuda_major=int(cuda.split(".")[0]),
    )
