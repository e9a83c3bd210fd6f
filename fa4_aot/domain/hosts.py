"""Host targets: the CPU of a SKU's GPU hosts, for which every object's and library's host code is generated.

A kernel object is a GPU binary wrapped in host code (the launch shim, compiled by CuTe's LLVM); a lean library
is that object linked. Left alone, LLVM generates the host code for the build machine's own CPU (AVX-512 on an
AVX-512 build host, x86-64 on a Grace GPU host's behalf). So each SKU declares the host target of its GPU hosts
(variants.toml `host`), the build generates and links for it on any build host, and the target is part of every
kernel key and entry. Pure: `detect()` is the only function here that reads this machine.
"""

from __future__ import annotations

import platform
import re
from dataclasses import dataclass
from pathlib import Path

DEFAULT = "x86-64-v3"  # HGX servers of the Hopper and Blackwell generations all have AVX2 (x86-64-v3)


@dataclass(frozen=True)
class HostTarget:
    name: str  # as variants.toml names it
    arch: str  # platform.machine() of the hosts that run it; lean libraries are filed under it
    triple: str  # LLVM target triple of the host code
    cpu: str  # LLVM CPU: the instruction-set baseline host code is generated for
    needs: tuple[str, ...]  # CPU flags (/proc/cpuinfo) a host must have to run that code
    zig: str  # `zig cc -target` that links libraries for it
    description: str


_X86 = ("x86_64", "x86_64-unknown-linux-gnu", "x86_64-linux-gnu")
_ARM = ("aarch64", "aarch64-unknown-linux-gnu", "aarch64-linux-gnu")
_V2 = ("cx16", "popcnt", "sse4_1", "sse4_2", "ssse3")
_V3 = (*_V2, "avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe")
_V4 = (*_V3, "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")
TARGETS = {t.name: t for t in (
    HostTarget("x86-64-v2", _X86[0], _X86[1], "x86-64-v2", _V2, _X86[2], "x86-64 with SSE4.2 (2009 and later)"),
    HostTarget("x86-64-v3", _X86[0], _X86[1], "x86-64-v3", _V3, _X86[2], "x86-64 with AVX2 (Haswell, Zen and later)"),
    HostTarget("x86-64-v4", _X86[0], _X86[1], "x86-64-v4", _V4, _X86[2], "x86-64 with AVX-512 (Skylake-SP, Zen 4)"),
    HostTarget("aarch64", _ARM[0], _ARM[1], "generic", (), _ARM[2], "any 64-bit Arm (Armv8.0-A)"),
    HostTarget("neoverse-v2", _ARM[0], _ARM[1], "neoverse-v2", ("atomics", "asimddp", "sve", "sve2", "bf16", "i8mm"),
               _ARM[2], "Arm Neoverse V2: the Grace CPU of GH200, GB200 and GB300 nodes"),
)}


def get(name: str) -> HostTarget:
    """The host target called `name`. Raises ValueError listing the known ones."""
    if name not in TARGETS:
        raise ValueError(f"invalid host target {name!r}: known are {', '.join(TARGETS)}")
    return TARGETS[name]


@dataclass(frozen=True)
class HostCpu:
    """What a host's CPU is: its architecture (platform.machine()) and feature flags."""

    arch: str
    flags: frozenset[str]


def lacks(target: HostTarget, cpu: HostCpu) -> list[str]:
    """What `cpu` lacks to run code built for `target`: [] when it can, else the architecture or the missing
    flags, sorted."""
    if cpu.arch != target.arch:
        return [f"architecture {target.arch} (this CPU is {cpu.arch})"]
    return sorted(set(target.needs) - cpu.flags)


def detect(cpuinfo: Path = Path("/proc/cpuinfo")) -> HostCpu:
    """This machine's CPU. Flags come from the first processor's `flags` (x86) or `Features` (Arm) line of
    /proc/cpuinfo; without one (not Linux) the flag set is empty, so only targets that need no flag match."""
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine().lower(), platform.machine())
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        text = ""
    found = re.search(r"^(?:flags|Features)\s*:(.*)$", text, re.MULTILINE)
    return HostCpu(machine, frozenset(found.group(1).split()) if found else frozenset())


# ELF e_machine values of the architectures above (the ELF specification's EM_X86_64 and EM_AARCH64)
_ELF_MACHINES = {62: "x86_64", 183: "aarch64"}


def elf_arch(data: bytes) -> str:
    """The architecture an ELF object or library is for ("x86_64", "aarch64", or "unknown (e_machine N)").
    Raises ValueError for bytes that are not a 64-bit little-endian ELF file."""
    if data[:6] != b"\x7fELF\x02\x01":
        raise ValueError("not a 64-bit little-endian ELF file")
    machine = int.from_bytes(data[18:20], "little")
    return _ELF_MACHINES.get(machine, f"unknown (e_machine {machine})")


# Operands only AVX-512 (EVEX) code has: zmm registers, opmask registers k0-k7, embedded broadcast
_AVX512 = re.compile(r"%zmm\d|%k[0-7]\b|\{%k[0-7]\}|\{1to\d+\}")
_AVX = re.compile(r"%ymm\d")
_BEYOND = {"x86-64-v2": (_AVX512, _AVX), "x86-64-v3": (_AVX512,), "x86-64-v4": ()}


def isa_violations(disassembly: str, target: HostTarget) -> list[str]:
    """Instructions of `disassembly` (objdump -d, AT&T syntax) that `target`'s baseline does not have: lines
    with AVX-512 operands for x86-64-v3, with AVX or AVX-512 ones for x86-64-v2. Empty for Arm targets, whose
    baseline this scan does not model (their objects are checked by architecture)."""
    patterns = _BEYOND.get(target.name, ())
    return [line.strip() for line in disassembly.splitlines() if any(p.search(line) for p in patterns)]
