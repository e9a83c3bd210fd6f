"""certify.reference: attention as FA4 defines it (bottom-right masks, softcap, sinks, GQA, empty rows, every
layout), its gradients, bounded-memory blocks, and FA4's tolerance."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import torch

from fa4_aot.certify import reference as ref
from fa4_aot.certify.inputs import Inputs, make_inputs
from fa4_aot.certify.reference import Outputs, compare, reference, tolerance
from fa4_aot.domain.signature import Signature

F64 = torch.float64
SIG = Signature(layout="dense", pass_="fwd", dtype="bf16", head_dim=32, head_dim_v=24, mask="full", window=(0, 0),
                softcap=0.0, sink=False, num_splits=1, heads_q=8, heads_kv=2)


def sig_of(**changes: Any) -> Signature:
    return dataclasses.replace(SIG, **changes)


def fa4_allowed(sq: int, sk: int, mask: str, window: tuple[int, int] = (0, 0)) -> torch.Tensor:
    """FA4's mask written out (mask.py; testing.py construct_local_mask): row i sees key j iff j < sk and, causal,
    j <= i + sk - sq; local (left, right), i + sk - sq - left <= j <= i + sk - sq + right."""
    allowed = torch.zeros(sq, sk, dtype=torch.bool)
    for i in range(sq):
        for j in range(sk):
            diagonal = i + sk - sq
            if mask == "full":
                allowed[i, j] = True
            elif mask == "causal":
                allowed[i, j] = j <= diagonal
            else:
                allowed[i, j] = diagonal - window[0] <= j <= diagonal + window[1]
    return allowed


def explicit(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, softcap: float = 0.0,
             sink: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence in float64: q (sq, hq, d), k (sk, hkv, d); the sink as a real extra softmax column whose
    value row is zero; (out (sq, hq, dv), lse (hq, sq)); a row with no logit at all gives 0 and -inf."""
    q, k, v = q.to(F64), k.to(F64), v.to(F64)
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(q.shape[-1])
    if softcap:
        s = torch.tanh(s / softcap) * softcap
    s = s.masked_fill(~allowed, -math.inf)
    if sink is not None:
        s = torch.cat([s, sink.to(F64)[:, None, None].expand(-1, s.shape[1], 1)], dim=-1)
        v = torch.cat([v, v.new_zeros(1, *v.shape[1:])])
    lse = torch.logsumexp(s, dim=-1)
    p = torch.nan_to_num(torch.softmax(s, dim=-1), nan=0.0)  # rows of -inf only: P = 0
    return torch.einsum("hqk,khd->qhd", p, v), lse


def dense(sig: Signature, batch: int, sq: int, sk: int, seed: int = 0, heads_kv: int = 2) -> Inputs:
    return make_inputs(sig, {"batch": batch, "seqlen_q": sq, "seqlen_k": sk, "heads_kv": heads_kv}, seed, "cpu")


def close(a: torch.Tensor, b: torch.Tensor, atol: float = 2e-5) -> bool:
    return torch.allclose(a.to(F64), b.to(F64), atol=atol, rtol=atol, equal_nan=False)


@pytest.mark.parametrize("mask", ["full", "causal"])
@pytest.mark.parametrize("heads_q,heads_kv", [(4, 4), (8, 2), (6, 1)])
def test_matches_sdpa_at_equal_lengths(mask: str, heads_q: int, heads_kv: int) -> None:
    sig = sig_of(mask=mask, heads_q=heads_q, heads_kv=heads_kv, head_dim_v=32)
    inputs = dense(sig, 2, 33, 33, heads_kv=heads_kv)
    got = reference(inputs, sig, dtype=torch.float32)
    q, k, v = (inputs.tensors[n].to(F64).transpose(1, 2) for n in ("q", "k", "v"))
    group = heads_q // heads_kv
    want = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), is_causal=mask == "causal").transpose(1, 2)
    assert got.out.dtype == torch.float32 and close(got.out, want)
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k.repeat_interleave(group, 1)) / math.sqrt(32)
    if mask == "causal":
        scores = scores.masked_fill(~torch.ones(33, 33, dtype=torch.bool).tril(), -math.inf)
    assert got.lse is not None and close(got.lse, torch.logsumexp(scores, -1))


