"""The store's verdict files order verdicts by when they are written, not by the `when` they claim: a verdict dated
ahead (its publisher's word) must not outlive a measurement written after it, in the store or in a pull."""

from __future__ import annotations

import time
from pathlib import Path

from fa4_aot.domain.verdicts import Verdict, check_when
from fa4_aot.remote.push_pull import newer_than_held
from fa4_aot.store import Store

KEY = "ab" * 32
DEV = "nvidia-h200.132sm.driver-13.0.cuda-13.0"
OTHER = "nvidia-h200.132sm.driver-12.8.cuda-12.8"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def test_a_future_dated_verdict_in_the_store_does_not_outlive_a_later_write(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    store.put_verdicts([Verdict(KEY, DEV, "pass", when="9999-12-31T23:59:59Z"),
                        Verdict(KEY, OTHER, "pass", when="2026-12-01T00:00:00Z")])
    wrong = Verdict(KEY, DEV, "wrong", tensor="dq", error=1.0, bound=0.1, when=_now())
    assert newer_than_held(store, [wrong]) == [wrong]  # a pull keeps the later measurement
    store.put_verdicts([wrong])
    assert sorted((v.device, v.status) for v in store.verdicts(KEY)) == [(OTHER, "pass"), (DEV, "wrong")]


def test_a_verdict_time_is_a_date_from_2020_up_to_a_few_minutes_ahead() -> None:
    clock = 1_780_000_000.0  # 2026-05-28
    for good in ("2020-01-01T00:00:00Z", "2026-05-28T20:31:00Z"):
        assert check_when(good, clock) == good
    for bad, why in (("2026-05-28T20:40:00Z", "future"), ("9999-12-31T23:59:59Z", "future"),
                     ("2019-12-31T23:59:59Z", "before 2020"), ("2026-02-30T00:00:00Z", "not a date"),
                     ("2026-05-28 20:00:00", "expected a string"), (1764756000, "expected a string"),
                     (None, "expected a string")):
        try:
            check_when(bad, clock)
        except ValueError as e:
            assert why in str(e), (bad, e)
        else:
            raise AssertionError(f"{bad!r} was taken as a verdict time")
