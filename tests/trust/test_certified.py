"""The certification gate both runtimes ask before a kernel's first launch (fa4_aot/trust/certified.py): the
policy, the known-bad registry (the project's file and a store's measured entries) and the store's verdicts, as
tables over real entries and a real store."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from fa4_aot.domain import kernel_keys, known_bad
from fa4_aot.domain.signature import Signature
from fa4_aot.domain.verdicts import DeviceClass, Verdict
from fa4_aot.errors import ConfigError, KernelRefused, StoreError
from fa4_aot.store import Entry, Store
from fa4_aot.trust.certified import Gate, policy_from_env
from tests.conftest import proven
from tests.store.test_store import make_entry

H200 = DeviceClass("nvidia-h200", 132, "13.0", "13.0")
OTHER_DRIVER = DeviceClass("nvidia-h200", 132, "12.8", "13.0")
SIG_72 = Signature("dense", "bwd", "bf16", 72, 72, "causal", (0, 0), 0.0, False, 1, 16, 16)
SIG_64 = dataclasses.replace(SIG_72, head_dim=64, head_dim_v=64)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "store")


def entry(store: Store, family: str = "_flash_attn_bwd", tag: str = "") -> Entry:
    found = make_entry(store, f"kernel {family} {tag}".encode(), tag=tag)
    return proven(dataclasses.replace(found, family=family))  # filed under the key its fields hash to


def refusal(gate: Gate, e: Entry, sig: Signature | None) -> str | None:
    found = gate.refusal(e, sig)
    return None if found is None else found.reason


@pytest.mark.parametrize("value,expected", [(None, "known-bad"), ("", "known-bad"), ("require", "require"),
                                            ("off", "off"), ("known-bad", "known-bad")])
def test_policy(monkeypatch: pytest.MonkeyPatch, value: str | None, expected: str) -> None:
    if value is None:
        monkeypatch.delenv("FA4_AOT_CERTIFIED", raising=False)
    else:
        monkeypatch.setenv("FA4_AOT_CERTIFIED", value)
    assert policy_from_env() == expected


def test_a_bad_policy_names_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FA4_AOT_CERTIFIED", "strict")
    with pytest.raises(ConfigError, match="require.*known-bad.*off"):
        policy_from_env()


def test_the_registry_refuses_the_sm90_dq_bug_with_its_source(store: Store) -> None:
    gate = Gate(store, "h200", H200, policy="known-bad")
    bwd, fwd = entry(store), entry(store, "_flash_attn_fwd")
    assert refusal(gate, bwd, SIG_72) == "sm90-bwd-dq-hd72-80"
    assert refusal(gate, fwd, SIG_72) is None  # the forward of that call is right
    assert refusal(gate, bwd, SIG_64) is None
    assert refusal(gate, bwd, None) is None  # no call known: no signature predicate can hold
    message = str(gate.refusal(bwd, SIG_72))
    assert "wrong dq" in message and "flash-attention#2896" in message and "FA4_AOT_CERTIFIED=off" in message
    newer = dataclasses.replace(bwd, toolchain={"flash-attn-4": "4.0.1"})
    assert refusal(gate, newer, SIG_72) is None  # the entry names the FA4 release it was measured on


@pytest.mark.parametrize("status,policy,device,expected", [
    ("pass", "known-bad", H200, None),
    ("pass", "require", H200, None),
    ("wrong", "known-bad", H200, "wrong"),
    ("crash", "known-bad", H200, "crash"),
    ("hang", "require", H200, "hang"),
    ("refused", "known-bad", H200, "refused"),
    ("wrong", "off", H200, None),
    (None, "known-bad", H200, None),  # unchecked: allowed by default
    (None, "require", H200, "unchecked"),
    ("pass", "require", OTHER_DRIVER, "unchecked"),  # a verdict holds for its device class only
    ("wrong", "known-bad", OTHER_DRIVER, None),
    ("wrong", "known-bad", None, None),  # a CPU host checking a store launches nothing
])
def test_verdicts_by_policy_and_device(store: Store, status: str | None, policy: str, device: DeviceClass | None,
                                       expected: str | None) -> None:
    e = entry(store, "_flash_attn_fwd")
    if status is not None:
        store.put_verdicts([Verdict(e.kernel_key, H200.id, status, detail="dq off", tensor="dq" if status == "wrong"
                                    else "", error=1.3 if status == "wrong" else None,
                                    bound=0.01 if status == "wrong" else None)])
    gate = Gate(store, "h200", device, policy=policy)
    assert refusal(gate, e, SIG_64) == (expected if policy != "off" else None)


def test_admit_decides_once_per_kernel_and_signature(store: Store) -> None:
    e = entry(store)
    asked: list[str] = []

    def entry_of(key: str) -> Entry:
        asked.append(key)
        return e

    gate = Gate(store, "h200", H200, policy="known-bad")
    for _ in range(3):
        with pytest.raises(KernelRefused):
            gate.admit(e.kernel_key, SIG_72, entry_of)
        gate.admit(e.kernel_key, SIG_64, entry_of)
    assert asked == [e.kernel_key, e.kernel_key]


def test_a_signpost_reads_the_verdicts_of_its_kernel(store: Store) -> None:
    """install() loads the base-key signpost where the device's constants equal the build's; certification keeps
    verdicts under the full key."""
    e = entry(store, "_flash_attn_fwd")
    signpost = dataclasses.replace(e, kernel_key=kernel_keys.entry_keys(e)[0])
    assert signpost.is_signpost
    store.put_verdicts([Verdict(e.kernel_key, H200.id, "pass")])
    assert refusal(Gate(store, "h200", H200, policy="require"), signpost, SIG_64) is None
    store.put_verdicts([Verdict(e.kernel_key, H200.id, "crash", detail="illegal address")])
    assert refusal(Gate(store, "h200", H200, policy="known-bad"), signpost, SIG_64) == "crash"


def test_a_kernel_not_yet_there_is_decided_once_it_is(store: Store) -> None:
    e = entry(store, "_flash_attn_fwd")
    gate = Gate(store, "h200", H200, policy="require")
    gate.admit(e.kernel_key, SIG_64, lambda _key: None)  # missing (the runtime says so); nothing decided
    with pytest.raises(KernelRefused, match="no certification"):
        gate.admit(e.kernel_key, SIG_64, lambda _key: e)  # fetched since: unchecked under require


def test_measured_entries_of_the_store_count(store: Store) -> None:
    e = entry(store, "_flash_attn_fwd", tag="paged")
    measured = known_bad.Bad(id="measured-h200-abc", symptom="crash: illegal address", source="fa4-aot certify",
                             when={"layout": "dense", "head_dim": 64}, arch=("sm_90a",), parts=("fwd",), sku=("h200",))
    store.put_known_bad("h200", known_bad.measured_document([measured]))
    assert refusal(Gate(store, "h200", H200, policy="known-bad"), e, SIG_64) == "measured-h200-abc"
    assert refusal(Gate(store, "h100-sxm", H200, policy="known-bad"), e, SIG_64) is None  # another SKU's file


def test_a_malformed_measured_file_is_an_error_not_silence(store: Store) -> None:
    store.put_known_bad("h200", json.dumps({"format": 1, "revision": 1, "bad": [{"id": "x"}]}).encode())
    with pytest.raises(StoreError, match="certify --sku h200"):
        Gate(store, "h200", H200, policy="known-bad")


def _certified_at_degenerate_sizes(store: Store) -> tuple[Entry, Gate]:
    """A store whose certification found the backward kernel of SIG_64 wrong at seqlen_k 2 and right at 1024:
    the run's measured entry and the kernel's verdict, as certify keeps them (certify/measured.py)."""
    from fa4_aot.certify import measured
    from fa4_aot.certify.plan import Check, Use
    from fa4_aot.certify.pool import Outcome
    from fa4_aot.domain.skus import Sku

    e = entry(store, "_flash_attn_bwd", tag="scoped")
    uses = (Use("_flash_attn_bwd", e.kernel_key),)
    failing = Outcome("f", Check(SIG_64, {"batch": 2, "seqlen_q": 1, "seqlen_k": 2, "heads_kv": 16}, uses, "small",
                                 1), "wrong", "bwd", [{"tensor": "dk", "error": 0.3, "bound": 0.01}])
    passing = Outcome("p", Check(SIG_64, {"batch": 2, "seqlen_q": 1024, "seqlen_k": 1024, "heads_kv": 16}, uses,
                                 "typical", 2), "pass", "bwd")
    verdict = Verdict(e.kernel_key, H200.id, "wrong", detail="dk", tensor="dk", error=0.3, bound=0.01)
    store.put_verdicts([verdict])
    sku = Sku("h200", "sm_90a", 132, 62914560, 13)
    made, found, repros = measured.entries([failing], [failing, passing], [verdict], sku, H200.id, store.get_entry)
    store.put_known_bad("h200", measured.document(None, made, found, repros))
    return e, Gate(store, "h200", H200, policy="known-bad")


def test_a_scoped_refusal_refuses_inside_its_sizes_and_serves_outside(store: Store) -> None:
    """A finding at seqlen_k 2 refuses the kernel at such sizes only: at seqlen_k 1024, where its checks passed,
    both the measured entry and the kernel's failed verdict let it run (one record, one scope)."""
    e, gate = _certified_at_degenerate_sizes(store)
    with pytest.raises(KernelRefused, match="seqlen_k <= 1023"):
        gate.admit(e.kernel_key, SIG_64, lambda _key: e, {"batch": 4, "seqlen_q": 1, "seqlen_k": 2})
    gate.admit(e.kernel_key, SIG_64, lambda _key: e, {"batch": 4, "seqlen_q": 2048, "seqlen_k": 2048})
    with pytest.raises(KernelRefused):
        gate.admit(e.kernel_key, SIG_64, lambda _key: e)  # sizes unknown: refused, never served unjudged


