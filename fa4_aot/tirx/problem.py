"""One static problem of the TIRx FA4 kernel, its persistent schedule, and the SKU constants that schedule consumes.

The kernel (tirx-kernels 0.1.2.post1, ported/flashattention/flash_attention4.py, `make_kernel`) is traced for
fixed sizes and bakes two B200 choices into its bytes:
- `MAX_CTAS = 148` (the B200's SM count): a non-causal kernel runs a persistent grid of min(MAX_CTAS, tasks) CTAs
  (`cta_count = ... min(max_ctas, num_total_tasks)`); a causal one runs one CTA per task and never reads it;
- `L2_SIZE = 50 * 1024 * 1024` (FA4's head-swizzle budget): a causal kernel's LPT scheduler walks
  `L2_SWIZZLE = 1 << log2(L2_SIZE // SIZE_ONE_KV_HEAD)` KV heads together; the linear (non-causal) one does not.
So a kernel consumes exactly one derived constant, named for what it is (skus.Constants computes both for a SKU
or a device): `persistent_ctas(T)` or `l2_swizzle(S)`. Two SKUs whose values agree share the kernel; a B200 and
a GB200 (148 and 152 SMs) share every causal kernel and every non-causal one of 148 tasks or fewer. Pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..domain import kernel_keys
from ..domain.skus import Constants, Sku
from .toolenv import TOOLCHAIN

FAMILY = "tirx_fa4"  # index entries' family: the key and `fa4-aot list` tell it from FA4's families
KERNEL = "flash_attention4"  # the tirx-kernels kernel this family builds
ARCHS = ("sm_100a",)  # make_kernel's @txl.kernel(arch="sm_100a"); the sm_110a (Thor) 2-CTA path is not built
HEAD_DIMS = (128,)  # the port's tiles (MMA_N = BLK_N = 128) and tensor maps assume head dim 128
BLK_M = 128
BLK_N = 128
SMEM_PIPE_DEPTH_Q = 2
F16_BYTES = 2
_FORM = re.compile(r"b(\d+)-q(\d+)-k(\d+)-h(\d+)-kv(\d+)-d(\d+)-(causal|full)")


def ceildiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Problem:
    """The static sizes one kernel is traced for; str() and parse() round-trip (b1-q4096-k4096-h32-kv8-d128-causal)."""

    batch: int
    seqlen_q: int
    seqlen_kv: int
    heads_q: int
    heads_kv: int
    head_dim: int = 128
    causal: bool = True

    def __post_init__(self) -> None:
        problem = self.problem()
        if problem:
            raise ValueError(f"invalid TIRx problem {self}: {problem}")

    def problem(self) -> str | None:
        """Why the kernel cannot be traced for these sizes, or None."""
        if min(self.batch, self.seqlen_q, self.seqlen_kv, self.heads_q, self.heads_kv) < 1:
            return "every size must be at least 1"
        if self.head_dim not in HEAD_DIMS:
            return f"head dim {self.head_dim}: the TIRx kernel is built for head dim {HEAD_DIMS[0]} only"
        if self.heads_q % self.heads_kv:
            return f"{self.heads_kv} KV heads do not divide {self.heads_q} query heads"
        if BLK_M % self.gqa:
            return f"GQA ratio {self.gqa} does not divide the {BLK_M}-row query tile"
        if self.causal and self.seqlen_kv < self.seqlen_q:
            return "causal with seqlen_kv < seqlen_q is not built (the port's causal bounds assume kv >= q)"
        return None

    def __str__(self) -> str:
        return (f"b{self.batch}-q{self.seqlen_q}-k{self.seqlen_kv}-h{self.heads_q}-kv{self.heads_kv}-"
                f"d{self.head_dim}-{'causal' if self.causal else 'full'}")

    @classmethod
    def parse(cls, text: str) -> Problem:
        m = _FORM.fullmatch(text.strip())
        if not m:
            raise ValueError(f"invalid TIRx problem {text!r}: expected e.g. b1-q4096-k4096-h32-kv8-d128-causal")
        b, q, k, h, kv, d = (int(s) for s in m.groups()[:6])
        return cls(b, q, k, h, kv, d, causal=m.group(7) == "causal")

    @property
    def gqa(self) -> int:
        return self.heads_q // self.heads_kv

    @property
    def tasks(self) -> int:
        """make_kernel's num_total_tasks: (batch, KV head, pair of query tiles)."""
        q_blocks = ceildiv(self.seqlen_q, BLK_M // self.gqa)
        return self.batch * self.heads_kv * ceildiv(q_blocks, SMEM_PIPE_DEPTH_Q)

    @property
    def kv_head_bytes(self) -> int:
        """make_kernel's SIZE_ONE_KV_HEAD: one KV head's K and V in fp16."""
        return self.seqlen_kv * self.head_dim * 2 * F16_BYTES

    def consumed_name(self) -> str:
        """The one SKU constant this kernel's bytes depend on (see the module)."""
        return f"l2_swizzle({self.kv_head_bytes})" if self.causal else f"persistent_ctas({self.tasks})"

    def compile_key(self) -> dict[str, Any]:
        """What the trace is specialized to (canonical JSON values; the dtype is fixed by the port)."""
        return {"kernel": KERNEL, "batch": self.batch, "seqlen_q": self.seqlen_q, "seqlen_kv": self.seqlen_kv,
                "heads_q": self.heads_q, "heads_kv": self.heads_kv, "head_dim": self.head_dim,
                "causal": self.causal, "dtype": "fp16"}

    @classmethod
    def from_compile_key(cls, key: dict[str, Any]) -> Problem:
        return cls(key["batch"], key["seqlen_q"], key["seqlen_kv"], key["heads_q"], key["heads_kv"],
                   key["head_dim"], key["causal"])


@dataclass(frozen=True)
class Schedule:
    """What the SKU changes in one kernel: its grid and the causal scheduler's L2 head swizzle."""

    grid: int
    l2_swizzle: int  # 1 where the scheduler does not use it (non-causal)
    consumed: dict[str, int]

    @property
    def max_ctas(self) -> int:
        """The MAX_CTAS a build sets in the kernel module: the grid itself (min(grid, tasks) is the grid)."""
        return self.grid


def schedule(problem: Problem, constants: Constants) -> Schedule:
    """The schedule of `problem` on a SKU or device with `constants` (the derivation builds and loads share)."""
    name = problem.consumed_name()
    value = constants.value(name)
    if problem.causal:
        return Schedule(grid=problem.tasks, l2_swizzle=value, consumed={name: value})
    return Schedule(grid=value, l2_swizzle=1, consumed={name: value})


def l2_size_for(problem: Problem, l2_swizzle: int) -> int:
    """An L2_SIZE for which make_kernel derives exactly `l2_swizzle` (what a build substitutes for its 50 MiB)."""
    return l2_swizzle * problem.kv_head_bytes


def keys(problem: Problem, sku: Sku, sched: Schedule) -> tuple[str, str]:
    """(base key, full key) of `problem`'s kernel for `sku`'s arch, CUDA major and host, with the constants of
    `sched` (kernel_keys.key_of, as every family's; the toolchain is the pinned one, so a GPU host without TVM
    computes the same keys)."""
    def key(consumed: dict[str, int]) -> str:
        return kernel_keys.key_of(FAMILY, problem.compile_key(), arch=sku.arch, cuda_major=sku.cuda_major,
                                  toolchain=TOOLCHAIN, consumed=consumed, host=sku.host)

    return key({}), key(sched.consumed)
