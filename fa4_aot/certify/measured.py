"""From a certification run's failures to the SKU's measured known-bad entries and their size scopes. Pure.

One entry per failing (signature less its head counts and window, part): its symptom is the worst verdict of the
kernels it blamed, its source this run. Its scope (domain/scopes.py) comes from the sizes of the run's checks of
the same signature and part: where they failed and where they passed. The kernels it blamed are mapped to it, so
that the gate refuses their failed verdicts in the same scope; a kernel blamed by two entries, or by one without
a scope, keeps a whole refusal.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..domain import known_bad, scopes
from ..domain.skus import Sku
from ..domain.verdicts import Verdict
from ..store import Entry
from . import blame, repro_script
from .pool import Outcome


@dataclass
class _Finding:
    part: str
    when: dict[str, Any]
    failing: list[Outcome] = field(default_factory=list)
    kernels: set[str] = field(default_factory=set)


def entries(failing: list[Outcome], outcomes: list[Outcome], verdicts: list[Verdict], sku: Sku, device: str,
            entry_of: Callable[[str], Entry | None]) -> tuple[list[known_bad.Bad], scopes.Scopes, dict[str, str]]:
    """The measured entries of the `failing` outcomes (those that are FA4's), their scopes, judged against
    every outcome of the run (`outcomes`: the passing evidence), and each entry's one-file repro (repro_script.py,
    of its worst failing check) by id."""
    failed = {v.kernel_key: v for v in verdicts if v.status in ("wrong", "crash", "hang")}
    found: dict[str, _Finding] = {}
    for o in failing:
        for part in blame.failing_parts(o):
            keys = [u.kernel_key for u in o.check.kernels if u.part == part and u.kernel_key in failed]
            if keys:
                when = _when(o)
                ident = hashlib.sha256(json.dumps([sku.name, part, when], sort_keys=True).encode()).hexdigest()[:12]
                finding = found.setdefault(f"measured-{sku.name}-{ident}", _Finding(part, when))
                finding.failing.append(o)
                finding.kernels.update(keys)
    made, scoped, owners, repros = [], {}, defaultdict(set), {}
    for ident, f in found.items():
        key = sorted(f.kernels)[0]
        entry = entry_of(key)
        versions = {n: entry.toolchain.get(n, "") for n in ("flash-attn-4", "nvidia-cutlass-dsl")} if entry else {}
        worst = max(f.failing, key=_worst)
        repros[ident] = repro_script.script(worst.check, symptom=_said(worst), versions=versions,
                                            source=f"fa4-aot certify on {device} ({failed[key].when})")
        made.append(known_bad.Bad(
            id=ident, symptom=failed[key].describe(), source=f"fa4-aot certify on {device} ({failed[key].when})",
            when=f.when, flash_attn=(entry.toolchain.get("flash-attn-4", "*"),) if entry else ("*",),
            cutlass_dsl=(entry.toolchain.get("nvidia-cutlass-dsl", "*"),) if entry else ("*",),
            arch=(sku.arch,), parts=(f.part,), sku=(sku.name,)))
        scope = scopes.derive([_sizes(o) for o in f.failing],
                              [_sizes(o) for o in outcomes if _when(o) == f.when and _passed(o, f.part)])
        if scope is not None:
            scoped[ident] = scope
        for k in f.kernels:
            owners[k].add(ident if scope is not None else "")
    kernels = {k: next(iter(ids)) for k, ids in owners.items() if len(ids) == 1 and "" not in ids}
    return made, scopes.Scopes(scoped, kernels), repros


def document(before: bytes | None, made: list[known_bad.Bad], found: scopes.Scopes,
             repros: dict[str, str] | None = None) -> bytes:
    """The store's measured document (Store.put_known_bad) with `made`, `found` and `repros` over what it held
    `before`: an entry measured again replaces its old self, its old scope and its old repro. Scopes and repros
    are top-level maps, which clients that predate them ignore."""
    doc = json.loads(before) if before else {}
    old = list(known_bad.parse(doc, "store").entries) if before else []
    old_scopes = scopes.Scopes.from_document(doc, "store") if before else scopes.NONE
    new = {b.id for b in made}
    kept = {i: s for i, s in old_scopes.entries.items() if i not in new} | dict(found.entries)
    kernels = {k: i for k, i in old_scopes.kernels.items() if i in kept and k not in found.kernels}
    kernels |= dict(found.kernels)
    out = json.loads(known_bad.measured_document(list({b.id: b for b in old + made}.values())))
    out["scopes"] = scopes.Scopes(kept, kernels).to_dict()
    old_repros = known_bad.repros(doc, "store") if before else {}
    out["repros"] = {i: text for i, text in old_repros.items() if i not in new} | dict(repros or {})
    return json.dumps(out, sort_keys=True, indent=1).encode()


def _said(o: Outcome) -> str:
    """What the check of a repro saw: each of FA4's failing tensors, its error and bound, and its ratio at every
    run (reproduce.py's repeats with other inputs); a crash or hang by its detail."""
    said = [f"{f['tensor']} off by {f['error']:.3g} against a bound of {f['bound']:.3g}"
            + (f" (error/bound over {len(f['ratios'])} runs: {', '.join(f'{r:.3g}' for r in f['ratios'])})"
               if f.get("ratios") else "")
            for f in _measured_misses(o) if isinstance(f.get("bound"), (int, float))]
    return f"{o.status} ({o.part}): " + ("; ".join(said) or o.detail or "no detail")


def _worst(o: Outcome) -> float:
    """The largest error/bound of an outcome's failures of FA4's own tensors (a crash or hang: infinite)."""
    ratios = [f["error"] / f["bound"] if f.get("bound") else float("inf") for f in _measured_misses(o)]
    return max(ratios, default=float("inf") if o.status in ("crash", "hang") else 0.0)


def _measured_misses(o: Outcome) -> list[dict[str, Any]]:
    """The failures of `o` that are FA4's own tensors (not the lean runtime's) with a measured error."""
    return [f for f in o.failures if f.get("tensor") != "lean" and isinstance(f.get("error"), (int, float))]


def _when(o: Outcome) -> dict[str, Any]:
    """An entry's signature predicate: the check's signature less its head counts and window."""
    return {k: v for k, v in o.check.sig.to_dict().items() if k not in ("heads_q", "heads_kv", "window")}


def _sizes(o: Outcome) -> dict[str, int | None]:
    page = {"page_size": o.check.sig.page_size} if o.check.sig.page_size else {}
    return scopes.call_sizes({**o.check.point, **page})


def _passed(o: Outcome, part: str) -> bool:
    """Whether `o` is evidence that `part` computed right: a pass (marginal misses included), or a check whose
    forward was right when only its backward failed."""
    if not blame.evidence(o):
        return False
    return o.status == "pass" or (o.status == "wrong" and part == "fwd" and part not in blame.failing_parts(o))
