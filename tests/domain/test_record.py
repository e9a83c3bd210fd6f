"""FA4_AOT_RECORD: one JSON line per distinct call, appended safely by many processes, read back by coverage."""

from __future__ import annotations

import json
import multiprocessing
from dataclasses import replace
from pathlib import Path

import pytest

from fa4_aot.compile import coverage
from fa4_aot.domain import call_log
from fa4_aot.domain.calls import Call
from fa4_aot.errors import ConfigError

CALL = Call(layout="dense", pass_="bwd", dtype="bf16", head_dim=128, head_dim_v=128, mask="causal", window=(0, 0),
            softcap=0.0, sink=False, num_splits=1, batch=2, seqlen_q=4096, seqlen_k=4096, heads_q=32, heads_kv=8)


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(call_log, "_seen", set())


def test_unset_records_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FA4_AOT_RECORD", raising=False)
    assert call_log.note(CALL) is False


def test_each_distinct_call_once_and_lines_read_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FA4_AOT_RECORD", str(path))
    other = replace(CALL, layout="paged", pass_="fwd", seqlen_q=1, page_size=16, window=(127, 0), mask="local")
    assert [call_log.note(c) for c in (CALL, CALL, other, CALL)] == [True, False, True, False]
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[0])["pass_"] == "bwd"
    assert coverage.read_calls(path) == [CALL, other]


def _append(path: str, worker: int) -> None:
    import os

    os.environ["FA4_AOT_RECORD"] = path
    call_log._seen.clear()
    for i in range(300):
        call_log.note(replace(CALL, batch=worker * 1000 + i, window=(i, 0)))


def test_processes_appending_together_never_interleave_lines(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append, args=(str(path), w)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    assert all(p.exitcode == 0 for p in procs)
    calls = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(calls) == 1200 and len({c["batch"] for c in calls}) == 1200


def test_unwritable_target_warns_and_never_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FA4_AOT_RECORD", str(tmp_path / "missing-dir" / "calls.jsonl"))
    with pytest.warns(UserWarning, match="FA4_AOT_RECORD=.*cannot append"):
        assert call_log.note(CALL) is False


def test_record_refuses_a_symlink(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A link planted where the record goes (a shared temp folder) must not turn appends onto its target."""
    target = tmp_path / "victim"
    target.write_text("untouched\n")
    (tmp_path / "calls.jsonl").symlink_to(target)
    monkeypatch.setenv("FA4_AOT_RECORD", str(tmp_path / "calls.jsonl"))
    with pytest.warns(UserWarning, match="FA4_AOT_RECORD=.*symbolic link"):
        assert call_log.note(CALL) is False
    assert target.read_text() == "untouched\n"


@pytest.mark.parametrize("text,why", [
    ("{}", r"missing \['layout'"),
    ('{"layout": "dense"', "not a call"),
    (json.dumps({**CALL.to_dict(), "colour": 1}), r"unknown \['colour'\]"),
    (json.dumps({**CALL.to_dict(), "layout": "sparse"}), "layout must be one of"),
    ("[1, 2]", "expected a JSON object"),
    ("", "no calls"),
])
def test_bad_calls_file_names_file_and_line(tmp_path: Path, text: str, why: str) -> None:
    path = tmp_path / "calls.jsonl"
    path.write_text("\n" + text + "\n")
    with pytest.raises(ConfigError, match=f"calls.jsonl(:2)?: .*{why}"):
        coverage.read_calls(path)
