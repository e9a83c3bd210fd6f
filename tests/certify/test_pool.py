"""The certification pool's process handling (fa4_aot/certify/pool.py) with real worker processes that follow the
worker protocol without a GPU (scripted_worker.py): a crash, a death and a hang each cost one outcome and a new
worker, never the run, and each outcome names the part that was running."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fa4_aot.certify import plan, schedule
from fa4_aot.certify.plan import Check, Use
from fa4_aot.certify.pool import Pool
from fa4_aot.domain.signature import Signature

SCRIPT = [sys.executable, str(Path(__file__).with_name("scripted_worker.py"))]
GPU = lambda _gpu: 64 << 30  # noqa: E731  (the bytes its workers share: no GPU here to ask)
SIG = Signature("dense", "bwd", "bf16", 72, 72, "causal", (0, 0), 0.0, False, 1, 8, 8)


def check(how: str) -> Check:
    return Check(SIG, {"batch": 1, "seqlen_q": 8, "seqlen_k": 8, "heads_kv": 8},
                 (Use("_flash_attn_fwd", "a" * 64), Use("_flash_attn_bwd", "b" * 64)), "typical", 1, how)


def run(hows: list[str], jobs: int = 1, deadline: float = 30.0) -> dict[str, tuple[str, str, str]]:
    # a fresh worker's first check also gets the start-up allowance: a loaded host starts Python slowly
    pool = Pool(Path("/nonexistent"), "h200", [0], jobs, deadline, command=SCRIPT, startup=60.0, capacity=GPU)
    checks = [(f"c{i}", check(how)) for i, how in enumerate(hows)]
    return {o.ident: (o.status, o.part, o.detail) for o in pool.run(checks)}


@pytest.mark.timeout(600)  # the hangs sleep an hour: only the pool's deadline ends them
def test_every_check_gets_an_outcome_through_crashes_deaths_and_hangs() -> None:
    found = run(["pass", "crash", "pass", "die", "wrong", "hang", "pass", "bwd-hang", "pass"], deadline=2.0)
    assert len(found) == 9, found
    assert [found[f"c{i}"][0] for i in range(9)] == ["pass", "crash", "pass", "crash", "wrong", "hang", "pass",
                                                     "hang", "pass"]
    assert "illegal memory access" in found["c1"][2]
    assert "died (exit code 9)" in found["c3"][2]
    assert found["c5"][1] == "fwd" and found["c7"][1] == "bwd"  # the part announced before it hung
    assert found["c4"][1] == "bwd"


def test_several_workers_share_the_checks() -> None:
    found = run(["pass"] * 12 + ["crash", "die"], jobs=3)
    assert sorted(s for s, _p, _d in found.values()) == ["crash"] * 2 + ["pass"] * 12


def test_stop_hands_out_nothing_more() -> None:
    pool = Pool(Path("/nonexistent"), "h200", [0], 1, 30.0, command=SCRIPT, startup=60.0, capacity=GPU)
    seen = []
    for outcome in pool.run([(f"c{i}", check("pass")) for i in range(10)], stop=lambda: len(seen) >= 2):
        seen.append(outcome)
    assert 2 <= len(seen) < 10
    assert not pool.workers  # closed


def test_checks_skip_passes_over_get_no_outcome() -> None:
    pool = Pool(Path("/nonexistent"), "h200", [0], 1, 30.0, command=SCRIPT, startup=60.0, capacity=GPU)
    crashed: list[str] = []
    checks = [("c0", check("crash"))] + [(f"c{i}", check("pass")) for i in range(1, 6)]
    for outcome in pool.run(checks, skip=lambda c: bool(crashed)):
        crashed.append(outcome.ident)
    assert crashed[0] == "c0" and len(crashed) <= 2  # at most the check already handed out when c0 crashed


def test_h200_default_certify_out_of_memory_restarts_the_worker_without_a_crash() -> None:
    # the default h200 build's certification at -j 16 (H200, 2026-12-03): a worker that ran out of GPU memory and
    # lost its context answered "crash"; now an error marked restart, and the worker is replaced all the same
    found = run(["oom", "pass", "oom", "jobs"], jobs=1)
    assert [found[f"c{i}"][0] for i in range(4)] == ["error", "pass", "error", "pass"]
    assert "not a kernel fault" in found["c0"][2]
    assert found["c3"][2] == "1"  # the worker knows its count per GPU: its share of the GPU's memory


def test_workers_learn_how_many_share_their_gpu() -> None:
    found = run(["jobs"] * 3, jobs=3)
    assert {d for _s, _p, d in found.values()} == {"3"}


def test_the_pool_asks_skip_about_each_check_once_not_once_per_answer() -> None:
    # the default h100-sxm build's certification: the pool filtered every waiting check through `skip` at each
    # worker answer (9,230 checks, ~23,000 answers), so the parent fell behind its 16 workers and they waited
    asked: list[str] = []
    pool = Pool(Path("/nonexistent"), "h200", [0], 3, 30.0, command=SCRIPT, startup=60.0, capacity=GPU)
    checks = [(f"c{i}", check("pass")) for i in range(30)]
    found = list(pool.run(checks, skip=lambda c: bool(asked.append(c.label))))
    assert len(found) == 30
    assert len(asked) == 30


def test_a_check_larger_than_an_even_share_is_granted_the_memory_its_estimate_needs() -> None:
    # the H100's default-build certification at -j 16: an even share of the GPU (4.4 GiB a worker) ran 375
    # checks out of memory while 50-65 GiB of the GPU stood free
    big = Check(SIG, {"batch": 1, "seqlen_q": 65243, "seqlen_k": 4096, "heads_kv": 8},
                (Use("_flash_attn_fwd", "a" * 64), Use("_flash_attn_bwd", "b" * 64)), "large", 1, "memory")
    small = check("memory")
    pool = Pool(Path("/nonexistent"), "h200", [0], 16, 30.0, command=SCRIPT, startup=60.0, capacity=GPU)
    found = {o.ident: int(o.detail) for o in pool.run([("big", big), ("small", small)])}
    assert found["big"] == schedule.grant(plan.peak_bytes(big), GPU(0)) > GPU(0) // 16
    assert found["small"] == schedule.grant(plan.peak_bytes(small), GPU(0)) < found["big"]


def test_workers_run_torch_on_one_cpu_thread() -> None:
    # the default h200 build's certification at -j 16: torch's thread per CPU in each of 16 workers made a varlen
    # check of 65,535 sequences spend 1 to 3 s on its inputs' few CPU ops
    found = run(["threads"] * 2, jobs=2)
    assert {d for _s, _p, d in found.values()} == {"1"}
