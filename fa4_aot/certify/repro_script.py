"""A one-file repro of a certification finding: a Python script that needs torch and flash-attn-4 on a GPU of the
arch, and nothing of fa4-aot, so that an upstream issue can quote it. Pure (text from a check).

The script makes the check's inputs again, bit for bit on the same kind of GPU: the same seed, the same draws in
the same order as certify/inputs.py (q, k, v, the sink and dout from one CUDA generator; the per-sequence tensors
written out as literals, a paged call's page table by the same permutation). It calls FA4's public function
(flash_attn_func or flash_attn_varlen_func) with the check's arguments, computes FA4's own references with FA4's
own `flash_attn.cute.testing.attention_ref` per sequence (upcast for the reference, the input precision with
reordered ops for the comparison point, as FA4's tests do) and applies FA4's test criterion: max |got - ref| <=
rtol x max |pt - ref| + atol, rtol 2 (3 with a softcap), atol twice the rounding of ref near its values (plus
3e-4 on gradients with a softcap). It prints each tensor's error, bound and ratio and exits 1 when one is out.
"""

from __future__ import annotations

import pprint
import textwrap

import torch

from ..domain.recipe_format import HEADS
from . import inputs
from .plan import Check

_LITERAL_LIMIT = 4096  # per-sequence tensors longer than this are not written out (a paged table is redrawn)


def script(check: Check, *, symptom: str, source: str, versions: dict[str, str]) -> str:
    """The repro of `check` as Python source. `symptom` and `source` say what certification saw and where;
    `versions` names flash-attn-4 and nvidia-cutlass-dsl as the store's kernels were built with."""
    sig = check.sig
    heads_kv = int(check.point.get(HEADS, sig.heads_kv))
    shapes, per_seq, maxes = inputs._layout(sig, check.point, torch.Generator().manual_seed(check.seed))
    literal = {name: t.tolist() for name, t in per_seq.items() if name != "page_table" or t.numel() <= _LITERAL_LIMIT}
    flags = sig.call(0, 0, 0).flags()
    setup = {
        "layout": sig.layout, "dtype": sig.dtype, "head_dim": sig.head_dim, "head_dim_v": sig.head_dim_v,
        "heads_q": sig.heads_q // sig.heads_kv * heads_kv, "heads_kv": heads_kv, "q_rows": list(shapes[0]),
        "k_rows": list(shapes[1]), "softcap": float(sig.softcap), "sink": sig.sink,
        "training": sig.pass_ in inputs.TRAINING, "seed": check.seed, "page_size": sig.page_size,
        "num_pages": int(check.point.get("num_pages", 0)), "pages_per_seq": int(check.point.get("pages_per_seq", 0)),
    }
    kwargs = {**{k: list(v) if isinstance(v, tuple) else v for k, v in flags.items()}, **maxes}
    header = (f"{sig.pass_} {sig.layout} {sig.dtype} d={sig.head_dim}x{sig.head_dim_v} {sig.mask}, "
              f"{' '.join(f'{k}={v}' for k, v in check.point.items())}")
    made = ", ".join(f"{k} {v}" for k, v in sorted(versions.items()) if v)
    return _TEMPLATE.format(
        header=textwrap.shorten(header, 104), saw=_lines(f"What certification saw: {symptom}"),
        where=_lines(f"Source: {source}; kernels built with {made or 'unknown versions'}."),
        setup=pprint.pformat(setup, sort_dicts=False, width=110), kwargs=pprint.pformat(kwargs, sort_dicts=False),
        per_seq=pprint.pformat(literal, width=116, compact=True),
    )


def _lines(text: str) -> str:
    """`text` wrapped to the house's line length, with no triple quote to end the script's docstring."""
    return textwrap.fill(text, 116).replace('"""', "'''")


