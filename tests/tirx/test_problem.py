"""The TIRx FA4 family's pure core: problems round-trip, the schedule follows each SKU's row as the kernel's own
formulas would (MAX_CTAS, L2_SIZE), and keys name exactly the constant the bytes depend on."""

from __future__ import annotations

import math

import pytest

from fa4_aot.domain.skus import MIB, Constants, Sku
from fa4_aot.tirx.problem import Problem, keys, l2_size_for, schedule

B200 = Sku("b200", "sm_100a", 148, 132644864, 13)
GB200 = Sku("gb200", "sm_100a", 152, 132644864, 13)
B200_L2 = Sku("b200-l2", "sm_100a", 148, 132644864, 13, l2_budget=True)  # budget follows its 126.5 MiB L2


@pytest.mark.parametrize("text", ["b1-q4096-k4096-h32-kv8-d128-causal", "b2-q256-k512-h4-kv4-d128-full"])
def test_problem_round_trips(text: str) -> None:
    assert str(Problem.parse(text)) == text


@pytest.mark.parametrize(("text", "why"), [
    ("b1-q256-k256-h4-kv4-d64-full", "head dim 64"),
    ("b1-q256-k256-h6-kv4-d128-full", "do not divide"),
    ("b1-q512-k256-h4-kv4-d128-causal", "seqlen_kv < seqlen_q"),
    ("b1-q256-k256-h256-kv1-d128-full", "GQA ratio 256"),
    ("b1-q256-k256-h4-kv4", "expected e.g."),
])
def test_bad_problems_say_why(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        Problem.parse(text)


def _kernel_formulas(p: Problem, max_ctas: int, l2_size: int) -> tuple[int, int]:
    """make_kernel's own lines (tirx-kernels 0.1.2.post1, flash_attention4.py): cta_count and L2_SWIZZLE."""
    seq_q_per_tile = 128 // (p.heads_q // p.heads_kv)
    num_q_blocks = math.ceil(math.ceil(p.seqlen_q / seq_q_per_tile) / 2)
    tasks = p.batch * p.heads_kv * num_q_blocks
    size = p.seqlen_kv * p.head_dim * 2 * 2
    swizzle = 1 if l2_size < size else 1 << int(math.log2(l2_size // size))
    return (tasks if p.causal else min(max_ctas, tasks)), swizzle


@pytest.mark.parametrize("text", ["b1-q256-k256-h4-kv4-d128-full", "b2-q256-k256-h80-kv80-d128-full",
                                  "b1-q8192-k8192-h32-kv32-d128-full", "b1-q4096-k4096-h32-kv8-d128-causal",
                                  "b4-q1024-k131072-h32-kv8-d128-causal", "b1-q100-k300-h8-kv1-d128-causal"])
@pytest.mark.parametrize("sku", [B200, GB200, B200_L2], ids=lambda s: s.name)
def test_schedule_is_the_kernels_own_formula_with_the_skus_constants(text: str, sku: Sku) -> None:
    p = Problem.parse(text)
    budget = sku.constants().value("l2_budget")
    grid, swizzle = _kernel_formulas(p, sku.sm_count, budget)
    got = schedule(p, sku.constants())
    assert got.grid == grid
    if p.causal:
        assert got.l2_swizzle == swizzle
        assert _kernel_formulas(p, 0, l2_size_for(p, got.l2_swizzle))[1] == swizzle  # what a build substitutes


def test_l2_budget_is_fa4s_50_mib_unless_the_row_says_follow_the_l2() -> None:
    assert B200.constants().value("l2_budget") == 50 * MIB
    assert B200_L2.constants().value("l2_budget") == 126 * MIB
    p = Problem.parse("b1-q4096-k4096-h32-kv8-d128-causal")  # 2 MiB of K/V per head
    assert (schedule(p, B200.constants()).l2_swizzle, schedule(p, B200_L2.constants()).l2_swizzle) == (16, 32)


@pytest.mark.parametrize(("text", "shared"), [
    ("b1-q256-k256-h4-kv4-d128-full", True),  # 4 tasks: grid 4 on both
    ("b2-q256-k256-h80-kv80-d128-full", False),  # 160 tasks: grid 148 against 152
    ("b1-q4096-k4096-h32-kv8-d128-causal", True),  # causal: one CTA per task, same L2 budget
])
def test_two_skus_share_a_kernel_exactly_when_its_constant_agrees(text: str, shared: bool) -> None:
    p = Problem.parse(text)
    b200, gb200 = (keys(p, s, schedule(p, s.constants())) for s in (B200, GB200))
    assert b200[0] == gb200[0]  # one base key: where a client learns which constant matters
    assert (b200[1] == gb200[1]) is shared


def test_every_size_and_the_mask_is_in_the_key() -> None:
    base = Problem.parse("b1-q256-k256-h4-kv4-d128-full")
    others = ["b2-q256-k256-h4-kv4-d128-full", "b1-q384-k384-h4-kv4-d128-full", "b1-q256-k384-h4-kv4-d128-full",
              "b1-q256-k256-h8-kv4-d128-full", "b1-q256-k256-h4-kv2-d128-full", "b1-q256-k256-h4-kv4-d128-causal"]
    found = {keys(p, B200, schedule(p, B200.constants()))[0] for p in [base, *map(Problem.parse, others)]}
    assert len(found) == 1 + len(others)


def test_unknown_constant_still_refused() -> None:
    with pytest.raises(ValueError, match="unknown SKU constant"):
        Constants(148, 1).value("persistent_ctas(x)")
