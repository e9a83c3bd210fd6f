"""Planning says it is alive (issue 30, point 9): the whole-matrix `--dry-run` planned for 22 minutes before its
estimate, and an interrupted whole-matrix build printed no progress line for 314 s. Planning now says its total at
once (work items planned / total) and, while no item finishes, says it again every few seconds on stderr, as
lines or (--json) JSON events, stdout keeping the one summary document.

Regression: a dry run's first planning line came when planning was over ([2/2]); nothing before it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from fa4_aot.cli.progress import Progress
from tests.conftest import TINY_VARIANTS, run_cli

DRY_RUN = ["build", "--sku", "h200", "--model", "bert-base", "--tp", "1", "--workload", "prefill", "--dry-run"]


@pytest.mark.slow
def test_i30_9_a_dry_run_says_its_planning_progress_on_stderr_while_planning(tmp_path: Path) -> None:
    done = run_cli(*DRY_RUN, "--json", cache=tmp_path / "store")
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(done.stdout)  # stdout: the summary document alone
    events = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    planning = [e for e in events if e["event"] == "plan"]
    total = doc["calls"]
    assert planning and planning[0]["done"] == 0 and planning[0]["total"] == total == 2, planning
    assert [e["done"] for e in planning] == sorted(e["done"] for e in planning) and planning[-1]["done"] == total
    lines = run_cli(*DRY_RUN, cache=tmp_path / "store")
    assert lines.returncode == 0, lines.stderr[-3000:]
    said = [line for line in lines.stderr.splitlines() if "calls and signatures" in line]
    assert said[0].startswith("[0/2] planned 0 of 2 calls and signatures") and said[-1].startswith("[2/2]"), said


def _wait_for(capsys: pytest.CaptureFixture[str], text: str) -> str:
    """stderr captured until it holds `text` (a heartbeat comes from Progress's thread); fails after 60 s."""
    seen = ""
    end = time.monotonic() + 60
    while text not in seen and time.monotonic() < end:
        time.sleep(0.02)
        seen += capsys.readouterr().err
    assert text in seen, seen
    return seen


@pytest.mark.parametrize("as_json", [False, True])
def test_i30_9_progress_says_its_last_update_again_while_none_comes_then_stops_at_close(
        capsys: pytest.CaptureFixture[str], as_json: bool) -> None:
    bar = Progress("plan", quiet=False, as_json=as_json, tty=False, every=0.05)
    bar.update(0, 3, "ok", "planned 0 of 3")
    first = _wait_for(capsys, '"elapsed"' if as_json else "planned 0 of 3 (")
    said = [line for line in first.splitlines() if line]
    assert len(said) >= 2 and all(("0/3" in line) or ('"done": 0' in line) for line in said), said
    bar.close()
    capsys.readouterr()
    time.sleep(0.3)  # six heartbeat periods: none may come after close
    assert capsys.readouterr().err == ""


def test_i30_9_progress_without_every_says_nothing_between_updates(capsys: pytest.CaptureFixture[str]) -> None:
    with Progress("plan", quiet=False, as_json=False, tty=False) as bar:
        bar.update(0, 3, "ok", "planned 0 of 3")
        time.sleep(0.2)
    assert capsys.readouterr().err == "[0/3] planned 0 of 3\n"


@pytest.mark.slow
def test_an_item_two_variants_share_is_planned_once_and_counted_for_both(tmp_path: Path) -> None:
    """The whole matrix names a signature under several variants (3,401 items, 3,152 distinct for h200): each is
    planned once, and every variant naming it still counts its kernels."""
    text = TINY_VARIANTS.read_text()
    start = text.rfind("[[variants]]", 0, text.index('name = "full-fwd"'))
    end = text.find("[[variants]]", start + 1)
    block = text[start:end if end != -1 else len(text)]
    twice = tmp_path / "twice.toml"
    twice.write_text(text + "\n" + block.replace('name = "full-fwd"', 'name = "full-fwd-again"'))
    done = run_cli("build", "--sku", "h200", "--variants", str(twice), "--dry-run", "--json", cache=tmp_path / "s")
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(done.stdout)
    assert doc["variants"]["full-fwd"] == doc["variants"]["full-fwd-again"] >= 1, doc["variants"]
    assert doc["kernels"] == len(doc["kernel_keys"]) and doc["calls"] == len(doc["variants"])
    events = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    assert [e["done"] for e in events if e["event"] == "plan"][-1] == doc["calls"]  # both counted as planned
