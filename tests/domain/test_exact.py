"""Exact call records (fa4_aot/domain/exact.py): what a well-formed record is, what check() refuses (a record comes from
clients, through the server's open POST /v1/misses), and describing real tensor arguments (fa4/exact_replay.py)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from fa4_aot.domain.calls import Call
from fa4_aot.domain.exact import MAX_CHARS, ExactCall, check


def tensor(*shape: int, dtype: str = "bfloat16", grad: bool = False, offset: int = 0) -> dict[str, Any]:
    stride, step = [], 1
    for n in reversed(shape):
        stride.insert(0, step)
        step *= n
    return {"tensor": dtype, "shape": list(shape), "stride": stride, "offset": offset, "grad": grad}


RECORD = {
    "format": 1, "entry": "FlashAttnVarlenFunc",
    "forward": {"q": tensor(1300, 12, 128, grad=True), "k": tensor(1300, 2, 128, grad=True), "v": {"same_as": "k"},
                "cu_seqlens_q": tensor(4, dtype="int32"), "max_seqlen_q": 1000, "causal": True,
                "window_size": [None, None], "softcap": 0.0, "softmax_scale": 0.08838834764831845},
    "backward": {"dout": tensor(1300, 12, 128), "dlse": None},
}


def _with(path: str, value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(RECORD)
    *parents, last = path.split(".")
    node: Any = doc
    for part in parents:
        node = node[part]
    node[last] = value
    return doc


@pytest.mark.parametrize("doc, message", [
    (_with("format", 2), "format 2 is not 1"),
    (_with("entry", "os.system"), "entry must be one of"),
    ({**RECORD, "extra": 1}, "exactly format, entry, forward and backward"),
    (_with("forward.q.tensor", "complex64"), "a tensor is {tensor: dtype"),
    (_with("forward.q.shape", [1300, 12]), "of equal length"),
    (_with("forward.q.shape", [-1, 12, 128]), "non-negative integers"),
    (_with("forward.q.offset", 4096), "offset is an integer in [0, 256)"),
    (_with("forward.q.stride", [1 << 47, 1 << 47, 1]), "spans more than"),
    (_with("forward.v", {"same_as": "dout"}), "same_as must name another argument of the same call"),
    (_with("forward.softcap", float("inf")), "finite numbers only"),
    (_with("forward.score_mod", {"__callable__": "x"}), "expected null, a boolean"),
    (_with("forward.window_size", [[[1]]]), "lists nest at most 2 deep"),
    (_with("backward", {"dout": None}), "exactly dout and dlse"),
    (_with("forward.Q-Bad", 1), "invalid argument name"),
    (_with("forward.aux_scalars", ["x" * 300]), "text longer than"),
    (_with("forward.aux_scalars", [tensor(1)] * 64 + [None]), "at most 64 items"),
    (_with("forward.aux_scalars", [[1234567890] * 64] * 64), f"longer than {MAX_CHARS}"),
])
def test_check_refuses_malformed_records(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as e:
        check(doc)
    assert message in str(e.value)


def test_records_round_trip_and_dedupe() -> None:
    assert check(json.loads(json.dumps(RECORD))) == RECORD
    call = Call.from_dict({
        "layout": "varlen", "pass_": "bwd", "dtype": "bf16", "head_dim": 128, "head_dim_v": 128, "mask": "causal",
        "window": (0, 0), "softcap": 0.0, "sink": False, "num_splits": 1, "batch": 3, "seqlen_q": 1000,
        "seqlen_k": 1000, "heads_q": 12, "heads_kv": 2})
    a = ExactCall.from_dict(RECORD, call)
    reordered = ExactCall.from_dict(dict(reversed(list(copy.deepcopy(RECORD).items()))), call)
    assert a == reordered and len({a, reordered}) == 1 and a.to_dict() == RECORD and a.training
    assert a.describe() == f"{call.describe()} [exact fwd+bwd]"
    assert ExactCall.from_dict({**RECORD, "backward": None}).describe().startswith(
        "FlashAttnVarlenFunc q=1300x12x128 k=1300x2x128 [exact]")


def test_describe_keeps_what_fa4_reads_and_refuses_what_it_cannot_hold() -> None:
    import torch

    from fa4_aot.fa4.exact_replay import describe, with_backward

    packed = torch.empty(2, 777, 3, 16, 64, dtype=torch.bfloat16)
    q, k = packed[:, :, 0], packed[:, :, 1].requires_grad_(False)
    seqused = torch.empty(2, dtype=torch.int32)
    doc = describe("FlashAttnFunc", {"q": q, "k": k, "v": k, "seqused_k": seqused, "causal": True,
                                     "window_size": (128, 0), "num_splits": 0})
    assert doc is not None
    assert doc["forward"]["k"] == {"tensor": "bfloat16", "shape": [2, 777, 16, 64], "stride": [777 * 3072, 3072, 64, 1],
                                   "offset": 1024 % 128, "grad": False}
    assert doc["forward"]["v"] == {"same_as": "k"} and doc["forward"]["window_size"] == [128, 0]
    assert doc["forward"]["seqused_k"]["shape"] == [2] and doc["backward"] is None
    full = with_backward(doc, torch.empty(2, 777, 16, 64, dtype=torch.bfloat16), None)
    assert full is not None and full["backward"]["dout"]["shape"] == [2, 777, 16, 64]
    assert full["backward"]["dlse"] is None
    assert describe("FlashAttnFunc", {"q": q, "score_mod": lambda *a: a[0]}) is None
    assert describe("FlashAttnFunc", {"q": torch.empty(2, dtype=torch.complex64)}) is None
