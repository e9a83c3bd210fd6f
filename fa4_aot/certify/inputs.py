"""A certification call's inputs: random tensors at one point of a signature's size space, as FA4's interface
takes them (flash_attn_func for dense, flash_attn_varlen_func for varlen, seqused and paged).

`make_inputs(sig, point, seed, device)` builds q, k, v and the per-sequence tensors so that the call has exactly
the sizes the recipe regions read (domain/recipe_space.py names them; `point` also holds the KV head count): varlen
sequences summing to total_q/total_k with the longest at max_seqlen_q/k, seqused_k in [seqlen_q, max_seqlen_k] with
the largest at max_seqlen_k, page tables over a pool of num_pages pages. The sizes are those FA4's callers pass
(certify.plan.in_domain): a KV cache already holds its new queries' keys (vLLM and SGLang append them before
attention), so no sequence has fewer keys than queries; a varlen max length is a real sequence's.
`Inputs.kwargs()` is the call's keyword arguments after q, k and v, the same for FA4 and for fa4_aot's lean
runtime (runtime/api.py takes FA4's names).

Pure torch; never imports FA4. The same seed gives the same tensors on the same kind of device.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ..domain.recipe_format import HEADS
from ..domain.signature import Signature

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
TRAINING = ("bwd", "bwd_det")


@dataclass(frozen=True)
class Inputs:
    """One call's arguments. `tensors`: q, k, v and the layout's tensors (cu_seqlens_q/k, seqused_k, page_table,
    learnable_sink), by FA4's names; `options`: its other keyword arguments (flags, max_seqlen_q/k); `dout`: the
    output gradient of a training call (None for a forward)."""

    layout: str
    tensors: dict[str, torch.Tensor]
    options: dict[str, Any] = field(default_factory=dict)
    dout: torch.Tensor | None = None

    @property
    def training(self) -> bool:
        return self.dout is not None

    @property
    def dtype(self) -> torch.dtype:
        return self.tensors["q"].dtype

    def kwargs(self) -> dict[str, Any]:
        """The call's keyword arguments, q, k and v aside: `flash_attn_func(q, k, v, **inputs.kwargs())` for dense,
        `flash_attn_varlen_func(q, k, v, **inputs.kwargs())` otherwise (FA4's or the lean runtime's)."""
        return {**{n: t for n, t in self.tensors.items() if n not in ("q", "k", "v")}, **self.options}

    def lengths(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(query rows, keys) of each sequence as int64 CPU tensors of length batch: the keys are seqused_k where
        given (seqused, paged), the sequence's own (varlen) or the tensor's (dense)."""
        t = self.tensors
        if self.layout == "varlen":
            return t["cu_seqlens_q"].cpu().long().diff(), t["cu_seqlens_k"].cpu().long().diff()
        batch, seqlen_q = t["q"].shape[:2]
        len_q = torch.full((batch,), seqlen_q, dtype=torch.int64)
        if "seqused_k" in t:
            return len_q, t["seqused_k"].cpu().long()
        return len_q, torch.full((batch,), t["k"].shape[1], dtype=torch.int64)

    def cost(self) -> int:
        """An estimate of the reference's work: the sum over sequences of rows x keys x query heads x (d + dv)
        (multiply-adds of QK^T and PV; the reference pads each group of sequences to its longest, at most about
        2x in each length)."""
        q, v = self.tensors["q"], self.tensors["v"]
        len_q, len_k = self.lengths()
        return int((len_q * len_k).sum()) * q.shape[-2] * (q.shape[-1] + v.shape[-1])


def make_inputs(sig: Signature, point: Mapping[str, int], seed: int, device: str | torch.device) -> Inputs:
    """Random inputs of `sig` at `point` (recipe_space's sizes of sig.layout, plus "heads_kv": the query heads are
    the signature's GQA ratio times it; the signature's own count when absent). q, k, v and learnable_sink are
    standard normal in the signature's dtype (q times softcap / 4 with a softcap, as FA4's tests do, so that scores
    reach the cap); a training pass gives q, k, v and the sink requires_grad and draws `dout`. Raises ValueError
    for sizes no call can have (a max length above its tensor's, a total above batch x max) or no caller passes
    (a varlen max length above its total; a KV cache of max_seqlen_k keys shorter than seqlen_q queries)."""
    heads_kv = int(point.get(HEADS, sig.heads_kv))
    heads_q = sig.heads_q // sig.heads_kv * heads_kv
    gen = torch.Generator().manual_seed(seed)  # lengths and page tables: small, drawn on the CPU
    shapes, per_seq, options = _layout(sig, point, gen)
    dev = torch.device(device)
    dgen = torch.Generator(device=dev).manual_seed(seed)
    dtype, training = DTYPES[sig.dtype], sig.pass_ in TRAINING

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=dgen, dtype=dtype, device=dev)

    (q_rows, k_rows) = shapes
    q = normal(*q_rows, heads_q, sig.head_dim)
    if sig.softcap > 0:
        q = q * (sig.softcap / 4)
    tensors = {"q": q, "k": normal(*k_rows, heads_kv, sig.head_dim), "v": normal(*k_rows, heads_kv, sig.head_dim_v)}
    tensors.update({name: t.to(dev) for name, t in per_seq.items()})
    if sig.sink:
        tensors["learnable_sink"] = normal(heads_q)
    if training:
        for name in ("q", "k", "v", "learnable_sink"):
            if name in tensors:
                tensors[name].requires_grad_(True)
    flags = sig.call(0, 0, 0).flags()  # causal, window_size, softcap, num_splits, ...: domain.calls' one definition
    dout = normal(*q_rows, heads_q, sig.head_dim_v) if training else None
    return Inputs(sig.layout, tensors, {**flags, **options}, dout)


