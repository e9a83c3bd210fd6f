"""Call is one pure value: every producer goes through from_dict, which round-trips to_dict (also through JSON,
as a miss travels to the server and back), refuses what is not a call, and shares one pass/mask derivation."""

from __future__ import annotations

import json

import pytest

from fa4_aot.client.arguments import call_from
from fa4_aot.domain.calls import Call, dtype_name, mask_of, pass_of

CALL = Call(layout="paged", pass_="fwd_lse", dtype="fp16", head_dim=128, head_dim_v=64, mask="local", window=(64, 0),
            softcap=30.0, sink=True, num_splits=2, batch=2, seqlen_q=128, seqlen_k=1024, heads_q=16, heads_kv=4,
            page_size=256)


def test_from_dict_inverts_to_dict_also_through_json() -> None:
    assert Call.from_dict(CALL.to_dict()) == CALL
    assert Call.from_dict(json.loads(json.dumps(CALL.to_dict()))) == CALL
    no_page = {k: v for k, v in CALL.to_dict().items() if k != "page_size"}
    assert Call.from_dict(no_page).page_size == 0


@pytest.mark.parametrize("change, says", [
    ({"layout": "strided"}, "layout must be one of"),
    ({"pass_": "bwd_fast"}, "pass_ must be one of"),
    ({"dtype": "fp8"}, "dtype must be one of"),
    ({"mask": "sliding"}, "mask must be one of"),
    ({"window": [1, 2, 3]}, "window must be two integers"),
    ({"extra": 1}, "unknown ['extra']"),
])
def test_from_dict_refuses_what_is_not_a_call(change: dict, says: str) -> None:
    with pytest.raises(ValueError) as info:
        Call.from_dict({**CALL.to_dict(), **change})
    assert says in str(info.value) and "invalid call" in str(info.value)


def test_from_dict_names_a_missing_field() -> None:
    data = CALL.to_dict()
    del data["heads_kv"]
    with pytest.raises(ValueError, match=r"missing \['heads_kv'\]"):
        Call.from_dict(data)


@pytest.mark.parametrize("training, deterministic, return_lse, expected", [
    (False, False, False, "fwd"), (False, False, True, "fwd_lse"), (False, True, False, "fwd"),
    (True, False, False, "bwd"), (True, True, False, "bwd_det"), (True, False, True, "bwd"),
])
def test_pass_of(training: bool, deterministic: bool, return_lse: bool, expected: str) -> None:
    assert pass_of(training=training, deterministic=deterministic, return_lse=return_lse) == expected


def test_mask_and_dtype_names() -> None:
    import torch

    assert [mask_of(causal=c, local=w) for c, w in ((True, False), (False, True), (False, False))] == \
        ["causal", "local", "full"]
    assert (dtype_name(torch.bfloat16), dtype_name(torch.float16), dtype_name(torch.float32)) == ("bf16", "fp16", None)


def test_flags_are_what_fa4_is_called_with() -> None:
    assert CALL.flags() == {"causal": False, "window_size": (64, 0), "softcap": 30.0, "num_splits": 2,
                            "deterministic": False, "return_lse": True}
    causal = Call.from_dict({**CALL.to_dict(), "mask": "causal", "pass_": "bwd_det", "window": (0, 0)})
    assert causal.flags()["causal"] and causal.flags()["window_size"] == (None, None)
    assert causal.flags()["deterministic"] and not causal.flags()["return_lse"]


_LOAD = dict(causal=False, dtype=None, window_size=(None, None), softcap=0.0, sink=False, num_splits=1,
             layout="dense", page_size=0, training=False, deterministic=False, return_lse=False)


def test_call_from_loads_arguments() -> None:
    import torch

    call = call_from((2, 128, 16, 128), (2, 1024, 4, 64), **{**_LOAD, "dtype": torch.float16, "layout": "paged",
                     "page_size": 256, "window_size": (64, 0), "softcap": 30, "sink": True, "num_splits": 2,
                     "return_lse": True})
    assert call == CALL
    assert call_from((1, 8, 2, 64), None, **_LOAD).dtype == "bf16"  # default dtype, k_shape defaults to q_shape


@pytest.mark.parametrize("change, says", [
    ({"dtype": "float32"}, "bf16 or fp16"),
    ({"window_size": (3, None)}, "give both sides"),
    ({"window_size": (3, 0), "causal": True}, "either causal=True or a window_size"),
    ({"layout": "paged"}, "needs page_size"),
    ({"layout": "strided"}, "layout must be one of"),
])
def test_call_from_says_which_argument_is_wrong(change: dict, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        call_from((1, 8, 2, 64), None, **{**_LOAD, **change})
    with pytest.raises(ValueError, match="batch, seqlen, heads, head_dim"):
        call_from((1, 8, 64), None, **_LOAD)