def test_the_per_call_check_refuses_scoped_calls_after_a_kernel_was_loaded(store: Store) -> None:
    """FA4 over install() loads a kernel once: later calls at other sizes are judged by check_call."""
    e, gate = _certified_at_degenerate_sizes(store)
    gate.admit(e.kernel_key, SIG_64, lambda _key: e, {"batch": 4, "seqlen_q": 2048, "seqlen_k": 2048})
    gate.check_call(SIG_64.call(4, 2048, 2048), "bwd")
    gate.check_call(SIG_64.call(4, 1, 2), "fwd")  # the forward is not in the finding's part
    with pytest.raises(KernelRefused, match="seqlen_k <= 1023"):
        gate.check_call(SIG_64.call(4, 1, 2), "bwd")


def test_a_client_without_scopes_refuses_the_whole_signature(store: Store) -> None:
    """The scopes are a map beside the entries: a reader that ignores it (a client before scopes) still parses the
    document and refuses the entry's whole signature."""
    e, _gate = _certified_at_degenerate_sizes(store)
    data = store.known_bad("h200")
    assert data is not None
    doc = json.loads(data)
    assert set(doc["scopes"]) == {"entries", "kernels"} and all("scope" not in b for b in doc["bad"])
    plain = known_bad.load().plus(list(known_bad.parse({k: doc[k] for k in ("format", "revision", "bad")},
                                                        "old").entries))
    gate = Gate(store, "h200", H200, policy="known-bad", registry=plain)
    assert refusal(gate, e, SIG_64) is not None


