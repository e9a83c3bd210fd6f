"""The reference a kernel is checked against: attention exactly as FA4 defines it, computed by torch in a chosen
precision, and the tolerance of FA4's own tests.

FA4's definition (flash_attn/cute: interface.py, mask.py, softmax.py, testing.py's attention_ref):
- scores q.k * softmax_scale (default 1/sqrt(head_dim)); a softcap maps them to tanh(s / softcap) * softcap
  before masking; query head h reads KV head h // (heads_q / heads_kv).
- masks align bottom-right per sequence: key j is seen by row i iff j < seqlen_k and, causal, j <= i + seqlen_k -
  seqlen_q, or, local (left, right), i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right; the
  lengths are the sequence's own (cu_seqlens, seqused_k). A row that sees no key gives out 0 and lse -inf.
- a learnable sink (one natural-log logit per query head, unscaled) is one more softmax column with no value:
  it adds exp(sink) to the denominator, so lse includes it and an empty row has lse = sink.
- lse is float32, (batch, heads_q, seqlen_q) for 4-d q (dense, seqused, paged), (heads_q, total_q) for varlen.

`reference(inputs, sig, dtype=torch.float32)` is the exact reference; with the input dtype it is "the same
computation in the input precision" (FA4's tests' out_pt: scores and PV in that dtype, the softmax in float32, as
attention_ref with upcast=False). Dense, seqused and paged calls run batched; varlen sequences in groups of
similar lengths padded to the group's longest; scores are computed a bounded block of query rows at a time
(CHUNK_ELEMENTS), each block checkpointed for the backward, so memory stays bounded at any size.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from ..domain.signature import Signature
from .inputs import Inputs

CHUNK_ELEMENTS = 1 << 26  # scores (and gathered K/V) elements of one block: 256 MiB of float32
NAMES = ("out", "lse", "dq", "dk", "dv", "dsink")
SOFTCAP_GRAD_ATOL = 3e-4  # FA4's tests add it to the gradients' bound with a softcap
_GRADS = {"q": "dq", "k": "dk", "v": "dv", "learnable_sink": "dsink"}


@dataclass(frozen=True)
class Outputs:
    """A call's results, by FA4's names: out, lse and, for training, the gradients (dsink with a sink).
    `softcap` is the signature's (compare's factor depends on it); 0 for results from a kernel."""

    out: torch.Tensor
    lse: torch.Tensor | None = None
    dq: torch.Tensor | None = None
    dk: torch.Tensor | None = None
    dv: torch.Tensor | None = None
    dsink: torch.Tensor | None = None
    softcap: float = 0.0

    def get(self, name: str) -> torch.Tensor | None:
        return getattr(self, name)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class _Rule:
    scale: float
    softcap: float
    mask: str
    window: tuple[int, int]
    dtype: torch.dtype  # scores and PV
    soft: torch.dtype  # the softmax: float32 unless dtype is wider


@dataclass(frozen=True)
class _Group:
    """Sequences padded to common lengths: q (n, Sq, hq, d), k and v (n, Sk, hkv, d|dv), each sequence's lengths."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    len_q: torch.Tensor
    len_k: torch.Tensor
    full_k: bool  # every key of k is valid (no key mask needed)


