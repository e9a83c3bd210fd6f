"""Whether a failing check's failures reproduce: the rule that turns a miss into a `wrong` verdict. Pure.

FA4's bound on a tensor (reference.tolerance) is an estimate of rounding: twice the error of the same computation
in the input precision, plus two ulps of the values near 0.3. At ordinary sizes it is far above what a correct
kernel misses by. At degenerate sizes (one query, one or two keys, a gradient that cancels to nearly 0) it is a
handful of ulps, and a correct kernel misses it by chance: FA4's own JIT at head dim 64, causal, seqlen_q 1,
seqlen_k 2 gave ratios (error / bound) of 0.5, 0.99-1.0 in four seeds and 5.9 in one, over six seeds (an H100,
FA4 4.0.0b36). A wrong kernel misses it by a systematic amount, at every seed: the wrong dq at head dims 72/80 by
25-73x, the backward 128/64 without a mask by 2-80,000x (bench/certify_findings-*.jsonl).

So a failing check is run again REPEATS more times, each with new random inputs and a float64 reference (the
checker does that: checker.run), and a failure is confirmed, i.e. `wrong`, when
- it is a fact, not a measurement against an estimate: a NaN or infinity, a missing or misshapen tensor, a
  deterministic backward that does not repeat bitwise, a lean runtime whose forward differs bitwise from FA4's
  (bound 0); or
- its median ratio over all runs exceeds MARGIN: it misses at most seeds, by more than rounding scatters; or
- any run misses by more than GROSS times its bound, further than any correct kernel was measured to.
Every other failure is marginal: reported (the check passes, with its marginal failures named), never a verdict.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

REPEATS = 4  # more runs of a failing check, each with new inputs and a float64 reference
MARGIN = 1.25  # the median error / bound a failure must exceed over all runs
GROSS = 10.0  # error / bound past which one run suffices (a correct kernel's worst measured: 5.9)
SEED_STRIDE = 1009  # run n of a check uses seed check.seed + n * SEED_STRIDE (distinct from the plan's seeds)


def identity(failure: dict[str, Any]) -> tuple[str, str]:
    """What a failure is about, the same in every run: (what failed, which tensor)."""
    return str(failure.get("tensor", "")), str(failure.get("output") or failure.get("tensor", ""))


def ratio(failure: dict[str, Any]) -> float:
    """error / bound of one failure: infinite for a non-finite or missing error, or any error over a 0 bound."""
    error, bound = failure.get("error"), failure.get("bound")
    if not isinstance(error, int | float) or not math.isfinite(error):
        return math.inf
    if not isinstance(bound, int | float) or not math.isfinite(bound) or bound <= 0:
        return math.inf if error > 0 or bound == 0 else 0.0
    return float(error) / float(bound)


def confirm(runs: Sequence[Sequence[dict[str, Any]]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(confirmed, marginal) failures of the first run, given every run's failures (runs[0] the check's own, the
    rest its repeats; a run without a failure of some identity passed it, ratio 0). Each failure comes back as
    the first run's, with `ratios` (one per run) added."""
    first = list(runs[0])
    confirmed: list[dict[str, Any]] = []
    marginal: list[dict[str, Any]] = []
    for failure in first:
        ident = identity(failure)
        ratios = [max((ratio(f) for f in run if identity(f) == ident), default=0.0) for run in runs]
        judged = {**failure, "ratios": [r if math.isfinite(r) else None for r in ratios]}
        (confirmed if holds(ratios) else marginal).append(judged)
    return confirmed, marginal


def holds(ratios: Sequence[float]) -> bool:
    """Whether failures of these ratios (one per run) are a defect rather than rounding (see the module)."""
    return any(math.isinf(r) or r > GROSS for r in ratios) or statistics.median(ratios) > MARGIN
