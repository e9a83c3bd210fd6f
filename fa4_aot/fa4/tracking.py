"""Which call is FA4 running? install() wraps FA4's autograd functions so that a kernel missing from the
store can be reported with the Call that needed it (a summary: FA4_AOT_RECORD appends it, record.py) and the
exact record of its arguments (fa4_aot/domain/exact.py), which `fa4-aot build --from-misses` replays to build exactly
the kernels that call asked for. Importing this module imports no FA4: only capture() and from_arguments()
touch FA4 or torch.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

from ..domain import call_log
from ..domain.calls import Call, dtype_name, mask_of, pass_of
from . import exact_replay

_current = threading.local()
_per_call: Callable[[Call, str], None] | None = None  # check_calls(): judges each call before FA4 runs it
Describe = Callable[[], dict[str, Any] | None]  # the exact record of the call in flight, made only when asked
_UNSUPPORTED = ("qv", "gather_kv_indices", "score_mod", "mask_mod", "block_sparse_tensors", "aux_tensors")


def current() -> Call | None:
    """The Call FA4 is running on this thread, when install() could describe it, else None."""
    return getattr(_current, "call", None)


def current_record() -> dict[str, Any] | None:
    """The exact record (fa4_aot/domain/exact.py) of the call FA4 runs on this thread, or None. Made when asked, i.e. on
    a miss: describing every call would cost each one microseconds."""
    describe = getattr(_current, "describe", None)
    return describe() if describe is not None else None


@contextmanager
def running(call: Call | None, describe: Describe | None = None) -> Iterator[None]:
    previous = current(), getattr(_current, "describe", None)
    _current.call, _current.describe = call, describe
    try:
        yield
    finally:
        _current.call, _current.describe = previous


def check_calls(check: Callable[[Call, str], None] | None) -> None:
    """Have `check(call, part)` judge each call install() can describe before FA4 runs it: part "fwd" before a
    forward, "bwd" before a backward; whatever it raises (KernelRefused) stops the call. None: no check. The
    certification gate's scoped refusals need it: FA4 loads a kernel once, then launches it at every size."""
    global _per_call
    _per_call = check


def capture() -> None:
    """Wrap FlashAttnFunc and FlashAttnVarlenFunc (forward and backward) so that current() describes the call.
    Idempotent. Calls this module cannot describe (score_mod, block sparsity, MLA...) run with current() None."""
    from flash_attn.cute.interface import FlashAttnFunc, FlashAttnVarlenFunc

    for fn, layout in ((FlashAttnFunc, "dense"), (FlashAttnVarlenFunc, "varlen")):
        if getattr(fn.forward, "_fa4_aot_wrapped", False):
            continue
        fn.forward = staticmethod(_wrap_forward(fn.forward, layout, fn.__name__))
        fn.backward = staticmethod(_wrap_backward(fn.backward))


def _wrap_forward(forward: Any, layout: str, entry: str) -> Any:
    signature = inspect.signature(forward)

    def wrapped(ctx: Any, *args: Any, **kwargs: Any) -> Any:
        arguments: dict[str, Any] = {}
        call = None
        try:  # describing the call must never break it
            arguments = dict(signature.bind(ctx, *args, **kwargs).arguments)
            del arguments["ctx"]  # ctx will hold `describe`, which holds these: no reference cycle through ctx
            call = from_arguments(layout, arguments)
        except Exception:  # a call a Call cannot summarise (MLA...) may still have an exact record
            pass
        ctx._fa4_aot_call = call
        if call is not None:
            call_log.note(call)  # FA4_AOT_RECORD: append each distinct call (no-op when unset)

        def describe() -> dict[str, Any] | None:
            return exact_replay.describe(entry, arguments) if arguments else None

        # a backward needs the forward's record after the forward returned: kept on ctx, for training calls only
        # (what it holds besides the tensors FA4 saves for backward anyway is small integer metadata)
        ctx._fa4_aot_describe = describe if _training(arguments) else None
        if _per_call is not None and call is not None:
            _per_call(call, "fwd")
        with running(call, describe):
            return forward(ctx, *args, **kwargs)

    wrapped._fa4_aot_wrapped = True  # type: ignore[attr-defined]
    return wrapped


def _wrap_backward(backward: Any) -> Any:
    def wrapped(ctx: Any, dout: Any, dlse: Any) -> Any:
        forward = getattr(ctx, "_fa4_aot_describe", None)

        def describe() -> dict[str, Any] | None:
            return exact_replay.with_backward(forward(), dout, dlse) if forward is not None else None

        call = getattr(ctx, "_fa4_aot_call", None)
        if _per_call is not None and call is not None:
            _per_call(call, "bwd")
        with running(call, describe):
            return backward(ctx, dout, dlse)

    return wrapped


def _training(a: dict[str, Any]) -> bool:
    """FA4's own `requires_grad` test: any input requires grad, whatever the grad mode (autograd runs
    Function.forward with grad disabled)."""
    return any(getattr(a.get(name), "requires_grad", False) for name in ("q", "k", "v", "qv", "learnable_sink"))


def from_arguments(layout: str, a: dict[str, Any]) -> Call | None:
    """The Call behind FA4 forward arguments `a` (as bound to FlashAttn[Varlen]Func.forward), or None."""
    if any(a.get(name) is not None for name in _UNSUPPORTED):
        return None
    q, k, v = a["q"], a["k"], a["v"]
    dtype = dtype_name(q.dtype)
    window = a.get("window_size") or (None, None)
    if dtype is None or (window != (None, None) and None in window):
        return None
    local = window != (None, None)
    # FA4 keeps LSE and compiles the training kernels when any input requires grad (its own `requires_grad`),
    # whatever the grad mode: is_grad_enabled() is False here even inside a training step (which recorded
    # training misses as "fwd")
    training = _training(a)
    layout, batch, sq, sk, page = _layout_shape(layout, a, q, k)
    return Call.from_dict({
        "layout": layout, "dtype": dtype, "head_dim": q.shape[-1], "head_dim_v": v.shape[-1],
        "pass_": pass_of(training=training, deterministic=bool(a.get("deterministic")),
                         return_lse=bool(a.get("return_lse"))),
        "mask": mask_of(causal=bool(a.get("causal")), local=local),
        "window": cast(tuple[int, int], window) if local else (0, 0),
        "softcap": float(a.get("softcap") or 0.0), "sink": a.get("learnable_sink") is not None,
        "num_splits": int(a.get("num_splits", 1)), "batch": batch, "seqlen_q": sq, "seqlen_k": sk,
        "heads_q": q.shape[-2], "heads_kv": k.shape[-2], "page_size": page,
    })


def _layout_shape(layout: str, a: dict[str, Any], q: Any, k: Any) -> tuple[str, int, int, int, int]:
    """(layout, batch, seqlen_q, seqlen_k, page_size) in Call's logical terms."""
    if layout == "dense":
        return "dense", q.shape[0], q.shape[1], k.shape[1], 0
    if a.get("page_table") is not None:
        table = a["page_table"]
        return "paged", table.shape[0], q.shape[1], table.shape[1] * k.shape[1], k.shape[1]
    if a.get("cu_seqlens_q") is not None:
        return "varlen", a["cu_seqlens_q"].shape[0] - 1, a["max_seqlen_q"], a["max_seqlen_k"], 0
    return "seqused", q.shape[0], q.shape[1], k.shape[1], 0
