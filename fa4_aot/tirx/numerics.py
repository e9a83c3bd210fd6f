"""What a TIRx FA4 kernel's output is checked against, in numpy alone (the simulation environment has no torch):
attention in float32 and the same computation in fp16, and the bound of FA4's own forward tests.

FA4's test_flash_attn_output accepts `out` when max |out - ref| <= 2 * max |ref_lowp - ref| + atol, where `ref` is
the float32 computation rounded to fp16, `ref_lowp` is attention_ref(upcast=False): scores and P @ V in fp16, the
softmax in float32, and atol = 2 * max |(ref + 0.3) - 0.3 - ref| in fp16 (the rounding of an output near its
values). fa4_aot/certify/reference.py is the torch version the certifier uses for FA4's own kernels. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FACTOR = 2.0  # FA4's rtol for a forward without softcap


@dataclass(frozen=True)
class Check:
    max_error: float  # max |out - ref| over every element
    bound: float  # FA4's: FACTOR * max |ref_lowp - ref| + atol
    finite: bool

    @property
    def ok(self) -> bool:
        return self.finite and self.max_error <= self.bound


def _masked(scores: np.ndarray, causal: bool) -> np.ndarray:
    """Scores with keys past the diagonal at -inf, aligned bottom-right as FA4 aligns them (seqlen_kv >= seqlen_q)."""
    if not causal:
        return scores
    sq, sk = scores.shape[-2:]
    return np.where(np.triu(np.ones((sq, sk), bool), sk - sq + 1), -np.inf, scores)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool, *, lowp: bool = False) -> np.ndarray:
    """softmax(q k^T / sqrt(d)) v of (batch, seqlen, heads, d) fp16 tensors, query head h reading KV head
    h // (heads_q / heads_kv); in float32, or with `lowp` FA4's fp16 computation. Returns fp16 (batch, seqlen_q,
    heads_q, d)."""
    group = q.shape[2] // k.shape[2]
    qf = q.astype(np.float32).transpose(0, 2, 1, 3)
    kf = np.repeat(k, group, axis=2).astype(np.float32).transpose(0, 2, 1, 3)
    vf = np.repeat(v, group, axis=2).astype(np.float32).transpose(0, 2, 1, 3)
    scale = 1.0 / np.sqrt(q.shape[-1])
    if lowp:  # q * scale, the scores and the probabilities rounded to fp16 as torch's fp16 einsums round them
        scores = (qf * scale).astype(np.float16).astype(np.float32) @ kf.transpose(0, 1, 3, 2)
        scores = scores.astype(np.float16).astype(np.float32)
    else:
        scores = qf @ kf.transpose(0, 1, 3, 2) * scale
    scores = _masked(scores, causal)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    if lowp:
        p = p.astype(np.float16).astype(np.float32)
    out: np.ndarray = (p @ vf).transpose(0, 2, 1, 3).astype(np.float16)
    return out


def check(out: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool) -> Check:
    """`out` (fp16, the kernel's) against the float32 reference, within FA4's bound."""
    ref = attention(q, k, v, causal).astype(np.float32)
    lowp = attention(q, k, v, causal, lowp=True).astype(np.float32)
    ref16 = ref.astype(np.float16)
    atol = 2 * float(np.abs((ref16 + np.float16(0.3)) - np.float16(0.3) - ref16).astype(np.float32).max())
    got = np.asarray(out, dtype=np.float32)
    if got.shape != ref.shape:
        raise ValueError(f"the kernel's output is {got.shape}, the problem's is {ref.shape}")
    finite = bool(np.isfinite(got).all())
    error = float(np.abs(got - ref).max()) if finite else float("inf")
    return Check(error, FACTOR * float(np.abs(lowp - ref).max()) + atol, finite)
