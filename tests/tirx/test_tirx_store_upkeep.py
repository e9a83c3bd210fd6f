"""The store's upkeep leaves TIRx kernels alone when it judges FA4's toolchain: `fa4-aot migrate` / `doctor` called
the TIRx kernels "built by another toolchain" and advised `prune --toolchain old`, which deleted them (found while
building issue 31: a TIRx entry's toolchain names tirx-kernels and apache-tvm, never flash-attn-4)."""

from __future__ import annotations

import hashlib

from fa4_aot.domain.skus import Sku
from fa4_aot.store import Entry
from fa4_aot.store.migrate import foreign
from fa4_aot.store.prune import Rules, select
from fa4_aot.tirx.problem import Problem, keys, schedule
from fa4_aot.tirx.producer import make_entry

B200 = Sku("b200", "sm_100a", 148, 132644864, 13)
FA4_TOOLS = {"flash-attn-4": "4.0.0b36", "nvidia-cutlass-dsl": "4.8.1"}


def _tirx_entry() -> Entry:
    p = Problem.parse("b1-q256-k256-h4-kv4-d128-full")
    sched = schedule(p, B200.constants())
    return make_entry(p, B200, sched, b"kernel", 1.0, "t", keys(p, B200, sched)[1])


def _fa4_entry(version: str) -> Entry:
    return Entry(kernel_key=hashlib.sha256(version.encode()).hexdigest(), object_digest="0" * 64, size=1,
                 family="fwd", compile_key=[version], sku="b200", arch="sm_100a", sm_count=148, l2_bytes=1,
                 cuda_major=13, toolchain={**FA4_TOOLS, "flash-attn-4": version}, variant="v", call="c",
                 compile_seconds=1.0)


def test_d_tirx_kernels_are_not_foreign_to_fa4s_toolchain() -> None:
    counts, _names = foreign([_tirx_entry(), _fa4_entry("4.0.0b35")], FA4_TOOLS)
    assert counts == {"b200": 1}  # the old FA4 kernel only


def test_d_prune_toolchain_old_keeps_tirx_kernels() -> None:
    tirx, old, current = _tirx_entry(), _fa4_entry("4.0.0b35"), _fa4_entry("4.0.0b36")
    dropped = select([tirx, old, current], Rules(toolchain=current.toolchain), now=0.0)
    assert dropped == [old]
