"""domain/misses.py: the Miss and BuildJob values, their documents and the miss key (issue 30, "a home for misses").

The key bytes must not change: a client of an older version reports under the old key and a server recomputes it,
so the differential tests below compare the new functions with frozen copies of the old ones (their bodies as
they were before issue 30: kernel_keys.call_key, runtime/misses.miss_of, compile/builder.miss_of) over many random
misses, and pin digests of keys computed by the old code before the change."""

from __future__ import annotations

import hashlib
import json
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import pytest

from fa4_aot.domain.calls import DTYPES, LAYOUTS, MASKS, PASSES, Call
from fa4_aot.domain.misses import LEAN_FAMILY, BuildJob, Miss, lean_key
from fa4_aot.domain.signature import Signature
from fa4_aot.domain.skus import Sku
from fa4_aot.store import recipes

SKUS = ["h200", "b200", "h100-sxm", "x"]


# -- the old code, frozen (as it was at f9f0733) -----------------------------------------------------------------

def _old_dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def old_call_key(call: dict[str, Any], sku: str) -> str:  # fa4_aot/domain/kernel_keys.py call_key
    return hashlib.sha256(_old_dumps({"lean_call": call, "sku": sku}).encode()).hexdigest()


@dataclass(frozen=True)
class OldMiss:  # fa4_aot/store/side.py Miss
    kernel_key: str
    family: str
    compile_key: Any
    sku: str
    call: dict[str, Any] | None = None
    args: dict[str, Any] | None = None
    when: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))


def old_lean_miss_of(call: Call, sku: str) -> OldMiss:  # fa4_aot/runtime/misses.py miss_of (and key_of)
    return OldMiss(kernel_key=old_call_key(call.to_dict(), sku), family="recipe", compile_key=call.to_dict(),
                   sku=sku, call=call.to_dict())


def old_job_miss_of(job: dict[str, Any]) -> dict[str, Any]:  # fa4_aot/compile/builder.py miss_of
    return {name: job.get(name) for name in ("kernel_key", "family", "compile_key", "sku", "call", "args")}


def random_call(rng: random.Random) -> Call:
    mask, layout, hkv = rng.choice(MASKS), rng.choice(LAYOUTS), rng.choice([1, 2, 4, 8])
    return Call(layout=layout, pass_=rng.choice(PASSES), dtype=rng.choice(DTYPES),
                head_dim=rng.choice([64, 96, 128, 192]), head_dim_v=rng.choice([64, 128]), mask=mask,
                window=(rng.randint(-1, 512), rng.randint(-1, 512)) if mask == "local" else (-1, -1),
                softcap=rng.choice([0.0, 0.0, 15.0, 30.5]), sink=rng.random() < 0.2,
                num_splits=rng.choice([1, 1, 2, 3]), batch=rng.randint(1, 64), seqlen_q=rng.randint(1, 1 << 16),
                seqlen_k=rng.randint(1, 1 << 16), heads_q=hkv * rng.choice([1, 2, 4, 7]), heads_kv=hkv,
                page_size=rng.choice([0, 16, 64]) if layout == "paged" else 0)


def random_miss(rng: random.Random) -> Miss:
    """A lean miss, or a kernel miss with a random key, compile key, call and args."""
    call = random_call(rng)
    if rng.random() < 0.5:
        return Miss.lean(call, rng.choice(SKUS))
    key = "".join(rng.choice("0123456789abcdef") for _ in range(64))
    return Miss(kernel_key=key, family=rng.choice(["fwd", "bwd", "fwd_combine"]),
                compile_key=[rng.randint(0, 9), "x", None, {"float": "0x1.0p+0"}], sku=rng.choice(SKUS),
                call=rng.choice([None, call.to_dict()]), args=rng.choice([None, {"q": [1, 2], "causal": True}]),
                when="2026-12-01T00:00:00Z")


# -- key bytes ---------------------------------------------------------------------------------------------------

