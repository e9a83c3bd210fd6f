"""domain/devices.py: one answer to "which SKU and device class is this host", for the runtimes, install(),
prefetch, doctor and certification. resolve() and resolve_certifying() are pure and tested by table; probe() is
the only part that touches CUDA."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from fa4_aot.client import prefetch
from fa4_aot.domain import devices, hosts
from fa4_aot.domain.devices import Probe, resolve, resolve_certifying
from fa4_aot.domain.matching import DeviceInfo
from fa4_aot.errors import Fa4AotError, HostMismatch, UnknownSku
from fa4_aot.matrix import variants

SKUS = variants.load(Path(__file__).resolve().parents[2] / "variants.toml").skus
ZEN3 = hosts.HostCpu("x86_64", frozenset("cx16 popcnt sse4_1 sse4_2 ssse3 avx avx2 bmi1 bmi2 f16c fma movbe".split()))
GRACE = hosts.HostCpu("aarch64", frozenset("fp asimd atomics asimddp sve sve2 bf16 i8mm".split()))
H200 = DeviceInfo("NVIDIA H200", (9, 0), 132, 62914560, 13)
H200_CLASS = "nvidia-h200.132sm.driver-13.0.cuda-13.0"
GH200 = dataclasses.replace(SKUS["h200"], name="gh200", host="neoverse-v2")


def on(device: DeviceInfo | None, cpu: hosts.HostCpu | None = ZEN3) -> Probe:
    """What probe() reads on a host with `device` (None: no CUDA, so no CPU is read either) under driver 13.0."""
    return Probe(device, 13000, "13.0", cpu) if device is not None else Probe(None)


@pytest.mark.parametrize(
    ("skus", "probe", "forced", "sku", "device_class"),
    [
        (SKUS, on(H200), None, "h200", H200_CLASS),
        (SKUS, on(H200), "", "h200", H200_CLASS),  # FA4_AOT_SKU set but empty: not forced
        (SKUS, on(H200), "b200", "b200", H200_CLASS),  # forced row; the class is still the real device's
        (SKUS, on(None), "b200", "b200", None),  # a CPU host checking b200's store
        (SKUS, on(None), "gb200", "gb200", None),  # ... even of another host target: it loads nothing
        (SKUS, Probe(None, cpu=ZEN3), "gb200", "gb200", None),  # a CPU read without a device is not asked
        ({"h200": SKUS["h200"], "gh200": GH200}, on(H200, GRACE), None, "gh200", H200_CLASS),
        ({"h200": SKUS["h200"]}, on(dataclasses.replace(H200, sm_count=130)), None, "h200",
         "nvidia-h200.130sm.driver-13.0.cuda-13.0"),  # served by arch and CUDA major
    ],
)
def test_resolve(skus: dict, probe: Probe, forced: str | None, sku: str, device_class: str | None) -> None:
    found = resolve(skus, probe, forced)
    assert found.sku.name == sku
    assert (str(found.device_class) if found.device_class else None) == device_class
    assert found.trace


@pytest.mark.parametrize(
    ("skus", "probe", "forced", "error", "said"),
    [
        (SKUS, on(None), None, UnknownSku, "set FA4_AOT_SKU"),
        (SKUS, on(H200), "gb200", HostMismatch, "neoverse-v2"),  # a GPU host forcing a row its CPU cannot run
        (SKUS, on(H200, GRACE), None, HostMismatch, "x86-64-v3"),
        ({"h200": SKUS["h200"]}, on(dataclasses.replace(H200, cuda_major=12)), None, UnknownSku, "h200-cu12"),
        (SKUS, on(DeviceInfo("NVIDIA A100", (8, 0), 108, 41943040, 13)), None, UnknownSku, "no SKU has"),
    ],
)
def test_resolve_refuses(skus: dict, probe: Probe, forced: str | None, error: type, said: str) -> None:
    with pytest.raises(error, match=said):
        resolve(skus, probe, forced)


@pytest.mark.parametrize(
    ("probe", "named", "sku"),
    [
        (on(H200), None, "h200"),
        (on(H200), "h200", "h200"),
        (on(dataclasses.replace(H200, l2_bytes=50 << 20)), "h200", "h200"),  # L2 is not part of a GPU's identity
    ],
)
def test_resolve_certifying(probe: Probe, named: str | None, sku: str) -> None:
    row, device = resolve_certifying(SKUS, probe, named)
    assert row.name == sku and str(device) == str(probe.device_class)


@pytest.mark.parametrize(
    ("probe", "named", "error", "said"),
    [
        (on(None), None, UnknownSku, "no CUDA device"),
        (on(None), "h200", UnknownSku, "no CUDA device"),
        (on(dataclasses.replace(H200, sm_count=130)), None, UnknownSku, r"h100-pcie \(114 SMs != 130\)"),
        (on(dataclasses.replace(H200, sm_count=130)), "h200", UnknownSku, "132 SMs != 130"),
        (on(dataclasses.replace(H200, cuda_major=12)), "h200", UnknownSku, "CUDA 13 != 12"),
        (on(H200), "b200", UnknownSku, "arch sm_100a != sm_90"),
        (on(H200), "h300", UnknownSku, "h300"),
        (on(H200, GRACE), "h200", HostMismatch, "x86-64-v3"),
    ],
)
def test_resolve_certifying_refuses(probe: Probe, named: str | None, error: type, said: str) -> None:
    with pytest.raises(error, match=said):
        resolve_certifying(SKUS, probe, named)


def test_the_shell_reads_fa4_aot_sku_now(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "probe", lambda index=None: on(None))
    monkeypatch.setenv("FA4_AOT_SKU", "b300")
    assert devices.this_device(SKUS).sku.name == "b300"
    monkeypatch.setenv("FA4_AOT_SKU", "h200")
    assert devices.this_device(SKUS).sku.name == "h200"


def test_prefetch_on_a_cpu_host_picks_the_forced_sku_as_the_runtimes_do(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host without a GPU loads no kernel, so its CPU need not run the SKU's host code: prefetch once checked it
    (HostMismatch for gb200 on x86) where the runtimes do not; now it goes on to ask for a server."""
    monkeypatch.setattr(devices, "probe", lambda index=None: Probe(None))
    monkeypatch.setenv("FA4_AOT_SKU", "gb200")
    monkeypatch.setenv("FA4_AOT_OFFLINE", "1")
    monkeypatch.delenv("FA4_AOT_SERVER", raising=False)
    with pytest.raises(Fa4AotError, match="prefetch needs a server"):
        prefetch.prefetch("llama-3.1-8b")