def reference(inputs: Inputs, sig: Signature, *, dtype: torch.dtype, softmax_scale: float | None = None) -> Outputs:
    """FA4's attention of `inputs` computed in `dtype` (the inputs are converted to it): out and lse in FA4's
    layouts and, for a training call, dq, dk, dv (and dsink) by autograd with inputs.dout. Never modifies the
    inputs; the outputs are detached."""
    soft = dtype if torch.finfo(dtype).bits >= 32 else torch.float32
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(sig.head_dim)
    rule = _Rule(scale, float(sig.softcap), sig.mask, (int(sig.window[0]), int(sig.window[1])), dtype, soft)
    # a KV pool (forward only): its sequences' pages converted once gathered (_batched), not the whole pool: a wide
    # check's pool (plan.WIDE_ELEMENTS) is 21 GB more in float32
    pooled = ("k", "v") if inputs.layout == "paged" and not inputs.training else ()
    leaves = {name: t.detach().to(dtype).requires_grad_(inputs.training) if name in _GRADS and name not in pooled
              else t for name, t in inputs.tensors.items()}
    with torch.set_grad_enabled(inputs.training):
        out, lse = (_varlen if inputs.layout == "varlen" else _batched)(inputs, leaves, rule)
    grads: dict[str, torch.Tensor] = {}
    if inputs.dout is not None:
        wrt = [name for name in _GRADS if name in leaves]
        found = torch.autograd.grad(out, [leaves[n] for n in wrt], inputs.dout.to(dtype), allow_unused=True)
        grads = {_GRADS[n]: torch.zeros_like(leaves[n]) if g is None else g for n, g in zip(wrt, found, strict=True)}
    return Outputs(out.detach(), lse.detach(), softcap=float(sig.softcap), **grads)