CASES = [  # (mask, window, sq, sk, softcap)
    ("causal", (0, 0), 5, 12, 0.0), ("causal", (0, 0), 12, 5, 0.0), ("causal", (0, 0), 1, 7, 0.0),
    ("causal", (0, 0), 7, 1, 0.0), ("local", (2, 1), 6, 11, 0.0), ("local", (2, 1), 11, 6, 0.0),
    ("local", (0, 3), 9, 9, 0.0), ("local", (4, 0), 3, 10, 0.0), ("local", (5, -1), 8, 8, 0.0),
    ("full", (0, 0), 5, 9, 6.0), ("causal", (0, 0), 9, 4, 3.0), ("local", (3, 3), 10, 7, 10.0),
]


@pytest.mark.parametrize("mask,window,sq,sk,softcap", CASES)
@pytest.mark.parametrize("sink", [False, True])
def test_masks_softcap_and_sinks_as_fa4_defines_them(mask: str, window: tuple[int, int], sq: int, sk: int,
                                                     softcap: float, sink: bool) -> None:
    sig = sig_of(mask=mask, window=window, softcap=softcap, sink=sink)
    inputs = dense(sig, 3, sq, sk, seed=sq * 31 + sk)
    got = reference(inputs, sig, dtype=torch.float32)
    t = inputs.tensors
    assert got.lse is not None and got.lse.shape == (3, 8, sq)
    allowed = fa4_allowed(sq, sk, mask, window)
    for b in range(3):
        out, lse = explicit(t["q"][b], t["k"][b], t["v"][b], allowed, softcap, t.get("learnable_sink"))
        assert close(got.out[b], out) and close(got.lse[b], lse)
    empty = ~allowed.any(1)  # rows that see no key: out 0, lse -inf, or the sink logit with a sink
    if empty.any():
        assert torch.equal(got.out[:, empty], torch.zeros_like(got.out[:, empty]))
        expected = t["learnable_sink"].float()[None, :, None] if sink else torch.tensor(-math.inf)
        assert torch.equal(got.lse[:, :, empty], expected.expand_as(got.lse[:, :, empty]))


def varlen_inputs(sig: Signature, lengths_q: list[int], lengths_k: list[int], seed: int = 0) -> Inputs:
    point = {"batch": len(lengths_q), "total_q": sum(lengths_q), "total_k": sum(lengths_k),
             "max_seqlen_q": max(lengths_q), "max_seqlen_k": max(max(lengths_k), 1), "heads_kv": 2}
    inputs = make_inputs(dataclasses.replace(sig, layout="varlen"), point, seed, "cpu")
    cu = {n: torch.tensor([0, *torch.tensor(ls).cumsum(0).tolist()], dtype=torch.int32)
          for n, ls in (("cu_seqlens_q", lengths_q), ("cu_seqlens_k", lengths_k))}
    return dataclasses.replace(inputs, tensors={**inputs.tensors, **cu})


@pytest.mark.parametrize("mask,window", [("causal", (0, 0)), ("local", (3, 1)), ("full", (0, 0))])
def test_varlen_equals_each_sequence_alone(mask: str, window: tuple[int, int]) -> None:
    """Sequences of every kind: longer q than k, no rows, no keys, one row, equal lengths."""
    sig = sig_of(mask=mask, window=window, sink=True, softcap=5.0)
    lengths_q, lengths_k = [7, 0, 3, 5, 1, 9, 4], [3, 4, 0, 5, 6, 17, 4]
    inputs = varlen_inputs(sig, lengths_q, lengths_k)
    got = reference(inputs, dataclasses.replace(sig, layout="varlen"), dtype=torch.float32)
    t = inputs.tensors
    assert got.out.shape == (sum(lengths_q), 8, 24) and got.lse is not None and got.lse.shape == (8, sum(lengths_q))
    cu_q, cu_k = t["cu_seqlens_q"].tolist(), t["cu_seqlens_k"].tolist()
    for b in range(len(lengths_q)):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        alone = Inputs("dense", {"q": t["q"][None, rows], "k": t["k"][None, keys], "v": t["v"][None, keys],
                                 "learnable_sink": t["learnable_sink"]})
        want = reference(alone, sig, dtype=torch.float32) if lengths_k[b] else None
        out, lse = (want.out[0], want.lse[0]) if want is not None and want.lse is not None else explicit(
            t["q"][rows], t["k"][keys], t["v"][keys], fa4_allowed(lengths_q[b], 0, mask), 5.0, t["learnable_sink"])
        assert close(got.out[rows], out) and close(got.lse[:, rows], lse)


