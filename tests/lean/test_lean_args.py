"""The lean entry points take FA4's arguments: what they cannot serve is refused by name, before any GPU work."""

from __future__ import annotations

import pytest

import fa4_aot
from fa4_aot import lean, lean_api
from fa4_aot.errors import Fa4AotError


def _qkv(grad: bool = False):
    import torch

    return [torch.zeros(1, 128, h, 64, dtype=torch.bfloat16, requires_grad=grad) for h in (8, 2, 2)]


@pytest.mark.parametrize("name", ["score_mod", "mask_mod", "qv", "block_sparse_tensors", "pack_gqa", "page_table"])
def test_unsupported_fa4_arguments_are_named(name: str) -> None:
    with pytest.raises(lean.Unsupported, match=name):
        fa4_aot.flash_attn_func(*_qkv(), **{name: object()})


def test_unknown_argument_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="bogus"):
        fa4_aot.flash_attn_func(*_qkv(), bogus=1)


def test_training_with_return_lse_is_refused() -> None:
    with pytest.raises(lean.Unsupported, match="return_lse"):
        fa4_aot.flash_attn_func(*_qkv(grad=True), return_lse=True)


def test_varlen_needs_cu_seqlens_and_integer_max_lengths() -> None:
    with pytest.raises(lean.Unsupported, match="max_seqlen"):
        fa4_aot.flash_attn_varlen_func(*_qkv(), cu_seqlens_q=None)


@pytest.mark.parametrize("kw,mask,window,pass_", [
    ({"causal": True}, "causal", (0, 0), "fwd"), ({}, "full", (0, 0), "fwd"),
    ({"window_size": (128, 0)}, "local", (128, 0), "fwd"), ({"return_lse": True}, "full", (0, 0), "fwd_lse"),
    ({"training": True, "deterministic": True}, "full", (0, 0), "bwd_det"), ({"training": True}, "full", (0, 0), "bwd"),
])
def test_signature_matches_what_the_planner_records(kw: dict, mask: str, window: tuple, pass_: str) -> None:
    sig = lean_api.signature("dense", "torch.bfloat16", 8, 64, 2, 64, **kw)
    assert (sig.mask, sig.window, sig.pass_, sig.heads_q, sig.heads_kv, sig.dtype) == (mask, window, pass_, 8, 2,
                                                                                        "bf16")


def test_half_open_window_and_fp32_are_refused() -> None:
    with pytest.raises(ValueError, match="both sides"):
        lean_api.signature("dense", "torch.bfloat16", 8, 64, 8, 64, window_size=(128, None))
    with pytest.raises(ValueError, match="bf16 or fp16"):
        lean_api.signature("dense", "torch.float32", 8, 64, 8, 64)


def test_trusted_keys_refuse_the_lean_runtime(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("FA4_AOT_TRUSTED_KEYS", "ssh-ed25519 AAAA test")
    with pytest.raises(Fa4AotError, match="install"):
        lean.runtime(tmp_path / "store")