def test_a_refusal_for_fa4s_bug_names_its_one_file_repro(store: Store, tmp_path: Path) -> None:
    """A measured entry carries the repro of its worst failing check (a top-level `repros` map): a refusal says
    how to print it, `known-bad --repro` prints it, and it is Python at the check's very sizes."""
    import ast

    from click.testing import CliRunner

    from fa4_aot.certify import measured
    from fa4_aot.cli import main

    e, gate = _certified_at_degenerate_sizes(store)
    with pytest.raises(KernelRefused) as refused:
        gate.admit(e.kernel_key, SIG_64, lambda _key: e, {"batch": 4, "seqlen_q": 1, "seqlen_k": 2})
    ident = refused.value.reason
    assert f"`fa4-aot known-bad --sku h200 --repro {ident}`" in str(refused.value)
    printed = CliRunner().invoke(main, ["--cache-dir", str(store.root), "known-bad", "--sku", "h200", "--repro", ident])
    assert printed.exit_code == 0, printed.output
    ast.parse(printed.output)
    assert "'q_rows': [2, 1]" in printed.output and "'k_rows': [2, 2]" in printed.output
    assert "wrong (bwd): dk off by 0.3 against a bound of 0.01" in printed.output
    listed = CliRunner().invoke(main, ["--cache-dir", str(store.root), "known-bad", "--sku", "h200"]).output
    assert f"repro: fa4-aot known-bad --sku h200 --repro {ident} > repro.py" in listed
    missing = CliRunner().invoke(main, ["--cache-dir", str(store.root), "known-bad", "--sku", "h200", "--repro", "x"])
    assert missing.exit_code == 1 and f"entries with one: {ident}" in missing.output
    data = store.known_bad("h200")
    assert data is not None
    again = json.loads(measured.document(data, [], measured.scopes.NONE, {}))  # a later run that measured nothing
    assert set(again["repros"]) == {ident} and again["repros"][ident] == json.loads(data)["repros"][ident]


def test_a_measured_file_without_repros_refuses_without_naming_one(store: Store) -> None:
    """Entries written before repros existed (no `repros` map) still refuse, and the message names no repro."""
    e, _gate = _certified_at_degenerate_sizes(store)
    data = store.known_bad("h200")
    assert data is not None
    doc = json.loads(data)
    del doc["repros"]
    store.put_known_bad("h200", json.dumps(doc).encode())
    gate = Gate(store, "h200", H200, policy="known-bad")
    with pytest.raises(KernelRefused) as refused:
        gate.admit(e.kernel_key, SIG_64, lambda _key: e, {"batch": 4, "seqlen_q": 1, "seqlen_k": 2})
    assert "--repro" not in str(refused.value)