Shapes = tuple[tuple[int, ...], tuple[int, ...]]


def _layout(sig: Signature, point: Mapping[str, int],
            gen: torch.Generator) -> tuple[Shapes, dict[str, torch.Tensor], dict[str, int]]:
    """(q's and k's leading dims, the per-sequence int32 tensors, the max lengths) of sig.layout at `point`."""
    p = {name: int(value) for name, value in point.items()}
    batch = p["batch"]
    if sig.layout == "dense":
        return ((batch, p["seqlen_q"]), (batch, p["seqlen_k"])), {}, {}
    maxes = {"max_seqlen_q": p["max_seqlen_q"], "max_seqlen_k": p["max_seqlen_k"]}
    if sig.layout == "varlen":
        _at_most(p, "max_seqlen_q", p["total_q"], "total_q")
        _at_most(p, "max_seqlen_k", p["total_k"], "total_k")
        cu_q = _cumulative(_split(p["total_q"], batch, p["max_seqlen_q"], gen))
        cu_k = _cumulative(_split(p["total_k"], batch, p["max_seqlen_k"], gen))
        return ((p["total_q"],), (p["total_k"],)), {"cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k}, maxes
    if sig.layout == "seqused":
        _at_most(p, "max_seqlen_q", p["seqlen_q"], "seqlen_q")
        _at_most(p, "max_seqlen_k", p["seqlen_k"], "seqlen_k")
        used = _used(batch, p["seqlen_q"], p["max_seqlen_k"], gen)
        return ((batch, p["seqlen_q"]), (batch, p["seqlen_k"])), {"seqused_k": used}, maxes
    if sig.layout == "paged":
        _at_most(p, "max_seqlen_q", p["seqlen_q"], "seqlen_q")
        _at_most(p, "max_seqlen_k", p["pages_per_seq"] * sig.page_size, "pages_per_seq x page_size")
        table = _page_table(batch, p["pages_per_seq"], p["num_pages"], gen)
        used = _used(batch, p["seqlen_q"], p["max_seqlen_k"], gen)
        return (((batch, p["seqlen_q"]), (p["num_pages"], sig.page_size)),
                {"page_table": table, "seqused_k": used}, maxes)
    raise ValueError(f"layout {sig.layout!r} has no certification inputs")


def _at_most(point: Mapping[str, int], name: str, high: int, what: str) -> None:
    if point[name] > high:
        raise ValueError(f"invalid point {dict(point)!r}: {name} {point[name]} exceeds {what} ({high})")


def _used(batch: int, low: int, high: int, gen: torch.Generator) -> torch.Tensor:
    """seqused_k: uniform in [low, high] per sequence, one sequence (at random) exactly `high`. `low` is the query
    count: a serving engine calls with the new queries' keys in the cache (low >= 1), and a cache shorter than
    its queries leaves causal rows that see no key, which no caller passes (the H200's paged illegal addresses
    over the default build: seqused_k drawn from 0, most sequences shorter than their queries). Raises
    ValueError when high < low."""
    if not 1 <= low <= high:
        raise ValueError(f"no KV cache of at most {high} keys holds {low} new queries' keys: max_seqlen_k must be "
                         f"at least seqlen_q >= 1, as its callers pass it (certify.plan.in_domain)")
    used = torch.randint(low, high + 1, (batch,), generator=gen)
    used[int(torch.randint(0, batch, (1,), generator=gen))] = high
    return used.to(torch.int32)


def _split(total: int, count: int, cap: int, gen: torch.Generator) -> torch.Tensor:
    """`count` lengths in [0, cap] summing to `total`, one of them (at random) `cap` when total >= cap; the rest
    spread at random (proportional shares, then the remainder into the sequences with room)."""
    if total > count * cap or count < 1:
        raise ValueError(f"{total} rows do not fit {count} sequences of at most {cap}")
    lengths = torch.zeros(count, dtype=torch.int64)
    longest = int(torch.randint(0, count, (1,), generator=gen))
    rest, others = total, torch.arange(count)
    if total >= cap:
        lengths[longest], rest = cap, total - cap
        others = others[others != longest]
    if len(others) and rest:
        weights = torch.rand(len(others), generator=gen, dtype=torch.float64) + 1e-6
        share = (weights / weights.sum() * rest).floor().long().clamp(max=cap)
        left = rest - int(share.sum())
        while left > 0:  # each round fills at least one sequence or places every row left
            room = cap - share
            step = -(-left // int((room > 0).sum()))
            give = room.clamp(max=step)
            give = (give - (give.cumsum(0) - left).clamp(min=0)).clamp(min=0)
            share, left = share + give, left - int(give.sum())
        lengths[others] = share
    return lengths


def _cumulative(lengths: torch.Tensor) -> torch.Tensor:
    return torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).to(torch.int32)


def _page_table(batch: int, pages_per_seq: int, num_pages: int, gen: torch.Generator) -> torch.Tensor:
    """(batch, pages_per_seq) int32 page ids: consecutive runs of one random permutation of the pool, so all
    distinct when the pool holds batch x pages_per_seq pages; a smaller pool is reused across sequences (as
    caches sharing pages are), distinct within a sequence while the pool holds pages_per_seq pages."""
    perm = torch.randperm(num_pages, generator=gen)
    flat = torch.arange(batch * pages_per_seq) % num_pages
    return perm[flat].reshape(batch, pages_per_seq).to(torch.int32)
