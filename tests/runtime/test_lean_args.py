"""The lean entry points take FA4's arguments: what they cannot serve is refused by name, before any GPU work."""

from __future__ import annotations

import pytest

import fa4_aot
from fa4_aot.runtime import api, call_args, runner


def _qkv(grad: bool = False):
    import torch

    return [torch.zeros(1, 128, h, 64, dtype=torch.bfloat16, requires_grad=grad) for h in (8, 2, 2)]


@pytest.mark.parametrize("name", ["score_mod", "mask_mod", "qv", "block_sparse_tensors", "pack_gqa", "seqused_q"])
def test_unsupported_fa4_arguments_are_named(name: str) -> None:
    with pytest.raises(runner.Unsupported, match=name):
        fa4_aot.flash_attn_func(*_qkv(), **{name: object()})


def test_unknown_argument_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="bogus"):
        fa4_aot.flash_attn_func(*_qkv(), bogus=1)


def test_training_with_return_lse_is_refused() -> None:
    with pytest.raises(runner.Unsupported, match="return_lse"):
        fa4_aot.flash_attn_func(*_qkv(grad=True), return_lse=True)


@pytest.mark.parametrize("name", ["page_table", "seqused_k"])
def test_dense_entry_takes_no_varlen_arguments(name: str) -> None:
    with pytest.raises(TypeError, match=name):  # as FA4's flash_attn_func: these belong to flash_attn_varlen_func
        fa4_aot.flash_attn_func(*_qkv(), **{name: object()})


def test_varlen_needs_integer_max_lengths() -> None:
    import torch

    q, k, v = (t[0] for t in _qkv())
    cu = torch.tensor([0, 128], dtype=torch.int32)
    with pytest.raises(runner.Unsupported, match="max_seqlen"):
        fa4_aot.flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=128)


@pytest.mark.parametrize("given", [{}, {"cu_seqlens_q": 1}, {"page_table": 1}, {"cu_seqlens_q": 1, "seqused_k": 1},
                                   {"cu_seqlens_k": 1, "cu_seqlens_q": 1, "seqused_k": 1}])
def test_varlen_forms_without_a_recipe_are_named(given: dict) -> None:
    import torch

    with pytest.raises(runner.Unsupported, match="varlen .cu_seqlens_q and cu_seqlens_k., seqused") as e:
        fa4_aot.flash_attn_varlen_func(*_qkv(), **{k: torch.zeros(2, dtype=torch.int32) for k in given})
    assert " + ".join(n for n in ("cu_seqlens_q", "cu_seqlens_k", "seqused_k", "page_table") if n in given) in \
        str(e.value)


def test_seqused_and_paged_sizes_default_as_fa4() -> None:
    import torch

    q, k, _v = _qkv()
    table = torch.zeros(1, 5, dtype=torch.int32)
    pool = torch.zeros(40, 16, 2, 64)
    assert call_args.decode_sizes("seqused", q, k, None, None, None) == {
        "batch": 1, "seqlen_q": 128, "seqlen_k": 128, "max_seqlen_q": 128, "max_seqlen_k": 128}
    assert call_args.decode_sizes("paged", q, pool, table, None, 70) == {
        "batch": 1, "seqlen_q": 128, "num_pages": 40, "pages_per_seq": 5, "max_seqlen_q": 128, "max_seqlen_k": 70}
    assert call_args.decode_sizes("paged", q, pool, table, None, None)["max_seqlen_k"] == 5 * 16
    with pytest.raises(runner.Unsupported, match="max_seqlen_k must be an int"):
        call_args.decode_sizes("paged", q, pool, table, None, torch.tensor(3))


def test_decode_signatures_are_the_planners() -> None:
    from fa4_aot.domain.signature import Signature
    from fa4_aot.matrix import variants
    from tests.conftest import ROOT

    matrix = variants.load(ROOT / "tests" / "data" / "lean_variants.toml")
    decode = next(v for v in matrix.variants if v.name == "lean-decode")
    planned = {Signature.of(c) for c in decode.calls(matrix.shapes[decode.shapes])}
    mine = {api.signature(layout, "torch.bfloat16", 32, 128, 8, 128, causal=True, return_lse=lse,
                               page_size=16) for layout in ("seqused", "paged") for lse in (False, True)}
    assert mine == planned


