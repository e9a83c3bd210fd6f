"""From check outcomes to kernel verdicts: which kernel a failed check blames. Pure.

A check launches a few kernels, in two parts: the forward (the attention kernel, the split-KV combine) and the
backward (preprocess, the backward kernel, postprocess). A wrong `out` or `lse`, or a crash or hang while the
forward ran, points at the forward's kernels; a wrong gradient, a deterministic backward that does not repeat, or a
crash or hang in the backward, at the backward's. Within that part, a wrong tensor suspects the kernels that
compute it: dv is the backward kernel's (and, with GQA, its postprocess's), never the preprocess's, which only
feeds dq and dk (the rowsum of dO * O in dS). Of the suspects, a failure blames those that no passing evidence
clears (a kernel shared with checks that passed, such as a combine or preprocess kernel, is not blamed for another
kernel's fault); when every suspect passed elsewhere, it blames the part's main kernel (the attention kernel
itself, compiled for the signature), not the helpers shared across signatures, where another signature's checks
passed: a refusal of a shared helper would refuse every signature that uses it.
Evidence of passing: every kernel of a passing check, and the forward's kernels of a check whose forward outputs
were right. A check that raised a Python error (FA4 refusing the call, a kernel missing) is evidence of nothing,
and so is one that ran out of GPU memory, whatever status it came with (out_of_memory: the GPU was full, at a size
no kernel's fault; the default h200 build's certification at -j 16 on the H200 gave 8 kernels a crash verdict and a
measured known-bad entry for a tiny call that met a GPU full of other workers' cached memory).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from ..domain.verdicts import Verdict, severity
from .plan import Use
from .pool import Outcome

_FORWARD = ("out", "lse")
_MEMORY = ("out of memory", "outofmemoryerror")  # torch's OutOfMemoryError, CUDA's cudaErrorMemoryAllocation
MEMORY_NOTE = "out of GPU memory, not a kernel fault"  # how the checker's answer says so


def out_of_memory(detail: str) -> bool:
    """Whether an error's text says the GPU ran out of memory (torch.OutOfMemoryError, or a CUDA error 'out of
    memory' from a kernel launch or a module load)."""
    text = detail.lower()
    return any(m in text for m in _MEMORY)


def evidence(outcome: Outcome) -> bool:
    """Whether an outcome says anything about its kernels: not a Python error, not running out of memory."""
    return outcome.status != "error" and not out_of_memory(outcome.detail)


def part_of_failure(failure: dict[str, Any]) -> str:
    """fwd for a wrong out or lse (also as the lean runtime's), else bwd."""
    name = failure.get("output") or failure.get("tensor", "")
    return "fwd" if name in _FORWARD else "bwd"


def failing_parts(outcome: Outcome) -> set[str]:
    if not evidence(outcome):
        return set()
    if outcome.status == "wrong":
        return {part_of_failure(f) for f in outcome.failures}
    if outcome.status in ("crash", "hang"):
        return {outcome.part}
    return set()


def cleared(outcomes: list[Outcome]) -> set[str]:
    """Kernel keys with passing evidence (see the module)."""
    found: set[str] = set()
    for o in outcomes:
        if o.status == "pass":
            found.update(u.kernel_key for u in o.check.kernels)
        elif o.status == "wrong" and "fwd" not in failing_parts(o):
            found.update(u.kernel_key for u in o.check.kernels if u.part == "fwd")
    return found


def verdicts(outcomes: list[Outcome], device: str, toolchain: str) -> list[Verdict]:
    """One verdict per kernel that any outcome gives evidence about, for device class `device`."""
    passing = cleared(outcomes)
    blamed: dict[str, list[Outcome]] = defaultdict(list)
    checks: dict[str, int] = defaultdict(int)
    for o in outcomes:
        if not evidence(o):
            continue
        for u in o.check.kernels:
            checks[u.kernel_key] += 1
        for use in _blamed(o, passing):
            blamed[use.kernel_key].append(o)
    found = []
    for key in sorted(set(checks) | set(blamed)):
        if blamed[key]:
            found.append(_failed(key, blamed[key], device, toolchain, checks[key]))
        elif key in passing:
            found.append(Verdict(key, device, "pass", checks=checks[key], toolchain=toolchain))
    return found


def _blamed(outcome: Outcome, passing: set[str]) -> list[Use]:
    found: dict[str, Use] = {}
    for suspects in _suspected(outcome):
        unexplained = [u for u in suspects if u.kernel_key not in passing]
        main = [u for u in suspects if not helper(u.family)]
        found.update((u.kernel_key, u) for u in unexplained or main or suspects)
    return list(found.values())


def _suspected(outcome: Outcome) -> list[list[Use]]:
    """The kernels each failure of `outcome` suspects: those of its part computing its tensor (see the module)."""
    if not evidence(outcome):
        return []
    if outcome.status in ("crash", "hang"):
        return [[u for u in outcome.check.kernels if u.part == outcome.part]]
    if outcome.status != "wrong":
        return []
    found = []
    for failure in outcome.failures:
        part, name = part_of_failure(failure), failure.get("output") or failure.get("tensor", "")
        found.append([u for u in outcome.check.kernels
                      if u.part == part and not (name == "dv" and "preprocess" in u.family)])
    return found


def helper(family: str) -> bool:
    """Whether a kernel family is a helper of a part (preprocess, postprocess, the split-KV combine), shared by
    the signatures whose main kernels differ."""
    return any(word in family for word in ("preprocess", "postprocess", "combine"))


def _failed(key: str, outcomes: list[Outcome], device: str, toolchain: str, checks: int) -> Verdict:
    worst = max(outcomes, key=lambda o: severity(_status(o)))
    calls = list(dict.fromkeys(o.check.describe() for o in outcomes))[:3]
    if worst.status != "wrong":
        return Verdict(key, device, _status(worst), detail=f"{worst.detail} ({worst.part}) at {calls[0]}"[:1900],
                       checks=checks, calls=calls, toolchain=toolchain)
    failure = max(worst.failures, key=_badness)
    detail = f"{failure.get('detail') or failure.get('tensor')} at {worst.check.describe()}"
    return Verdict(key, device, "wrong", detail=detail[:1900], tensor=failure.get("tensor", ""),
                   error=_finite(failure.get("error")), bound=_finite(failure.get("bound")), checks=checks,
                   calls=calls, toolchain=toolchain)


def _finite(value: Any) -> float | None:
    """A measured error as a verdict keeps it: None for NaN or an infinity (verdicts are strict JSON)."""
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def _badness(failure: dict[str, Any]) -> float:
    """How far past its bound a failure is: a non-finite error (NaN in an output) counts as the worst."""
    error = failure.get("error")
    if not isinstance(error, int | float) or not math.isfinite(error):
        return math.inf
    return float(error) / max(float(failure.get("bound") or 0.0), 1e-30)


def _status(outcome: Outcome) -> str:
    return outcome.status if outcome.status in ("wrong", "crash", "hang") else "pass"
