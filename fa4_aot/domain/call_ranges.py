"""The values FA4 itself accepts in a Call, checked before anything is built for one.

A miss report decides what a builder compiles, so the service refuses calls FA4 would refuse anyway, before they
cost a compile. The ranges are FA4's own, read from flash_attn/cute/interface.py (flash-attn-4 4.0.0b36) and kept
here as data, because nothing under domain/ imports FA4: `_validate_head_dims` (head dims multiples of 16 bytes'
worth of elements, i.e. 8 for bf16/fp16; 8..256 on SM90; 8..128, 192x128, 256x256, or a head_dim_v of 512 with
head_dim 64 or 512 on SM100/SM110; the union is accepted here, FA4 rejects the rest per arch at build time),
`num_head % num_head_kv == 0`, a softcap of 0 meaning none (FA4 divides by it), and `_resolve_causal_local_window`
(a window side of -1 or less is unbounded, so -1 is the one spelling of it). Pure: table-driven tests in
tests/domain/test_call_ranges.py.
"""

from __future__ import annotations

import math

from .calls import Call

ALIGNMENT = 8  # elements: FA4's alignment is 16 bytes // element size, and every dtype here is 2 bytes
MLA_HEAD_DIM_V = 512  # DeepSeek MLA absorbed: head_dim_v 512 with head_dim 64 or 512


def head_dims_supported(head_dim: int, head_dim_v: int) -> bool:
    """Whether some arch FA4 builds for takes (head_dim, head_dim_v) (the union of _validate_head_dims's cases)."""
    if head_dim % ALIGNMENT or head_dim_v % ALIGNMENT:
        return False
    if 8 <= head_dim <= 256 and 8 <= head_dim_v <= 256:
        return True
    return head_dim_v == MLA_HEAD_DIM_V and head_dim in (64, MLA_HEAD_DIM_V)


def problems(call: Call) -> list[str]:
    """What in `call` FA4 would refuse, one sentence each naming the range; [] for a call FA4 may build."""
    found = []
    if not head_dims_supported(call.head_dim, call.head_dim_v):
        found.append(f"head dims {call.head_dim}x{call.head_dim_v} are not ones FA4 supports (multiples of "
                     f"{ALIGNMENT} from 8 to 256, or head_dim_v {MLA_HEAD_DIM_V} with head_dim 64 or 512)")
    if call.heads_q % call.heads_kv:
        found.append(f"heads_q {call.heads_q} is not a multiple of heads_kv {call.heads_kv}, as FA4 requires")
    if not math.isfinite(call.softcap) or call.softcap < 0:
        found.append(f"softcap {call.softcap} is not a finite number >= 0 (FA4: 0 means no softcap)")
    if any(side < -1 for side in call.window):
        found.append(f"window {list(call.window)} has a side below -1 (FA4 reads any negative side as unbounded: "
                     "send -1)")
    if (call.layout == "paged") != (call.page_size > 0):
        found.append(f"page_size {call.page_size} does not fit layout {call.layout!r}: a paged layout needs a "
                     "page size > 0, every other layout 0")
    return found


def check(call: Call) -> Call:
    """`call` when FA4 may build it, else ValueError listing every problem."""
    found = problems(call)
    if found:
        raise ValueError(f"call {call.describe()} is outside FA4's ranges: " + "; ".join(found))
    return call
