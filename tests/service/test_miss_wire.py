"""The service's HTTP shapes of a miss and a build job against the domain values (domain/misses.py, issue 30): the
same field names both ways, so older clients and servers interoperate, and MissIn.to_miss is the one conversion."""

from __future__ import annotations

from datetime import UTC, datetime

from fa4_aot.domain.calls import Call
from fa4_aot.domain.kernel_keys import dumps
from fa4_aot.domain.misses import BUILD_JOB_FIELDS, MISS_FIELDS, BuildJob, Miss
from service.schemas import MissIn, MissOut
from service.schemas.builds import BuildOut

CALL = Call(layout="dense", pass_="fwd", dtype="bf16", head_dim=128, head_dim_v=128, mask="causal", window=(-1, -1),
            softcap=0.0, sink=False, num_splits=1, batch=2, seqlen_q=256, seqlen_k=256, heads_q=8, heads_kv=8)


def test_the_schemas_name_the_domain_fields() -> None:
    assert set(BuildOut.model_fields) == set(BUILD_JOB_FIELDS)
    assert set(MissIn.model_fields) == set(MISS_FIELDS) - {"when"}  # the server's clock stamps a report
    assert set(MissOut.model_fields) - {"count", "first_seen", "last_seen"} == set(MISS_FIELDS) - {"when"}


def test_a_clients_lean_miss_converts_once_and_keeps_its_key() -> None:
    miss = Miss.lean(CALL, "h200")
    got = MissIn.model_validate(miss.to_dict()).to_miss()
    assert got.kernel_key == miss.kernel_key and got.family == miss.family and got.sku == miss.sku
    assert dumps(got.call) == dumps(miss.call) and dumps(got.compile_key) == dumps(miss.compile_key)


def test_a_kernel_miss_converts_with_its_args() -> None:
    doc = {"kernel_key": "c" * 64, "family": "fwd", "compile_key": [1, "x"], "sku": "h200", "call": CALL.to_dict(),
           "args": None, "when": "2026-12-01T00:00:00Z"}
    got = MissIn.model_validate(doc).to_miss()
    assert (got.kernel_key, got.family, got.compile_key, got.sku) == ("c" * 64, "fwd", [1, "x"], "h200")
    assert dumps(got.call) == dumps(CALL.to_dict())


def test_a_build_answer_parses_into_a_build_job() -> None:
    now = datetime(2026, 12, 1, tzinfo=UTC)
    out = BuildOut(id=3, sku="h200", kernel_key="d" * 64, family="recipe", status="running", reports=1, attempts=1,
                   builder="b1", created=now, started=now, finished=None, lease_until=now, detail="",
                   compile_seconds=0.0, built=0, call=CALL.to_dict(), compile_key=CALL.to_dict(), claim="c" * 32)
    doc = out.model_dump(mode="json")
    job = BuildJob.from_dict(doc, claimed=True)
    assert (job.id, job.status, job.claim, job.created) == (3, "running", "c" * 32, doc["created"])
    assert job.to_dict() == doc
    assert job.miss.kernel_key == "d" * 64 and job.miss.is_lean and job.miss.parsed_call() == CALL
