"""The known-bad registry (fa4_aot/domain/known_bad.py) as tables: what a malformed document is told, which
signatures, versions, arches, parts, SKUs and kernels an entry names, and the project's own file."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from typing import Any

import pytest

from fa4_aot.domain import known_bad
from fa4_aot.domain.signature import Signature
from fa4_aot.errors import ConfigError

KEY = "ab" * 32
ENTRY: dict[str, Any] = {"id": "sm90-bwd-dq-hd72-80", "symptom": "wrong dq", "source": "Dao-AILab/flash-attention#2896",
                         "flash_attn": ["4.0.0b36"], "arch": ["sm_90a"], "parts": ["bwd"],
                         "when": {"head_dim": [72, 80], "pass_": ["bwd", "bwd_det"]}}
SIG = Signature(layout="dense", pass_="bwd", dtype="bf16", head_dim=72, head_dim_v=72, mask="causal", window=(0, 0),
                softcap=0.0, sink=False, num_splits=1, heads_q=16, heads_kv=16)
LOCAL = replace(SIG, pass_="fwd", mask="local", window=(127, 0), softcap=50.0, sink=True)
PAGED = replace(SIG, layout="paged", pass_="fwd", head_dim=160, head_dim_v=160, page_size=16)
TOOLS = {"flash-attn-4": "4.0.0b36", "nvidia-cutlass-dsl": "4.8.1"}


def doc(*entries: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {"format": 1, "revision": 3, "bad": list(entries), **top}


def entry(**changes: Any) -> dict[str, Any]:
    """ENTRY with fields changed (None: removed)."""
    out = copy.deepcopy(ENTRY)
    for name, value in changes.items():
        if value is None:
            out.pop(name)
        else:
            out[name] = value
    return out


@pytest.mark.parametrize(("document", "says"), [
    ({"revision": 1, "bad": []}, "format = 1"),
    ({"format": 2, "revision": 1, "bad": []}, "format = 1"),
    (doc(revision=True), "`revision` must be a whole number"),
    (doc(revision=-1), "`revision` must be a whole number"),
    (doc(bad={"id": "x"}), "`bad` must be a list"),
    (doc("not a table"), "[[bad]] #1: a known-bad entry must be a table"),
    (doc(entry(arches=["sm_90a"])), "unknown ['arches']"),
    (doc(entry(symptom=None)), "missing ['symptom']"),
    (doc(entry(when=None, source=None)), "missing ['source', 'when']"),
    (doc(entry(id="SM90-Bad")), "known-bad id 'SM90-Bad'"),
    (doc(entry(id=7)), "known-bad id 7"),
    (doc(entry(symptom="  ")), "symptom must be a non-empty string"),
    (doc(entry(source=["x"])), "source must be a non-empty string"),
    (doc(entry(when={})), "`when` must be a non-empty table of signature fields"),
    (doc(entry(when=[72])), "`when` must be a non-empty table"),
    (doc(entry(when={"head_size": 72})), "`when.head_size` is not a signature field"),
    (doc(entry(when={"head_dim": {"min": 65, "step": 8}})), "when.head_dim: a range is {min = N, max = N}"),
    (doc(entry(when={"head_dim": {}})), "when.head_dim: a range is"),
    (doc(entry(when={"head_dim": {"max": "96"}})), "when.head_dim: a range is"),
    (doc(entry(when={"sink": None})), "when.sink: expected a value, a list of values or a {min, max} range"),
    (doc(entry(when={"head_dim": [72, None]})), "when.head_dim: expected a value"),
    (doc(entry(flash_attn="")), "flash_attn: expected a list of strings"),
    (doc(entry(flash_attn=[4])), "flash_attn: expected a list of strings"),
    (doc(entry(cutlass_dsl=4.6)), "cutlass_dsl: expected a list of strings"),
    (doc(entry(parts=["fwd", "both"])), "parts must be among fwd, bwd"),
    (doc(entry(sku=[""])), "sku: expected a list of strings"),
    (doc(entry(kernel_keys=["abc"])), "kernel_keys must be 64 hex digits each"),
    (doc(entry(kernel_keys=[KEY.upper()])), "kernel_keys must be 64 hex digits each"),
    (doc(entry(), entry(symptom="again")), "known-bad ids repeat: ['sm90-bwd-dq-hd72-80']"),
])
def test_malformed_documents_name_the_field(document: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError) as error:
        known_bad.parse(document, "registry.toml")
    assert str(error.value).startswith("registry.toml") and says in str(error.value), str(error.value)


@pytest.mark.parametrize(("when", "sig", "holds"), [
    ({"head_dim": 72}, SIG, True),  # a value
    ({"head_dim": 72}, replace(SIG, head_dim=64), False),
    ({"head_dim": [72, 80]}, replace(SIG, head_dim=80), True),  # a list of values
    ({"head_dim": [72, 80]}, replace(SIG, head_dim=96), False),
    ({"head_dim": {"min": 65, "max": 96}}, SIG, True),  # a range, both ends included
    ({"head_dim": {"min": 72, "max": 72}}, SIG, True),
    ({"head_dim": {"min": 65, "max": 96}}, replace(SIG, head_dim=64), False),
    ({"head_dim": {"min": 65, "max": 96}}, replace(SIG, head_dim=128), False),
    ({"head_dim": {"min": 200}}, replace(SIG, head_dim=256), True),  # open above
    ({"page_size": {"max": 16}}, PAGED, True),  # open below
    ({"page_size": {"max": 16}}, replace(PAGED, page_size=64), False),
    ({"head_dim": [{"max": 32}, 72]}, SIG, True),  # values and ranges mixed
    ({"layout": "paged"}, PAGED, True),  # a string
    ({"layout": "paged"}, SIG, False),
    ({"layout": ["seqused", "paged"], "head_dim": 160}, PAGED, True),  # every field must hold
    ({"layout": ["seqused", "paged"], "head_dim": 128}, PAGED, False),
    ({"window": [127, 0]}, LOCAL, True),  # a window
    ({"window": [127, 0]}, replace(LOCAL, window=(63, 0)), False),
    ({"window": [[63, 0], [127, 0]]}, LOCAL, True),  # a list of windows
    ({"window": [[63, 0], [4095, 0]]}, LOCAL, False),
    ({"window": [127, 0]}, SIG, False),  # causal: Signature drops a leftover window
    ({"sink": True}, LOCAL, True),  # a bool
    ({"sink": True}, SIG, False),
    ({"softcap": 50}, LOCAL, True),  # 50 and 50.0 are one softcap
    ({"softcap": {"min": 0.1}}, SIG, False),
    ({"pass_": ["bwd", "bwd_det"], "dtype": "bf16"}, SIG, True),
    ({"pass_": ["bwd", "bwd_det"], "dtype": "fp16"}, SIG, False),
])
def test_signature_predicates(when: dict[str, Any], sig: Signature, holds: bool) -> None:
    bad = known_bad.parse_entry(entry(when=when, flash_attn=["*"], arch=["*"]), "t")
    assert bad.holds(sig, arch="sm_90a", versions=TOOLS) is holds
    assert bad.holds(sig.to_dict(), arch="sm_90a", versions=TOOLS) is holds  # a mapping, as the gate passes it


@pytest.mark.parametrize(("changes", "arch", "versions", "holds"), [
    ({}, "sm_90a", TOOLS, True),
    ({}, "sm_90a", {**TOOLS, "flash-attn-4": "9.9.9"}, False),  # another FA4: the entry says nothing of it
    ({}, "sm_90a", {"nvidia-cutlass-dsl": "4.8.1"}, False),  # no FA4 version known
    ({"flash_attn": ["4.0.0b35", "4.0.0b36"]}, "sm_90a", TOOLS, True),
    ({"flash_attn": ["*"]}, "sm_90a", {**TOOLS, "flash-attn-4": "9.9.9"}, True),
    ({"cutlass_dsl": ["4.6.0"]}, "sm_90a", TOOLS, False),
    ({"cutlass_dsl": ["4.6.0"]}, "sm_90a", {**TOOLS, "nvidia-cutlass-dsl": "4.6.0"}, True),
    ({}, "sm_100a", TOOLS, False),  # the arch
    ({"arch": ["sm_90a", "sm_100a"]}, "sm_100a", TOOLS, True),
    ({"arch": ["*"]}, "sm_120a", TOOLS, True),
    ({"flash_attn": None, "arch": None}, "sm_103a", {}, True),  # both default to any
])
def test_versions_and_arch(changes: dict[str, Any], arch: str, versions: dict[str, str], holds: bool) -> None:
    bad = known_bad.parse_entry(entry(**changes), "t")
    assert bad.holds(SIG, arch=arch, versions=versions) is holds


@pytest.mark.parametrize(("changes", "asked", "holds"), [
    ({}, {"part": "bwd"}, True),  # parts: which kernels of a matching call
    ({}, {"part": "fwd"}, False),
    ({}, {"part": None}, True),  # any part: the planner refuses the call whole
    ({"parts": None}, {"part": "fwd"}, True),  # default: both parts
    ({"sku": ["h200"]}, {}, False),  # a SKU predicate holds only when the caller names the SKU
    ({"sku": ["h200"]}, {"sku": "h200"}, True),
    ({"sku": ["h200"]}, {"sku": "h100-sxm"}, False),
    ({}, {"sku": "b200"}, True),  # no SKU predicate: any SKU
    ({"kernel_keys": [KEY]}, {}, False),  # likewise a kernel predicate
    ({"kernel_keys": [KEY]}, {"kernel_key": KEY}, True),
    ({"kernel_keys": [KEY]}, {"kernel_key": "cd" * 32}, False),
    ({}, {"kernel_key": "cd" * 32}, True),
    ({"sku": ["h200"], "kernel_keys": [KEY]}, {"sku": "h200", "kernel_key": KEY, "part": "bwd"}, True),
])
def test_parts_skus_and_kernels(changes: dict[str, Any], asked: dict[str, Any], holds: bool) -> None:
    bad = known_bad.parse_entry(entry(**changes), "t")
    assert bad.holds(SIG, arch="sm_90a", versions=TOOLS, **asked) is holds


@pytest.mark.parametrize(("family", "part"), [
    ("_flash_attn_fwd", "fwd"), ("_flash_attn_fwd_combine", "fwd"), ("_get_scheduler_metadata", "fwd"),
    ("_flash_attn_bwd", "bwd"), ("_bwd_preprocess", "bwd"), ("_bwd_postprocess_convert", "bwd"),
    ("_bwd_dsink_reduce", "bwd"),
])
def test_part_of(family: str, part: str) -> None:
    assert known_bad.part_of(family) == part


def test_registry_find_plus_and_the_measured_document() -> None:
    project = known_bad.parse(doc(entry()), "project")
    measured = known_bad.parse_entry(entry(id="measured-hd64", when={"head_dim": 64}, sku=["h200"],
                                           kernel_keys=[KEY], source="fa4-aot certify"), "store")
    both = project.plus([measured, known_bad.parse_entry(entry(symptom="a copy"), "store")])
    assert both.revision == 3 and [b.id for b in both.entries] == ["sm90-bwd-dq-hd72-80", "measured-hd64"]
    assert both.find(SIG, arch="sm_90a", versions=TOOLS).id == "sm90-bwd-dq-hd72-80"
    hd64 = replace(SIG, head_dim=64)
    assert both.find(hd64, arch="sm_90a", versions=TOOLS, sku="h200") is None
    assert both.find(hd64, arch="sm_90a", versions=TOOLS, sku="h200", kernel_key=KEY) is measured
    again = known_bad.parse(json.loads(known_bad.measured_document([measured])), "again")
    assert again.entries == (measured,) and again.revision == 1
    assert measured.describe() == "known bad (measured-hd64): wrong dq (source: fa4-aot certify)"


def test_the_project_file_parses_and_names_what_was_measured_on_the_h200() -> None:
    registry = known_bad.load()
    ids = [b.id for b in registry.entries]
    assert len(ids) == len(set(ids)) and registry.revision >= 1
    assert {"sm90-bwd-dq-hd72-80", "sm90-paged-hd160-illegal-address"} <= set(ids)
    assert all(b.symptom and b.source and not b.kernel_keys for b in registry.entries)  # measured ones live in stores
    assert registry.find(SIG, arch="sm_90a", versions=TOOLS, part="bwd").id == "sm90-bwd-dq-hd72-80"
    assert registry.find(SIG, arch="sm_90a", versions=TOOLS, part="fwd") is None
    assert registry.find(SIG, arch="sm_100a", versions=TOOLS) is None
    assert registry.find(PAGED, arch="sm_90a", versions=TOOLS).id == "sm90-paged-hd160-illegal-address"


def test_load_names_an_unreadable_or_broken_file(tmp_path: Any) -> None:
    with pytest.raises(ConfigError, match="cannot read the known-bad registry"):
        known_bad.load(tmp_path / "absent.toml")
    (tmp_path / "broken.toml").write_text("format = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        known_bad.load(tmp_path / "broken.toml")


def test_the_project_file_refuses_the_h200s_head_dim_128_value_64_backward_without_a_mask() -> None:
    """Certification on the H200 (session 17) found FA4's sm_90 backward wrong at head dims 128/64 without a causal
    mask, and right at 128/64 causal and 128/128 or 96/64 without a mask: the entry names that kernel class alone."""
    registry = known_bad.load()
    full = replace(SIG, head_dim=128, head_dim_v=64, mask="full")
    found = registry.find(full, arch="sm_90a", versions=TOOLS, part="bwd")
    assert found is not None and found.id == "sm90-bwd-hd128-dv64-full"
    assert registry.find(replace(full, layout="varlen", dtype="fp16", pass_="bwd_det"), arch="sm_90a",
                         versions=TOOLS, part="bwd") is found
    for fine in (replace(full, mask="causal"), replace(full, head_dim_v=128), replace(full, head_dim=96)):
        assert registry.find(fine, arch="sm_90a", versions=TOOLS, part="bwd") is None, fine
    assert registry.find(full, arch="sm_90a", versions=TOOLS, part="fwd") is None  # out is right
    assert registry.find(full, arch="sm_100a", versions=TOOLS) is None
