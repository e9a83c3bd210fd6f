"""`fa4-aot coverage`: would these calls (or this model's signatures) run from the store without compiling?

Two runtimes are judged. FA4 over install() (`--runtime fa4`): given the kernels FA4's dispatch picks for each call
(planned on fake tensors in processes configured for the SKU, as a build plans) and what the store holds, each call
is served or missing, with the kernels it lacks and the command that adds them. The lean runtime (`--runtime
lean`): a call is served when a recipe region of its signature (store.recipes.sources: its own file, or its
training signature's for a forward with LSE) holds at its sizes and every kernel that region names is stored for
the SKU with a library for its host; a model signature is served when its regions cover its whole size space
(recipe_space: the points a build explores, drawn afresh) with every kernel present. Judging is pure (`judge`,
`judge_lean`); no GPU and, for the lean runtime, no FA4 is needed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..spec.calls import Call

if TYPE_CHECKING:
    from .coverage_lean import Kernel, Lookup

@dataclass
class Verdict:
    label: str  # what was asked: a call, or a model signature
    calls: list[Any]  # the Calls, or the Signature, judged
    kernels: list[Kernel] = field(default_factory=list)
    missing: list[Kernel] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # FA4 rejected a call: no build can serve it
    fix: str = ""  # the command that adds what is missing
    unrecorded: list[str] = field(default_factory=list)  # lean runtime: calls no recipe region holds for

    @property
    def served(self) -> bool:
        return not self.missing and not self.errors and not self.unrecorded

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "served": self.served, "items": [c.to_dict() for c in self.calls],
                "kernels": len(self.kernels),
                "missing": [{"family": f, "kernel_key": k} for f, k in self.missing], "errors": self.errors,
                "unrecorded": self.unrecorded, "fix": "" if self.served else self.fix}


def judge(label: str, calls: list[Any], planned: Iterable[tuple[list[Kernel], str]], has: Callable[[str], bool],
          fix: str) -> Verdict:
    """Pure: `planned` holds, per call, its kernels and FA4's error ('' when none); `has(kernel_key)` says whether
    the store holds a kernel. Missing kernels are listed once, in first-seen order."""
    verdict = Verdict(label=label, calls=calls, fix=fix)
    seen: dict[Kernel, None] = {}
    for (kernels, error), call in zip(planned, calls, strict=True):
        if error:
            verdict.errors.append(f"{label if not isinstance(call, Call) else call.describe()}: {error}")
        for kernel in kernels:
            seen[kernel] = None
    verdict.kernels = list(seen)
    verdict.missing = [k for k in verdict.kernels if not has(k[1])]
    return verdict


def judge_lean(label: str, calls: list[Any], lookups: Iterable[Lookup], has: Callable[[str], bool],
               fix: str) -> Verdict:
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
    verdict.kernels = list(seen)
    verdict.missing = [k for k in verdict.kernels if not has(k[1])]
    return verdict


def summary(verdicts: list[Verdict]) -> dict[str, Any]:
    served = sum(v.served for v in verdicts)
    return {"served": served, "missing": len(verdicts) - served, "total": len(verdicts),
            "ok": served == len(verdicts), "results": [v.to_dict() for v in verdicts]}


def lines(verdicts: list[Verdict]) -> list[str]:
    """Human-readable report: one line per item, the missing kernels and the fix under each missing one."""
    out = []
    for v in verdicts:
        if v.served:
            out.append(f"served   {v.label}  ({len(v.kernels)} kernel(s))")
            continue
        lacks = f", {len(v.unrecorded)} without a recipe region" if v.unrecorded else ""
        out.append(f"MISSING  {v.label}  ({len(v.missing)} of {len(v.kernels)} kernel(s) not in the store{lacks})")
        out += [f"    {family} {key[:16]}…" for family, key in v.missing]
        out += [f"    {e}" for e in v.unrecorded]
        out += [f"    FA4 rejects {e}" for e in v.errors]
        if v.missing or v.unrecorded:
            out.append(f"    add with: {v.fix}")
    s = summary(verdicts)
    out.append(f"{s['served']} of {s['total']} served, {s['missing']} missing")
    return out


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
def plan(sku: Any, store_root: Path, items: list[Any], jobs: int = 1) -> list[tuple[list[Kernel], str]]:
    """Per item (a Call: its kernels at its shapes; a Signature: at every shape), (its kernels, FA4's one-line
    error or ''). Planned on fake tensors for `sku`; nothing is compiled."""
    from ..store import Store
    from .executors import LocalExecutor

    out: list[tuple[list[Kernel], str]] = [([], "") for _ in items]
    if not items:
        return out
    jobs = max(1, min(jobs, len(items)))
    chunks = [list(range(i, len(items), jobs)) for i in range(jobs)]
    ex = LocalExecutor(jobs)
    try:
        chunked = [[("coverage", items[i]) for i in chunk] for chunk in chunks]
        for c, (kernels, failures, _regions, _errors) in ex.plan(sku, Store(store_root), chunked, record=False):
            for family, _ident, kernel_key, local, _call in kernels:
                out[chunks[c][local]][0].append((family, kernel_key))
            for local, error in failures:
                out[chunks[c][local]] = (out[chunks[c][local]][0], error)
    finally:
        ex.close()
    return out


RUNTIMES = ("fa4", "lean")


def check_calls(sku: Any, store: Any, calls: list[Call], calls_file: Path, jobs: int = 1,
                runtime: str = "fa4") -> list[Verdict]:
    """One verdict per call on `runtime`; the fix builds exactly the calls of the file."""
    fix = f"fa4-aot build --sku {sku.name} --calls {calls_file}"
    if runtime == "lean":
        from . import coverage_lean

        found = coverage_lean.Regions(store, sku)
        return [judge_lean(c.describe(), [c], [found.of_call(c)], coverage_lean.held(store, sku), fix)
                for c in calls]
    planned = plan(sku, store.root, calls, jobs)
    return [judge(c.describe(), [c], [p], _held(store, sku), fix) for c, p in zip(calls, planned, strict=True)]


def check_model(sku: Any, store: Any, model: Any, tps: tuple[int, ...], workloads: tuple[str, ...],
                model_arg: str, jobs: int = 1, runtime: str = "fa4") -> list[Verdict]:
    """One verdict per (TP degree, signature) of `model` on `runtime`, judged over the signature's shape-complete
    plan (fa4) or its whole size space (lean)."""
    from ..matrix import modelwork

    items = modelwork.items(model, tps, workloads)
    fixes = [f"fa4-aot build --sku {sku.name} --model {model_arg} --tp {item.tp} --workload {','.join(item.workloads)}"
             for item in items]
    if runtime == "lean":
        from . import coverage_lean

        found = coverage_lean.Regions(store, sku)
        return [judge_lean(item.label, [item.signature], [found.of_signature(item.signature)],
                           coverage_lean.held(store, sku), fix) for item, fix in zip(items, fixes, strict=True)]
    planned = plan(sku, store.root, [i.signature for i in items], jobs)
    return [judge(item.label, [item.signature], [p], _held(store, sku), fix)
            for item, p, fix in zip(items, planned, fixes, strict=True)]


def _held(store: Any, sku: Any) -> Any:
    """Whether the store serves a base kernel key to `sku`: the kernel, or its variant for the SKU's consumed
    constants (issue 13: base keys are shared by the SKUs of an arch)."""
    from .orchestrator import stored_key

    return lambda base: stored_key(store, base, sku) is not None
