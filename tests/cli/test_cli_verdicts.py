"""Certification in the CLI, through click's runner over real stores whose verdicts Store.put_verdicts wrote:
`list` (a verdict column, every device class's verdict in --json), `coverage` (certified / failed / unchecked
kernels, refused calls), `doctor` (policy, registry, measured entries, verdicts by status, failed kernels with the
fix) and `known-bad` (the registry in force)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from fa4_aot.cli import main
from fa4_aot.domain import known_bad
from fa4_aot.domain.calls import Call
from fa4_aot.domain.verdicts import Verdict
from fa4_aot.store import Entry, Store
from tests.conftest import TINY_VARIANTS, copy_store
from tests.store.test_store import make_entry

H200 = "nvidia-h200.132sm.driver-13.0.cuda-13.0"
H200_OLD = "nvidia-h200.132sm.driver-12.8.cuda-12.8"
FULL_FWD = Call(layout="dense", pass_="fwd", dtype="bf16", head_dim=64, head_dim_v=64, mask="full", window=(0, 0),
                softcap=0.0, sink=False, num_splits=1, batch=1, seqlen_q=512, seqlen_k=512, heads_q=16, heads_kv=16)
TRAIN72 = Call(layout="dense", pass_="bwd", dtype="bf16", head_dim=72, head_dim_v=72, mask="causal", window=(0, 0),
               softcap=0.0, sink=False, num_splits=1, batch=2, seqlen_q=1024, seqlen_k=1024, heads_q=16, heads_kv=16)


@pytest.fixture(autouse=True)
def _defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FA4_AOT_CACHE", "FA4_AOT_VARIANTS", "FA4_AOT_SKU", "FA4_AOT_SERVER", "FA4_AOT_TOKEN",
                 "FA4_AOT_CERTIFIED", "FA4_AOT_TRUSTED_KEYS"):
        monkeypatch.delenv(name, raising=False)


def cli(cache: Path, *args: str) -> Result:
    return CliRunner().invoke(main, ["--cache-dir", str(cache), *args])


def verdict(key: str, status: str = "pass", device: str = H200, **more: object) -> Verdict:
    return Verdict(kernel_key=key, device=device, status=status, checks=4, toolchain="4.0.0b36/4.8.1",
                   when="2026-12-03T00:00:00Z", **more)  # type: ignore[arg-type]


def stored(store: Store, tag: str) -> Entry:
    entry = make_entry(store, tag.encode(), tag=tag)
    store.put_entry(entry)
    return entry


@pytest.fixture
def certified(tmp_path: Path) -> tuple[Store, list[Entry]]:
    """Three h200 kernels: one passed, one wrong on the newer driver (passed on the older), one unchecked."""
    store = Store(tmp_path / "store")
    entries = [stored(store, f"kernel {i}") for i in range(3)]
    store.put_verdicts([verdict(entries[0].kernel_key),
                        verdict(entries[1].kernel_key, "wrong", tensor="dq", error=1.3, bound=0.02,
                                detail="bwd dense bf16 d=72"),
                        verdict(entries[1].kernel_key, device=H200_OLD)])
    return store, entries


def test_list_shows_a_verdict_column_and_every_device_class_in_json(certified: tuple[Store, list[Entry]]) -> None:
    store, (passed, wrong, unchecked) = certified
    text = cli(store.root, "list")
    assert text.exit_code == 0, text.output
    rows = {line[:16]: line for line in text.output.splitlines()}
    assert text.output.splitlines()[0].split()[:6] == ["kernel", "sku", "family", "bytes", "verdict", "call"]
    assert rows[passed.kernel_key[:16]].split()[5] == "pass"
    assert rows[wrong.kernel_key[:16]].split()[5] == "wrong:dq+1"  # the worst, and one more device class
    assert rows[unchecked.kernel_key[:16]].split()[5] == "-"
    listed = {e["kernel_key"]: e for e in json.loads(cli(store.root, "list", "--json").output)}
    assert [listed[e.kernel_key]["certification"] for e in (passed, wrong, unchecked)] == \
        ["certified", "failed", "unchecked"]
    both = listed[wrong.kernel_key]["verdicts"]
    assert sorted(both) == [H200_OLD, H200] and both[H200]["status"] == "wrong" and both[H200]["error"] == 1.3
    assert both[H200_OLD]["status"] == "pass" and listed[unchecked.kernel_key]["verdicts"] == {}
    (row,) = json.loads(cli(store.root, "list", "--summary", "--json").output)
    assert row["certification"] == {"certified": 1, "failed": 1, "unchecked": 1}
    assert "1 certified, 1 failed, 1 unchecked" in cli(store.root, "list", "--summary").output


def doctor(store: Store, monkeypatch: pytest.MonkeyPatch, policy: str | None = None) -> tuple[int, dict[str, str]]:
    monkeypatch.setenv("FA4_AOT_SKU", "h200")  # this host has no GPU: doctor checks the SKU's store
    if policy is not None:
        monkeypatch.setenv("FA4_AOT_CERTIFIED", policy)
    result = cli(store.root, "doctor", "--json")
    (check,) = [c for c in json.loads(result.output) if c["check"] == "certified"]
    return result.exit_code, check


def test_doctor_reports_policy_registry_verdicts_and_names_failed_kernels(
        certified: tuple[Store, list[Entry]], monkeypatch: pytest.MonkeyPatch) -> None:
    store, (_passed, wrong, _unchecked) = certified
    store.put_known_bad("h200", known_bad.measured_document([known_bad.parse_entry(
        {"id": "measured-hd96", "symptom": "crash", "source": "fa4-aot certify", "when": {"head_dim": 96}}, "t")]))
    code, check = doctor(store, monkeypatch)
    assert code == 0 and check["status"] == "warn"
    revision = known_bad.load().revision
    assert f"FA4_AOT_CERTIFIED=known-bad; known-bad registry revision {revision}" in check["detail"]
    assert "1 measured in this store for h200" in check["detail"]
    assert "h200: 3 kernel(s), verdicts: 2 pass, 1 wrong, 1 unchecked" in check["detail"]
    assert f"FAILED {wrong.kernel_key[:16]}… {wrong.family} ({H200}: wrong: dq off by 1.3" in check["detail"]
    assert "fa4-aot certify --sku h200" in check["next"] and "refuse" in check["next"]
    text = cli(store.root, "doctor").output
    assert "WARN certified" in text and "next: both runtimes refuse them" in text


@pytest.mark.parametrize(("policy", "status", "says"), [
    ("off", "warn", "FA4_AOT_CERTIFIED=off"),  # failed kernels are still named
    ("require", "warn", "FA4_AOT_CERTIFIED=require"),
])
def test_doctor_names_the_policy(certified: tuple[Store, list[Entry]], monkeypatch: pytest.MonkeyPatch,
                                 policy: str, status: str, says: str) -> None:
    code, check = doctor(certified[0], monkeypatch, policy)
    assert (code, check["status"]) == (0, status) and says in check["detail"]


def test_doctor_require_warns_of_unchecked_kernels_and_a_bad_policy_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store(tmp_path / "store")
    stored(store, "kernel")
    assert doctor(store, monkeypatch)[1]["status"] == "ok"
    code, check = doctor(store, monkeypatch, "require")
    assert check["status"] == "warn" and "refuses the 1 unchecked kernel(s)" in check["next"]
    code, check = doctor(store, monkeypatch, "always")
    assert (code, check["status"]) == (1, "fail") and "FA4_AOT_CERTIFIED='always' is not a policy" in check["detail"]
    monkeypatch.setenv("FA4_AOT_CERTIFIED", "known-bad")
    store.put_known_bad("h200", b"[1, 2")
    code, check = doctor(store, monkeypatch)
    assert (code, check["status"]) == (1, "fail") and "fa4-aot certify --sku h200" in check["detail"]


def test_known_bad_lists_the_registry_in_force(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    project = known_bad.load()
    doc = json.loads(cli(store.root, "known-bad", "--json").output)
    assert [e["id"] for e in doc["entries"]] == [b.id for b in project.entries]
    assert doc["revision"] == project.revision and doc["policy"] == "known-bad" and doc["measured"] == 0
    assert all(e["origin"] == "project" and e["applies"] for e in doc["entries"])  # the installed FA4 is 4.0.0b36
    measured = known_bad.parse_entry({"id": "measured-bwd-hd64", "symptom": "wrong dq", "source": "fa4-aot certify",
                                      "when": {"head_dim": 64}, "sku": ["h200"], "kernel_keys": ["ab" * 32],
                                      "flash_attn": ["9.9.9"]}, "t")
    store.put_known_bad("h200", known_bad.measured_document([measured]))
    doc = json.loads(cli(store.root, "known-bad", "--sku", "h200", "--json").output)
    assert doc["measured"] == 1 and doc["entries"][-1]["id"] == "measured-bwd-hd64"
    assert (doc["entries"][-1]["origin"], doc["entries"][-1]["applies"]) == ("store", False)
    assert [e["id"] for e in json.loads(cli(store.root, "known-bad", "--sku", "b200", "--json").output)["entries"]] \
        == [b.id for b in project.entries]
    text = cli(store.root, "known-bad", "--sku", "h200").output
    assert "sm90-bwd-dq-hd72-80  [project]  arch sm_90a  flash-attn-4 4.0.0b36" in text
    assert 'when: head_dim=[72, 80], pass_=["bwd", "bwd_det"]' in text
    assert "measured-bwd-hd64  [store, not this toolchain]" in text and "sku h200  1 kernel(s)" in text
    assert f"1 measured in {store.root} for h200" in text.splitlines()[-1]


def test_known_bad_errors_are_one_line(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    store.put_known_bad("h200", b"{broken")
    broken = cli(store.root, "known-bad", "--sku", "h200")
    assert broken.exit_code == 1 and "run `fa4-aot certify --sku h200` again" in broken.output
    typo = cli(store.root, "known-bad", "--sku", "h20")
    assert typo.exit_code == 1 and "did you mean 'h200'" in typo.output


@pytest.mark.slow
def test_coverage_counts_certification_and_refused_calls(tiny_h200_full_fwd: Path, tmp_path: Path) -> None:
    store = Store(copy_store(tiny_h200_full_fwd, tmp_path / "store"))
    (kernel,) = [e for e in store.entries() if not e.is_signpost]
    calls = tmp_path / "calls.jsonl"
    calls.write_text(f"{json.dumps(FULL_FWD.to_dict())}\n{json.dumps(TRAIN72.to_dict())}\n")
    args = ("coverage", "--sku", "h200", "--calls", str(calls), "--variants", str(TINY_VARIANTS))
    doc = json.loads(cli(store.root, *args, "--json").output)
    assert (doc["served"], doc["missing"], doc["refused"], doc["ok"]) == (1, 0, 1, False)
    assert doc["certification"] == {"certified": 0, "failed": 0, "unchecked": 1}
    (dq_bug,) = [b for b in known_bad.load().entries if b.id == "sm90-bwd-dq-hd72-80"]
    assert doc["results"][1]["refused"][0].endswith(dq_bug.describe())  # the symptom and its source, whole
    store.put_verdicts([verdict(kernel.kernel_key, "crash", detail="cudaErrorIllegalAddress")])
    result = cli(store.root, *args)
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("served   fwd dense bf16 d=64 full") and lines[0].endswith("(1 kernel(s); 0 certified, "
                                                                                        "1 failed, 0 unchecked)")
    assert lines[1].startswith(f"    failed certification: {kernel.family} {kernel.kernel_key[:16]}")
    assert lines[2].startswith("REFUSED  bwd dense bf16 d=72 causal") and "known bad (sm90-bwd-dq-hd72-80)" in lines[3]
    assert lines[-1] == "1 of 2 served, 0 missing, 1 refused (known bad); stored kernels: 0 certified, 1 failed, " \
                        "0 unchecked"
