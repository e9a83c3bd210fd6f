"""prepare(): plan one call signature, load every kernel it needs from the store, and return an AttentionFn
that runs FA4 with those flags (fa4_aot.load does the same on the lean runtime). FA4 is reached only through
the seam (fa4_aot.fa4)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import fa4
from ..domain.calls import Call
from .arguments import call_from
from .installation import Installation, has_cuda, install, installed

# Requests one process keeps in flight to the server while it fetches kernels one by one. Under a cluster's start
# every node's requests queue at the server, and each waits about as long as the whole queue: 8 a node let 64 nodes'
# tails pass a 10 s deadline where 4 held them all, no slower in all (bench/RESULTS.md session 14).
FETCH_THREADS = 4


class AttentionFn:
    """A loaded call signature: calling it runs FA4 (flash_attn_func or flash_attn_varlen_func) with the
    flags it was loaded for; tensors and per-call arguments (cu_seqlens, page_table...) come at call time."""

    def __init__(self, call: Call, installation: Installation, kernels: list[str]) -> None:
        self.call = call
        self.installation = installation
        self.kernel_keys = kernels

    def __call__(self, q: Any, k: Any, v: Any, **kwargs: Any) -> Any:
        with fa4.running(self.call):
            return fa4.attend(self.call, q, k, v, **kwargs)


def prepare(q_shape: tuple[int, int, int, int], k_shape: tuple[int, int, int, int] | None = None, *,
            causal: bool = False, dtype: Any = None, window_size: tuple[int | None, int | None] = (None, None),
            softcap: float = 0.0, learnable_sink: bool = False, num_splits: int = 1, layout: str = "dense",
            page_size: int = 0, training: bool = False, deterministic: bool = False, return_lse: bool = False,
            mode: str | None = None, cache_dir: Path | None = None) -> AttentionFn:
    """Load every kernel FA4 needs for this signature, then return a callable with FA4's semantics.

    q_shape is (batch, seqlen_q, heads, head_dim) and k_shape (batch, seqlen_k, heads_kv, head_dim_v)
    in logical form for every layout ("dense", "varlen", "seqused", "paged"): for varlen they are the
    batch size and the max sequence lengths. Installs fa4_aot in `mode` (default strict) if needed.
    Raises KernelMissing in strict mode before returning if any kernel is absent. Arguments are checked
    first (ValueError), before any device or store is looked at.

    Without a GPU (FA4_AOT_SKU=NAME set; see install()) it plans for that SKU, fetches what the server has,
    and checks that the store holds every kernel, verified and trusted, without loading any: the returned
    callable then fails like FA4 would on CPU tensors. That is how a CPU host checks a store before a job.
    """
    call = call_from(q_shape, k_shape, causal=causal, dtype=dtype, window_size=window_size, softcap=softcap,
                     sink=learnable_sink, num_splits=num_splits, layout=layout, page_size=page_size,
                     training=training, deterministic=deterministic, return_lse=return_lse)
    current = installed()
    inst = install(mode or (current.mode if current else "strict"), cache_dir=cache_dir)
    return AttentionFn(call, inst, _load(call, inst))


def _load(call: Call, inst: Installation) -> list[str]:
    """The kernel keys of every kernel FA4 plans for `call`, after fetching those the store lacks (FETCH_THREADS at a
    time) and then loading each through FA4 on a GPU, or checking its object verified and trusted on disk without
    one; a kernel still absent is recorded as a miss, and in strict mode raises KernelMissing (see
    Installation.object_for)."""
    needed = fa4.plan(call)
    kernel_keys = [inst.kernel_key(family, key) for (family, _), key in needed.items()]
    absent = [kk for kk in kernel_keys if not inst.store.has_entry(kk)]
    inst.fetch_many(absent, threads=FETCH_THREADS)
    with fa4.running(call):
        for (family, _), key in needed.items():
            if has_cuda():
                fa4.lookup(family, key)  # loads, or raises/records the miss
            else:
                inst.object_for(family, key)  # verified and trusted on disk, or raises/records the miss
    return kernel_keys
