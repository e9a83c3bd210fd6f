"""`fa4-aot certify`: run a store's kernels on a GPU of their SKU and keep a verdict per kernel and device class.

1. Plan (plan.py): checks drawn from the recipe regions of the signatures asked for (the variants matrix, a
   model, calls), PER_KERNEL per kernel. Kernels that already have a verdict for this device class are skipped
   (a run is resumable; `again` checks them anew). A check whose kernels the known-bad registry names is not run:
   they get `refused`, unless `recheck_known_bad` (to see whether a new FA4 fixed them).
2. Run (pool.py, checker.py): `jobs` worker processes per GPU, each check under a deadline; every outcome is
   appended to a journal as it comes, so an interrupted run resumes where it stopped. The wide checks (a KV pool
   past 32-bit offsets, plan._wide) run last with one worker per GPU, the GPU to itself, and with them once more
   each check that ran out of GPU memory (an error, never a verdict: blame.out_of_memory).
   A failing check is run again with other inputs in its worker, and only failures that reproduce count
   (reproduce.py); the others are reported as marginal.
3. Ask the oracle: each check that still failed runs once more through FA4's own JIT, in fresh workers with no
   kernel of the store (pool ORACLE). A failure the JIT reproduces is FA4's; one it does not is ours, a defect of
   fa4-aot (a wrong kernel, launch or check) to fix, never a known-bad entry.
4. Judge (blame.py) and keep: verdicts into the store; for each failure that is FA4's (or that no oracle ran), a
   measured known-bad entry for the SKU (its signature, part, symptom and this run as its source), which the
   planner and both runtimes then honour.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..domain import devices, known_bad, scopes
from ..domain.signature import Signature
from ..domain.skus import Sku
from ..domain.verdicts import DeviceClass, Verdict
from ..store import Store
from ..trust.certified import registry_for
from . import blame, measured, plan
from .pool import Outcome, Pool

Progress = Callable[[int, int, Outcome], None]


@dataclass
class Report:
    """What a run did: verdicts kept, what it could not check, and its time."""

    sku: str
    device: str
    verdicts: list[Verdict] = field(default_factory=list)
    checks: int = 0
    skipped: int = 0  # checks whose kernels all had a verdict for this device already
    after_crash: int = 0  # checks not run: the same kernels had crashed or hung in another check
    errors: list[str] = field(default_factory=list)  # checks that raised before judging (no verdict from them)
    out_of_memory: int = 0  # of those, checks that ran out of GPU memory (also when run alone on the GPU)
    unreached: list[str] = field(default_factory=list)
    measured: list[known_bad.Bad] = field(default_factory=list)
    scopes: scopes.Scopes = scopes.NONE  # where the measured entries hold (domain/scopes.py)
    findings: list[Finding] = field(default_factory=list)
    marginal: list[dict[str, Any]] = field(default_factory=list)  # misses that did not reproduce
    seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)  # seconds of each step of the module's list: where a
    # run's time went (plan, checks, oracle, keep)
    check_steps: dict[str, float] = field(default_factory=dict)  # the workers' seconds by step of a check
    # (checker.Clock), summed over the checks: where the checks' time went
    interrupted: bool = False

    def counts(self) -> dict[str, int]:
        found: dict[str, int] = {}
        for v in self.verdicts:
            found[v.status] = found.get(v.status, 0) + 1
        return found

    def to_dict(self) -> dict[str, Any]:
        return {"sku": self.sku, "device": self.device, "counts": self.counts(), "checks": self.checks,
                "skipped": self.skipped, "after_crash": self.after_crash, "seconds": round(self.seconds, 1),
                "phases": {name: round(s, 1) for name, s in self.phases.items()}, "interrupted": self.interrupted,
                "check_steps": {name: round(s, 1) for name, s in self.check_steps.items()},
                "verdicts": [v.to_dict() for v in self.verdicts], "errors": self.errors,
                "out_of_memory": self.out_of_memory,
                "unreached": self.unreached, "measured_known_bad": [b.to_dict() for b in self.measured],
                "scoped_refusals": {i: s.describe() for i, s in self.scopes.entries.items()},
                "findings": [f.to_dict() for f in self.findings],
                "findings_by_origin": {o: sum(f.origin == o for f in self.findings) for o in ORIGINS},
                "marginal": self.marginal}


ORIGINS = ("fa4", "ours", "unknown")


@dataclass(frozen=True)
class Finding:
    """A check whose failure reproduced, and whose it is (`origin`): `fa4` when FA4's own JIT fails the same
    check, `ours` when the JIT passes it (a defect of fa4-aot), `unknown` when no oracle ran or it could not
    (`oracle` says what it did)."""

    check: str
    status: str
    part: str
    failures: list[dict[str, Any]]
    detail: str
    origin: str
    oracle: str
    kernels: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.check, "status": self.status, "part": self.part, "failures": self.failures,
                "detail": self.detail, "origin": self.origin, "oracle": self.oracle, "kernels": self.kernels}


@dataclass(frozen=True)
class Options:
    jobs: int = 1  # worker processes per GPU
    gpus: tuple[int, ...] = ()  # default: every visible GPU
    deadline: float = 120.0  # seconds one check may take before its worker counts as hung
    again: bool = False
    recheck_known_bad: bool = False
    lean: bool = True  # also run each check on the lean runtime and compare it with FA4
    journal: Path | None = None
    variants: Path | None = None  # the SKU table the run was given: the workers read the same
    oracle: bool = True  # run each finding through FA4's own JIT to tell FA4's bugs from ours


def certify(store: Store, sku: Sku, items: Iterable[tuple[str, Signature]] | None = None, *,
            keys: set[str] | None = None, options: Options = Options(), progress: Progress | None = None,
            stop: Callable[[], bool] = lambda: False) -> Report:
    """Certify, in `store` on this host's GPUs, the kernels of `items` ((label, signature) pairs; default: every
    signature the store recorded for `sku`), only those in `keys` when given (see the module). Raises Fa4AotError
    (UnknownSku) when there is no GPU, or it is not of `sku`."""
    start = time.monotonic()
    device = devices.certifying({sku.name: sku}, sku.name)[1]  # a GPU of `sku`, or UnknownSku says why
    report = Report(sku.name, device.id)
    planned = plan.plan(store, sku, plan.signatures_in(store, sku, keys) if items is None else items,
                        keys=keys)
    report.unreached = planned.unreached
    certified = set() if options.again else _certified(store, planned.kernels(), device.id,
                                                           options.recheck_known_bad)
    fresh = [c for c in planned.checks if not {u.kernel_key for u in c.kernels} <= certified]
    report.skipped = len(planned.checks) - len(fresh)
    todo, refused = _split(fresh, store, sku, device, options.recheck_known_bad)
    done = read_journal(options.journal) if options.journal else {}
    named = _ids(todo)
    pending = [(i, c) for i, c in named if i not in done]
    report.checks = len(todo)
    lap = _laps(report.phases, start)
    lap("plan")
    run = _Run(store, sku, options, {i: done[i] for i, _c in named if i in done}, len(todo), progress, stop)
    run.all(pending)
    lap("checks")
    outcomes = list(run.found.values())
    report.check_steps = _steps(outcomes)
    origins = run.oracle(outcomes) if options.oracle else {}
    lap("oracle")
    report.interrupted = stop()
    report.after_crash = len(todo) - len(outcomes)
    report.findings = [_finding(o, origins.get(o.ident, ("unknown", "no oracle ran"))) for o in outcomes
                       if blame.failing_parts(o)]
    report.marginal = [{"check": o.check.describe(), **m} for o in outcomes for m in o.marginal]
    _keep(store, sku, device, report, outcomes, refused, {i for i, (origin, _) in origins.items() if origin == "ours"})
    lap("keep")
    if options.journal and not report.interrupted:
        options.journal.unlink(missing_ok=True)  # kept in the store now: a later run starts afresh
    report.seconds = time.monotonic() - start
    return report


@dataclass
class _Run:
    """The outcomes of one certification run by check id (a later outcome of a check replaces its first), each
    journalled and shown as it comes."""

    store: Store
    sku: Sku
    options: Options
    found: dict[str, Outcome]
    total: int
    progress: Progress | None
    stop: Callable[[], bool]
    lost: set[frozenset[str]] = field(default_factory=set)  # kernel sets that crashed or hung: their other checks
    # would only do it again

    def all(self, pending: list[tuple[str, plan.Check]]) -> None:
        """Run `pending` on the options' workers, the wide checks last with one worker per GPU (a KV pool of more
        than 2^31 elements: the GPU to itself), and with them once more each check that ran out of GPU memory (too
        large for its worker's share, or it met a GPU the others had filled)."""
        self.checks([(i, c) for i, c in pending if c.kind != "wide"], self.options.jobs)
        again = [(o.ident, o.check) for o in self.found.values() if blame.out_of_memory(o.detail)] \
            if self.options.jobs > 1 else []
        self.checks([(i, c) for i, c in pending if c.kind == "wide"] + again, 1)

    def checks(self, pending: list[tuple[str, plan.Check]], jobs: int) -> None:
        """Run `pending` on `jobs` workers per GPU."""
        if not pending or self.stop():
            return
        gpus = list(self.options.gpus) or _visible_gpus()
        pool = Pool(self.store.root, self.sku.name, gpus, jobs, self.options.deadline, self.options.lean,
                    variants=self.options.variants)
        for outcome in pool.run(pending, self.stop, skip=lambda c: _kernels(c) in self.lost):
            self.found[outcome.ident] = outcome
            if outcome.status in ("crash", "hang"):
                self.lost.add(_kernels(outcome.check))
            if self.options.journal:
                _journal_add(self.options.journal, outcome)
            if self.progress:
                self.progress(len(self.found), self.total, outcome)

    def oracle(self, outcomes: list[Outcome]) -> dict[str, tuple[str, str]]:
        """(origin, what the JIT did) of each outcome that failed (see Finding), by check id: the same checks,
        run by FA4's own JIT in fresh workers."""
        failed = [(o.ident, o.check) for o in outcomes if blame.failing_parts(o)]
        if not failed or self.stop():
            return {}
        gpus = list(self.options.gpus) or _visible_gpus()
        pool = Pool(self.store.root, self.sku.name, gpus, self.options.jobs, self.options.deadline,
                    variants=self.options.variants, oracle=True)
        return {o.ident: _origin(o) for o in pool.run(failed, self.stop)}


def _laps(phases: dict[str, float], start: float) -> Callable[[str], None]:
    """A stopwatch over `phases`: each call records, under its name, the seconds since the one before (the first:
    since `start`)."""
    last = [start]

    def lap(name: str) -> None:
        now = time.monotonic()
        phases[name] = now - last[0]
        last[0] = now

    return lap


def _steps(outcomes: list[Outcome]) -> dict[str, float]:
    """The workers' seconds by step summed over `outcomes`, and "answered": the seconds from hand-out to answer."""
    found: dict[str, float] = {"answered": sum(o.seconds for o in outcomes)}
    for outcome in outcomes:
        for name, seconds in outcome.steps.items():
            found[name] = found.get(name, 0.0) + seconds
    return found


def _origin(jit: Outcome) -> tuple[str, str]:
    """Whose a finding is, from FA4's JIT's outcome of the same check: a failure there is FA4's, a pass ours."""
    said = "; ".join(f"{f.get('tensor')} {f.get('error')} > {f.get('bound')}" for f in jit.failures) or jit.detail
    if blame.failing_parts(jit):
        return "fa4", f"FA4's JIT: {jit.status} ({jit.part}): {said}"[:500]
    if jit.status == "pass":
        return "ours", "FA4's JIT passes this check: a defect of fa4-aot's kernels, launch or check"
    return "unknown", f"FA4's JIT could not run it: {jit.detail}"[:500]


def _finding(outcome: Outcome, origin: tuple[str, str]) -> Finding:
    return Finding(outcome.check.describe(), outcome.status, outcome.part, outcome.failures, outcome.detail[:500],
                   origin[0], origin[1], [u.kernel_key for u in outcome.check.kernels])


def _kernels(check: plan.Check) -> frozenset[str]:
    return frozenset(u.kernel_key for u in check.kernels)


def signatures_of(work: Iterable[tuple[str, Any]]) -> list[tuple[str, Signature]]:
    """(label, signature) of (label, Call or Signature) work items, each signature once."""
    from ..domain.calls import Call

    found: dict[Signature, str] = {}
    for label, item in work:
        sig = Signature.of(item) if isinstance(item, Call) else item
        if isinstance(sig, Signature):
            found.setdefault(sig, label)
    return [(label, sig) for sig, label in found.items()]


@dataclass(frozen=True)
class Judgement:
    """What a run's outcomes say (judge): a verdict per kernel, the measured known-bad entries, the sizes they hold
    at, and each entry's one-file repro by id."""

    verdicts: list[Verdict]
    measured: list[known_bad.Bad]
    scopes: scopes.Scopes
    repros: dict[str, str]


def judge(store: Store, sku: Sku, device: str, outcomes: list[Outcome], ours: Set[str] = frozenset()
          ) -> Judgement:
    """Certify's judging of `outcomes` on `device` (a device class id), reading `store` only: blame.verdicts, and a
    measured known-bad entry for each failure but those that are `ours` (check ids): a defect of fa4-aot is a bug
    to fix, not a fact about FA4 for the registry."""
    verdicts = blame.verdicts(outcomes, device, _toolchain(store, outcomes))
    fa4s = [o for o in outcomes if o.ident not in ours]
    made, found, repros = measured.entries(fa4s, outcomes, verdicts, sku, device, store.get_entry)
    return Judgement(verdicts, made, found, repros)


def _keep(store: Store, sku: Sku, device: DeviceClass, report: Report, outcomes: list[Outcome],
          refused: list[Verdict], ours: Set[str] = frozenset()) -> None:
    """The run's judgement (judge) into `report` and the store: verdicts, and the measured known-bad entries."""
    judged = judge(store, sku, device.id, outcomes, ours)
    report.verdicts = judged.verdicts + refused
    report.errors = [f"{o.check.describe()}: {o.detail}" for o in outcomes if o.status == "error"]
    report.out_of_memory = sum(blame.out_of_memory(o.detail) for o in outcomes)
    store.put_verdicts(report.verdicts)
    report.measured, report.scopes = judged.measured, judged.scopes
    if report.measured:
        store.put_known_bad(sku.name, measured.document(store.known_bad(sku.name), report.measured, report.scopes,
                                                        judged.repros))


def _split(checks: list[plan.Check], store: Store, sku: Sku, device: DeviceClass, recheck: bool
           ) -> tuple[list[plan.Check], list[Verdict]]:
    """(the checks to run, `refused` verdicts for the kernels the registry names, whose checks are not run)."""
    if recheck:
        return checks, []
    registry = registry_for(store, sku.name)
    run, refused = [], {}
    for check in checks:
        bad = [(u, b) for u in check.kernels if (b := _bad(registry, store, sku, check.sig, u)) is not None]
        if not bad:
            run.append(check)
        for use, entry in bad:
            refused[use.kernel_key] = (use, entry)
    return run, [Verdict(u.kernel_key, device.id, "refused", detail=b.describe()[:1900])
                 for u, b in refused.values()]


def _bad(registry: known_bad.Registry, store: Store, sku: Sku, sig: Signature, use: plan.Use) -> known_bad.Bad | None:
    entry = store.get_entry(use.kernel_key)
    if entry is None:
        return None
    return registry.find(sig, arch=entry.arch, versions=entry.toolchain, part=use.part, sku=sku.name,
                         kernel_key=use.kernel_key)


def _certified(store: Store, kernels: set[str], device: str, recheck: bool) -> set[str]:
    """The `kernels` that have a verdict for `device` (a `refused` one does not count when the known-bad kernels
    are to be run), each kernel's verdict file read once."""
    return {k for k in kernels
            if any(v.device == device and not (recheck and v.status == "refused") for v in store.verdicts(k))}


def _ids(checks: list[plan.Check]) -> list[tuple[str, plan.Check]]:
    return [(hashlib.sha256(json.dumps(c.to_dict(), sort_keys=True).encode()).hexdigest()[:20], c) for c in checks]


def _visible_gpus() -> list[int]:
    import torch

    return list(range(torch.cuda.device_count()))


def _toolchain(store: Store, outcomes: list[Outcome]) -> str:
    for o in outcomes:
        for u in o.check.kernels:
            entry = store.get_entry(u.kernel_key)
            if entry is not None:
                return f"{entry.toolchain.get('flash-attn-4', '?')}/{entry.toolchain.get('nvidia-cutlass-dsl', '?')}"
    return ""


def default_journal(store: Store, sku: Sku, device: DeviceClass) -> Path:
    """Where a run keeps its outcomes until it ends (outside the store: it is this host's progress, not data)."""
    ident = hashlib.sha256(f"{store.root}\0{sku.name}\0{device.id}".encode()).hexdigest()[:16]
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return base / "fa4-aot" / "certify" / f"{sku.name}-{ident}.jsonl"


def read_journal(path: Path) -> dict[str, Outcome]:
    """The outcomes a run journalled (default_journal), each check's last, by check id."""
    found: dict[str, Outcome] = {}
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return found
    for line in lines:
        try:
            outcome = Outcome.from_dict(json.loads(line))
        except (ValueError, KeyError, TypeError):
            continue  # a line cut short by the interruption
        found[outcome.ident] = outcome
    return found


def _journal_add(path: Path, outcome: Outcome) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(outcome.to_dict()) + "\n")