def test_lean_keys_equal_the_old_functions_over_random_calls() -> None:
    rng = random.Random(1)
    for _ in range(2000):
        call, sku = random_call(rng), rng.choice(SKUS)
        assert lean_key(call.to_dict(), sku) == old_call_key(call.to_dict(), sku)
        new, old = Miss.lean(call, sku).to_dict(), asdict(old_lean_miss_of(call, sku))
        new.pop("when"), old.pop("when")
        assert new == old and json.dumps(new, sort_keys=True) == json.dumps(old, sort_keys=True)


def _digest(keys: list[str]) -> str:
    h = hashlib.sha256()
    for k in keys:
        h.update(k.encode())
    return h.hexdigest()


def test_keys_equal_those_the_old_code_computed() -> None:
    """Digests of keys the code before issue 30 computed over the same seeded calls (kernel_keys.call_key through
    runtime/misses.key_of, store/recipes.recipe_key and legacy_key, runtime/misses.miss_of's documents)."""
    rng = random.Random(30)
    assert _digest([Miss.lean(random_call(rng), rng.choice(SKUS)).kernel_key for _ in range(500)]) == \
        "5e65fabd3da36837d84381b7762c006d068d496efb38c48685123934f1f9ba8e"
    rng, keys = random.Random(31), []
    for _ in range(300):
        sig = Signature.of(random_call(rng))
        sku = Sku(name="s", arch=rng.choice(["sm_90a", "sm_100a"]), sm_count=rng.choice([132, 148]),
                  l2_bytes=rng.choice([50 << 20, 60 << 20]), cuda_major=rng.choice([12, 13]),
                  host=rng.choice(["", "x86-64-v3"]))
        keys += [recipes.recipe_key(sig, sku), recipes.recipe_key(sig, sku, 2), recipes.legacy_key(sig, sku)]
    assert _digest(keys) == "b8ed976d7ffb912f130f2151eccd3171cf9c47bb5e5a1a8ac2cfaa4c5ad80024"
    rng, docs = random.Random(32), []
    for _ in range(300):
        doc = Miss.lean(random_call(rng), rng.choice(SKUS)).to_dict()
        doc.pop("when")
        docs.append(json.dumps(doc, sort_keys=True))
    assert _digest(docs) == "b12c4eef0449c66993cc0c79a7d50d40e1fb4845d11156c3d9fb4fed8dc04ee8"


def test_a_jobs_miss_is_what_the_old_builder_built() -> None:
    rng = random.Random(2)
    for i in range(500):
        doc = {**random_miss(rng).to_dict(), "id": i, "status": "running", "attempts": 1, "claim": "c" * 32}
        doc.pop("when")
        new = BuildJob.from_dict(doc, claimed=True).miss.to_dict()
        new.pop("when")
        assert new == old_job_miss_of(doc)


# -- documents ---------------------------------------------------------------------------------------------------

def test_misses_round_trip_and_read_the_old_documents() -> None:
    rng = random.Random(3)
    for _ in range(500):
        miss = random_miss(rng)
        assert Miss.from_dict(miss.to_dict()) == miss
        text = json.dumps(miss.to_dict(), sort_keys=True)  # through JSON a call's window tuple comes back a list
        assert json.dumps(Miss.from_dict(json.loads(text)).to_dict(), sort_keys=True) == text
        old = OldMiss(**miss.to_dict())  # what store/side.py wrote and a client reported before
        assert json.dumps(asdict(old), sort_keys=True, indent=1) == json.dumps(miss.to_dict(), sort_keys=True, indent=1)
        assert Miss.from_dict(asdict(old)) == miss


def test_a_servers_listing_item_is_a_miss_without_its_counts() -> None:
    item = {"kernel_key": "a" * 64, "sku": "h200", "family": "fwd", "compile_key": [1], "call": None, "args": None,
            "count": 3, "first_seen": "2026-12-01T00:00:00Z", "last_seen": "2026-12-01T00:00:00Z"}
    assert Miss.from_dict(item) == Miss("a" * 64, "fwd", [1], "h200", when="")


