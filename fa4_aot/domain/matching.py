"""Which row of the SKU table serves a device: `select()`, pure and table-tested (the device, a DeviceInfo, comes
from devices.probe() or a test), and whether this host's CPU can run a row's kernels."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import HostMismatch, UnknownSku
from . import hosts
from .sku_table import unknown
from .skus import Constants, Sku


@dataclass(frozen=True)
class DeviceInfo:
    """What a CUDA device reports about itself, plus the CUDA major of the runtime (torch.version.cuda)."""

    name: str
    capability: tuple[int, int]
    sm_count: int
    l2_bytes: int
    cuda_major: int


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
        return _forced(skus, forced, cpu)
    if device is None:
        raise UnknownSku("no CUDA device is visible to torch: set FA4_AOT_SKU=NAME (`fa4-aot skus`) to plan and "
                         "check the store for a SKU on this host; loading kernels needs the GPU")
    trace = [f"{sku.name}: {_mismatch(sku, device) or 'match'}" for sku in skus.values()]
    same = _same_target(skus, device)
    row, exact = _preferred(same if cpu is None else _runnable(same, cpu), device)
    if not exact:
        trace.append(f"{row.name}: serves this device by arch and CUDA major ({_described(device)}); kernels "
                     "that consumed a constant load only where the device's value equals it")
    return row, Constants(device.sm_count, device.l2_bytes, row.l2_budget), trace


def _forced(skus: dict[str, Sku], forced: str, cpu: hosts.HostCpu | None) -> tuple[Sku, Constants, list[str]]:
    """select() for FA4_AOT_SKU=`forced`: that row, with its own figures as the device's."""
    if forced not in skus:
        raise UnknownSku(f"FA4_AOT_SKU={forced!r}: {unknown(forced, skus)}")
    if cpu is not None:
        check_host(skus[forced], cpu)
    return skus[forced], skus[forced].constants(), [f"{forced}: forced by FA4_AOT_SKU"]


def _same_target(skus: dict[str, Sku], device: DeviceInfo) -> list[Sku]:
    """The rows of the device's arch and CUDA major, by name; UnknownSku with the fix when there is none."""
    same = sorted((s for s in skus.values() if _mismatch(s, device, figures=False) == ""), key=lambda s: s.name)
    if not same:
        _raise_cuda_mismatch(skus, device)
        raise UnknownSku(
            f"no SKU has this device's arch and CUDA major ({_described(device)}); known: "
            f"{', '.join(sorted(skus))}. Add a [skus.NAME] table to variants.toml with these figures and run "
            "`fa4-aot build --sku NAME`, or set FA4_AOT_SKU to use one anyway")
    return same


def _preferred(rows: list[Sku], device: DeviceInfo) -> tuple[Sku, bool]:
    """The row of `rows` that serves `device` (its exact figures, else its SM count, else the first) and whether
    its figures are exact; UnknownSku when several rows have the device's exact figures."""
    exact = [s for s in rows if not _mismatch(s, device)]
    if len(exact) > 1:
        names = ", ".join(s.name for s in exact)
        raise UnknownSku(f"several SKUs match this device ({names}); give their figures apart or set FA4_AOT_SKU")
    return (exact or [s for s in rows if s.sm_count == device.sm_count] or rows)[0], bool(exact)


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
    """How `sku` differs from `device`, first difference only ("" when it does not): arch, CUDA major, and with
    `figures` the SM count and L2 size."""
    if sku.capability != device.capability:
        return f"arch {sku.arch} != sm_{device.capability[0]}{device.capability[1]}"
    if sku.cuda_major != device.cuda_major:
        return f"CUDA {sku.cuda_major} != {device.cuda_major}"
    if figures and sku.sm_count != device.sm_count:
        return f"{sku.sm_count} SMs != {device.sm_count}"
    if figures and sku.l2_bytes != device.l2_bytes:
        return f"L2 {sku.l2_bytes} B != {device.l2_bytes} B"
    return ""


def not_of(sku: Sku, device: DeviceInfo) -> str:
    """How `device` differs from a GPU of `sku` as certification counts it ("" when it is one): arch, CUDA major
    and SM count, not the L2 size (a verdict holds for the GPU that measured it; select() serves more)."""
    differs = _mismatch(sku, device)
    return "" if differs.startswith("L2 ") else differs
