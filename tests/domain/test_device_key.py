"""kernel_keys.device_key: the one rule from a kernel's base key to the key of the build a device loads (the lean
runtime's libraries, install(), prefetch, certification's plan and the build's linking ask it), and build_key, the
key a loaded entry's verdicts are kept under (the gate, install()'s wait for certification)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from fa4_aot.domain import kernel_keys
from fa4_aot.domain.skus import Constants


@dataclass(frozen=True)
class Built:
    """An index entry's key fields (kernel_keys.Entry), filed under its base key or its full key."""

    hardware_queries: list[Any] = field(default_factory=list)
    full: bool = False  # filed under its full key (else: its base key, a signpost where it consumed constants)
    family: str = "fwd"
    compile_key: Any = (1, "x")
    arch: str = "sm_100a"
    sm_count: int = 148
    l2_bytes: int = 1 << 27
    cuda_major: int = 13
    toolchain: dict[str, str] = field(default_factory=lambda: {"flash-attn-4": "4.0"})
    host: str = "x86-64-v3"

    @property
    def kernel_key(self) -> str:
        return kernel_keys.entry_keys(self)[1 if self.full else 0]


CONSUMED = [["sm_count", 148]]
BASE = Built().kernel_key  # the base key of every Built() below: the base key ignores consumed constants
B200, OTHER = Constants(148, 1 << 27), Constants(132, 1 << 27)


def full(sm_count: int) -> str:
    return Built([["sm_count", sm_count]], full=True).kernel_key


@pytest.mark.parametrize(
    ("base", "constants", "expected"),
    [
        (None, B200, BASE),  # 1. no base entry: nothing says more, the base key is what to fetch
        (Built(), B200, BASE),  # 2. the kernel consumed no SKU constant: the base entry is the kernel
        (Built(CONSUMED), None, BASE),  # 3. no device constants given: the base entry's own build
        (Built(CONSUMED), B200, full(148)),  # 4. the build with the device's values, the base's own here...
        (Built(CONSUMED), OTHER, full(132)),  # ... or another
    ],
    ids=["no-entry", "consumed-nothing", "no-constants", "device-values-same", "device-values-other"],
)
def test_device_key_fallback_order(base: Built | None, constants: Constants | None, expected: str) -> None:
    assert kernel_keys.device_key(BASE, base, constants) == expected


def test_device_key_of_a_constant_this_version_cannot_compute_raises() -> None:
    with pytest.raises(ValueError, match="tmem_columns"):
        kernel_keys.device_key(BASE, Built([["tmem_columns", 512]]), B200)


def test_device_key_is_the_base_entrys_own_full_key_for_its_own_values() -> None:
    signpost = Built(CONSUMED)
    assert kernel_keys.device_key(BASE, signpost, B200) == kernel_keys.build_key(signpost) == full(148)


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        (Built(), BASE),  # consumed nothing: one key
        (Built(CONSUMED), full(148)),  # a signpost: its build's full key
        (Built(CONSUMED, full=True), full(148)),
    ],
    ids=["consumed-nothing", "signpost", "full-entry"],
)
def test_build_key(entry: Built, expected: str) -> None:
    assert kernel_keys.build_key(entry) == expected


def test_build_key_of_an_entry_whose_constants_cannot_be_read_is_its_own_key() -> None:
    class Malformed(Built):
        @property
        def kernel_key(self) -> str:
            return "f" * 64

    assert kernel_keys.build_key(Malformed([{}])) == "f" * 64
