"""Fault-suite fixtures: a seeded random source for the fault suite, and each suite's case count (and the seed)
printed at the end of the run.
A plugin (tests/conftest.py's pytest_plugins): the suites live in several folders."""

from __future__ import annotations

import os
import random
import time
from typing import Any

import pytest

SUITES = {"store/test_cache_hardening.py": "cache-hardening suite", "e2e/test_faults.py": "fault suite"}
# One seed per run, printed in the summary; FA4_AOT_FAULT_SEED=<seed> replays the same kill points.
FAULT_SEED = int(os.environ.get("FA4_AOT_FAULT_SEED") or time.time_ns() % 2**32)
_COUNTS = pytest.StashKey[dict[str, int]]()


@pytest.fixture
def fault_rng(request: pytest.FixtureRequest) -> random.Random:
    """Random kill points for one case: seeded by the run's seed and the case's id, so a case replays the
    same way whatever else runs."""
    print(f"fault seed {FAULT_SEED} (FA4_AOT_FAULT_SEED={FAULT_SEED} replays it)")
    return random.Random(f"{FAULT_SEED}:{request.node.nodeid}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    counts = config.stash.setdefault(_COUNTS, {})
    for item in items:
        suite = SUITES.get("/".join(item.path.parts[-2:]))
        if suite:
            counts[suite] = counts.get(suite, 0) + 1


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    for suite, n in sorted(config.stash.get(_COUNTS, {}).items()):
        seed = f" (seed {FAULT_SEED}; FA4_AOT_FAULT_SEED={FAULT_SEED} replays it)" if suite == "fault suite" else ""
        terminalreporter.write_line(f"{suite}: {n} cases{seed}")
