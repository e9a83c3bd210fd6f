"""The one-file repro a measured known-bad entry carries (certify/repro_script.py), run here on the CPU: it makes the
certifier's very inputs, FA4's attention_ref per sequence agrees with certify's reference, and its verdict follows
FA4's criterion (a right result exits 0, a wrong gradient exits 1 and is named). Skipped where FA4 is not installed:
the script imports FA4's public functions and its test reference."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from fa4_aot.certify import repro_script
from fa4_aot.certify.inputs import DTYPES, make_inputs
from fa4_aot.certify.plan import Check
from fa4_aot.certify.reference import reference
from fa4_aot.domain.signature import Signature

pytest.importorskip("flash_attn.cute.testing")
BASE = Signature(layout="dense", pass_="bwd", dtype="bf16", head_dim=32, head_dim_v=32, mask="causal", window=(0, 0),
                 softcap=0.0, sink=False, num_splits=1, heads_q=6, heads_kv=2)
CASES = {  # name: (signature changes, point)
    "dense causal, more queries than keys": ({}, {"batch": 2, "seqlen_q": 13, "seqlen_k": 5, "heads_kv": 2}),
    "dense full softcap sink": ({"mask": "full", "softcap": 4.0, "sink": True},
                                {"batch": 2, "seqlen_q": 7, "seqlen_k": 9, "heads_kv": 1}),
    "varlen local, empty sequences": ({"layout": "varlen", "mask": "local", "window": (3, 1), "dtype": "fp16"},
                                      {"batch": 4, "total_q": 20, "total_k": 17, "max_seqlen_q": 11,
                                       "max_seqlen_k": 9, "heads_kv": 2}),
    "varlen causal, no mask dv 16": ({"layout": "varlen", "mask": "full", "head_dim_v": 16},
                                     {"batch": 3, "total_q": 14, "total_k": 30, "max_seqlen_q": 8,
                                      "max_seqlen_k": 12, "heads_kv": 2}),
    "seqused forward": ({"layout": "seqused", "pass_": "fwd"},
                        {"batch": 3, "seqlen_q": 4, "seqlen_k": 16, "max_seqlen_q": 4, "max_seqlen_k": 12,
                         "heads_kv": 2}),
    "paged forward": ({"layout": "paged", "pass_": "fwd", "page_size": 4},
                      {"batch": 3, "seqlen_q": 2, "pages_per_seq": 5, "num_pages": 9, "max_seqlen_q": 2,
                       "max_seqlen_k": 18, "heads_kv": 2}),
}


def _check(name: str) -> Check:
    changes, point = CASES[name]
    return Check(dataclasses.replace(BASE, **changes), point, (), "small", seed=1234 + len(name))


def _load(text: str) -> dict[str, Any]:
    """The script's functions, with its device the CPU."""
    ns: dict[str, Any] = {"__name__": "repro"}
    exec(compile(text, "repro.py", "exec"), ns)
    ns["DEVICE"] = "cpu"
    return ns


def _script(check: Check) -> str:
    return repro_script.script(check, symptom="dq off", source="fa4-aot certify on h100-sxm",
                               versions={"flash-attn-4": "4.0.0b36"})


@pytest.mark.parametrize("name", CASES)
def test_the_repro_makes_the_certifiers_inputs(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(repro_script, "_LITERAL_LIMIT", 4)  # a paged table redrawn, not written out
    check = _check(name)
    q, k, v, sink, dout, per_seq = _load(_script(check))["make_inputs"]()
    want = make_inputs(check.sig, check.point, check.seed, "cpu")
    got = {"q": q, "k": k, "v": v, "learnable_sink": sink, **per_seq}
    assert sorted(n for n, t in got.items() if t is not None) == sorted(want.tensors)
    for n, t in want.tensors.items():
        assert torch.equal(got[n].detach(), t.detach()), n
    assert (dout is None) == (want.dout is None) and (dout is None or torch.equal(dout, want.dout))


def _run(ns: dict[str, Any], outputs: dict[str, torch.Tensor], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    ns["fa4"] = lambda *args: outputs
    with pytest.raises(SystemExit) as stopped:
        ns["main"]()
    return int(stopped.value.code), capsys.readouterr().out


@pytest.mark.parametrize("name", CASES)
def test_the_repro_passes_a_right_result_and_names_a_wrong_one(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A right result (certify's float64 reference, rounded to the input dtype) is within FA4's bound by FA4's
    own reference per sequence; the same with one element of a gradient (or out) moved by 1 is not."""
    check = _check(name)
    ns = _load(_script(check))
    inputs = make_inputs(check.sig, check.point, check.seed, "cpu")
    exact = reference(inputs, check.sig, dtype=torch.float64)
    names = ("out", "dq", "dk", "dv", "dsink")
    right = {n: exact.get(n).to(DTYPES[check.sig.dtype]) for n in names if exact.get(n) is not None}
    code, said = _run(ns, right, capsys)
    assert code == 0, said
    assert "within its own test bound" in said and "WRONG" not in said
    target = "dq" if "dq" in right else "out"
    wrong = dict(right)
    wrong[target] = right[target].clone()
    wrong[target].view(-1)[-1] += 1.0
    code, said = _run(ns, wrong, capsys)
    assert code == 1 and f"{target}: error" in said and "WRONG" in said.split(f"{target}: error")[1].splitlines()[0]


def test_the_repro_says_what_certification_saw_and_needs_no_fa4_aot() -> None:
    text = _script(_check("varlen local, empty sequences"))
    assert "dq off" in text and "fa4-aot certify on h100-sxm" in text and "flash-attn-4 4.0.0b36" in text
    assert "fa4_aot" not in text.replace("fa4-aot", "")


def test_the_repros_atol_is_the_rounding_of_the_reference_in_its_own_dtype(capsys: pytest.CaptureFixture[str]) -> None:
    # the default h200 build's repro of fp16 d=96 at 65,243 queries over 1 key: the script took the atol in
    # float32 (1e-7 where FA4's check_tensor_vs_ref takes it in fp16), so it told FA4's own dv, off by two fp16
    # ulps of a value near 256, to be 65,500 times outside FA4's bound
    check = _check("varlen local, empty sequences")
    ns = _load(_script(check))
    q, k, v, sink, dout, per_seq = ns["make_inputs"]()
    ref = ns["reference"](q, k, v, sink, dout, per_seq, upcast=True)
    pt = ns["reference"](q, k, v, sink, dout, per_seq, upcast=False)
    _code, said = _run(ns, ref, capsys)
    for name, r in ref.items():
        expected = 2.0 * (pt[name].float() - r.float()).abs().max().item() + \
            2 * (r + 0.3 - 0.3 - r).abs().max().item()
        assert f"{name}: error 0, bound {expected:.4g} " in said, (name, said)
