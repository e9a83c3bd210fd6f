"""The known-bad registry refuses, on load, an entry that can never match (domain/known_bad.py): each field is held
to what the matcher compares it with (a kernel's arch and toolchain, the call's signature, the SKU and kernel key),
so that a refusal the file means to make cannot silently never happen. The project's file and a store's measured
entries (known-bad/<sku>.json) are read through the same check."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from fa4_aot.domain import known_bad
from fa4_aot.errors import ConfigError, StoreError
from fa4_aot.store import Store
from fa4_aot.trust.certified import registry_for
from tests.domain.test_known_bad import doc, entry

NEVER = {
    "flash-attn-empty": (entry(flash_attn=[]), "flash_attn is empty"),
    "cutlass-dsl-empty": (entry(cutlass_dsl=[]), "cutlass_dsl is empty"),
    "arch-empty": (entry(arch=[]), "arch is empty"),
    "parts-empty": (entry(parts=[]), "parts is empty"),
    "sku-empty": (entry(sku=[]), "sku is empty"),
    "kernel-keys-empty": (entry(kernel_keys=[]), "kernel_keys is empty"),
    "arch-without-its-a": (entry(arch=["sm_90"]), "arch 'sm_90' never matches"),
    "arch-in-capitals": (entry(arch=["SM_90A"]), "e.g. sm_90a"),
    "arch-a-compute-capability": (entry(arch=["9.0"]), "arch '9.0' never matches"),
    "version-with-a-v": (entry(flash_attn=["v4.0.0b36"]), "flash-attn-4 version as installed"),
    "version-with-spaces": (entry(cutlass_dsl=[" 4.8.1"]), "nvidia-cutlass-dsl version as installed"),
    "sku-in-capitals": (entry(sku=["H200"]), "sku 'H200' never matches"),
    "mask-in-capitals": (entry(when={"mask": "Full"}), "when.mask: expected a value"),
    "layout-unknown": (entry(when={"layout": "bshd"}), "one of dense, varlen, seqused, paged"),
    "pass-unknown": (entry(when={"pass_": ["bwd", "backward"]}), "'backward' never matches"),
    "dtype-a-torch-name": (entry(when={"dtype": "torch.bfloat16"}), "one of bf16, fp16"),
    "head-dim-a-string": (entry(when={"head_dim": "72"}), "a whole number"),
    "head-dim-a-bool": (entry(when={"head_dim": True}), "a whole number"),
    "head-dim-a-fraction": (entry(when={"head_dim": 72.5}), "a whole number"),
    "softcap-nan": (entry(when={"softcap": math.nan}), "a finite number"),
    "sink-a-number": (entry(when={"sink": 1}), "true or false"),
    "sink-a-range": (entry(when={"sink": {"min": 0}}), "a range never matches a call's sink"),
    "mask-a-range": (entry(when={"mask": {"min": 1}}), "a range never matches a call's mask"),
    "range-nan-min": (entry(when={"head_dim": {"min": math.nan}}), "of finite numbers"),
    "range-nan-max": (entry(when={"softcap": {"max": math.nan}}), "of finite numbers"),
    "range-infinite": (entry(when={"head_dim": {"min": math.inf}}), "of finite numbers"),
    "range-empty": (entry(when={"head_dim": {"min": 96, "max": 64}}), "is empty (min > max)"),
    "values-empty": (entry(when={"head_dim": []}), "an empty list never matches"),
    "window-of-three": (entry(when={"window": [127, 0, 1]}), "a [left, right] pair"),
    "window-of-strings": (entry(when={"window": ["127", "0"]}), "a [left, right] pair"),
    "windows-empty": (entry(when={"window": []}), "a [left, right] pair"),
    "window-without-local": (entry(when={"window": [127, 0], "mask": "causal"}), "only a call of mask \"local\""),
}


@pytest.mark.bad_input("known-bad registry")
@pytest.mark.parametrize(("bad", "says"), NEVER.values(), ids=NEVER.keys())
def test_an_entry_that_can_never_match_is_refused_with_the_reason(bad: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError) as error:
        known_bad.parse(doc(bad), "registry.toml")
    message = str(error.value)
    assert message.startswith("registry.toml [[bad]] #1: known-bad entry sm90-bwd-dq-hd72-80") and says in message, \
        message


MATCHING = {
    "any-version-and-arch": entry(flash_attn=["*"], cutlass_dsl=["*"], arch=["*"]),
    "newer-arches": entry(arch=["sm_100a", "sm_103a", "sm_120a"]),
    "a-dev-release": entry(flash_attn=["4.0.0.dev20261201+cu13"]),
    "a-local-window": entry(when={"window": [[63, 0], [127, 0]], "mask": ["local", "causal"]}),
    "open-ranges": entry(when={"head_dim": [{"max": 32}, 72], "softcap": {"min": 0.5}}),
    "a-measured-entry": entry(sku=["h200-cu12"], kernel_keys=["ab" * 32]),
}


@pytest.mark.parametrize("good", MATCHING.values(), ids=MATCHING.keys())
def test_entries_that_can_match_still_load(good: dict[str, Any]) -> None:
    assert known_bad.parse(doc(good), "registry.toml").entries[0].id == "sm90-bwd-dq-hd72-80"


@pytest.mark.bad_input("known-bad registry")
def test_a_measured_entry_that_can_never_match_is_refused_with_the_fix(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    store.put_known_bad("h200", json.dumps(doc(entry(arch=["sm_90"], sku=["h200"]))).encode())
    with pytest.raises(StoreError, match=r"arch 'sm_90' never matches.*fa4-aot certify --sku h200"):
        registry_for(store, "h200")