def test_a_lean_miss_is_keyed_by_its_call() -> None:
    call = random_call(random.Random(4))
    miss = Miss.lean(call, "h200")
    assert miss.is_lean and miss.family == LEAN_FAMILY and miss.compile_key == miss.call == call.to_dict()
    assert miss.parsed_call() == call and miss.kernel_key == lean_key(call.to_dict(), "h200")
    assert Miss.lean(call, "b200").kernel_key != miss.kernel_key


def test_a_call_this_version_cannot_read_is_none() -> None:
    assert Miss("a" * 64, "fwd", [], "h200", call={"layout": "new"}).parsed_call() is None
    assert Miss("a" * 64, "fwd", [], "h200").parsed_call() is None


GOOD = {"kernel_key": "a" * 64, "family": "fwd", "compile_key": [], "sku": "h200"}


@pytest.mark.parametrize(("doc", "says"), [
    ([1], "expected a JSON object"),
    ({k: v for k, v in GOOD.items() if k != "kernel_key"}, "'kernel_key' is missing"),
    ({**GOOD, "kernel_key": "A" * 64}, "kernel_key \"AAAA"),
    ({**GOOD, "kernel_key": 7}, "not 64 lowercase hex"),
    ({**GOOD, "family": ""}, "family \"\" is not a non-empty string"),
    ({**GOOD, "sku": None}, "sku null is not a non-empty string"),
    ({k: v for k, v in GOOD.items() if k != "compile_key"}, "'compile_key' is missing"),
    ({**GOOD, "call": "fwd"}, "call \"fwd\" is not a JSON object"),
    ({**GOOD, "args": [1]}, "args [1] is not a JSON object"),
    ({**GOOD, "when": 5}, "when 5 is not"),
])
def test_a_document_that_is_not_a_miss_says_which_field(doc: Any, says: str) -> None:
    with pytest.raises(ValueError, match="invalid miss") as e:
        Miss.from_dict(doc)
    assert says in str(e.value)


JOB = {"id": 7, "sku": "h200", "kernel_key": "b" * 64, "family": "recipe", "status": "queued", "reports": 2,
       "attempts": 0, "builder": "", "created": "2026-12-01T00:00:00Z", "started": None, "finished": None,
       "lease_until": None, "detail": "", "compile_seconds": 0.0, "built": 0, "call": None, "compile_key": None,
       "args": None, "claim": None, "not_before": None}


def test_build_jobs_round_trip_and_end() -> None:
    job = BuildJob.from_dict(JOB)
    assert job.to_dict() == JOB and BuildJob.from_dict(job.to_dict()) == job and not job.ended
    assert BuildJob.from_dict({**JOB, "status": "rejected"}).ended
    assert BuildJob.from_dict({**JOB, "newer_field": 1}) == job  # a newer server's fields are dropped
    assert job.miss == Miss("b" * 64, "recipe", None, "h200", when="2026-12-01T00:00:00Z")


@pytest.mark.parametrize(("changes", "says"), [
    ({"id": "7"}, "id \"7\" is not a whole number"),
    ({"id": True}, "id true is not a whole number"),
    ({"attempts": -1}, "attempts -1"),
    ({"status": None}, "status null is not"),
    ({"kernel_key": "x"}, "kernel_key \"x\""),
    ({"compile_seconds": "1"}, "compile_seconds"),
    ({"call": [1]}, "call [1] is not a JSON object"),
    ({"created": 5}, "created 5"),
])
def test_a_document_that_is_not_a_build_job_says_which_field(changes: dict[str, Any], says: str) -> None:
    with pytest.raises(ValueError, match="invalid build job") as e:
        BuildJob.from_dict({**JOB, **changes})
    assert says in str(e.value)


def test_a_claim_holds_its_claim_and_compile_key() -> None:
    with pytest.raises(ValueError, match="invalid claimed build job: claim null"):
        BuildJob.from_dict(JOB, claimed=True)
    with pytest.raises(ValueError, match="'compile_key' is missing"):
        BuildJob.from_dict({k: v for k, v in JOB.items() if k != "compile_key"} | {"claim": "c"}, claimed=True)
    assert BuildJob.from_dict({**JOB, "claim": "c"}, claimed=True).claim == "c"
