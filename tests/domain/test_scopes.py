"""Size scopes of measured findings (fa4_aot/domain/scopes.py): derived from failing and passing sizes, judged
per call, kept in the known-bad document as a map old clients ignore."""

from __future__ import annotations

import pytest

from fa4_aot.domain import scopes
from fa4_aot.errors import ConfigError


def at(sq: int, sk: int, batch: int = 2) -> dict[str, int | None]:
    return {"batch": batch, "seqlen_q": sq, "seqlen_k": sk}


@pytest.mark.parametrize(("failing", "passing", "expected"), [
    # a degenerate size fails, ordinary ones pass: refused below the smallest passing size of each separating axis
    ([at(1, 2)], [at(1024, 1024), at(300, 2048)], "seqlen_q <= 299 or seqlen_k <= 1023"),
    ([at(112, 1)], [at(112, 512, 1), at(4096, 4096, 1)], "seqlen_k <= 511"),
    # large sizes fail, small pass: refused above the largest passing size
    ([at(8192, 8192, 8)], [at(128, 128, 8), at(512, 256, 8)], "seqlen_q >= 513 or seqlen_k >= 257"),
    # failures among passes on every axis: no scope, the whole signature is refused
    ([at(64, 64), at(4096, 4096)], [at(1024, 1024)], None),
    ([at(1, 2)], [], None),  # nothing passed: nothing vouches for any size
    ([at(64, 64, 1)], [at(64, 64, 8)], "batch <= 7"),  # the batch only where no sequence length separates
])
def test_derive(failing: list[dict[str, int | None]], passing: list[dict[str, int | None]],
                expected: str | None) -> None:
    scope = scopes.derive(failing, passing)
    assert (scope.describe() if scope else None) == expected
    if scope is not None:
        assert all(scope.holds(p) for p in failing) and not any(scope.holds(p) for p in passing)


def test_an_unknown_size_is_inside_the_scope() -> None:
    scope = scopes.derive([at(112, 1)], [at(112, 512)])
    assert scope is not None and scope.holds({"batch": 1, "seqlen_q": 5, "seqlen_k": None})


def test_call_sizes_of_recipe_points() -> None:
    assert scopes.call_sizes({"batch": 3, "max_seqlen_q": 7, "max_seqlen_k": 9, "total_q": 12}) == at(7, 9, 3)
    assert scopes.call_sizes({"batch": 2, "seqlen_q": 1, "pages_per_seq": 3, "page_size": 16, "num_pages": 9}) \
        == at(1, 48)


def test_a_document_round_trips_and_a_bad_scope_is_refused() -> None:
    scope = scopes.derive([at(1, 2)], [at(1024, 1024)])
    assert scope is not None
    found = scopes.Scopes({"measured-h200-abc": scope}, {"a" * 64: "measured-h200-abc"})
    again = scopes.Scopes.from_document({"scopes": found.to_dict()}, "test")
    assert again == found and again.of_kernel("a" * 64) == ("measured-h200-abc", scope)
    for bad in ([], [{"axis": "heads", "max": 3}], [{"axis": "seqlen_k", "max": -1}],
                [{"axis": "seqlen_k", "max": 2, "min": 1}], [{"axis": "seqlen_k", "max": 2.5}]):
        with pytest.raises(ConfigError, match="scope"):
            scopes.Scopes.from_document({"scopes": {"entries": {"x": bad}}}, "test")
    with pytest.raises(ConfigError, match="kernels"):
        scopes.Scopes.from_document({"scopes": {"entries": {}, "kernels": {"a" * 64: "missing"}}}, "test")
