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


SERVED = [at(512, 512), at(2048, 4096), at(161, 3), at(4096, 17), at(1, 1024)]  # ordinary sizes that passed


@pytest.mark.parametrize(("failing", "passing", "expected"), [
    # the default h100-sxm build on the H100: bf16 d=256 local softcap backward failed at 161 x 2 and passed at
    # 1 x 2 and 224 x 1 beside ordinary sizes: refused at seqlen_k <= 2 (the passes there too), served above
    ([at(161, 2)], [at(1, 2), at(224, 1)] + SERVED, "seqlen_k <= 2"),
    # fp16 d=96 dk at 65,243 queries over 1 key, passing at 1 x 1, 8 x 1 and 262,142 x 4: refused at seqlen_k <= 2,
    # not at seqlen_q >= 4097 (which would refuse long-context training)
    ([at(65243, 1)], [at(1, 1), at(8, 1), at(262142, 4)] + SERVED, "seqlen_k <= 2"),
    # failures across the sizes with one chance pass at one end: no scope
    ([at(64, 64), at(2048, 2048), at(1, 2)], [at(512, 512), at(8192, 8192)], None),
    # failures from seqlen 3 up with passes below (FA4's dq bug at head dims 72 and 80 on the H100): no scope, the
    # large sizes are never what a miss at degenerate sizes explains
    ([at(3, 95), at(769, 84), at(6219, 3)], [at(1, 5), at(2, 17), at(1, 1), at(2, 900), at(4096, 4096)], None),
    # passes beyond the failures do not outnumber those among them: no scope
    ([at(16, 2), at(16, 8)], [at(16, 1), at(16, 4), at(16, 6), at(16, 16), at(16, 32), at(16, 64)], None),
])
def test_failures_among_passes_at_degenerate_sizes_are_scoped_not_the_whole_signature(
        failing: list[dict[str, int | None]], passing: list[dict[str, int | None]], expected: str | None) -> None:
    scope = scopes.derive(failing, passing)
    assert (scope.describe() if scope else None) == expected
    if scope is not None:
        assert all(scope.holds(p) for p in failing) and not any(scope.holds(p) for p in SERVED)


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
