"""FA4's own ranges for a Call (domain/call_ranges.py), table-driven: what the service refuses before a compile
(issue 28, D32), and the edge shapes FA4 supports that it must keep accepting."""

from __future__ import annotations

from typing import Any

import pytest

from fa4_aot.domain import call_ranges
from tests.helpers.builders import tiny

ACCEPTED: list[dict[str, Any]] = [
    {}, {"head_dim": 8, "head_dim_v": 8}, {"head_dim": 256, "head_dim_v": 256}, {"head_dim": 192, "head_dim_v": 128},
    {"head_dim": 64, "head_dim_v": 512}, {"head_dim": 512, "head_dim_v": 512}, {"softcap": 30.0},
    {"mask": "local", "window": (-1, 0)}, {"mask": "local", "window": (128, 128)},
    {"mask": "causal", "window": (1024, 0)},
    {"heads_q": 8, "heads_kv": 2}, {"layout": "paged", "page_size": 128},
]
REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"head_dim": 7, "head_dim_v": 7}, "head dims"), ({"head_dim": 264, "head_dim_v": 264}, "head dims"),
    ({"head_dim": 128, "head_dim_v": 512}, "head dims"), ({"head_dim": 4, "head_dim_v": 4}, "head dims"),
    ({"heads_q": 3, "heads_kv": 2}, "heads_q"), ({"softcap": -2.5}, "softcap"), ({"softcap": float("inf")}, "softcap"),
    ({"softcap": float("nan")}, "softcap"), ({"mask": "local", "window": (-5, 3)}, "window"),
    ({"page_size": 16}, "page_size"), ({"layout": "paged", "page_size": 0}, "page_size"),
]


@pytest.mark.parametrize("changes", ACCEPTED)
def test_calls_fa4_takes_pass(changes: dict[str, Any]) -> None:
    call = tiny(**changes)
    assert call_ranges.problems(call) == [] and call_ranges.check(call) is call


@pytest.mark.parametrize(("changes", "named"), REFUSED)
def test_calls_outside_fa4s_ranges_are_named(changes: dict[str, Any], named: str) -> None:
    found = call_ranges.problems(tiny(**changes))
    assert len(found) == 1 and named in found[0]
    with pytest.raises(ValueError, match="outside FA4's ranges"):
        call_ranges.check(tiny(**changes))
