"""Which check a free certification worker takes next (fa4_aot/certify/schedule.py): a signature's checks stay with
one worker, and GPU memory is granted after each check's estimate, with no check starved by smaller ones."""

from __future__ import annotations

from fa4_aot.certify.plan import Check
from fa4_aot.certify.schedule import GRANT_FACTOR, GRANT_FLOOR, Schedule, grant
from fa4_aot.domain.signature import Signature

GIB = 1 << 30


def sig(head_dim: int) -> Signature:
    return Signature("dense", "bwd", "bf16", head_dim, head_dim, "causal", (0, 0), 0.0, False, 1, 8, 8)


def check(head_dim: int, label: str, gib: float = 0.0) -> tuple[str, Check]:
    """A check of the signature of `head_dim`, estimated at `gib` GiB (its point's "gib", read by `estimate`)."""
    return label, Check(sig(head_dim), {"batch": 1, "gib": int(gib * 64)}, (), "typical", 1, label)


def estimate(c: Check) -> int:
    return c.point["gib"] * GIB // 64


def schedule(jobs: list[tuple[str, Check]], capacity: int = 64 * GIB, alone: bool = False) -> Schedule:
    return Schedule(jobs, lambda c: c.sig, estimate, {0: capacity}, alone)


def taken(s: Schedule, slot: int) -> str | None:
    job = s.take(slot, 0)
    return None if job is None else job[0]


def test_grants_follow_the_estimate_within_the_capacity() -> None:
    for est, capacity, expected in [(0, 64 * GIB, GRANT_FLOOR),
                                    (2 * GIB, 64 * GIB, GRANT_FACTOR * 2 * GIB + GRANT_FLOOR),
                                    (40 * GIB, 64 * GIB, 64 * GIB)]:
        assert grant(est, capacity) == expected


def test_a_worker_keeps_to_its_signature_then_helps_from_the_back_of_the_longest_group() -> None:
    s = schedule([check(64, "a1"), check(64, "a2"), check(128, "b1"), check(64, "a3"), check(128, "b2"),
                  check(96, "c1")])
    assert [taken(s, 0), taken(s, 1), taken(s, 0), taken(s, 2)] == ["a1", "b1", "a2", "c1"]
    assert taken(s, 2) == "a3"  # its own group is done, none is left unheld: the back of the longest
    assert [taken(s, 1), taken(s, 0), taken(s, 1)] == ["b2", None, None]
    assert len(s) == 0


def test_skipped_checks_are_dropped_at_their_turn() -> None:
    s = schedule([check(64, "a1"), check(64, "a2"), check(64, "a3")])
    job = s.take(0, 0, skip=lambda c: c.label == "a1")
    assert job is not None and job[0] == "a2" and len(s) == 1


def test_a_large_check_runs_beside_small_ones_where_their_grants_leave_room() -> None:
    s = schedule([check(64, "big-a", 1.0), check(64, "big-b", 8.0), check(128, "s1"), check(96, "s2")],
                 capacity=40 * GIB)
    first = s.take(0, 0)
    assert first is not None and first[2] == 5 * GIB
    assert [taken(s, 1), taken(s, 2)] == ["s1", "s2"]  # 1 GiB each: the floor
    s.release(0, first[2])
    second = s.take(0, 0)
    assert second is not None and second[0] == "big-b" and second[2] == 33 * GIB
    assert s.used[0] == 35 * GIB


def test_the_reservation_of_a_waiting_check_holds_off_smaller_ones_until_it_fits() -> None:
    s = schedule([check(64, "small-a", 2.0), check(128, "huge", 6.0), check(96, "small-b", 2.0)],
                 capacity=30 * GIB)
    a = s.take(0, 0)  # 9 GiB
    assert a is not None and a[0] == "small-a"
    assert s.take(1, 0) is None  # huge: 25 GiB does not fit beside 9: it waits and reserves 25
    assert s.reserved[0] == (1, 25 * GIB)
    assert s.take(2, 0) is None  # small-b's 9 GiB would leave no room for the reservation
    s.release(0, a[2])
    b = s.take(1, 0)
    assert b is not None and b[0] == "huge" and 0 not in s.reserved
    c = s.take(2, 0)
    assert c is None  # 25 + 9 > 30: small-b waits its turn


def test_a_check_larger_than_the_gpu_runs_when_nothing_else_does() -> None:
    s = schedule([check(64, "a", 1.0), check(128, "giant", 100.0)], capacity=40 * GIB)
    a = s.take(0, 0)
    assert a is not None and s.take(1, 0) is None
    s.release(0, a[2])
    giant = s.take(1, 0)
    assert giant is not None and giant[0] == "giant" and giant[2] == 40 * GIB


def test_one_worker_per_gpu_is_granted_the_whole_gpu() -> None:
    s = schedule([check(64, "a")], capacity=40 * GIB, alone=True)
    job = s.take(0, 0)
    assert job is not None and job[2] == 40 * GIB


def test_a_check_its_worker_never_took_goes_back_first() -> None:
    s = schedule([check(64, "a1"), check(64, "a2")])
    job = s.take(0, 0)
    assert job is not None
    s.again(0, job[:2], 0, job[2])
    assert s.used[0] == 0 and len(s) == 2 and taken(s, 0) == "a1"
