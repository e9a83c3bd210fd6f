"""`fa4-aot coverage`: would these calls (or this model's signatures) run from the store without compiling?

Two runtimes are judged. FA4 over install() (`--runtime fa4`): given the kernels FA4's dispatch picks for each call
(planned on fake tensors in processes configured for the SKU, as a build plans) and what the store holds, each call
is served, missing (with the kernels it lacks and the command that adds them) or refused (the known-bad registry
names it: refusals.py; no build serves it). The lean runtime (`--runtime
lean`): a call is served when a recipe region of its signature (store.recipes.sources: its own file, or its
training signature's for a forward with LSE) holds at its sizes and every kernel that region names is stored for
the SKU with a library for its host; a model signature is served when its regions cover its whole size space
(recipe_space: the points a build explores, drawn afresh) with every kernel present. Each verdict also counts
its stored kernels' certification (trust/standing.py: certified, failed, unchecked). Judging is pure (`judge`,
`judge_lean`); no GPU and, for the lean runtime, no FA4 is needed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from ..domain import narrow_build
from ..domain.calls import Call
from ..errors import ConfigError
from ..trust import standing

if TYPE_CHECKING:
    from .coverage_lean import Kernel, Lookup

Standing = Callable[[str], str]  # a stored kernel's base key -> certified, failed or unchecked (trust/standing.py)


class Planned(NamedTuple):
    """What planning found of one item."""

    kernels: list[Kernel]
    error: str = ""  # FA4's one-line error: no build can serve it
    refused: str = ""  # the known-bad registry's reason (refusals.py): no build serves it


@dataclass
class Verdict:
    label: str  # what was asked: a call, or a model signature
    calls: list[Any]  # the Calls, or the Signature, judged
    kernels: list[Kernel] = field(default_factory=list)
    missing: list[Kernel] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # FA4 rejected a call: no build can serve it
    fix: str = ""  # the command that adds what is missing
    unrecorded: list[str] = field(default_factory=list)  # lean runtime: calls no recipe region holds for
    refused: list[str] = field(default_factory=list)  # the known-bad registry refused a call: never built
    standings: dict[str, str] = field(default_factory=dict)  # stored kernels' base key -> certification

    @property
    def served(self) -> bool:
        return not self.missing and not self.errors and not self.unrecorded and not self.refused

    def certification(self) -> dict[str, int]:
        return standing.counts(self.standings.values())

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "served": self.served, "items": [c.to_dict() for c in self.calls],
                "kernels": len(self.kernels),
                "missing": [{"family": f, "kernel_key": k} for f, k in self.missing], "errors": self.errors,
                "unrecorded": self.unrecorded, "refused": self.refused, "certification": self.certification(),
                "failed_kernels": [{"family": f, "kernel_key": k} for f, k in self.failed_kernels()],
                "fix": "" if self.served else self.fix}

    def failed_kernels(self) -> list[Kernel]:
        return [k for k in self.kernels if self.standings.get(k[1]) == "failed"]


def judge(label: str, calls: list[Any], planned: Iterable[tuple[Any, ...]], has: Callable[[str], bool],
          fix: str, standing_of: Standing | None = None) -> Verdict:
    """Pure: `planned` holds, per call, a Planned (its kernels, FA4's error, the registry's refusal; a plain
    (kernels, error) pair too); `has(kernel_key)` says whether the store holds a kernel and `standing_of` its
    certification. Missing kernels are listed once, in first-seen order."""
    verdict = Verdict(label=label, calls=calls, fix=fix)
    seen: dict[Kernel, None] = {}
    for found, call in zip(planned, calls, strict=True):
        kernels, error, refused = Planned(*found)
        what = label if not isinstance(call, Call) else call.describe()
        verdict.errors += [f"{what}: {error}"] if error else []
        verdict.refused += [f"{what}: {refused}"] if refused else []
        for kernel in kernels:
            seen[kernel] = None
    return _held(verdict, list(seen), has, standing_of)


def _held(verdict: Verdict, kernels: list[Kernel], has: Callable[[str], bool],
          standing_of: Standing | None) -> Verdict:
    """`verdict` with its kernels, those the store lacks, and the certification of those it holds."""
    verdict.kernels = kernels
    verdict.missing = [k for k in kernels if not has(k[1])]
    if standing_of is not None:
        verdict.standings = {k[1]: standing_of(k[1]) for k in kernels if k not in verdict.missing}
    return verdict


def judge_lean(label: str, calls: list[Any], lookups: Iterable[Lookup], has: Callable[[str], bool],
               fix: str, standing_of: Standing | None = None) -> Verdict:
    """Pure: the lean runtime's verdict on `calls` (one Lookup each): served when a region holds for each and
    `has(kernel key)` (stored for the SKU, with a library for its host) for every kernel of those regions."""
    verdict = Verdict(label=label, calls=calls, fix=fix)
    seen: dict[Kernel, None] = {}
    for lookup, call in zip(lookups, calls, strict=True):
        what = call.describe() if isinstance(call, Call) else label
        if lookup.unsupported:
            verdict.errors.append(f"{what}: {lookup.unsupported}")
        elif lookup.outside:
            verdict.unrecorded.append(f"{what}: no recipe region holds at {lookup.outside}")
        for kernel in lookup.kernels:
            seen[kernel] = None
    return _held(verdict, list(seen), has, standing_of)


def summary(verdicts: list[Verdict]) -> dict[str, Any]:
    """Counts over the verdicts (refused ones are not counted as missing: no build serves them) and the
    certification of the distinct stored kernels they need."""
    served = sum(v.served for v in verdicts)
    refused = sum(bool(v.refused) and not v.served for v in verdicts)
    kernels = {key: s for v in verdicts for key, s in v.standings.items()}
    return {"served": served, "missing": len(verdicts) - served - refused, "refused": refused,
            "total": len(verdicts), "ok": served == len(verdicts),
            "certification": standing.counts(kernels.values()), "results": [v.to_dict() for v in verdicts]}


def lines(verdicts: list[Verdict]) -> list[str]:
    """Human-readable report: per item a line (served, MISSING or REFUSED) with its kernels' certification, the
    missing kernels and the fix, or the registry's reason; then the totals."""
    out = [line for v in verdicts for line in _item_lines(v)]
    s = summary(verdicts)
    refused = f", {s['refused']} refused (known bad)" if s["refused"] else ""
    certified = ", ".join(f"{n} {name}" for name, n in s["certification"].items()) if _checked(verdicts) else ""
    out.append(f"{s['served']} of {s['total']} served, {s['missing']} missing{refused}"
               + (f"; stored kernels: {certified}" if certified else ""))
    return out


