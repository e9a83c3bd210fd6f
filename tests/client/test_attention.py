"""prepare() and AttentionFn over a fake of the FA4 seam: what prepare() asks FA4 for and in which order, without FA4
or a GPU. (The real seam under prepare() needs a GPU to load objects: tests/gpu/test_h200_strict.py runs it.)"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from fa4_aot.client import attention, installation
from fa4_aot.client.installation import Installation
from fa4_aot.domain import kernel_keys
from fa4_aot.domain.skus import Sku
from fa4_aot.fa4 import tracking
from fa4_aot.store import Store
from fa4_aot.trust.policy import Trust

SKU = Sku(name="h200", arch="sm_90a", sm_count=132, l2_bytes=62914560, cuda_major=13)
TOOLS = {"flash-attn-4": "4.0.0b36", "nvidia-cutlass-dsl": "4.8.1", "cutlass-dsl-cuda": "cu13"}
NEEDED = {("_flash_attn_fwd", '["a"]'): ("a",), ("_flash_attn_bwd", '["b"]'): ("b",)}


@pytest.fixture
def seam(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    store = Store(tmp_path)
    inst = Installation(sku=SKU, store=store, mode="strict", trace=[], trust=Trust(SKU, store, None, {}), tools=TOOLS)
    monkeypatch.setattr(installation, "_installed", inst)  # what install() returns for this mode and store
    log: list[tuple[Any, ...]] = []
    fake = SimpleNamespace(
        log=log, inst=inst,
        plan=lambda call: log.append(("plan", call)) or dict(NEEDED),
        lookup=lambda family, key: log.append(("lookup", family, key, tracking.current())) or True,
        attend=lambda call, q, k, v, **kw: log.append(("attend", call, q, kw, tracking.current())) or "out",
        running=tracking.running,
    )
    monkeypatch.setattr(attention, "fa4", fake)
    monkeypatch.setattr(attention, "has_cuda", lambda: True)  # the GPU path; a CPU host: tests/client/test_cpu_host.py
    return fake


def test_prepare_plans_then_asks_fa4_for_each_kernel_while_the_call_runs(seam: SimpleNamespace, tmp_path: Path) -> None:
    attn = attention.prepare((2, 1024, 16, 128), causal=True, training=True, cache_dir=tmp_path)
    call = attn.call
    assert (call.pass_, call.mask, call.batch, call.heads_kv) == ("bwd", "causal", 2, 16)
    assert seam.log == [("plan", call), ("lookup", "_flash_attn_fwd", ("a",), call),
                        ("lookup", "_flash_attn_bwd", ("b",), call)]
    assert attn.kernel_keys == [kernel_keys.kernel_key(f, key, SKU, TOOLS) for (f, _), key in NEEDED.items()]
    assert attn.installation is seam.inst
    assert attn("q", "k", "v", softcap=2.0) == "out"
    assert seam.log[-1] == ("attend", call, "q", {"softcap": 2.0}, call)
    assert tracking.current() is None


def test_bad_arguments_are_refused_before_fa4_is_asked(seam: SimpleNamespace, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="either causal=True or a window_size"):
        attention.prepare((2, 1024, 16, 128), causal=True, window_size=(128, 0), cache_dir=tmp_path)
    assert seam.log == []
