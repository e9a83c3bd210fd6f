"""The lean runtime's per-call host path for forward-only calls (issue 17, point 4), on CPU tensors with kernels
stubbed: Bound.forward runs FA4's steps with no autograd node, and launches what the autograd Function launches
(kernels, argument structure, every tensor's shape, stride, dtype and, for inputs, storage). FA4's detach steps are
aliased only where no input requires grad (a detached tensor differs from its input in requires_grad alone): with
inputs that require grad the kernels receive FA4's detached tensors, and an input that requires none reaches them as
the very tensor given."""

from __future__ import annotations

from typing import Any

import pytest

from fa4_aot.domain import recipe_format
from fa4_aot.domain.region import Region, parse_regions
from fa4_aot.domain.signature import Signature
from fa4_aot.runtime import replay
from fa4_aot.runtime.runner import _function
from tests.runtime.test_replay import recorded

SIG = {"layout": "seqused", "pass_": "fwd", "dtype": "bf16", "head_dim": 128, "head_dim_v": 128, "mask": "causal",
       "window": [0, 0], "softcap": 0.0, "sink": False, "num_splits": 1, "heads_q": 32, "heads_kv": 8}
PAIRS = [(SIG, {"batch": 4, "seqlen_q": 1, "seqlen_k": 1024, "max_seqlen_q": 1, "max_seqlen_k": 1024}),
         ({**SIG, "layout": "paged", "pass_": "fwd_lse", "page_size": 16},
          {"batch": 4, "seqlen_q": 1, "num_pages": 300, "pages_per_seq": 64, "max_seqlen_q": 1, "max_seqlen_k": 1024}),
         ({**SIG, "layout": "dense", "sink": True},
          {"batch": 1, "seqlen_q": 512, "seqlen_k": 512}),
         ({**SIG, "layout": "dense"}, {"batch": 1, "seqlen_q": 512, "seqlen_k": 512})]
IDS = ["seqused-fwd", "paged16-fwd-lse", "dense-sink-fwd", "dense-fwd"]


@pytest.fixture(scope="module")
def regions() -> list[Region]:
    return parse_regions(recorded(PAIRS))


def _bound(region: Region, case: int, launches: list) -> replay.Bound:
    import torch

    sizes = {**PAIRS[case][1], **recipe_format.bound_sizes(Signature.from_dict(PAIRS[case][0]))}
    fakes = [lambda *a, i=i: launches.append((i, a)) for i in range(len(region.kernels))]
    return replay.bind(region, sizes, fakes, torch.device("cpu"), None)


def _inputs(region: Region, case: int, grad: bool) -> dict[str, Any]:
    import torch

    sizes = {**PAIRS[case][1], **recipe_format.bound_sizes(Signature.from_dict(PAIRS[case][0]))}
    found = {}
    for name, slot in region.inputs.items():
        meta = region.meta[slot]
        t = torch.randn(replay.concretize(meta.shape, sizes)).to(getattr(torch, meta.dtype))
        found[name] = t.requires_grad_(grad) if t.is_floating_point() else t
    return found


def _described(args: tuple) -> list:
    """A launch's arguments with each tensor as (shape, stride, dtype, requires_grad, storage address)."""
    import torch

    return [(tuple(a.shape), a.stride(), a.dtype, a.requires_grad, a.data_ptr()) if isinstance(a, torch.Tensor)
            else a for a in args]


@pytest.mark.parametrize("grad", [False, True], ids=["inputs-without-grad", "inputs-with-grad-under-no-grad"])
@pytest.mark.parametrize("case", range(len(PAIRS)), ids=IDS)
def test_forward_only_path_launches_what_the_autograd_function_launches(regions, case, grad):
    """Inputs that require grad under no_grad run a forward in FA4 too (lse computed): the kernels then receive
    FA4's detached tensors, with requires_grad as FA4 passes them."""
    import torch

    region = regions[case]
    inputs = _inputs(region, case, grad)
    through_autograd: list = []
    direct: list = []
    with torch.no_grad():
        out_a, lse_a = _function().apply(_bound(region, case, through_autograd), tuple(inputs), *inputs.values())
        out_d, lse_d = _bound(region, case, direct).forward(inputs)
    assert [i for i, _ in direct] == [i for i, _ in through_autograd] and direct
    given = {t.data_ptr() for t in inputs.values()}
    for (_i, mine), (_j, theirs) in zip(direct, through_autograd, strict=True):
        mine, theirs = _described(mine), _described(theirs)
        assert len(mine) == len(theirs)
        for m, t in zip(mine, theirs, strict=True):
            if isinstance(m, tuple) and len(m) == 5 and isinstance(m[2], torch.dtype):  # a tensor: made per call
                assert m[:4] == t[:4] and (m[4] == t[4] or t[4] not in given), (m, t)  # unless it is an input
            else:
                assert m == t
    for mine, theirs in ((out_d, out_a), (lse_d, lse_a)):
        assert (mine is None) == (theirs is None)
        if mine is not None:
            assert (mine.shape, mine.stride(), mine.dtype) == (theirs.shape, theirs.stride(), theirs.dtype)
            assert mine.grad_fn is None and not mine.requires_grad