def _item_lines(v: Verdict) -> list[str]:
    cert = "; " + ", ".join(f"{n} {name}" for name, n in v.certification().items()) if v.standings else ""
    if v.served:
        return [f"served   {v.label}  ({len(v.kernels)} kernel(s){cert})"] + _failed_lines(v)
    if v.refused and not (v.missing or v.unrecorded or v.errors):
        return [f"REFUSED  {v.label}  (the known-bad registry names it: no build serves it; `fa4-aot known-bad`)"] \
            + [f"    {why}" for why in v.refused]
    lacks = f", {len(v.unrecorded)} without a recipe region" if v.unrecorded else ""
    out = [f"MISSING  {v.label}  ({len(v.missing)} of {len(v.kernels)} kernel(s) not in the store{lacks}{cert})"]
    out += [f"    {family} {key[:16]}…" for family, key in v.missing]
    out += [f"    {e}" for e in v.unrecorded]
    out += [f"    FA4 rejects {e}" for e in v.errors]
    out += [f"    refused: {e}" for e in v.refused]
    out += _failed_lines(v)
    if v.missing or v.unrecorded:
        out.append(f"    add with: {v.fix}")
    return out


def _failed_lines(v: Verdict) -> list[str]:
    return [f"    failed certification: {family} {key[:16]}… (refused at run time; `fa4-aot list` shows why)"
            for family, key in v.failed_kernels()]


def _checked(verdicts: list[Verdict]) -> bool:
    return any(v.standings for v in verdicts)


