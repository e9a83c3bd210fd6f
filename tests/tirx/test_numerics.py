"""The check a simulated TIRx kernel's output must pass (fa4_aot/tirx/numerics.py): FA4's forward bound accepts
attention computed in fp16 as FA4 computes it, and refuses an output that is perturbed, masked the other way, or
has its heads or rows swapped. Pure numpy, at the NumSim test's smallest shapes."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from fa4_aot.tirx.numerics import attention, check


def _inputs(seqlen: int, heads: int, heads_kv: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((1, seqlen, h, 128)).astype(np.float16) for h in (heads, heads_kv, heads_kv))


def _bump(out: np.ndarray) -> np.ndarray:  # one element off by 1/128: twice FA4's bound at these sizes
    out = out.copy()
    out[0, 37, 0, 5] += np.float16(1 / 128)
    return out


WRONG: dict[str, Callable[[np.ndarray, tuple[np.ndarray, ...], bool], np.ndarray]] = {
    "one element perturbed": lambda out, qkv, causal: _bump(out),
    "the other mask": lambda out, qkv, causal: attention(*qkv, not causal, lowp=True),
    "rows shifted by one": lambda out, qkv, causal: np.roll(out, 1, axis=1),
    "a corrupted input": lambda out, qkv, causal: attention(_bump(qkv[0]) * 2, *qkv[1:], causal, lowp=True),
    "not a number": lambda out, qkv, causal: np.where(out == out.max(), np.float16("nan"), out),
}


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("seqlen", "heads", "heads_kv"), [(128, 1, 1), (256, 2, 1)])
def test_fp16_attention_passes_and_every_wrong_output_fails(seqlen: int, heads: int, heads_kv: int,
                                                            causal: bool) -> None:
    qkv = _inputs(seqlen, heads, heads_kv)
    good = attention(*qkv, causal, lowp=True)  # what a right fp16 kernel computes, up to its own rounding
    passed = check(good, *qkv, causal)
    assert passed.ok and 0 < passed.max_error <= passed.bound < 0.01, passed
    for name, wrong in WRONG.items():
        assert not check(wrong(good, qkv, causal), *qkv, causal).ok, name


def test_the_reference_is_attention() -> None:
    """Against a per-row loop: softmax over the keys a row sees (bottom-right causal), query head h on KV head
    h // group."""
    q, k, v = _inputs(128, 2, 1, seed=3)
    out = attention(q, k, v, True).astype(np.float32)
    for h in (0, 1):
        for i in (0, 64, 127):
            s = k[0, : i + 1, 0].astype(np.float32) @ q[0, i, h].astype(np.float32) / np.sqrt(128)
            p = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
            np.testing.assert_allclose(out[0, i, h], p @ v[0, : i + 1, 0].astype(np.float32), atol=2e-3)


def test_an_output_of_another_shape_is_refused() -> None:
    q, k, v = _inputs(128, 1, 1)
    with pytest.raises(ValueError, match="shape|output"):
        check(np.zeros((1, 128, 2, 128), np.float16), q, k, v, False)