def paged_inputs(sig: Signature, seed: int = 0) -> Inputs:
    point = {"batch": 4, "seqlen_q": 5, "num_pages": 9, "pages_per_seq": 3, "max_seqlen_q": 5, "max_seqlen_k": 21,
             "heads_kv": 2}
    return make_inputs(dataclasses.replace(sig, layout="paged", page_size=8), point, seed, "cpu")


@pytest.mark.parametrize("mask,window", [("causal", (0, 0)), ("local", (6, 0)), ("full", (0, 0))])
def test_paged_equals_the_gathered_sequences(mask: str, window: tuple[int, int]) -> None:
    sig = sig_of(mask=mask, window=window, sink=True)
    inputs = paged_inputs(sig)
    t = inputs.tensors
    got = reference(inputs, dataclasses.replace(sig, layout="paged", page_size=8), dtype=torch.float32)
    for b in range(4):
        used = int(t["seqused_k"][b])
        k, v = (t[n][t["page_table"][b].long()].flatten(0, 1)[:used] for n in ("k", "v"))
        out, lse = explicit(t["q"][b], k, v, fa4_allowed(5, used, mask, window), 0.0, t["learnable_sink"])
        assert close(got.out[b], out) and got.lse is not None and close(got.lse[b], lse)


def test_seqused_reads_no_key_past_the_used_length() -> None:
    sig = sig_of(layout="seqused", mask="causal", sink=False)
    point = {"batch": 3, "seqlen_q": 6, "seqlen_k": 20, "max_seqlen_q": 6, "max_seqlen_k": 14, "heads_kv": 2}
    inputs = make_inputs(sig, point, 5, "cpu")
    t = inputs.tensors
    used = t["seqused_k"].tolist()
    garbage = {n: t[n].clone() for n in ("k", "v")}
    for b, u in enumerate(used):
        for n in ("k", "v"):
            garbage[n][b, u:] = 1e4
    spoiled = reference(dataclasses.replace(inputs, tensors={**t, **garbage}), sig, dtype=torch.float32)
    got = reference(inputs, sig, dtype=torch.float32)
    assert torch.equal(spoiled.out, got.out) and spoiled.lse is not None and got.lse is not None
    assert torch.equal(spoiled.lse, got.lse)
    for b, u in enumerate(used):
        out, lse = explicit(t["q"][b], t["k"][b, :u], t["v"][b, :u], fa4_allowed(6, u, "causal"))
        assert close(got.out[b], out) and close(got.lse[b], lse)


def explicit_grads(inputs: Inputs, sig: Signature) -> dict[str, torch.Tensor]:
    """float64 autograd of `explicit` over each sequence of a dense or varlen call."""
    t = {n: x.detach().to(F64).requires_grad_() for n, x in inputs.tensors.items() if n in ref._GRADS}
    if inputs.layout == "varlen":
        cu_q, cu_k = inputs.tensors["cu_seqlens_q"].tolist(), inputs.tensors["cu_seqlens_k"].tolist()
        spans = [(slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])) for b in range(len(cu_q) - 1)]
        pick = lambda x, s: x[s]  # noqa: E731
    else:
        spans = [(b, b) for b in range(t["q"].shape[0])]
        pick = lambda x, s: x[s]  # noqa: E731
    outs = []
    for rows, keys in spans:
        q, k, v = pick(t["q"], rows), pick(t["k"], keys), pick(t["v"], keys)
        allowed = fa4_allowed(q.shape[0], k.shape[0], sig.mask, sig.window)
        outs.append(explicit(q, k, v, allowed, sig.softcap, t.get("learnable_sink"))[0])
    out = torch.cat(outs) if inputs.layout == "varlen" else torch.stack(outs)
    assert inputs.dout is not None
    found = torch.autograd.grad(out, list(t.values()), inputs.dout.to(F64))
    return {ref._GRADS[n]: g for n, g in zip(t, found, strict=True)}