# -- calls files ----------------------------------------------------------------------------------------------
def _object(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    return data


def read_calls(path: Path) -> list[Call]:
    """The calls of a JSON-lines file (blank lines skipped, duplicates kept once, order kept).
    Raises ConfigError naming file and line."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"cannot read calls file {path}: {e.strerror}") from e
    out: dict[Call, None] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            out[Call.from_dict(_object(json.loads(raw)))] = None
        except (ValueError, TypeError) as e:
            raise ConfigError(f"{path}:{number}: not a call ({e}); lines are what FA4_AOT_RECORD writes: "
                              "one JSON object per line with layout, pass_, dtype, head_dim, ... page_size") from e
    if not out:
        raise ConfigError(f"{path}: no calls (record some with FA4_AOT_RECORD={path})")
    return list(out)


# -- the shell: plan through FA4's dispatch in processes configured for the SKU, as a build does -----------------
def plan(sku: Any, store_root: Path, items: list[Any], jobs: int = 1) -> list[Planned]:
    """Per item (a Call: its kernels at its shapes; a Signature: at every shape), a Planned: its kernels, FA4's
    one-line error and the known-bad registry's refusal (refusals.py: the registry in force for the store).
    Planned on fake tensors for `sku`; nothing is compiled."""
    from ..store import Store
    from .executors import LocalExecutor

    out = [Planned([]) for _ in items]
    if not items:
        return out
    jobs = max(1, min(jobs, len(items)))
    chunks = [list(range(i, len(items), jobs)) for i in range(jobs)]
    ex = LocalExecutor(jobs)
    try:
        chunked = [[("coverage", items[i]) for i in chunk] for chunk in chunks]
        for c, found in ex.plan(sku, Store(store_root), chunked, record=False):
            for kernel in found.kernels:
                out[chunks[c][kernel.work_index]].kernels.append((kernel.family, kernel.kernel_key))
            for rejected in found.rejected:
                i = chunks[c][rejected.work_index]
                out[i] = out[i]._replace(refused=rejected.error) if rejected.known_bad else \
                    out[i]._replace(error=rejected.error)
    finally:
        ex.close()
    return out


RUNTIMES = ("fa4", "lean")


def check_calls(sku: Any, store: Any, calls: list[Call], calls_file: Path, jobs: int = 1,
                runtime: str = "fa4") -> list[Verdict]:
    """One verdict per call on `runtime`; the fix builds exactly the calls of the file."""
    fix = narrow_build.for_calls_file(sku.name, calls_file)
    if runtime == "lean":
        from . import coverage_lean

        found, certified = coverage_lean.Regions(store, sku), _in_store(store, sku)[1]
        return [judge_lean(c.describe(), [c], [found.of_call(c)], coverage_lean.held(store, sku), fix, certified)
                for c in calls]
    planned = plan(sku, store.root, calls, jobs)
    held, certified = _in_store(store, sku)
    return [judge(c.describe(), [c], [p], held, fix, certified) for c, p in zip(calls, planned, strict=True)]


def check_model(sku: Any, store: Any, model: Any, tps: tuple[int, ...], workloads: tuple[str, ...],
                model_arg: str, jobs: int = 1, runtime: str = "fa4") -> list[Verdict]:
    """One verdict per (TP degree, signature) of `model` on `runtime`, judged over the signature's shape-complete
    plan (fa4) or its whole size space (lean)."""
    from ..matrix import modelwork

    items = modelwork.items(model, tps, workloads)
    fixes = [narrow_build.for_model(sku.name, model_arg, item.tp, item.workloads) for item in items]
    if runtime == "lean":
        from . import coverage_lean

        found, certified = coverage_lean.Regions(store, sku), _in_store(store, sku)[1]
        return [judge_lean(item.label, [item.signature], [found.of_signature(item.signature)],
                           coverage_lean.held(store, sku), fix, certified)
                for item, fix in zip(items, fixes, strict=True)]
    planned = plan(sku, store.root, [i.signature for i in items], jobs)
    held, certified = _in_store(store, sku)
    return [judge(item.label, [item.signature], [p], held, fix, certified)
            for item, p, fix in zip(items, planned, fixes, strict=True)]


def _in_store(store: Any, sku: Any) -> tuple[Callable[[str], bool], Standing]:
    """Whether the store serves a base kernel key to `sku` (the kernel, or its variant for the SKU's consumed
    constants: base keys are shared by the SKUs of an arch), and the certification of the kernel it
    serves (its verdicts are kept under that key)."""
    from .orchestrator import stored_key

    verdicts = standing.Verdicts(store)

    def certified(base: str) -> str:
        key = stored_key(store, base, sku)
        return verdicts.standing(key) if key is not None else "unchecked"

    return (lambda base: stored_key(store, base, sku) is not None), certified
