"""Host targets (fa4_aot/domain/hosts.py): pure tables."""

from __future__ import annotations

from pathlib import Path

import pytest

from fa4_aot.domain import hosts

V3, GRACE = hosts.get("x86-64-v3"), hosts.get("neoverse-v2")


@pytest.mark.parametrize(
    ("line", "target", "bad"),
    [
        ("  4005a0:\tc5 fd 6f 04 07       \tvmovdqa (%rdi,%rax,1),%ymm0", "x86-64-v3", False),
        ("  4005a0:\t62 f1 fe 48 6f 04 07 \tvmovdqu64 (%rdi,%rax,1),%zmm0", "x86-64-v3", True),
        ("  4005a0:\t62 f1 7c 29 28 c1    \tvmovaps %ymm1,%ymm0{%k1}", "x86-64-v3", True),
        ("  4005a0:\tc5 f8 93 c8          \tkmovw  %k0,%eax", "x86-64-v3", True),
        ("  4005a0:\t62 f2 7d 38 18 07    \tvbroadcastss (%rdi){1to8},%ymm0", "x86-64-v3", True),
        ("  4005a0:\tc5 fd 6f 04 07       \tvmovdqa (%rdi,%rax,1),%ymm0", "x86-64-v2", True),
        ("  4005a0:\t66 0f 6f 04 07       \tmovdqa (%rdi,%rax,1),%xmm0", "x86-64-v2", False),
        ("  4005a0:\t62 f1 fe 48 6f 04 07 \tvmovdqu64 (%rdi,%rax,1),%zmm0", "x86-64-v4", False),
        ("  40:\t91000000 \tadd\tx0, x0, #0x0", "neoverse-v2", False),
        ("  4005a0:\t48 8b 04 07          \tmov    (%rdi,%rax,1),%rax  # kmask", "x86-64-v3", False),
    ],
)
def test_isa_violations(line: str, target: str, bad: bool) -> None:
    assert bool(hosts.isa_violations(line, hosts.get(target))) is bad


@pytest.mark.parametrize(
    ("cpu", "target", "lacks"),
    [
        (hosts.HostCpu("x86_64", frozenset(hosts.get("x86-64-v4").needs)), V3, []),
        (hosts.HostCpu("x86_64", frozenset(hosts.get("x86-64-v2").needs)), V3,
         ["avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe"]),
        (hosts.HostCpu("aarch64", frozenset(GRACE.needs)), V3, ["architecture x86_64 (this CPU is aarch64)"]),
        (hosts.HostCpu("aarch64", frozenset(GRACE.needs)), GRACE, []),
        (hosts.HostCpu("aarch64", frozenset({"asimd"})), hosts.get("aarch64"), []),
        (hosts.HostCpu("x86_64", frozenset(V3.needs)), GRACE, ["architecture aarch64 (this CPU is x86_64)"]),
    ],
)
def test_lacks(cpu: hosts.HostCpu, target: hosts.HostTarget, lacks: list[str]) -> None:
    assert hosts.lacks(target, cpu) == lacks


def test_get_refuses_an_unknown_target_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match="invalid host target 'avx9': known are x86-64-v2, x86-64-v3"):
        hosts.get("avx9")


def test_elf_arch_reads_e_machine() -> None:
    header = bytearray(b"\x7fELF\x02\x01" + bytes(58))
    header[18:20] = (183).to_bytes(2, "little")
    assert hosts.elf_arch(bytes(header)) == "aarch64"
    header[18:20] = (62).to_bytes(2, "little")
    assert hosts.elf_arch(bytes(header)) == "x86_64"
    with pytest.raises(ValueError, match="not a 64-bit little-endian ELF"):
        hosts.elf_arch(b"#!/bin/sh\n")


def test_detect_reads_flags_of_x86_and_features_of_arm(tmp_path: Path) -> None:
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 bmi2\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    assert {"avx2", "bmi2"} <= hosts.detect(x86).flags
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd sve2 bf16\nCPU implementer\t: 0x41\n")
    assert hosts.detect(arm).flags == frozenset({"fp", "asimd", "sve2", "bf16"})
    assert hosts.detect(tmp_path / "absent").flags == frozenset()
