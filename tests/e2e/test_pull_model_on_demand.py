"""`fa4-aot pull --model` against a server with an on-demand builder, end to end on this CPU host (issue 30, point
2): a real uvicorn server lacking the model, a real `fa4-aot builder` compiling with FA4, a node store that starts
empty. One pull reports what the server lacks, the builder builds it, and the next pull is complete: the on-demand
loop completes a model's whole set in one round.

Regression (issue 30, point 2): the miss of a signature the server had no recipe file of was built as one call
(the kernels FA4 launches at 4096 tokens), while its recipe file named every kernel of every size; the next pull
reported those as kernel misses carrying that same call, whose jobs all failed ("re-planning the recorded call did
not select it"), and the set was never complete. bert-base at TP 1, prefill: the smallest catalog model whose
signatures launch other kernels at other sizes (2 signatures, 7 kernels).

SQLite only: each build costs real compiles; the queue's database logic runs over both backends elsewhere.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fa4_aot.remote.http import Remote
from fa4_aot.trust import signing_keys
from tests.conftest import run_cli
from tests.helpers.builders import BuilderProcess, hold_sku, jobs, wait_until
from tests.helpers.servers import Server

pytestmark = pytest.mark.slow
PULL = ["--sku", "h200", "--model", "qwen2.5-0.5b", "--tp", "1", "--workload", "prefill", "--json"]
INSECURE = {"FA4_AOT_INSECURE": "1"}  # the builder signs nothing here: the node takes unsigned kernels


@pytest.fixture(scope="module")
def new_db_url() -> Callable[[Path], str]:
    return lambda folder: f"sqlite:///{folder / 'fa4-aot.db'}"


@dataclass
class Round:
    """One round of the on-demand loop: the server, its builder's log, the pull before and the pull after."""

    server: Server
    log: Path
    first: dict[str, Any]
    second: dict[str, Any]


@pytest.fixture(scope="module")
def round_(tmp_path_factory: pytest.TempPathFactory, server: Server) -> Iterator[Round]:
    """An empty node pulls the model from a server that lacks it, a real builder builds every job the pull
    queued, and the node pulls again."""
    tmp = tmp_path_factory.mktemp("round")
    hold_sku(server)
    builder = BuilderProcess(server, tmp / "builder", tmp / "builder.log").start()
    try:
        first = _pull(server, tmp / "node")
        wait_until(lambda: _settled(server), 1800, "the builder to finish every job")
        yield Round(server, builder.log, first, _pull(server, tmp / "node"))
    finally:
        builder.kill()
    assert "Traceback" not in builder.log.read_text(), builder.log.read_text()[-3000:]


def _pull(server: Server, node: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    done = run_cli("pull", "--server", server.url, *PULL, cache=node, env=env or INSECURE)
    assert done.returncode in (0, 1), done.stderr[-3000:]  # 1: incomplete, the document says what is lacking
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def _settled(server: Server) -> list[dict[str, Any]] | None:
    found = jobs(server)
    return found if found and all(j["status"] in ("done", "failed") for j in found) else None


def test_i30_2_pull_model_then_on_demand_builds_complete_the_whole_set(round_: Round) -> None:
    first, second = round_.first, round_.second
    assert not first["complete"] and first["signatures"] == len(first["unbuilt"]) >= 2, first
    assert first["reported"] == first["signatures"] and first["failures"] == [], first  # one miss a signature
    done = jobs(round_.server)
    assert [j["status"] for j in done] == ["done"] * len(done), [(j["status"], j["detail"]) for j in done]
    assert second["complete"], second
    assert second["unbuilt"] == second["missing"] == second["failures"] == [] and second["reported"] == 0, second
    assert second["kernels"] > first["signatures"], second  # more kernels than the reported calls launch
    assert len(jobs(round_.server)) == first["reported"], jobs(round_.server)  # nothing more queued: one round


def test_i30_3_pull_under_trusted_keys_names_the_servers_unsigned_recipes_and_reports_no_miss(
        round_: Round, tmp_path: Path) -> None:
    """The builder signed nothing: a node trusting a key refuses its recipe files, says they are unsigned and
    how to sign them, and reports none of them as a miss (a build would only make the same unsigned files)."""
    _private, public = signing_keys.generate(tmp_path, "ops")
    env = {"FA4_AOT_TRUSTED_KEYS": public.line()}
    queued = len(jobs(round_.server))
    doc = _pull(round_.server, tmp_path / "node", env)
    listed = set(Remote(round_.server.url).recipes("h200"))  # the server has them: none is a miss
    assert not doc["complete"] and doc["unbuilt"] == [] and doc["missing"] == [] and doc["reported"] == 0, doc
    assert len(doc["unsigned"]) == doc["signatures"] and set(doc["unsigned"]) <= listed, doc
    assert "--signing-key" in doc["refusal"] and "fa4-aot sign --sku h200" in doc["refusal"], doc
    assert len(jobs(round_.server)) == queued
    text = run_cli("pull", "--server", round_.server.url, *PULL[:-1], cache=tmp_path / "node", env=env)
    assert text.returncode == 1 and "unsigned on the server: recipe file" in text.stdout + text.stderr, text
    assert "missing on the server" not in text.stdout + text.stderr and "unbuilt" not in text.stdout + text.stderr
