"""The certification checker: a worker process on one GPU that runs checks (plan.Check) and says how each went.

`python -m fa4_aot.certify.checker` reads one check per line (JSON) on stdin and answers on stdout, one JSON line
each: {"id", "part": "fwd"|"bwd"} before each part runs (so that a hang or a death is blamed on the part that was
running), then {"id", "status", ...}. Statuses: pass; wrong (failures: [{tensor, error, bound}]); crash (a CUDA
error: the worker exits after saying so, its context is lost); error (a Python error before or around the kernels,
e.g. a kernel missing from the store, or the GPU out of memory: no verdict follows from it). Running out of memory
is never a crash, even when it cost the CUDA context: its answer is an error whose detail says so
(blame.MEMORY_NOTE), with "restart": true when the context is lost (the worker exits after saying so, as for a
crash, and the parent starts another).

The worker keeps to the GPU memory each check was granted (the request's "memory", in bytes: schedule.py; before
the first, an even share of the GPU among FA4_AOT_CERTIFY_JOBS workers) and frees its cached memory after each
check, so that one large check does not starve the others. Each answer says where the check's time went
("steps": seconds by step, and "cpu": this process's CPU seconds over the check).

Each check runs FA4 itself over install() (strict: kernels from the store only) on random inputs and compares
out, lse and the gradients with an fp32 reference in FA4's test style (reference.compare); a deterministic
backward runs twice and must repeat bitwise; the lean runtime runs the same call and must equal FA4 (forward
bitwise; gradients bitwise for the deterministic backward, within the tolerance otherwise). The parent
(pool.py) sets FA4_AOT_CACHE, FA4_AOT_SKU and FA4_AOT_CERTIFIED=off (the kernels under test must load). With
FA4_AOT_CERTIFY_ORACLE=jit the worker is the oracle for a finding: FA4's own JIT compiles and runs the same
check (no install(), no lean runtime), so that a failure it reproduces is FA4's and one it does not is ours. It
gets up to ORACLE_RUNS runs to reproduce it (oracle_run): some of FA4's bugs fail only now and then.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from .. import fa4
from ..domain.signature import Signature
from ..errors import Fa4AotError
from . import reference, reproduce
from .blame import MEMORY_NOTE, out_of_memory
from .inputs import Inputs, make_inputs
from .plan import Check
from .pool import ORACLE, memory_fraction

GRADS = ("dq", "dk", "dv", "dsink")
ORACLE_RUNS = 12  # runs FA4's JIT gets to reproduce a finding. FA4's backward at head dims 128/64 without a mask
# fails only now and then on the same inputs (a check failed 1 of its 5 runs, another 3 of 5, on the H200): one
# run of the JIT passed three such findings, which were then called fa4-aot's. A failure in one run of five is
# missed by 12 runs with probability 0.8^12, 7%; in three of five, 0.4^12, 2e-5


@dataclass(frozen=True)
class Runtimes:
    """What a check calls: FA4's attention (through install()) and, optionally, the lean runtime's, each by
    layout ("dense" takes flash_attn_func's arguments, the others flash_attn_varlen_func's), on `device`."""

    fa4: Callable[[Signature], Any]
    lean: Callable[[Signature], Any] | None
    device: str = "cuda"


def main() -> None:
    from ..client import installation
    from ..runtime import api

    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 reference must be fp32
    torch.backends.cudnn.allow_tf32 = False
    _limit_memory()
    oracle = os.environ.get(ORACLE) == "jit"
    if not oracle:  # the oracle runs FA4's own JIT: no kernel from the store
        installation.install(mode="strict")
    out = sys.stdout
    sys.stdout = sys.stderr  # whatever FA4 or CuTe print must not end up in the answers
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("memory"):
            _limit_memory(int(request["memory"]))
        lean = (lambda sig: api.flash_attn_func if sig.layout == "dense" else api.flash_attn_varlen_func) \
            if request.get("lean", True) and not oracle else None
        runtimes = Runtimes(lambda sig: partial(fa4.attend, sig.call(1, 1, 1)), lean)
        answer = (oracle_run if oracle else run)(request["id"], Check.from_dict(request["check"]), runtimes,
                                                 partial(_say, out))
        _say(out, answer)
        if answer["status"] == "crash" or answer.get("restart"):
            os._exit(3)  # the CUDA context is lost: the parent starts another worker
        torch.cuda.empty_cache()  # this check's blocks go back to the GPU, for the other workers' checks


def _limit_memory(granted: int | None = None) -> None:
    """Keep this worker's PyTorch allocator (FA4's buffers included) to `granted` bytes (default: an even share of
    the GPU): a check past it raises OutOfMemoryError in this worker instead of starving the other workers'."""
    if granted is None:
        fraction = memory_fraction(int(os.environ.get("FA4_AOT_CERTIFY_JOBS", "1")))
    else:
        fraction = min(1.0, granted / torch.cuda.get_device_properties(0).total_memory)
    torch.cuda.set_per_process_memory_fraction(fraction, 0)  # 0: the one GPU the worker sees


