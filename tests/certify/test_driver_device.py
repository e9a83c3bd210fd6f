"""certify() measures only on a GPU of the SKU it certifies, as `fa4-aot certifier` does: one rule
(domain/devices.resolve_certifying), which also asks for the SKU's CUDA major and a CPU that runs its host code."""

from __future__ import annotations

from pathlib import Path

import pytest

from fa4_aot.certify.driver import certify
from fa4_aot.domain import devices
from fa4_aot.domain.devices import Probe
from fa4_aot.domain.matching import DeviceInfo
from fa4_aot.errors import UnknownSku
from fa4_aot.matrix import variants
from fa4_aot.store import Store

H200 = variants.load(Path(__file__).resolve().parents[2] / "variants.toml").skus["h200"]


def test_a_gpu_of_the_sku_under_another_cuda_major_is_not_certified_as_it(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    device = DeviceInfo("NVIDIA H200", (9, 0), 132, 62914560, 12)  # torch built for CUDA 12 on an H200
    monkeypatch.setattr(devices, "probe", lambda index=None: Probe(device, 13000, "12.8", None))
    with pytest.raises(UnknownSku, match=r"not of SKU h200 \(CUDA 13 != 12\)"):
        certify(Store(tmp_path), H200)


def test_no_gpu_is_said_as_such(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "probe", lambda index=None: Probe(None))
    with pytest.raises(UnknownSku, match="no CUDA device is visible here"):
        certify(Store(tmp_path), H200)
