"""Which kernel a failed check blames (fa4_aot/certify/blame.py), as a table of outcomes and the verdicts they
give."""

from __future__ import annotations

import pytest

from fa4_aot.certify.blame import verdicts
from fa4_aot.certify.plan import Check, Use
from fa4_aot.certify.pool import Outcome
from fa4_aot.domain.signature import Signature

DEVICE = "nvidia-h200.132sm.driver-13.0.cuda-13.0"
SIG = Signature("dense", "bwd", "bf16", 72, 72, "causal", (0, 0), 0.0, False, 1, 8, 8)
FWD, COMBINE, PRE, BWD, POST, OTHER = (c * 64 for c in "abcdef")
FAMILIES = {FWD: "_flash_attn_fwd", COMBINE: "_flash_attn_fwd_combine", PRE: "_bwd_preprocess",
            BWD: "_flash_attn_bwd", POST: "_bwd_postprocess_convert", OTHER: "_flash_attn_fwd"}


def outcome(status: str, keys: tuple[str, ...], part: str = "fwd", failures: tuple[str, ...] = ()) -> Outcome:
    check = Check(SIG, {"batch": 1, "seqlen_q": 8, "seqlen_k": 8, "heads_kv": 8},
                  tuple(Use(FAMILIES[k], k) for k in keys), "typical", 1)
    return Outcome("x", check, status, part, [{"tensor": t, "error": 1.3, "bound": 0.01} for t in failures],
                   "CUDA error: illegal address" if status == "crash" else "")


TRAIN = (FWD, PRE, BWD, POST)
CASES = {
    "all pass": ([outcome("pass", TRAIN)], {FWD: "pass", PRE: "pass", BWD: "pass", POST: "pass"}),
    # a wrong dq blames the backward's kernels; the forward was right, so it passes
    "wrong dq": ([outcome("wrong", TRAIN, "bwd", ("dq",))],
                 {FWD: "pass", PRE: "wrong", BWD: "wrong", POST: "wrong"}),
    # ... but not a backward kernel that passed elsewhere
    "wrong dq, shared preprocess": ([outcome("wrong", TRAIN, "bwd", ("dq",)), outcome("pass", (OTHER, PRE))],
                                    {FWD: "pass", PRE: "pass", BWD: "wrong", POST: "wrong", OTHER: "pass"}),
    # a wrong out blames the forward's kernels; the backward's are not evidence either way
    "wrong out": ([outcome("wrong", TRAIN, "bwd", ("out", "dq"))],
                  {FWD: "wrong", PRE: "wrong", BWD: "wrong", POST: "wrong"}),
    "crash in forward, shared combine": ([outcome("crash", (FWD, COMBINE)), outcome("pass", (OTHER, COMBINE))],
                                         {FWD: "crash", COMBINE: "pass", OTHER: "pass"}),
    # every kernel of the failing part passed elsewhere: the combination fails, and the main kernel is blamed,
    # not the combine kernel that other signatures share
    "crash, all cleared": ([outcome("crash", (FWD, COMBINE)), outcome("pass", (FWD,)),
                            outcome("pass", (COMBINE,))], {FWD: "crash", COMBINE: "pass"}),
    # blame by tensor: dv is the backward kernel's (or its postprocess's), never the preprocess's
    "wrong dv": ([outcome("wrong", TRAIN, "bwd", ("dv",))], {FWD: "pass", BWD: "wrong", POST: "wrong"}),
    "hang in backward": ([outcome("hang", TRAIN, "bwd")], {PRE: "hang", BWD: "hang", POST: "hang"}),
    # a Python error (FA4 refusing, a kernel missing) says nothing about the kernels
    "error": ([outcome("error", TRAIN)], {}),
    "lean differs in out": ([Outcome("x", outcome("pass", TRAIN).check, "wrong", "fwd",
                                     [{"tensor": "lean", "output": "out", "error": 0.5, "bound": 0.0}])],
                            {FWD: "wrong"}),  # the backward's kernels: no evidence either way
    "deterministic repeat": ([Outcome("x", outcome("pass", TRAIN).check, "wrong", "bwd",
                                      [{"tensor": "repeat", "output": "dq", "error": 1e-3, "bound": 0.0}])],
                             {FWD: "pass", PRE: "wrong", BWD: "wrong", POST: "wrong"}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_blame(name: str) -> None:
    outcomes, expected = CASES[name]
    found = {v.kernel_key: v.status for v in verdicts(outcomes, DEVICE, "4.0.0b36/4.8.1")}
    assert found == expected


def test_a_wrong_verdict_says_which_tensor_by_how_much_and_where() -> None:
    (v,) = [v for v in verdicts([outcome("wrong", TRAIN, "bwd", ("dq",))], DEVICE, "t") if v.kernel_key == BWD]
    assert (v.tensor, v.error, v.bound, v.checks) == ("dq", 1.3, 0.01, 1)
    assert "dq off by 1.3" in v.describe() and "d=72" in v.describe()


def test_nan_errors_stay_strict_json() -> None:
    bad = Outcome("x", outcome("pass", TRAIN).check, "wrong", "fwd",
                  [{"tensor": "out", "error": float("nan"), "bound": 0.01}])
    (v,) = [v for v in verdicts([bad], DEVICE, "t") if v.kernel_key == FWD]
    assert v.status == "wrong" and v.error is None


def test_a_wrong_gradient_never_refuses_shared_backward_helpers_that_passed_elsewhere() -> None:
    """A wrong dq where every backward kernel passed other checks (another signature sharing the preprocess and
    postprocess, the same backward kernel at other sizes) blames the backward kernel alone: refusing the shared
    helpers would refuse every signature that launches them."""
    other = Check(SIG, {"batch": 4, "seqlen_q": 512, "seqlen_k": 512, "heads_kv": 8},
                  tuple(Use(FAMILIES[k], k) for k in TRAIN), "typical", 2)
    outcomes = [outcome("wrong", TRAIN, "bwd", ("dq",)), Outcome("y", other, "pass")]
    found = {v.kernel_key: v.status for v in verdicts(outcomes, DEVICE, "4.0.0b36/4.8.1")}
    assert found == {FWD: "pass", PRE: "pass", BWD: "wrong", POST: "pass"}
