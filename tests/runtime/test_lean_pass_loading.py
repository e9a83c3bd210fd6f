"""Issue 29: the lean runtime loads a pass's kernels at that pass's first call, on a real store (the tiny h200
det-bwd training signature: one forward kernel, three backward ones) with real libraries, no GPU (Attention.bound
and Bound.backward do all the host work of a first call up to the launches).

A training signature's first forward loads its forward kernel only, and its first backward the others; a
forward-only use of it (a forward returning LSE without grad, served by the training file's forward part) never
loads a backward kernel. A backward kernel that is missing, or that the certification gate refuses, fails the first
backward with KernelMissing or KernelRefused, not the forward, and the gate judges each kernel before its first
launch. On the code before (every kernel of the region loaded at the first forward) each of these failed."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from fa4_aot.domain import known_bad
from fa4_aot.domain.known_bad import Bad
from fa4_aot.errors import KernelMissing, KernelRefused
from fa4_aot.matrix import variants
from fa4_aot.runtime import runner
from fa4_aot.runtime.call_args import signature
from fa4_aot.store import Store
from fa4_aot.trust.certified import Gate
from tests.conftest import TINY_VARIANTS, build_json

SIZES = {"batch": 1, "seqlen_q": 512, "seqlen_k": 512}
FORWARD = ["_flash_attn_fwd"]
BACKWARD = ["_bwd_postprocess_convert", "_bwd_preprocess", "_flash_attn_bwd"]
# a registry entry refusing the backward of d=128 calls, as known_bad.toml's sm90-bwd-dq-hd72-80 does at 72 and 80
REFUSE_BWD = Bad(id="test-bwd-d128", symptom="wrong dq (test)", source="tests", when={"head_dim": 128},
                 parts=("bwd",))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    store = tmp_path_factory.mktemp("pass-loading") / "store"
    build_json(store, "h200", "det-bwd")
    return store


@pytest.fixture
def store(built: Path, tmp_path: Path) -> Store:
    root = tmp_path / "store"
    shutil.copytree(built, root, symlinks=True)
    return Store(root)


def _attention(store: Store, gate: Gate | None = None, **flags: Any) -> runner.Attention:
    sku = variants.load(TINY_VARIANTS).skus["h200"]
    rt = runner.Runtime(store, sku, None, None, None, gate)
    return rt.attention(signature("dense", "torch.bfloat16", 16, 128, 16, 128, causal=True, **flags))


def _loaded(attn: runner.Attention) -> list[str]:
    """The families of the kernels whose libraries the runtime has mapped."""
    return sorted(entry.family for entry in attn.rt.libraries._loaded.values())


def test_training_signature_loads_each_pass_at_its_first_call(store: Store) -> None:
    attn = _attention(store, training=True, deterministic=True)
    bound = attn.bound(SIZES, "cuda", None)
    assert _loaded(attn) == FORWARD and bound.trains
    assert len(bound.backward()) == len(bound.region.bwd) and _loaded(attn) == sorted(FORWARD + BACKWARD)


def test_forward_only_use_of_a_training_signature_loads_no_backward_kernel(store: Store) -> None:
    attn = _attention(store, return_lse=True)  # FA4's pass for inputs requiring grad under no_grad
    assert attn.sig.pass_ == "fwd_lse"
    bound = attn.bound(SIZES, "cuda", None)
    assert _loaded(attn) == FORWARD and not bound.trains
    attn.preload(SIZES)  # load(): every kernel the region launches; a forward part launches no backward kernel
    assert _loaded(attn) == FORWARD


def test_missing_backward_kernel_fails_the_first_backward_not_the_forward(store: Store) -> None:
    attn = _attention(store, training=True, deterministic=True)
    region = attn.region(attn.sizes(SIZES))
    victim = next(k for k in region.kernels if k.family == "_flash_attn_bwd")
    for entry in [e for e in store.entries() if e.family == victim.family]:
        store.remove_entry(entry.kernel_key)
    bound = attn.bound(SIZES, "cuda", None)
    with pytest.raises(KernelMissing, match="_flash_attn_bwd") as info:
        bound.backward()
    assert info.value.kernel_key == victim.kernel_key
    with pytest.raises(KernelMissing):  # asked again at the next backward, never a backward half bound
        bound.backward()
    assert not bound.bwd


def test_gate_refusing_the_backward_fails_the_first_backward_not_the_forward(store: Store) -> None:
    registry = known_bad.Registry(1, (REFUSE_BWD,))
    gate = Gate(store, "h200", None, policy="known-bad", registry=registry)
    attn = _attention(store, gate, training=True, deterministic=True)
    bound = attn.bound(SIZES, "cuda", None)
    assert _loaded(attn) == FORWARD
    with pytest.raises(KernelRefused, match="test-bwd-d128"):
        bound.backward()
    assert not bound.bwd  # refused before any backward step is bound, so before its first launch
