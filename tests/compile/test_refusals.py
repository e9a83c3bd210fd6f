"""The planner refuses what the known-bad registry names as FA4 refuses a call (compile/refusals.py, worker.plan_calls).

The pure part as a table; then FA4's real dispatch on this CPU host, in spawned workers configured for h200 (sm_90a)
and b200 (sm_100a), as every build, dry run, `--from-misses`, on-demand job and coverage check plans: a CPU plan
takes milliseconds, a worker's start seconds, so each SKU keeps one worker for the module.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from fa4_aot.compile import refusals
from fa4_aot.compile.builder import outcome_of
from fa4_aot.compile.executors import LocalExecutor
from fa4_aot.compile.rebuild import build_misses
from fa4_aot.compile.worker import PlanOut
from fa4_aot.domain import known_bad
from fa4_aot.domain.calls import Call
from fa4_aot.domain.misses import Miss
from fa4_aot.domain.signature import Signature
from fa4_aot.errors import ConfigError, StoreError
from fa4_aot.matrix import variants
from fa4_aot.store import Store
from tests.conftest import TINY_VARIANTS, run_cli

MATRIX = variants.load(TINY_VARIANTS)
H200, B200 = MATRIX.sku("h200"), MATRIX.sku("b200")
TOOLS = {"flash-attn-4": "4.0.0b36", "nvidia-cutlass-dsl": "4.8.1"}
TRAIN72 = Call(layout="dense", pass_="bwd", dtype="bf16", head_dim=72, head_dim_v=72, mask="causal", window=(0, 0),
               softcap=0.0, sink=False, num_splits=1, batch=2, seqlen_q=1024, seqlen_k=1024, heads_q=16, heads_kv=16)
TRAIN64 = replace(TRAIN72, head_dim=64, head_dim_v=64)
TRAIN80_DET = replace(TRAIN72, pass_="bwd_det", head_dim=80, head_dim_v=80)
PREFILL72 = replace(TRAIN72, pass_="fwd")
DECODE160 = replace(TRAIN72, layout="paged", pass_="fwd", head_dim=160, head_dim_v=160, batch=64, seqlen_q=1,
                    seqlen_k=4096, heads_q=32, heads_kv=8, page_size=16)
DQ_BUG, PAGED_CRASH = "sm90-bwd-dq-hd72-80", "sm90-paged-hd160-illegal-address"


def measured(*entries: dict[str, Any]) -> bytes:
    """known-bad/<sku>.json as `fa4-aot certify` writes it."""
    base = {"symptom": "wrong dq (rel. error 1.3)", "source": "fa4-aot certify on nvidia-h200 (test)", "sku": ["h200"]}
    return known_bad.measured_document([known_bad.parse_entry({**base, **e}, "test") for e in entries])


# -- the pure part ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("sku", "versions", "sig", "keys", "refused"), [
    (H200, TOOLS, Signature.of(TRAIN72), (), DQ_BUG),
    (H200, TOOLS, Signature.of(TRAIN80_DET), (), DQ_BUG),
    (H200, TOOLS, Signature.of(TRAIN64), (), None),
    (H200, TOOLS, Signature.of(PREFILL72), (), None),  # the forward alone is right
    (B200, TOOLS, Signature.of(TRAIN72), (), None),  # another arch
    (H200, {**TOOLS, "flash-attn-4": "9.9.9"}, Signature.of(TRAIN72), (), None),  # a FA4 that may have fixed it
    (H200, TOOLS, Signature.of(DECODE160), (), PAGED_CRASH),
    (H200, TOOLS, replace(Signature.of(DECODE160), page_size=128), (), PAGED_CRASH),
    (H200, TOOLS, None, (), None),  # an exact record without a Call: nothing to judge
])
def test_refusal_of_the_project_registry(sku: Any, versions: dict[str, str], sig: Signature | None,
                                         keys: tuple[str, ...], refused: str | None) -> None:
    bad = refusals.refusal(known_bad.load(), sku, versions, sig, keys)
    assert (bad.id if bad else None) == refused


def test_kernel_entries_match_only_with_their_kernels() -> None:
    key = "ab" * 32
    registry = known_bad.parse(json.loads(measured({"id": "m1", "when": {"head_dim": 64}, "kernel_keys": [key]})), "t")
    sig = Signature.of(TRAIN64)
    assert refusals.refusal(registry, H200, TOOLS, sig) is None  # before planning: no kernel known yet
    assert refusals.refusal(registry, H200, TOOLS, sig, ["cd" * 32]) is None
    assert refusals.refusal(registry, H200, TOOLS, sig, ["cd" * 32, key]).id == "m1"  # type: ignore[union-attr]
    assert refusals.refusal(registry, MATRIX.sku("h100-sxm"), TOOLS, sig, [key]) is None  # measured for h200 only
    assert refusals.kernel_names(registry, None, H200, ["cd" * 32]) == ["cd" * 32]
    assert refusals.kernel_names(known_bad.load(), None, H200, ["cd" * 32]) == []  # no entry names kernels


@pytest.mark.parametrize("item", [TRAIN72, Signature.of(TRAIN72)])
def test_signature_of(item: Any) -> None:
    assert refusals.signature_of(item) == Signature.of(TRAIN72)


def test_in_force(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FA4_AOT_CERTIFIED", raising=False)
    store = Store(tmp_path / "store")
    assert refusals.in_force(None, H200) == known_bad.load()
    store.put_known_bad("h200", measured({"id": "measured-hd96", "when": {"head_dim": 96}}))
    assert [b.id for b in refusals.in_force(store, H200).entries][-1] == "measured-hd96"
    assert refusals.in_force(store, B200) == known_bad.load()  # measured for h200 only
    monkeypatch.setenv("FA4_AOT_CERTIFIED", "off")  # the build host's policy: plan them anyway
    assert refusals.in_force(store, H200).entries == ()
    monkeypatch.setenv("FA4_AOT_CERTIFIED", "never")
    with pytest.raises(ConfigError, match="FA4_AOT_CERTIFIED='never' is not a policy"):
        refusals.in_force(store, H200)
    monkeypatch.setenv("FA4_AOT_CERTIFIED", "require")
    store.put_known_bad("h200", b"{not json")
    with pytest.raises(StoreError, match="fa4-aot certify --sku h200"):  # never "nothing is known bad"
        refusals.in_force(store, H200)


# -- real planning ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    return Store(tmp_path_factory.mktemp("refusals") / "store")


@pytest.fixture(scope="module")
def workers() -> Iterator[dict[str, LocalExecutor]]:
    found = {"h200": LocalExecutor(1), "b200": LocalExecutor(1)}
    yield found
    for ex in found.values():
        ex.close()


@pytest.fixture()
def no_measured(store: Store) -> Iterator[None]:
    store.put_known_bad("h200", measured())
    yield
    store.put_known_bad("h200", measured())


def plan(workers: dict[str, LocalExecutor], store: Store, sku: Any, *items: Call | Signature) -> PlanOut:
    ((_, out),) = list(workers[sku.name].plan(sku, store, [[("t", item) for item in items]], record=False))
    return out


def refused(out: PlanOut) -> dict[int, str]:
    return {r.work_index: r.known_bad for r in out.rejected}


@pytest.mark.slow
def test_h200_refuses_hd72_training_and_plans_hd64(workers: dict[str, LocalExecutor], store: Store,
                                                    no_measured: None) -> None:
    out = plan(workers, store, H200, TRAIN72, TRAIN64, TRAIN80_DET, PREFILL72, Signature.of(TRAIN72))
    assert refused(out) == {0: DQ_BUG, 2: DQ_BUG, 4: DQ_BUG}
    reason = out.rejected[0].error
    assert reason.startswith(f"known bad ({DQ_BUG}): FA4's sm_90 backward returns a wrong dq")
    assert "Dao-AILab/flash-attention#2896" in reason  # the source
    planned = {k.work_index for k in out.kernels}
    assert planned == {1, 3}  # hd64 training and hd72 prefill; nothing of a refused item
    assert {k.family for k in out.kernels if k.work_index == 1} >= {"_flash_attn_fwd", "_flash_attn_bwd"}


@pytest.mark.slow
def test_b200_plans_hd72_training(workers: dict[str, LocalExecutor], store: Store) -> None:
    out = plan(workers, store, B200, TRAIN72)
    assert out.rejected == [] and {k.family for k in out.kernels} >= {"_flash_attn_fwd", "_flash_attn_bwd"}


@pytest.mark.slow
def test_h200_refuses_paged_hd160_decode(workers: dict[str, LocalExecutor], store: Store, no_measured: None) -> None:
    out = plan(workers, store, H200, DECODE160, replace(DECODE160, head_dim=128, head_dim_v=128))
    assert refused(out) == {0: PAGED_CRASH} and {k.work_index for k in out.kernels} == {1}
    assert "cudaErrorIllegalAddress" in out.rejected[0].error and "sgl-project/sglang#35757" in out.rejected[0].error


@pytest.mark.slow
def test_measured_entries_of_the_store_are_honoured(workers: dict[str, LocalExecutor], store: Store,
                                                    no_measured: None) -> None:
    """What a certification measured (known-bad/h200.json): a signature, or kernel keys; one for another FA4
    version names nothing."""
    first = plan(workers, store, H200, TRAIN64, replace(TRAIN64, pass_="fwd"))
    (bwd,) = {k.kernel_key for k in first.kernels if k.family == "_flash_attn_bwd"}
    store.put_known_bad("h200", measured(
        {"id": "measured-hd96", "when": {"head_dim": 96}},
        {"id": "measured-bwd-hd64", "when": {"head_dim": 64}, "kernel_keys": [bwd]},
        {"id": "fixed-later", "when": {"head_dim": 128}, "flash_attn": ["9.9.9"]}))
    hd96, hd128 = replace(TRAIN64, head_dim=96, head_dim_v=96), replace(TRAIN64, head_dim=128, head_dim_v=128)
    out = plan(workers, store, H200, TRAIN64, replace(TRAIN64, pass_="fwd"), hd96, hd128)
    assert refused(out) == {0: "measured-bwd-hd64", 2: "measured-hd96"}
    assert out.rejected[0].error == "known bad (measured-bwd-hd64): wrong dq (rel. error 1.3) (source: fa4-aot " \
                                    "certify on nvidia-h200 (test))"
    assert {k.work_index for k in out.kernels} == {1, 3}  # the forward needs no such kernel; 9.9.9 is not ours


@pytest.mark.slow
def test_the_on_demand_builder_ends_a_refused_job_rejected_with_the_reason(
        workers: dict[str, LocalExecutor], store: Store, no_measured: None) -> None:
    miss = Miss.from_dict({"kernel_key": "ab" * 32, "family": "_flash_attn_bwd", "compile_key": ["x"],
                           "sku": "h200", "call": TRAIN72.to_dict(), "args": None})
    reports = build_misses(MATRIX, store, [miss], executor=workers["h200"])
    assert reports[0].failed == 0 and [r.status for r in reports[0].refused] == ["refused"]
    outcome = outcome_of(reports, "h200")
    assert outcome.status == "rejected" and outcome.detail.startswith(f"known bad ({DQ_BUG}):")
    assert outcome.built == 0 and not any(store.entries())


@pytest.mark.slow
def test_dry_run_reports_refused_calls(tmp_path: Path) -> None:
    calls = tmp_path / "calls.jsonl"
    calls.write_text("".join(json.dumps(c.to_dict()) + "\n" for c in (TRAIN72, TRAIN64, DECODE160)))
    args = ("build", "--sku", "h200", "--variants", str(TINY_VARIANTS), "--calls", str(calls), "--dry-run")
    result = run_cli(*args, "--json", cache=tmp_path / "store")
    assert result.returncode == 0, result.stderr[-2000:]  # refused as known bad is no failure of the build
    doc = json.loads(result.stdout)
    assert (doc["failed"], doc["refused"], doc["planned"]) == (0, 2, doc["kernels"]) and doc["kernels"] >= 3
    assert [r["call"].split(" b=")[0] for r in doc["refusals"]] == ["bwd dense bf16 d=72 causal",
                                                                     "fwd paged bf16 d=160 causal"]
    assert all(r["status"] == "refused" and r["error"].startswith("known bad (") for r in doc["refusals"])
    text = run_cli(*args, cache=tmp_path / "store").stdout
    assert f"REFUSED calls.jsonl: bwd dense bf16 d=72 causal b=2 sq=1024 sk=1024 h=16/16: known bad ({DQ_BUG})" in text
    assert "0 failed, 2 call(s) refused as known bad" in text
    assert not (tmp_path / "store" / "index").exists()  # a dry run builds nothing