@pytest.mark.parametrize("case", range(len(PAIRS)), ids=IDS)
def test_inputs_without_grad_reach_the_kernel_as_given(regions, case):
    """FA4's detach of an input that requires no grad is the input itself: no tensor is made for it per call."""
    region = regions[case]
    launches: list = []
    inputs = _inputs(region, case, grad=False)
    _bound(region, case, launches).forward(inputs)
    assert launches[0][1][0] is inputs["q"] and launches[0][1][1] is inputs["k"]


ENTRY_CALLS = {  # PAIRS index -> (entry point, q, k, v shapes and extra tensors) as a caller makes them
    0: ("varlen", (4, 1, 32, 128), (4, 1024, 8, 128), {"seqused_k": (4,)}),
    1: ("varlen", (4, 1, 32, 128), (300, 16, 8, 128), {"seqused_k": (4,), "page_table": (4, 64)}),
    3: ("dense", (1, 512, 32, 128), (1, 512, 8, 128), {}),
}


@pytest.fixture()
def lean_over(regions, tmp_path):
    """The lean runtime (fa4_aot's entry points) over a temp store holding `regions`, every kernel a stub that
    notes (PAIRS index of its region, arguments); yields the notes."""
    from fa4_aot import config
    from fa4_aot.domain.signature import Signature
    from fa4_aot.matrix import variants
    from fa4_aot.runtime import api, runner
    from fa4_aot.store import Store, recipes

    sku = variants.load(config.default_variants_file()).skus["h200"]
    store = Store(tmp_path)
    for region in regions:
        recipes.merge(store, recipes.recipe_key(Signature.from_dict(region.signature), sku), [region])
    keys = {k.kernel_key: i for i, r in enumerate(regions) for k in r.kernels}
    launches: list = []

    class Stubs:
        def prefetch(self, keys: list[str]) -> None:
            pass

        def function(self, kernel_key: str, family: str = "", sig: Any = None) -> Any:
            return lambda *args: launches.append((keys[kernel_key], args))

        def functions(self, kernels: list[tuple[str, str]], sig: Any = None, sizes: Any = None) -> list[Any]:
            return [self.function(key, family, sig) for key, family in kernels]

    rt = runner.Runtime(store, sku)
    rt.libraries = Stubs()
    before = runner.runtime
    runner.runtime = lambda cache_dir=None: rt
    api._cache.clear()
    try:
        yield launches
    finally:
        runner.runtime = before
        api._cache.clear()


def _plain_launches(launches: list) -> list:
    import torch

    def plain(a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            return (tuple(a.shape), a.stride(), a.dtype)
        return [plain(x) for x in a] if isinstance(a, list | tuple) else a

    return [(i, plain(args)) for i, args in launches]


@pytest.mark.parametrize("case", sorted(ENTRY_CALLS), ids=[IDS[i] for i in sorted(ENTRY_CALLS)])
def test_a_repeated_call_launches_what_its_first_launched(lean_over, case):
    """The second call of a forward-only call goes through the plan the first bound (runtime.api._plans): the same
    launches, the caller's tensors themselves; a call differing in the scale, the mask or the window plans again
    (another launch, or KernelMissing where no region holds), never reusing a plan."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    import fa4_aot
    from fa4_aot.errors import KernelMissing
    from fa4_aot.runtime import api

    entry, q_shape, kv_shape, extra_shapes = ENTRY_CALLS[case]
    fn = fa4_aot.flash_attn_func if entry == "dense" else fa4_aot.flash_attn_varlen_func
    with FakeTensorMode():
        q = torch.empty(q_shape, dtype=torch.bfloat16, device="cuda")
        k, v = (torch.empty(kv_shape, dtype=torch.bfloat16, device="cuda") for _ in range(2))
        extra = {n: torch.empty(shape, dtype=torch.int32, device="cuda") for n, shape in extra_shapes.items()}
        lse = {"return_lse": True} if case == 1 else {}
        launched = []
        for kwargs in ({}, {}, {"softmax_scale": 0.2}, {}):
            lean_over.clear()
            fn(q, k, v, causal=True, **extra, **lse, **kwargs)
            launched.append(_plain_launches(lean_over))
        assert lean_over[0][1][0] is q and len(api._plans) == 2
        assert launched[0] == launched[1] == launched[3] and launched[0] != launched[2]
        assert [i for i, _ in launched[0]] == [case]
        for other in ({"causal": False}, {"causal": True, "window_size": (128, 0)}):
            with pytest.raises(KernelMissing):
                fn(q, k, v, **other, **extra, **lse)
    api._cache.clear()
    assert not api._plans