def _batched(inputs: Inputs, t: dict[str, torch.Tensor], rule: _Rule) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense, seqused and paged: q is (batch, seqlen_q, hq, d); batches of sequences at a time, each sequence's
    keys cut to the longest used (paged: gathered through the page table)."""
    q, k, v = t["q"], t["k"], t["v"]
    len_q, len_k = inputs.lengths()
    keys = max(1, int(len_k.max()))
    batch, seqlen_q, heads_q = q.shape[:3]
    per = _per_chunk(seqlen_q, keys, heads_q, k.shape[-2], max(q.shape[-1], v.shape[-1]))
    pieces = []
    for start in range(0, batch, per):
        rows = slice(start, start + per)
        if inputs.layout == "paged":
            ks, vs = (_pages(x, t["page_table"][rows], keys).to(q.dtype) for x in (k, v))
        else:
            ks, vs = k[rows, :keys], v[rows, :keys]
        group = _Group(q[rows], ks, vs, len_q[rows].to(q.device), len_k[rows].to(q.device),
                       inputs.layout == "dense")
        pieces.append(_attend(group, t.get("learnable_sink"), rule))
    return torch.cat([out for out, _ in pieces]), torch.cat([lse for _, lse in pieces])


def _pages(pool: torch.Tensor, table: torch.Tensor, keys: int) -> torch.Tensor:
    """The first `keys` rows of each sequence's pages (n, keys, heads, dim) of a (pages, page_size, ...) pool."""
    return pool[table[:, : -(-keys // pool.shape[1])].long()].flatten(1, 2)[:, :keys]


def _varlen(inputs: Inputs, t: dict[str, torch.Tensor], rule: _Rule) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed q (total_q, hq, d): sequences grouped by length class, each group padded, its rows put back."""
    q, k, v = t["q"], t["k"], t["v"]
    if k.shape[0] == 0:  # no key at all: every row is empty (a zero key row stands in, masked)
        k, v = k.new_zeros(1, *k.shape[1:]), v.new_zeros(1, *v.shape[1:])
    len_q, len_k = inputs.lengths()
    start_q, start_k = (t[name].cpu().long()[:-1] for name in ("cu_seqlens_q", "cu_seqlens_k"))
    found: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # rows of out, of lse, their indices
    for seqs, span_q, span_k in _classes(len_q, len_k, q.shape[1], k.shape[1], max(q.shape[2], v.shape[2])):
        qi = (start_q[seqs, None] + torch.arange(span_q)).clamp(max=q.shape[0] - 1)
        ki = (start_k[seqs, None] + torch.arange(span_k)).clamp(max=k.shape[0] - 1)
        qi, ki = qi.to(q.device), ki.to(q.device)
        group = _Group(q[qi], k[ki], v[ki], len_q[seqs].to(q.device), len_k[seqs].to(q.device), False)
        out, lse = _attend(group, t.get("learnable_sink"), rule)
        valid = torch.arange(span_q, device=q.device) < group.len_q[:, None]
        found.append((out[valid], lse.transpose(1, 2)[valid], qi[valid]))
    out = q.new_zeros(q.shape[0], q.shape[1], v.shape[2])
    lse = torch.full((q.shape[0], q.shape[1]), -math.inf, dtype=rule.soft, device=q.device)
    if found:  # rows no sequence covers stay out 0, lse -inf
        rows, lses, index = (torch.cat(parts) for parts in zip(*found, strict=True))
        out, lse = out.index_copy(0, index, rows), lse.index_copy(0, index, lses)
    return out, lse.t().contiguous()


def _classes(len_q: torch.Tensor, len_k: torch.Tensor, heads_q: int, heads_kv: int,
             width: int) -> Iterator[tuple[torch.Tensor, int, int]]:
    """(sequence indices, padded rows, padded keys) of groups of the sequences with rows: sequences whose lengths
    round up to the same powers of two (padding at most doubles each length), in chunks of bounded size."""
    live = torch.nonzero(len_q > 0).flatten()
    cls = torch.ceil(torch.log2(len_q[live].double())) * 64 + torch.ceil(torch.log2(len_k[live].clamp(min=1).double()))
    order = torch.argsort(cls, stable=True)
    live, cls = live[order], cls[order]
    for seqs in torch.split(live, torch.unique_consecutive(cls, return_counts=True)[1].tolist()):
        span_q, span_k = int(len_q[seqs].max()), max(1, int(len_k[seqs].max()))
        for chunk in torch.split(seqs, _per_chunk(span_q, span_k, heads_q, heads_kv, width)):
            yield chunk, span_q, span_k


def _per_chunk(rows: int, keys: int, heads_q: int, heads_kv: int, width: int) -> int:
    """Sequences per group: the group's q, K/V and one query row of scores stay within CHUNK_ELEMENTS."""
    return max(1, CHUNK_ELEMENTS // max(heads_q * keys, keys * heads_kv * width, rows * heads_q * width))


def _attend(g: _Group, sink: torch.Tensor | None, rule: _Rule) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (n, Sq, hq, dv), lse (n, hq, Sq)) of a group, a block of query rows at a time; with several blocks
    and grad enabled, each block is recomputed in the backward instead of kept (torch checkpoint)."""
    n, seqlen_q, heads_q = g.q.shape[:3]
    kt, vt = g.k.permute(0, 2, 3, 1), g.v.permute(0, 2, 1, 3)  # (n, hkv, d, Sk), (n, hkv, Sk, dv)
    rows = max(1, CHUNK_ELEMENTS // (n * heads_q * kt.shape[-1]))
    saving = torch.is_grad_enabled() and rows < seqlen_q
    pieces = []
    for first in range(0, max(seqlen_q, 1), rows):  # one empty block for no rows
        block = partial(_block, first=first, len_q=g.len_q, len_k=g.len_k, full_k=g.full_k, rule=rule)
        args = (g.q[:, first:first + rows], kt, vt, sink)
        pieces.append(checkpoint(block, *args, use_reentrant=False) if saving else block(*args))
    return torch.cat([out for out, _ in pieces], 1), torch.cat([lse for _, lse in pieces], 2)


def _block(q: torch.Tensor, kt: torch.Tensor, vt: torch.Tensor, sink: torch.Tensor | None, *, first: int,
           len_q: torch.Tensor, len_k: torch.Tensor, full_k: bool, rule: _Rule) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows first.. of q (n, rows, hq, d) against all keys; GQA as (n, hkv, group x rows) so K/V are not copied."""
    (n, rows, heads_q, dim), heads_kv, keys, dim_v = q.shape, kt.shape[1], kt.shape[-1], vt.shape[-1]
    group = heads_q // heads_kv
    qh = q.reshape(n, rows, heads_kv, group, dim).permute(0, 2, 3, 1, 4).reshape(n, heads_kv, group * rows, dim)
    s = torch.matmul(qh, kt) * rule.scale
    if rule.softcap:
        s = torch.tanh(s / rule.softcap) * rule.softcap
    s = s.reshape(n, heads_kv, group, rows, keys).to(rule.soft)
    allowed = _allowed(first, rows, keys, len_q, len_k, full_k, rule)
    if allowed is not None:
        s = s.masked_fill(~allowed, -math.inf)
    p, lse = _softmax(s, None if sink is None else sink.to(rule.soft).reshape(1, heads_kv, group, 1, 1))
    out = torch.matmul(p.to(rule.dtype).reshape(n, heads_kv, group * rows, keys), vt)
    out = out.reshape(n, heads_kv, group, rows, dim_v).permute(0, 3, 1, 2, 4).reshape(n, rows, heads_q, dim_v)
    return out, lse.reshape(n, heads_q, rows)


def _softmax(s: torch.Tensor, sink: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(P, lse) over the last dim with the sink as one more logit; a row with no finite score and no sink has
    P = 0 and lse = -inf, with no NaN in the backward (so padded rows never poison real gradients)."""
    top = s.amax(-1, keepdim=True)
    if sink is not None:
        top = torch.maximum(top, sink)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top)).detach()  # P does not depend on it
    e = torch.exp(s - top)
    total = e.sum(-1, keepdim=True)
    if sink is not None:
        total = total + torch.exp(sink - top)
    p = e / torch.where(total > 0, total, torch.ones_like(total))
    return p, (torch.log(total) + top).squeeze(-1)


def _allowed(first: int, rows: int, keys: int, len_q: torch.Tensor, len_k: torch.Tensor, full_k: bool,
             rule: _Rule) -> torch.Tensor | None:
    """(n, 1, 1, rows or 1, keys) bool: which keys each row sees (FA4's bottom-right alignment per sequence); None
    when every row sees every key."""
    if rule.mask == "full" and full_k:
        return None
    i = torch.arange(first, first + rows, device=len_k.device).view(1, rows, 1)
    j = torch.arange(keys, device=len_k.device).view(1, 1, keys)
    lk = len_k.view(-1, 1, 1)
    ok = j < lk
    diagonal = i + lk - len_q.view(-1, 1, 1)
    if rule.mask == "causal":
        ok = ok & (j <= diagonal)
    elif rule.mask == "local":
        ok = ok & (j >= diagonal - rule.window[0]) & (j <= diagonal + rule.window[1])
    return ok[:, None, None]


# -- the tolerance -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Failure:
    """A tensor outside its bound: its name, largest error, the bound, where (index of the largest error)."""

    tensor: str
    error: float
    bound: float
    at: tuple[int, ...] = ()
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"tensor": self.tensor, "error": self.error, "bound": self.bound, "at": list(self.at),
                "note": self.note}

    def describe(self) -> str:
        where, note = f" at {list(self.at)}" if self.at else "", f" ({self.note})" if self.note else ""
        return f"{self.tensor}: max error {self.error:.4g}{where} > bound {self.bound:.4g}{note}"


def error(got: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """|got - ref| elementwise in float32: 0 where they are equal (matching infinities), inf where got is NaN."""
    a, b = got.detach().float(), ref.detach().float()
    diff = torch.where(a == b, torch.zeros_like(a), (a - b).abs())
    return torch.nan_to_num(diff, nan=math.inf)


def rounding(ref: torch.Tensor, dtype: torch.dtype) -> float:
    """FA4's tests' atol: 2 * max |(x + 0.3) - 0.3 - x| over the finite x of `ref` rounded to `dtype` (the
    rounding of an output of that dtype near its values)."""
    x = ref.detach()[torch.isfinite(ref.detach())].to(dtype)
    return 2 * float(((x + 0.3) - 0.3 - x).abs().max()) if x.numel() else 0.0


def allowance(ref32: Outputs, ref_lowp: Outputs, name: str) -> float:
    """The atol of `name`'s bound: FA4's rounding(ref32's tensor, ref_lowp's dtype of it); for lse at least the
    machine epsilon of the input dtype (ref_lowp.out's: 2^-7 for bf16, 2^-10 for fp16).

    Why lse has a floor: FA4's atol is a sample estimate of the rounding of an output near its values, and lse is
    float32 whatever the inputs, so over a small lse (one query row of one head: a single element) it can be 0,
    while the low-precision reference's lse (its softmax is float32) has almost no error of its own: the bound
    was 0 and any other float32 summation order failed (the H200, default build: lse off by 1.9e-6 to 6.7e-6
    after ~1M keys, bounds 0 to 5.7e-6). lse acts only through exp: the backward recomputes P = exp(S - lse), and
    a caller merging partial attentions weighs each by exp(lse_i - lse), so an error delta scales values held in
    the input dtype by exp(+-delta), a relative error of about delta; below that dtype's epsilon (its spacing at
    1) it is below the rounding of the values it scales, which out's and the gradients' own bounds cannot see
    either. A float32 bound (ulps times the key count's log) would need each row's key count and still be a guess
    at FA4's summation order; the epsilon needs neither, and a wrong scale, log base or sink moves lse far more."""
    ref, low = ref32.get(name), ref_lowp.get(name)
    if ref is None or low is None:
        raise ValueError(f"no reference {name!r}: the references hold {[n for n in NAMES if ref32.get(n) is not None]}")
    atol = rounding(ref, low.dtype)
    return max(atol, float(torch.finfo(ref_lowp.out.dtype).eps)) if name == "lse" else atol


def tolerance(ref32: Outputs, ref_lowp: Outputs, name: str, *, factor: float = 2.0,
              atol: float | None = None) -> float:
    """FA4's bound on a kernel's max error against ref32: `factor` times the low-precision reference's own max
    error plus `atol` (default: allowance(ref32, ref_lowp, name)). Raises ValueError for a tensor either
    reference lacks."""
    ref, low = ref32.get(name), ref_lowp.get(name)
    if ref is None or low is None:
        raise ValueError(f"no reference {name!r}: the references hold {[n for n in NAMES if ref32.get(n) is not None]}")
    own = float(error(low, ref).max()) if ref.numel() else 0.0
    return factor * own + (allowance(ref32, ref_lowp, name) if atol is None else atol)


def compare(got: Outputs, ref32: Outputs, ref_lowp: Outputs) -> list[Failure]:
    """The tensors of `got` outside FA4's bound (empty: pass): out and every gradient ref32 holds must be in
    `got` (a missing or misshapen one fails); lse is checked when `got` has it. Factor 2, or 3 with a softcap,
    and 3e-4 more on the gradients with a softcap, as FA4's test_flash_attn_output; atol `allowance`'s."""
    factor = 3.0 if ref32.softcap else 2.0
    failures: list[Failure | None] = []
    for name in NAMES:
        ref, low, mine = ref32.get(name), ref_lowp.get(name), got.get(name)
        if ref is None or low is None or (mine is None and name == "lse"):
            continue
        extra = SOFTCAP_GRAD_ATOL if ref32.softcap and name.startswith("d") else 0.0
        bound = tolerance(ref32, ref_lowp, name, factor=factor, atol=allowance(ref32, ref_lowp, name) + extra)
        failures.append(_check(name, mine, ref, bound))
    return [f for f in failures if f is not None]


def _check(name: str, got: torch.Tensor | None, ref: torch.Tensor, bound: float) -> Failure | None:
    if got is None or tuple(got.shape) != tuple(ref.shape):
        shape: Any = None if got is None else list(got.shape)
        return Failure(name, math.inf, bound, note=f"missing or shape {shape}, expected {list(ref.shape)}")
    err = error(got, ref)
    worst = float(err.max()) if ref.numel() else 0.0
    if worst <= bound:
        return None
    at = tuple(int(i) for i in torch.unravel_index(err.argmax(), err.shape))
    return Failure(name, worst, bound, at)
