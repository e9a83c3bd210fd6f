"""The shapes that represent every batch size and sequence length of a signature (pure; no FA4 import).

FA4 (flash-attn-4 4.0.0b36, flash_attn/cute/interface.py) chooses kernels from (batch, seqlen_q, seqlen_k)
only through these quantities, read from _flash_attn_fwd, _get_fwd_config, num_splits_heuristic and
_flash_attn_bwd:
- P = seqlen_q * (heads per KV head when pack_gqa) against tile_m and q_stage * tile_m (q_stage, the
  single-M-block flag behind static persistence and 2-CTA): tiles are 64, 128 or 192 rows, so thresholds are
  multiples of 64 up to 384; hd256 pack_gqa also tests seqlen_q > 128;
- the split-KV heuristic, min(num_SMs // total_mblocks, 128, num_n_blocks) with no split at
  num_n_blocks <= 4, where total_mblocks = batch * (a constant of the signature) * ceil(P / (q_stage*tile_m))
  and num_n_blocks = ceil(loaded seqlen_k / tile_n); kernels see the split count only as "split or not" and
  through the combine kernel's log_max_splits = max(ceil(log2 splits), 4); S ping-pong (sm100) compares
  num_n_blocks per split with 16 or 64; sm100 head_dim != head_dim_v switches tile_n at num_n_blocks >= 64;
- batch alone: 2 * batch * heads <= num_SMs (hd256 decode 2-CTA and pack_gqa on sm100, head dim 256 only)
  and batch > 256 (BIN_BATCH_SEARCH_THRESH: the varlen batch-lookup aid, forward and backward);
- the backward's single_q_block / single_k_block (seqlen rounded to one tile of 48..128 rows, 2 with 2-CTA).
So a few seqlen_q values around each tile edge, one batch per side of each batch threshold, batch
multiples that reach every split bucket, seqlen_k around each tile edge (backward) and a geometric seqlen_k
sweep (split pieces are at least a factor of 2 wide in num_n_blocks; the sweep steps by at most 1.5) reach
every kernel. tests/fa4/test_complete.py
checks that claim against FA4's real dispatch on random shapes.
"""

from __future__ import annotations

import dataclasses

from .signature import Signature
from .skus import Sku

MAX_SEQLEN_Q = 256 * 1024
MAX_SEQLEN_K = 1024 * 1024
BIN_BATCH_SEARCH_THRESH = 256  # flash_attn.cute.interface.BIN_BATCH_SEARCH_THRESH
MAX_SPLITS = 128  # the heuristic's max_splits
# Every tile_m, tile_n and q_stage * tile_m FA4 uses on sm_90 / sm_100 (and 128 for hd256 pack_gqa)
TILE_EDGES = (16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256, 384, 512, 768)


def seqlens_q(sig: Signature) -> list[int]:
    """seqlen_q values on both sides of every tile edge (as rows, and as rows / heads per KV head for
    pack_gqa), a few multi-block lengths, and huge ones."""
    ratio = max(1, sig.heads_q // max(1, sig.heads_kv))
    out = {1, 2, 3, 4097, 65537, MAX_SEQLEN_Q}
    for per in {1, ratio}:
        for rows in TILE_EDGES:
            edge = rows // per
            out.update(v for v in (edge, edge + 1, edge + 2 if rows % per else 0) if v >= 1)
        out.update(3 * (rows // per) + 1 for rows in (128, 192, 256, 384))
    return sorted(v for v in out if v <= MAX_SEQLEN_Q)


def batch_thresholds(sig: Signature, sku: Sku) -> list[int]:
    """The largest batch on the lower side of each batch-only test that applies to `sig` on `sku`."""
    out = {BIN_BATCH_SEARCH_THRESH} if sig.layout != "dense" else set()
    sm_count = sku.sm_count
    if 256 in (sig.head_dim, sig.head_dim_v) and sku.fa4_arch in ("sm_100", "sm_110"):
        out.update(sm_count // (2 * h) for h in (sig.heads_q, sig.heads_kv) if sm_count // (2 * h) >= 1)
    return sorted(out)


def batch_regimes(sig: Signature, sku: Sku) -> list[int]:
    """One batch per side of every batch-only test: 1, and t, t + 1 for each threshold t."""
    out = {1}
    for t in batch_thresholds(sig, sku):
        out.update((t, t + 1))
    return sorted(out)


def regime(sig: Signature, sku: Sku, batch: int) -> tuple[bool, ...]:
    """Which side of each batch-only test `batch` is on."""
    return tuple(batch > t for t in batch_thresholds(sig, sku))


def split_batches(sm_count: int) -> list[int]:
    """The smallest batch of each distinct num_SMs // batch, and one past num_SMs: any test of the form
    num_SMs // (batch * c) is a function of num_SMs // batch, so these batches reach every outcome."""
    out, seen = [], set()
    for b in range(1, sm_count + 2):
        q = sm_count // b
        if q not in seen:
            seen.add(q)
            out.append(b)
    return out


def split_bucket(total_mblocks_per_batch: int, batch: int, sm_count: int) -> int:
    """What the split-KV kernels can see of the heuristic's cap at this batch: 0 for no split, else the combine
    kernel's log_max_splits of the largest split count reachable."""
    cap = min(sm_count // max(1, total_mblocks_per_batch * batch), MAX_SPLITS)
    return 0 if cap <= 1 else max((cap - 1).bit_length(), 4)


def seqlens_k(sig: Signature) -> list[int]:
    """seqlen_k values that reach every kernel once batch and seqlen_q are fixed: both sides of every tile
    edge up to 256 (one tile, or one 2-CTA pair of tiles) for a backward, and with split-KV a geometric
    sweep (2^k + 1 and 1.5 * 2^k + 1, odd on purpose) up to 1M. [1] when seqlen_k cannot change kernels."""
    out = {1}
    if sig.pass_ in ("bwd", "bwd_det"):
        out.update(v for t in TILE_EDGES if t <= 256 for v in (t, t + 1))
    if splits_matter(sig):
        out.update((2, 3, 5, 7, MAX_SEQLEN_K))
        out.update(v for k in range(4, 21) for v in (2**k + 1, 3 * 2 ** (k - 1) + 1))
    return sorted(v for v in out if v <= MAX_SEQLEN_K)


def splits_matter(sig: Signature) -> bool:
    """Whether split-KV can happen: the heuristic (0) or a fixed N > 1."""
    return sig.num_splits != 1


def forward_of(sig: Signature) -> tuple[Signature, ...]:
    """The forward-only signature (no LSE) a training signature's build covers too: FA4 compiles another kernel
    for a forward without LSE (its compile key holds `lse is None`), so a model built for training serves its
    inference calls with it (the planner plans it, the build records its recipes). () for other passes."""
    return (dataclasses.replace(sig, pass_="fwd"),) if sig.pass_ in ("bwd", "bwd_det") else ()