_TEMPLATE = '''"""FA4 repro: {header}

{saw}
{where}

Run on a GPU of the same arch with torch and flash-attn-4 installed (no fa4-aot):  python THIS_FILE
It computes FA4's references with flash_attn.cute.testing.attention_ref, one sequence at a time, and applies FA4's
test criterion: max|got - ref| <= rtol * max|pt - ref| + atol. Exit status 1: a tensor is out of bound.
"""
import sys

import torch
from flash_attn.cute import flash_attn_func, flash_attn_varlen_func
from flash_attn.cute.testing import attention_ref

SETUP = {setup}
KWARGS = {kwargs}  # FA4's keyword arguments besides the per-sequence tensors
# cu_seqlens_q/k, seqused_k, page_table (int32), written out
PER_SEQ = {per_seq}
DEVICE = "cuda"
DTYPE = {{"bf16": torch.bfloat16, "fp16": torch.float16}}[SETUP["dtype"]]


def make_inputs():
    """q, k, v (and the sink, dout): standard normal from one CUDA generator, in this order."""
    gen = torch.Generator(device=DEVICE).manual_seed(SETUP["seed"])
    normal = lambda *shape: torch.randn(*shape, generator=gen, dtype=DTYPE, device=DEVICE)  # noqa: E731
    q = normal(*SETUP["q_rows"], SETUP["heads_q"], SETUP["head_dim"])
    if SETUP["softcap"] > 0:
        q = q * (SETUP["softcap"] / 4)
    k = normal(*SETUP["k_rows"], SETUP["heads_kv"], SETUP["head_dim"])
    v = normal(*SETUP["k_rows"], SETUP["heads_kv"], SETUP["head_dim_v"])
    sink = normal(SETUP["heads_q"]) if SETUP["sink"] else None
    dout = normal(*SETUP["q_rows"], SETUP["heads_q"], SETUP["head_dim_v"]) if SETUP["training"] else None
    per_seq = {{name: torch.tensor(values, dtype=torch.int32, device=DEVICE) for name, values in PER_SEQ.items()}}
    if SETUP["layout"] == "paged" and "page_table" not in per_seq:  # the same permutation as the certifier's
        batch, pages = SETUP["q_rows"][0], SETUP["pages_per_seq"]
        perm = torch.randperm(SETUP["num_pages"], generator=torch.Generator().manual_seed(SETUP["seed"]))
        table = perm[torch.arange(batch * pages) % SETUP["num_pages"]].reshape(batch, pages)
        per_seq["page_table"] = table.to(torch.int32).to(DEVICE)
    return q, k, v, sink, dout, per_seq


def sequences(q, k, v, per_seq):
    """(q, k, v) of each sequence as a batch of one, its keys only the ones it uses."""
    if SETUP["layout"] == "varlen":
        cq, ck = PER_SEQ["cu_seqlens_q"], PER_SEQ["cu_seqlens_k"]
        return [(q[cq[i]:cq[i + 1]][None], k[ck[i]:ck[i + 1]][None], v[ck[i]:ck[i + 1]][None])
                for i in range(len(cq) - 1)]
    used = PER_SEQ.get("seqused_k") or [k.shape[1]] * q.shape[0]
    if SETUP["layout"] == "paged":
        table = per_seq["page_table"].long()
        k, v = (x[table].flatten(1, 2) for x in (k, v))
    return [(q[i:i + 1], k[i:i + 1, :used[i]], v[i:i + 1, :used[i]]) for i in range(q.shape[0])]


def empty_rows(seqlen_q, seqlen_k):
    """How many leading query rows of a sequence see no key. FA4 defines their output as 0 (no gradient), while
    attention_ref's gradients are NaN there (FA4's tests skip such backwards). With FA4's bottom-right aligned
    masks they are the leading rows, and dropping leading rows keeps the others' alignment, so the reference
    takes them out and gives them FA4's result."""
    if KWARGS["causal"]:
        right = 0
    elif KWARGS["window_size"][0] is not None:
        right = KWARGS["window_size"][1]
    else:
        return seqlen_q if seqlen_k == 0 else 0
    return min(seqlen_q, max(0, seqlen_q - seqlen_k - right))


def reference(q, k, v, sink, dout, per_seq, upcast):
    """FA4's attention_ref over each sequence: out and, for training, the gradients by autograd."""
    leaves = [t.detach().clone().requires_grad_(SETUP["training"]) if t is not None else None for t in (q, k, v, sink)]
    window = KWARGS["window_size"]
    window = (None, None) if window[0] is None else tuple(window)
    outs = []
    for qs, ks, vs in sequences(*leaves[:3], per_seq):
        empty = empty_rows(qs.shape[1], ks.shape[1])
        part = [qs.new_zeros(1, empty, qs.shape[2], vs.shape[3])]
        if empty < qs.shape[1]:
            part.append(attention_ref(qs[:, empty:], ks, vs, causal=KWARGS["causal"], window_size=window,
                                      softcap=SETUP["softcap"], learnable_sink=leaves[3], upcast=upcast,
                                      reorder_ops=not upcast)[0])
        outs.append(torch.cat(part, dim=1))
    out = torch.cat(outs, dim=1)[0] if SETUP["layout"] == "varlen" else torch.cat(outs)
    found = {{"out": out.detach()}}
    if SETUP["training"]:
        wrt = [(n, t) for n, t in zip(("dq", "dk", "dv", "dsink"), leaves, strict=True) if t is not None]
        grads = torch.autograd.grad(out, [t for _, t in wrt], dout, allow_unused=True)
        found.update({{n: torch.zeros_like(t) if g is None else g for (n, t), g in zip(wrt, grads, strict=True)}})
    return found


def fa4(q, k, v, sink, dout, per_seq):
    """FA4's forward (and backward) of the call."""
    leaves = [t.detach().clone().requires_grad_(SETUP["training"]) if t is not None else None for t in (q, k, v, sink)]
    fn = flash_attn_func if SETUP["layout"] == "dense" else flash_attn_varlen_func
    kwargs = {{**KWARGS, **per_seq, "window_size": tuple(KWARGS["window_size"])}}
    if sink is not None:
        kwargs["learnable_sink"] = leaves[3]
    result = fn(*leaves[:3], **kwargs)
    out = result[0] if isinstance(result, tuple) else result
    found = {{"out": out.detach()}}
    if SETUP["training"]:
        wrt = [(n, t) for n, t in zip(("dq", "dk", "dv", "dsink"), leaves, strict=True) if t is not None]
        grads = torch.autograd.grad(out, [t for _, t in wrt], dout)
        found.update(zip([n for n, _ in wrt], grads, strict=True))
    if q.is_cuda:
        torch.cuda.synchronize()
    return found


def main():
    q, k, v, sink, dout, per_seq = make_inputs()
    got = fa4(q, k, v, sink, dout, per_seq)
    ref = reference(q, k, v, sink, dout, per_seq, upcast=True)
    pt = reference(q, k, v, sink, dout, per_seq, upcast=False)
    rtol, failed = (3.0 if SETUP["softcap"] else 2.0), False
    for name, r in ref.items():
        r32, g32, p32 = r.float(), got[name].float(), pt[name].float()
        atol = 2 * (r + 0.3 - 0.3 - r).abs().max().item() if r.numel() else 0.0  # in ref's dtype, as FA4's
        atol += 3e-4 if SETUP["softcap"] and name.startswith("d") else 0.0
        err = (g32 - r32).abs().nan_to_num(nan=float("inf")).max().item() if r.numel() else 0.0
        bound = rtol * ((p32 - r32).abs().max().item() if r.numel() else 0.0) + atol
        failed |= not err <= bound
        print(f"{{name}}: error {{err:.4g}}, bound {{bound:.4g}} ({{err / bound if bound else float('inf'):.3g}}x)"
              f"{{'  WRONG' if not err <= bound else ''}}")
    print("FA4 is outside its own test bound" if failed else "FA4 is within its own test bound")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
'''
