"""Replaying a recorded recipe on CPU tensors (kernels stubbed): every buffer FA4 would allocate comes out with
FA4's shape, stride and dtype, kernels are called in FA4's order with FA4's argument structure, and the
autograd Function hands back gradients shaped like the inputs. No FA4 import in this process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fa4_aot.domain import recipe_format
from fa4_aot.domain.region import Launch, Region, parse_regions
from fa4_aot.domain.signature import Signature
from fa4_aot.runtime import replay
from fa4_aot.runtime.runner import _function

ROOT = Path(__file__).resolve().parents[2]
SIG = {"layout": "dense", "pass_": "bwd", "dtype": "bf16", "head_dim": 128, "head_dim_v": 128, "mask": "causal",
       "window": [0, 0], "softcap": 0.0, "sink": False, "num_splits": 1, "heads_q": 8, "heads_kv": 2}
VARLEN = {**SIG, "layout": "varlen", "heads_kv": 8, "mask": "full"}
PAGED = {**SIG, "layout": "paged", "pass_": "fwd_lse", "page_size": 16, "heads_q": 32, "heads_kv": 8}
SEQUSED = {**SIG, "layout": "seqused", "pass_": "bwd", "sink": True}
PAIRS = [(SIG, {"batch": 2, "seqlen_q": 1000, "seqlen_k": 1000}),
         (VARLEN, {"batch": 3, "total_q": 1500, "total_k": 2000, "max_seqlen_q": 700, "max_seqlen_k": 900}),
         (PAGED, {"batch": 4, "seqlen_q": 1, "num_pages": 600, "pages_per_seq": 128, "max_seqlen_q": 1,
                  "max_seqlen_k": 2048}),
         (SEQUSED, {"batch": 2, "seqlen_q": 512, "seqlen_k": 700, "max_seqlen_q": 512, "max_seqlen_k": 700}),
         ({**VARLEN, "sink": True}, {"batch": 2, "total_q": 900, "total_k": 900, "max_seqlen_q": 500,
                                     "max_seqlen_k": 500})]


def recorded(pairs: list) -> list[dict]:
    """The regions record_probe.py records for (signature, sizes) pairs on the h200, in a process of its own, as
    recipe documents (Region.to_json)."""
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "runtime" / "record_probe.py"), "h200",
                           json.dumps(pairs)], capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def documents() -> list[dict]:
    return recorded(PAIRS)


@pytest.fixture(scope="module")
def regions(documents: list[dict]) -> list[Region]:
    return parse_regions(documents)


def _sizes(case: int) -> dict:
    """The sizes of PAIRS[case] with those its signature fixes (KV head count, page size, window), sizes of the
    region (recipe_format.bound_sizes)."""
    sig, sizes = PAIRS[case]
    return {**sizes, **recipe_format.bound_sizes(Signature.from_dict(sig))}


def _inputs(region: Region, sizes: dict, torch) -> dict:
    out = {}
    for name, slot in region.inputs.items():
        meta = region.meta[slot]
        out[name] = torch.zeros(replay.concretize(meta.shape, sizes), dtype=getattr(torch, meta.dtype))
    return out


@pytest.mark.parametrize("case", [0, 1, 2, 3], ids=["dense-gqa-causal-bwd", "varlen-mha-full-bwd",
                                                     "paged16-gqa-causal-fwd-lse", "seqused-gqa-sink-bwd"])
def test_replay_allocates_what_fa4_allocates(regions, case):
    import torch

    region, sizes = regions[case], _sizes(case)
    calls: list[tuple[int, int]] = []
    fakes = [lambda *a, i=i: calls.append((i, len(a))) for i in range(len(region.kernels))]
    bound = replay.bind(region, sizes, fakes, torch.device("cpu"), None)
    slots: list = [None] * region.tensors
    for name, t in _inputs(region, sizes, torch).items():
        slots[region.inputs[name]] = t
    bound.run(bound.fwd, slots)
    bound.run(bound.bwd, slots)
    assert all(slot is not None for slot in slots)
    for slot, t in enumerate(slots):
        meta = region.meta[slot]
        shape, stride = replay.concretize(meta.shape, sizes), replay.concretize(meta.stride, sizes)
        assert list(t.shape) == shape and list(t.stride()) == stride, (slot, t.shape, shape, t.stride(), stride)
        assert str(t.dtype) == f"torch.{meta.dtype}", (slot, t.dtype, meta.dtype)
    launched = [s for s in region.fwd + region.bwd if isinstance(s, Launch)]
    assert calls == [(s.kernel, len(s.args)) for s in launched]
    families = ["_flash_attn_fwd", "_bwd_preprocess", "_flash_attn_bwd"] if region.bwd else ["_flash_attn_fwd"]
    assert [k.family for k in region.kernels][:3] == families
    assert set(region.outputs) == ({"out", "lse", "dq", "dk", "dv"} | ({"dsink"} if region.signature["sink"]
                                   else set()) if region.bwd else {"out", "lse"})


def test_regression_varlen_backward_with_sink_records_dsink(regions):
    """The recorder took dsink from backward()'s result 17 for varlen (None: it is 16), so a varlen training
    signature with a learnable sink recorded no recipe at all."""
    region, sizes = regions[4], _sizes(4)
    dsink, sink = region.meta[region.outputs["dsink"]], region.meta[region.inputs["learnable_sink"]]
    found = [(replay.concretize(m.shape, sizes), m.dtype) for m in (dsink, sink)]
    assert found == [([VARLEN["heads_q"]], "bfloat16")] * 2


def test_autograd_function_returns_input_shaped_gradients(regions):
    import torch

    region, sizes = regions[0], _sizes(0)
    fakes = [lambda *a: None for _ in region.kernels]
    bound = replay.bind(region, sizes, fakes, torch.device("cpu"), 0.125)
    inputs = {n: t.requires_grad_() for n, t in _inputs(region, sizes, torch).items() if n != "dout"}
    out, lse = _function().apply(bound, tuple(inputs), *inputs.values())
    assert out.shape == inputs["q"].shape and not lse.requires_grad
    out.backward(torch.ones_like(out))
    for t in inputs.values():
        assert t.grad is not None and t.grad.shape == t.shape and t.grad.dtype == t.dtype


def test_softmax_scale_reaches_every_kernel_that_takes_it(regions):
    import torch

    region, sizes = regions[0], _sizes(0)
    seen: list = []
    fakes = [lambda *a: seen.append([x for x in a if isinstance(x, float)]) for _ in region.kernels]
    bound = replay.bind(region, sizes, fakes, torch.device("cpu"), 0.3)
    slots: list = [None] * region.tensors
    for name, t in _inputs(region, sizes, torch).items():
        slots[region.inputs[name]] = t
    bound.run(bound.fwd, slots)
    bound.run(bound.bwd, slots)
    assert seen[0] == [0.3] and seen[2] == [0.3], seen  # forward and main backward kernels take the scale
    assert {x for floats in seen for x in floats} <= {0.3, 1.0}


def test_inputs_are_checked_as_fa4_asserts(regions):
    import torch

    region, sizes = regions[0], _sizes(0)
    bound = replay.bind(region, sizes, [lambda *a: None for _ in region.kernels], torch.device("cpu"), None)
    inputs = {n: t for n, t in _inputs(region, sizes, torch).items() if n != "dout"}
    with pytest.raises(ValueError, match="CUDA"):
        bound.check(inputs)
    with pytest.raises(ValueError, match="k: got"):
        bound.check({**inputs, "k": inputs["k"][:1]})
    with pytest.raises(ValueError, match="float16"):
        bound.check({**inputs, "q": inputs["q"].half()})


def test_recorded_regions_round_trip_as_documents(documents, regions):
    """Issue 18, D26: every region the recorder writes (dense, varlen, paged, seqused, sinks) passes the format
    that clients apply on load and the server at upload (`documents` were parsed by the recorder and again by the
    fixture); a parsed region writes back exactly its document (recipe files and their keys do not depend on
    which side wrote them), and parsing that again gives the same region."""
    assert [r.to_json() for r in regions] == documents
    assert parse_regions([r.to_json() for r in regions]) == regions
    assert json.loads(json.dumps(documents)) == documents


def test_backward_steps_are_bound_at_the_first_backward(regions: list[Region]) -> None:
    """Issue 29: a training region's backward kernels loaded (and their steps bound) at the first backward, not at
    the first forward, as FA4 compiles its backward kernels at the first backward. bind() with `backward` is given
    only the forward's kernels; the autograd node is made from the region's recorded backward steps; the
    backward's kernels are asked for once, at the first backward."""
    import torch

    region, sizes = regions[0], _sizes(0)
    forward = set(region.launched(region.fwd))
    assert forward and set(region.launched(region.bwd)) - forward  # kernels only the backward launches
    asked: list[int] = []

    def backward() -> list[Any]:
        asked.append(1)
        return [lambda *a: None for _ in region.kernels]

    fakes = [(lambda *a: None) if i in forward else None for i in range(len(region.kernels))]
    bound = replay.bind(region, sizes, fakes, torch.device("cpu"), 0.125, backward)
    assert bound.trains and not bound.bwd and not asked
    for _round in range(2):
        inputs = {n: t.requires_grad_() for n, t in _inputs(region, sizes, torch).items() if n != "dout"}
        out, _lse = _function().apply(bound, tuple(inputs), *inputs.values())
        out.backward(torch.ones_like(out))
        assert all(t.grad is not None and t.grad.shape == t.shape for t in inputs.values())
    assert asked == [1] and len(bound.bwd) == len(region.bwd)


def test_first_backward_raises_what_loading_its_kernels_raises(regions: list[Region]) -> None:
    """A backward kernel the store lacks (or the certification gate refuses) surfaces at the first backward, as the
    loader's own error (fields kept through autograd), and is asked for again at the next backward."""
    import torch

    from fa4_aot.errors import KernelMissing

    region, sizes = regions[0], _sizes(0)
    calls: list[int] = []

    def backward() -> list[Any]:
        calls.append(1)
        raise KernelMissing("kernel abc… (_flash_attn_bwd) for SKU h200 is not in /store", sku="h200",
                            family="_flash_attn_bwd", kernel_key="abc", compile_key="")

    bound = replay.bind(region, sizes, [lambda *a: None for _ in region.kernels], torch.device("cpu"), 0.125,
                        backward)
    for attempt in (1, 2):
        inputs = {n: t.requires_grad_() for n, t in _inputs(region, sizes, torch).items() if n != "dout"}
        out, _lse = _function().apply(bound, tuple(inputs), *inputs.values())
        with pytest.raises(KernelMissing, match="_flash_attn_bwd") as info:
            out.backward(torch.ones_like(out))
        assert info.value.kernel_key == "abc" and len(calls) == attempt