class Clock:
    """Seconds by step of one check, summed over its runs (a failing check runs reproduce.REPEATS times more):
    `clock.lap(name)` adds the time since the last lap to `name`. `steps()` adds "cpu", the process's CPU
    seconds since the clock started: far below the wall's sum, the check waited for the GPU."""

    def __init__(self) -> None:
        self._last, self._cpu = time.perf_counter(), time.process_time()
        self.seconds: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._last
        self._last = now

    def steps(self) -> dict[str, float]:
        return {**{n: round(s, 4) for n, s in self.seconds.items()},
                "cpu": round(time.process_time() - self._cpu, 4)}


def run(ident: str, check: Check, runtimes: Runtimes, say: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Run `check` and judge it (see the module): the answer to print. Never raises; `say` is told each part
    before it runs. A check that fails is run reproduce.REPEATS times more, with new inputs and a float64
    reference: only the failures that reproduce (reproduce.confirm) make it `wrong`; the others are listed under
    `marginal` of a passing answer."""
    clock = Clock()
    try:
        failures = judge(ident, check, runtimes, say, clock=clock)
        if not failures:
            return {"id": ident, "status": "pass", "failures": [], "steps": clock.steps()}
        runs = [failures] + [_again(ident, check, runtimes, say, n, clock) for n in range(1, reproduce.REPEATS + 1)]
    except Exception as e:  # a CUDA error, FA4 refusing the call, or a kernel missing from the store
        return _failed(ident, e, runtimes.device)
    confirmed, marginal = reproduce.confirm(runs)
    answer = {"id": ident, "status": "wrong" if confirmed else "pass", "failures": confirmed, "steps": clock.steps()}
    return {**answer, "marginal": marginal} if marginal else answer


def oracle_run(ident: str, check: Check, runtimes: Runtimes, say: Callable[[dict[str, Any]], None],
               runs: int = ORACLE_RUNS) -> dict[str, Any]:
    """The oracle's answer for a finding (see the module): `wrong` with the failures of the first of up to `runs`
    runs that fails (run n on run()'s inputs of seed n: the check's, then its repeats'), `pass` when none does.
    No marginal rule: the finding was confirmed in the store's runs already; the question is only whether FA4's
    own JIT fails the same check. Never raises."""
    clock = Clock()
    try:
        for n in range(runs):
            failures = judge(ident, check, runtimes, say, clock=clock) if n == 0 else \
                _again(ident, check, runtimes, say, n, clock)
            if failures:
                return {"id": ident, "status": "wrong", "failures": failures, "runs": n + 1, "steps": clock.steps()}
    except Exception as e:  # a CUDA error, or FA4 refusing the call
        return _failed(ident, e, runtimes.device)
    return {"id": ident, "status": "pass", "failures": [], "runs": runs, "steps": clock.steps()}


def _again(ident: str, check: Check, runtimes: Runtimes, say: Callable[[dict[str, Any]], None], n: int,
           clock: Clock) -> list[dict[str, Any]]:
    """The failures of run `n` of a failing check: new inputs, a float64 reference, or a float32 one where the
    float64 reference does not fit this worker's share of the GPU (it doubles the reference's memory)."""
    seed = check.seed + n * reproduce.SEED_STRIDE
    try:
        return judge(ident, check, runtimes, say, seed=seed, exact=torch.float64, clock=clock)
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        return judge(ident, check, runtimes, say, seed=seed, clock=clock)


def judge(ident: str, check: Check, runtimes: Runtimes, say: Callable[[dict[str, Any]], None], *,
          seed: int | None = None, exact: torch.dtype = torch.float32, clock: Clock | None = None
          ) -> list[dict[str, Any]]:
    """The failures of `check` (empty: it passed) on the inputs of `seed` (default: the check's), against a
    reference in `exact` precision: FA4 against the references, a deterministic backward twice, the lean runtime
    against FA4. `clock` is told each step as it ends."""
    sig, lap = check.sig, (clock or Clock()).lap
    inputs = make_inputs(sig, check.point, check.seed if seed is None else seed, runtimes.device)
    lap("inputs")
    got = _run(runtimes.fa4(sig), inputs, sig, ident, say)
    lap("fa4")
    ref32 = reference.reference(inputs, sig, dtype=exact)
    low = reference.reference(inputs, sig, dtype=inputs.dtype)
    lap("reference")
    failures = [f.to_dict() for f in reference.compare(got, ref32, low)]
    lap("compare")
    if sig.pass_ == "bwd_det":
        failures += _repeat(got, _run(runtimes.fa4(sig), inputs, sig, ident, say))
        lap("fa4")
    if runtimes.lean is not None:
        lean = _run(runtimes.lean(sig), inputs, sig, ident, say)
        lap("lean")
        failures += _lean(sig, got, lean, ref32, low)
        lap("compare")
    _synchronize(inputs)
    lap("compare")
    return failures


def _run(fn: Any, inputs: Inputs, sig: Signature, ident: str, say: Callable[[dict[str, Any]], None]
         ) -> reference.Outputs:
    """Forward (and, for a training signature, backward with the inputs' dout) of `fn`, synchronised after each
    part so that an asynchronous CUDA error is raised in the part that caused it."""
    say({"id": ident, "part": "fwd"})
    t = inputs.tensors
    result = fn(t["q"], t["k"], t["v"], **inputs.kwargs())
    o, lse = result if isinstance(result, tuple) else (result, None)
    _synchronize(inputs)
    grads: dict[str, Any] = {}
    if sig.pass_ in ("bwd", "bwd_det"):
        say({"id": ident, "part": "bwd"})
        wrt = {name: t[src] for name, src in (("dq", "q"), ("dk", "k"), ("dv", "v"), ("dsink", "learnable_sink"))
               if src in t and t[src] is not None and t[src].requires_grad}
        values = torch.autograd.grad(o, list(wrt.values()), inputs.dout)
        grads = dict(zip(wrt, values, strict=True))
        _synchronize(inputs)
    return reference.Outputs(out=o.detach(), lse=None if lse is None else lse.detach(), **grads)


def _synchronize(inputs: Inputs) -> None:
    if inputs.tensors["q"].is_cuda:
        torch.cuda.synchronize()


def _repeat(first: reference.Outputs, second: reference.Outputs) -> list[dict[str, Any]]:
    """The deterministic backward must give the same bits twice."""
    found = []
    for name in GRADS:
        a, b = getattr(first, name), getattr(second, name)
        if a is not None and not torch.equal(a, b):
            error = float((a.float() - b.float()).abs().max())
            found.append({"tensor": "repeat", "output": name, "error": error, "bound": 0.0,
                          "detail": f"{name} differs between two runs of the deterministic backward"})
    return found


def _lean(sig: Signature, got: reference.Outputs, lean: reference.Outputs, ref32: reference.Outputs,
          low: reference.Outputs) -> list[dict[str, Any]]:
    """The lean runtime against FA4 on the same call: forward bitwise equal; gradients bitwise for the
    deterministic backward, within the reference's tolerance otherwise (FA4's own are not bitwise run to run)."""
    found = []
    exact = ("out", "lse", *(GRADS if sig.pass_ == "bwd_det" else ()))
    for name in exact:
        a, b = getattr(got, name), getattr(lean, name)
        if a is not None and (b is None or not torch.equal(a, b)):
            error = float((a.float() - b.float()).abs().max()) if b is not None else None
            found.append({"tensor": "lean", "output": name, "error": error, "bound": 0.0,
                          "detail": f"the lean runtime's {name} differs from FA4's"})
    if sig.pass_ == "bwd":
        found += [{**f.to_dict(), "tensor": "lean", "output": f.tensor, "detail": f"the lean runtime's {f.tensor}"}
                  for f in reference.compare(lean, ref32, low) if f.tensor in GRADS]
    return found


def _failed(ident: str, e: BaseException, device: str) -> dict[str, Any]:
    """The answer for a check that raised (the parent knows the part that was running from the part lines)."""
    text = f"{type(e).__name__}: {e}".splitlines()[0][:500] if str(e) else type(e).__name__
    if isinstance(e, torch.OutOfMemoryError) or out_of_memory(text):
        return _memory(ident, text, device)
    if isinstance(e, Fa4AotError) or device != "cuda" or not _cuda_lost():
        tail = traceback.format_exception(e)[-3:]
        return {"id": ident, "status": "error", "detail": text, "trace": "".join(tail)[-1500:]}
    return {"id": ident, "status": "crash", "detail": text}


def _memory(ident: str, text: str, device: str) -> dict[str, Any]:
    """The answer for a check that ran out of GPU memory: an error (the GPU was full, or the check too large for
    this worker's share: no kernel's fault), and a restart when the context did not survive it."""
    answer: dict[str, Any] = {"id": ident, "status": "error", "detail": f"{MEMORY_NOTE}: {text}"}
    if device == "cuda" and _cuda_lost():
        answer["restart"] = True
    return answer


def _cuda_lost() -> bool:
    """Whether the CUDA context is unusable (an illegal address and the like poison it for the process)."""
    try:
        torch.cuda.synchronize()
        torch.zeros(1, device="cuda").add_(1).item()
    except Exception:
        return True
    return False


def _say(out: Any, doc: dict[str, Any]) -> None:
    out.write(json.dumps(doc) + "\n")
    out.flush()


if __name__ == "__main__":
    main()