@pytest.mark.parametrize("layout", ["dense", "varlen"])
@pytest.mark.parametrize("mask,window,softcap,sink", [("causal", (0, 0), 0.0, True), ("local", (3, 2), 4.0, True),
                                                      ("full", (0, 0), 0.0, False)])
def test_gradients_equal_float64_autograd_of_the_explicit_form(layout: str, mask: str, window: tuple[int, int],
                                                              softcap: float, sink: bool) -> None:
    sig = sig_of(pass_="bwd", mask=mask, window=window, softcap=softcap, sink=sink, layout=layout)
    inputs = varlen_inputs(sig, [6, 0, 2, 9], [4, 3, 0, 12]) if layout == "varlen" else dense(sig, 2, 9, 6)
    want = explicit_grads(inputs, sig)
    for dtype, atol in ((torch.float64, 1e-10), (torch.float32, 1e-4)):
        got = reference(inputs, sig, dtype=dtype)
        for name, expected in want.items():
            mine = got.get(name)
            assert mine is not None and mine.dtype == dtype and close(mine, expected, atol), name
    assert not inputs.tensors["q"].grad  # the inputs are left alone


@pytest.mark.parametrize("layout", ["dense", "varlen", "paged"])
def test_blocks_of_bounded_size_give_the_same_results(layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Many batch chunks, row blocks and checkpointed backward blocks equal one whole block."""
    sig = sig_of(pass_="bwd", mask="causal", sink=True, layout=layout)
    if layout == "paged":
        sig = dataclasses.replace(sig, page_size=8)
        inputs = paged_inputs(sig)
    else:
        inputs = varlen_inputs(sig, [9, 1, 4, 12, 3], [9, 5, 2, 30, 3]) if layout == "varlen" else dense(sig, 3, 17, 9)
    whole = reference(inputs, sig, dtype=torch.float32)
    monkeypatch.setattr(ref, "CHUNK_ELEMENTS", 40)
    blocks = reference(inputs, sig, dtype=torch.float32)
    for name in ref.NAMES:
        a, b = whole.get(name), blocks.get(name)
        assert a is not None and b is not None and close(a, b, 1e-6), name


# -- the tolerance ---------------------------------------------------------------------------------------------
def references(sig: Signature, inputs: Inputs) -> tuple[Outputs, Outputs]:
    return reference(inputs, sig, dtype=torch.float32), reference(inputs, sig, dtype=inputs.dtype)


@pytest.fixture(scope="module")
def trained() -> tuple[Signature, Inputs, Outputs, Outputs]:
    sig = sig_of(pass_="bwd", mask="causal", sink=True)
    inputs = dense(sig, 2, 40, 56, seed=9)
    return (sig, inputs, *references(sig, inputs))


def as_kernel(ref32: Outputs, dtype: torch.dtype) -> Outputs:
    """What a correct kernel returns: the exact result rounded to the kernel's output dtype, lse float32."""
    low = {n: None if (x := ref32.get(n)) is None else x.to(dtype) for n in ("out", "dq", "dk", "dv", "dsink")}
    return Outputs(lse=ref32.lse, **low)  # type: ignore[arg-type]


def test_the_low_precision_reference_and_a_correct_kernel_pass(trained: Any) -> None:
    _, _, ref32, low = trained
    assert compare(low, ref32, low) == []
    assert compare(as_kernel(ref32, torch.bfloat16), ref32, low) == []
    for name in ("out", "dq", "dk", "dv", "dsink", "lse"):  # bounds are real: not zero, not huge
        assert 1e-5 < tolerance(ref32, low, name) < 0.5, name


@pytest.mark.parametrize("name", ["out", "dq", "dk", "dv", "dsink", "lse"])
def test_one_wrong_element_fails_naming_the_tensor(trained: Any, name: str) -> None:
    _, _, ref32, low = trained
    kernel = as_kernel(ref32, torch.bfloat16)
    bad = kernel.get(name).clone()  # type: ignore[union-attr]
    index = tuple(s // 2 for s in bad.shape)
    bad[index] += 4 * tolerance(ref32, low, name) + 0.05
    failures = compare(dataclasses.replace(kernel, **{name: bad}), ref32, low)
    assert [f.tensor for f in failures] == [name]
    assert failures[0].at == index and failures[0].error > failures[0].bound
    assert name in failures[0].describe() and failures[0].to_dict()["tensor"] == name


@pytest.mark.parametrize("change,note", [("nan", ""), ("missing", "missing"), ("shape", "shape")])
def test_nan_missing_and_misshapen_outputs_fail(trained: Any, change: str, note: str) -> None:
    _, _, ref32, low = trained
    kernel = as_kernel(ref32, torch.bfloat16)
    dq = kernel.dq
    assert dq is not None
    value = {"nan": dq.clone().index_fill_(0, torch.tensor([1]), math.nan), "missing": None, "shape": dq[:1]}[change]
    failures = compare(dataclasses.replace(kernel, dq=value), ref32, low)
    assert [(f.tensor, f.error) for f in failures] == [("dq", math.inf)] and note in failures[0].note


def test_lse_is_optional_and_infinities_match() -> None:
    sig = sig_of(mask="causal")
    inputs = dense(sig, 2, 9, 4)  # rows 0..4 see no key: lse -inf there
    ref32, low = references(sig, inputs)
    assert ref32.lse is not None and torch.isinf(ref32.lse).any()
    kernel = as_kernel(ref32, torch.bfloat16)
    assert compare(kernel, ref32, low) == [] and compare(dataclasses.replace(kernel, lse=None), ref32, low) == []
    wrong = ref32.lse.clone()
    wrong[0, 0, 0] = 0.0  # a finite lse where FA4 gives -inf
    assert [f.tensor for f in compare(dataclasses.replace(kernel, lse=wrong), ref32, low)] == ["lse"]


def test_softcap_widens_the_factor_and_the_gradient_atol() -> None:
    plain, capped = Outputs(torch.zeros(4)), Outputs(torch.zeros(4), softcap=5.0)
    low = Outputs(torch.full((4,), 0.01, dtype=torch.bfloat16).float().to(torch.bfloat16))
    own = float(torch.tensor(0.01, dtype=torch.bfloat16))
    got = Outputs(torch.full((4,), 2.5 * own))
    assert [f.tensor for f in compare(got, plain, low)] == ["out"]  # 2.5x the low-precision error > 2x
    assert compare(got, capped, low) == []  # <= 3x with a softcap
    assert tolerance(plain, low, "out", factor=3.0, atol=0.0) == pytest.approx(3 * own)
    assert tolerance(plain, low, "out", atol=0.0) == pytest.approx(2 * own)
    with pytest.raises(ValueError, match="dq"):
        tolerance(plain, low, "dq")


def test_default_atol_is_fa4s_rounding_allowance() -> None:
    """FA4's atol, 2 * max |(x + 0.3) - 0.3 - x| in the output's dtype: about an ulp of the values near 0.3 for
    bf16, nothing for float32; infinities (lse of empty rows) do not make it NaN."""
    values = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    values[0] = -math.inf
    bf16 = ref.rounding(values, torch.bfloat16)
    assert 2 ** -9 <= bf16 <= 2 * 2 ** -7 * (float(values[1:].abs().max()) + 0.3)
    assert 0 < ref.rounding(values, torch.float32) < 1e-6 and ref.rounding(values[:1], torch.bfloat16) == 0.0
    ref32, low = Outputs(values), Outputs(values.to(torch.bfloat16))
    own = float(ref.error(low.out, ref32.out).max())
    assert tolerance(ref32, low, "out") == pytest.approx(2 * own + bf16)


def fa4_order_lse(inputs: Inputs, block: int = 128) -> torch.Tensor:
    """A correct kernel's lse of a dense call, summed in another float32 order than the reference's: FA4's online
    softmax, a block of keys at a time with a running max and a rescaled running sum."""
    q, k = inputs.tensors["q"].float(), inputs.tensors["k"].float()
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    top = torch.full(s.shape[:-1], -math.inf)
    total = torch.zeros(s.shape[:-1])
    for first in range(0, s.shape[-1], block):
        part = s[..., first:first + block]
        new = torch.maximum(top, part.amax(-1))
        total = total * torch.exp(top - new) + torch.exp(part - new[..., None]).sum(-1)
        top = new
    return torch.log(total) + top


def test_h200_default_certify_lse_of_one_element_is_bounded() -> None:
    # Found certifying the default h200 build on the H200 (2026-12-03): "bwd dense fp16 d=96 full h=1:1 batch=1
    # seqlen_q=1 seqlen_k=1048575 heads_kv=1" was "wrong: lse off by 1.91e-06 (tolerance 0)", 8 kernels with
    # errors 1.9e-6 to 6.7e-6 against bounds 0 to 5.7e-6, all one query row over ~1M keys: FA4's atol over a
    # one-element float32 lse can be 0 and the low-precision reference's lse has almost no error of its own, so
    # a float32 summation order other than torch's failed. lse's atol is at least the input dtype's epsilon.
    lse = torch.tensor([[[14.0]]])  # ~log(1M keys): FA4's rounding estimate of it is 0
    assert ref.rounding(lse, torch.float32) == 0.0
    for dtype in (torch.float16, torch.bfloat16):
        ref32 = Outputs(torch.zeros(1, 1, 1, 96), lse)
        low = Outputs(torch.zeros(1, 1, 1, 96, dtype=dtype), lse.clone())
        for measured in (1.91e-6, 6.7e-6):
            assert compare(Outputs(low.out, lse + measured), ref32, low) == [], (dtype, measured)
        wrong = compare(Outputs(low.out, lse + 1e-2), ref32, low)  # a wrong lse still fails
        assert [f.tensor for f in wrong] == ["lse"] and wrong[0].bound == float(torch.finfo(dtype).eps)
    # a real call of that shape (fewer keys): a kernel's other float32 order passes, an lse off by 1e-2 fails
    sig = sig_of(pass_="fwd_lse", dtype="fp16", head_dim=96, head_dim_v=96, heads_q=1, heads_kv=1)
    inputs = dense(sig, 1, 1, 1 << 16, seed=3, heads_kv=1)
    ref32, low = references(sig, inputs)
    assert ref32.lse is not None and ref32.lse.numel() == 1
    kernel = Outputs(ref32.out.to(torch.float16), fa4_order_lse(inputs))
    assert compare(kernel, ref32, low) == []
    assert [f.tensor for f in compare(dataclasses.replace(kernel, lse=ref32.lse + 1e-2), ref32, low)] == ["lse"]


@pytest.mark.parametrize("head_dim", [72, 80])
def test_lse_floor_leaves_fa4s_wrong_dq_failing(head_dim: int) -> None:
    # FA4 4.0.0b36's sm_90 backward returns dq off by 1.3 (relative) at head dims 72 and 80 (README "Known
    # limits"): lse's floor is lse's only, that dq still fails, alone
    sig = sig_of(pass_="bwd", dtype="fp16", head_dim=head_dim, head_dim_v=head_dim, mask="causal")
    inputs = dense(sig, 2, 24, 40, seed=head_dim)
    ref32, low = references(sig, inputs)
    kernel = as_kernel(ref32, torch.float16)
    assert compare(kernel, ref32, low) == []
    assert kernel.dq is not None
    failures = compare(dataclasses.replace(kernel, dq=kernel.dq * -0.3), ref32, low)
    assert [f.tensor for f in failures] == ["dq"] and failures[0].error > 10 * failures[0].bound