@pytest.mark.parametrize("kw,mask,window,pass_", [
    ({"causal": True}, "causal", (0, 0), "fwd"), ({}, "full", (0, 0), "fwd"),
    ({"window_size": (128, 0)}, "local", (128, 0), "fwd"), ({"return_lse": True}, "full", (0, 0), "fwd_lse"),
    ({"training": True, "deterministic": True}, "full", (0, 0), "bwd_det"), ({"training": True}, "full", (0, 0), "bwd"),
])
def test_signature_matches_what_the_planner_records(kw: dict, mask: str, window: tuple, pass_: str) -> None:
    sig = api.signature("dense", "torch.bfloat16", 8, 64, 2, 64, **kw)
    assert (sig.mask, sig.window, sig.pass_, sig.heads_q, sig.heads_kv, sig.dtype) == (mask, window, pass_, 8, 2,
                                                                                        "bf16")


def test_half_open_window_and_fp32_are_refused() -> None:
    with pytest.raises(ValueError, match="both sides"):
        api.signature("dense", "torch.bfloat16", 8, 64, 8, 64, window_size=(128, None))
    with pytest.raises(ValueError, match="bf16 or fp16"):
        api.signature("dense", "torch.float32", 8, 64, 8, 64)


def test_trusted_keys_let_the_lean_runtime_use_only_signed_recipes(tmp_path) -> None:
    """With trusted keys the lean runtime reads a recipe file only if a valid manifest lists its sha256; a
    manifest signed before the lean runtime (no `recipes`) makes it ask for a re-sign (no blanket refusal)."""
    import hashlib
    import json

    from fa4_aot.config import default_variants_file
    from fa4_aot.errors import TrustError
    from fa4_aot.matrix import variants
    from fa4_aot.store import Store, recipes
    from fa4_aot.trust import signing, signing_keys
    from fa4_aot.trust.policy import Trust

    sku = variants.load(default_variants_file()).skus["h200"]
    store = Store(tmp_path / "store")
    sig = api.signature("dense", "torch.bfloat16", 8, 64, 8, 64, causal=True)
    key = recipes.recipe_key(sig, sku)
    region = {"format": 1, "signature": sig.to_dict(), "guards": [], "inputs": {"q": 0, "k": 1, "v": 2}, "tensors": 4,
              "meta": [[[1], [1], {"dtype": "bfloat16"}]] * 4, "fwd": [], "bwd": [], "outputs": {"out": 3, "lse": None},
              "kernels": [], "softmax_scale": 0.125}
    data = json.dumps({"key": key, "regions": [region]}).encode()
    store.put_recipes(key, data)
    private, public = signing_keys.generate(tmp_path / "keys", "k")
    old = {"sku": {"name": sku.name, **sku.target_facts()}, "kernels": {}, "toolchain": [],
           "created": "2026-01-01T00:00:00Z", "expires": "2099-01-01T00:00:00Z"}
    signing.save(store, signing.sign(old, signing_keys.load_private(private)))
    trusted = {public.key_id: public}
    with pytest.raises(TrustError, match="re-sign"):
        runner.Runtime(store, sku, None, Trust(sku, store, None, trusted)).attention(sig)
    listed = {**old, "created": "2026-02-01T00:00:00Z", "recipes": {key: hashlib.sha256(data).hexdigest()}}
    signing.save(store, signing.sign(listed, signing_keys.load_private(private)))
    assert len(runner.Runtime(store, sku, None, Trust(sku, store, None, trusted)).attention(sig).regions) == 1
    store.put_recipes(key, data + b" ")  # other bytes under the same key: not what was signed
    with pytest.raises(TrustError, match="is listed with sha256"):
        runner.Runtime(store, sku, None, Trust(sku, store, None, trusted)).attention(sig)


def test_load_paged_needs_the_page_size() -> None:
    with pytest.raises(ValueError, match="page_size"):
        fa4_aot.load((4, 1, 32, 128), (4, 2048, 8, 128), layout="paged")


def test_split_kv_on_sm90_is_refused_with_the_reason_not_a_build_hint(tmp_path) -> None:
    """Regression (lean2 report): num_splits > 1 on an H200 raised KernelMissing advising a build, which cannot help:
    FA4 has no split-KV kernels for sm_90. A b200 runtime takes the same signature (its recipes decide)."""
    from fa4_aot.matrix import variants
    from fa4_aot.store import Store
    from tests.conftest import ROOT

    matrix = variants.load(ROOT / "variants.toml")
    sig = api.signature("dense", "torch.bfloat16", 32, 128, 8, 128, causal=True, num_splits=4)
    with pytest.raises(runner.Unsupported, match="no split-KV kernels for sm_90"):
        runner.Runtime(Store(tmp_path / "h"), matrix.sku("h200")).attention(sig)
    assert runner.Runtime(Store(tmp_path / "b"), matrix.sku("b200")).attention(sig).sig == sig
