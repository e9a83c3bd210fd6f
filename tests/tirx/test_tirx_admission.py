"""fa4_aot.load(..., family="tirx") admits a kernel as the lean runtime does (runtime/runner.py Runtime.admit):
under FA4_AOT_TRUSTED_KEYS only what a valid signed manifest lists, and never what the certification gate refuses.
On a CPU host: the SKU is forced, the device class is given, and the launcher is replaced by a recorder, so that a
kernel that gets past the checks shows up as loaded instead of failing for want of a GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import fa4_aot
from fa4_aot.domain import devices
from fa4_aot.domain.sku_table import table
from fa4_aot.domain.verdicts import DeviceClass, Verdict
from fa4_aot.errors import ConfigError, KernelRefused, TrustError
from fa4_aot.runtime import runner
from fa4_aot.store import Entry, Store
from fa4_aot.tirx import loading
from fa4_aot.tirx.problem import Problem, keys, schedule
from fa4_aot.tirx.producer import make_entry
from fa4_aot.trust import signing, signing_keys

B200 = table(Path(__file__).resolve().parents[2] / "variants.toml")["b200"]
B200_CLASS = DeviceClass("nvidia-b200", 148, "13.0", "13.0")
PROBLEM = Problem.parse("b1-q256-k256-h4-kv4-d128-full")
Q_SHAPE = (1, 256, 4, 128)


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    """A store holding one TIRx kernel of PROBLEM for b200, and a process set up to load from it on a CPU host."""
    for name in ("FA4_AOT_TRUSTED_KEYS", "FA4_AOT_REVOKED", "FA4_AOT_SERVER", "FA4_AOT_CERTIFIED",
                 "FA4_AOT_INSECURE", "FA4_AOT_VARIANTS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FA4_AOT_SKU", "b200")
    monkeypatch.setattr(runner, "_runtimes", {})
    monkeypatch.setattr(devices, "probe", lambda index=None: devices.Probe(devices.DeviceInfo(
        "NVIDIA B200", (10, 0), B200.sm_count, B200.l2_bytes, 13), 13000, "13.0"))  # B200_CLASS's device
    monkeypatch.setattr(loading.KernelFile, "parse", staticmethod(lambda data, digest: data))
    monkeypatch.setattr(loading, "TirxAttention", lambda problem, kernel: ("loaded", kernel))
    found = Store(tmp_path / "store")
    found.put_object(b"planted kernel")
    found.put_entry(_entry())
    return found


def _entry() -> Entry:
    sched = schedule(PROBLEM, B200.constants())
    return make_entry(PROBLEM, B200, sched, b"planted kernel", 1.0, "t", keys(PROBLEM, B200, sched)[1])


def _load(store: Store) -> Any:
    return fa4_aot.load(Q_SHAPE, family="tirx", cache_dir=store.root)


def test_the_recorder_loads_an_unchecked_kernel_without_a_policy(store: Store) -> None:
    assert _load(store) == ("loaded", b"planted kernel")  # the setup itself: nothing refuses without a policy


def test_a_planted_tirx_kernel_is_refused_under_trusted_keys(store: Store, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    _private, public = signing_keys.generate(tmp_path / "keys", "build")
    monkeypatch.setenv("FA4_AOT_TRUSTED_KEYS", public.line())
    with pytest.raises(TrustError, match="is not listed by any valid manifest"):
        _load(store)


def test_a_tirx_kernel_listed_by_a_signed_manifest_loads_under_trusted_keys(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    private, public = signing_keys.generate(tmp_path / "keys", "build")
    signing.save(store, signing.sign(signing.manifest_of(store, B200), signing_keys.load_private(private)))
    monkeypatch.setenv("FA4_AOT_TRUSTED_KEYS", public.line())
    assert _load(store) == ("loaded", b"planted kernel")


def test_a_tirx_kernel_with_a_wrong_verdict_is_refused_under_require(store: Store,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    entry = _entry()
    store.put_verdicts([Verdict(entry.kernel_key, B200_CLASS.id, "wrong", tensor="out", error=1.0, bound=0.01,
                                checks=1, when="2026-12-01T00:00:00Z")])
    monkeypatch.setenv("FA4_AOT_CERTIFIED", "require")
    with pytest.raises(KernelRefused, match="failed certification") as refused:
        _load(store)
    assert refused.value.reason == "wrong"


def test_an_unchecked_tirx_kernel_is_refused_under_require(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FA4_AOT_CERTIFIED", "require")
    with pytest.raises(KernelRefused, match="has no certification"):
        _load(store)


def test_an_invalid_certification_policy_is_refused_by_a_tirx_load(store: Store,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FA4_AOT_CERTIFIED", "requre")
    with pytest.raises(ConfigError, match="is not a policy"):
        _load(store)
