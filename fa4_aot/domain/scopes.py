"""Where a certification finding holds: the size scope of a measured known-bad entry. Pure.

A finding is measured at a few sizes of a signature (plan.py's points), and the same signature's checks at other
sizes may pass: FA4 4.0.0b36's backward at head dim 128/64 without a mask failed at 37 of 111 sizes on the H200.
A refusal of the whole signature then stops calls that are right. So a measured entry carries a scope: the sizes
(a call's batch, seqlen_q and seqlen_k, as both runtimes know them for every call) where it is refused.

derive() draws the scope from the failing and passing points of the signature's part: for each sequence length,
when every failing point lies below every passing one, the scope holds below the smallest passing value (and
above the largest, the other way round). The scope is the union of those half-lines: a call is refused when any
holds, which refuses every size that no passing check vouches for on that side. The batch is used only where no
sequence length separates (the checks' batch sizes vary by draw, and a chance separation would refuse most
calls).

Where no sequence length separates them, because some passes lie among the failures at degenerate sizes (the
default h100-sxm build on the H100: a bf16 d=256 local softcap backward failed at seqlen_k 2, and passed at
seqlen_k 1 and 2 elsewhere), derive() takes a half-line `seqlen <= most` that holds every failure and reaches to
the nearest pass above them: the passes inside it are refused too (safe), and it is kept only when at least
MIN_BEYOND passes lie above it and they outnumber those inside, so that sizes are served only where most of the
evidence is and more than one pass vouches for them. Only the small sizes are refused so: misses at degenerate
sizes are what rounding explains least well, while a finding that fails across the sizes (FA4's dq bug at head
dims 72 and 80, with chance passes among its failures) keeps no scope. Of such half-lines, the one refusing the
fewest sizes is taken: seqlen_k <= 2 rather than seqlen_q <= 4096.
Where none qualifies (failures interleave with passes throughout, or nothing passed) there is no scope and the
whole signature is refused.

Scopes travel in the known-bad document a store keeps (Store.known_bad) as a top-level map beside its entries,
{"scopes": {"entries": {id: scope}, "kernels": {kernel key: id}}}: a client that predates them reads the entries
alone and refuses their whole signatures (safe), a current one refuses inside the scope only. `kernels` names the
kernels whose failed verdicts are that entry's finding: the gate applies the entry's scope to them too, so that
the verdict and the entry are one record with one scope.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from .calls import Call

AXES = ("batch", "seqlen_q", "seqlen_k")  # a Call's sizes: what both runtimes know of every call
_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class Bound:
    """One half-line: `axis` <= `most` (or >= `least`)."""

    axis: str
    least: int | None = None
    most: int | None = None

    def holds(self, sizes: Mapping[str, int | None]) -> bool:
        value = sizes.get(self.axis)
        if value is None:
            return True  # a size the caller does not know: inside, so that nothing unjudged is served
        return (self.least is None or value >= self.least) and (self.most is None or value <= self.most)

    def describe(self) -> str:
        return f"{self.axis} >= {self.least}" if self.least is not None else f"{self.axis} <= {self.most}"

    def to_dict(self) -> dict[str, Any]:
        return {"axis": self.axis, **({"min": self.least} if self.least is not None else {"max": self.most})}


@dataclass(frozen=True)
class Scope:
    """Where a finding holds: a call whose sizes meet any bound (see the module)."""

    bounds: tuple[Bound, ...]

    def holds(self, sizes: Mapping[str, int | None]) -> bool:
        return any(b.holds(sizes) for b in self.bounds)

    def describe(self) -> str:
        return " or ".join(b.describe() for b in self.bounds)

    def to_list(self) -> list[dict[str, Any]]:
        return [b.to_dict() for b in self.bounds]

    @classmethod
    def from_list(cls, data: Any, where: str) -> Scope:
        """Inverse of to_list; ConfigError naming `where` for anything else (a scope that cannot be read must not
        widen what is served)."""
        if not isinstance(data, list) or not data:
            raise ConfigError(f"{where}: a scope is a non-empty list of {{axis, min}} or {{axis, max}} bounds")
        return cls(tuple(_bound(b, where) for b in data))


def _bound(data: Any, where: str) -> Bound:
    ok = isinstance(data, dict) and data.get("axis") in AXES and len(data) == 2 and \
        sum(k in data for k in ("min", "max")) == 1
    value = data.get("min", data.get("max")) if ok else None
    if not ok or not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"{where}: scope bound {data!r}: expected {{axis: one of {', '.join(AXES)}, min or max: "
                          "a whole number >= 0}")
    return Bound(data["axis"], least=value if "min" in data else None, most=value if "max" in data else None)


def of_call(call: Call) -> dict[str, int | None]:
    """A Call's sizes (domain/calls.Call: what FA4 over install() knows of the call it runs)."""
    return {"batch": call.batch, "seqlen_q": call.seqlen_q, "seqlen_k": call.seqlen_k}


def call_sizes(sizes: Mapping[str, int]) -> dict[str, int | None]:
    """A call's sizes in a Call's terms from recipe-space sizes (a plan's point, the lean runtime's sizes):
    seqlen_q is a varlen call's max_seqlen_q, seqlen_k its max_seqlen_k, or a paged call's pages per sequence
    times the page size (what fa4/tracking's Call gives for the same call)."""
    seqlen_k = sizes.get("max_seqlen_k", sizes.get("seqlen_k"))
    if "pages_per_seq" in sizes and "page_size" in sizes:
        seqlen_k = sizes["pages_per_seq"] * sizes["page_size"]
    return {"batch": sizes.get("batch"), "seqlen_q": sizes.get("max_seqlen_q", sizes.get("seqlen_q")),
            "seqlen_k": seqlen_k}


def derive(failing: Iterable[Mapping[str, int | None]], passing: Iterable[Mapping[str, int | None]]
           ) -> Scope | None:
    """The scope of failures at `failing` sizes given passes at `passing` sizes (Call terms), or None: the whole
    signature (see the module)."""
    failing, passing = list(failing), list(passing)
    bounds = [b for axis in ("seqlen_q", "seqlen_k") if (b := _separating(axis, failing, passing)) is not None]
    if not bounds and (b := _holding(("seqlen_q", "seqlen_k"), failing, passing)) is not None:
        bounds = [b]
    if not bounds and (b := _separating("batch", failing, passing)) is not None:
        bounds = [b]
    return Scope(tuple(bounds)) if bounds else None


MIN_BEYOND = 3  # passes above a half-line that also holds passes, for it to be a scope (see the module)


def _holding(axes: tuple[str, ...], failing: list[Mapping[str, int | None]],
             passing: list[Mapping[str, int | None]]) -> Bound | None:
    """The half-line `axis <= most` of one of `axes` that holds every failing size, reaching to the nearest passing
    size above the failures, with MIN_BEYOND passes above it and more than inside it; of those, the one refusing
    the fewest sizes (see the module). None when there is none."""
    best: Bound | None = None
    for axis in axes:
        bad, good = _values(axis, failing), _values(axis, passing)
        above = [v for v in good if v > max(bad, default=0)]
        if not bad or len(bad) < len(failing) or len(above) < MIN_BEYOND or len(above) <= len(good) - len(above):
            continue
        bound = Bound(axis, most=min(above) - 1)
        if best is None or (bound.most or 0) < (best.most or 0):
            best = bound
    return best


def _separating(axis: str, failing: list[Mapping[str, int | None]], passing: list[Mapping[str, int | None]]
                ) -> Bound | None:
    """The half-line of `axis` holding every failing size and no passing one, bounded by the passing sizes."""
    bad, good = _values(axis, failing), _values(axis, passing)
    if not bad or not good or len(bad) < len(failing):
        return None
    if max(bad) < min(good):
        return Bound(axis, most=min(good) - 1)
    if min(bad) > max(good):
        return Bound(axis, least=max(good) + 1)
    return None


def _values(axis: str, points: list[Mapping[str, int | None]]) -> list[int]:
    """The sizes of `axis` at `points` that name it."""
    return [v for p in points if (v := p.get(axis)) is not None]


@dataclass(frozen=True)
class Scopes:
    """The scopes of a store's measured entries, and the kernels whose failed verdicts each entry stands for."""

    entries: Mapping[str, Scope]
    kernels: Mapping[str, str]

    def of_kernel(self, kernel_key: str) -> tuple[str, Scope] | None:
        """(entry id, scope) of the finding a kernel's failed verdict is, when it has a scope."""
        ident = self.kernels.get(kernel_key)
        scope = self.entries.get(ident) if ident is not None else None
        return (ident, scope) if ident is not None and scope is not None else None

    def to_dict(self) -> dict[str, Any]:
        return {"entries": {i: s.to_list() for i, s in sorted(self.entries.items())},
                "kernels": dict(sorted(self.kernels.items()))}

    @classmethod
    def from_document(cls, doc: Any, where: str) -> Scopes:
        """The `scopes` map of a known-bad document (none: no scope). ConfigError when it is malformed."""
        data = doc.get("scopes", {}) if isinstance(doc, dict) else {}
        if not isinstance(data, dict) or set(data) - {"entries", "kernels"}:
            raise ConfigError(f"{where}: `scopes` must be {{entries: {{id: scope}}, kernels: {{key: id}}}}")
        entries, kernels = data.get("entries", {}), data.get("kernels", {})
        if not isinstance(entries, dict) or not isinstance(kernels, dict) or not all(
                isinstance(k, str) and len(k) == 64 and set(k) <= _HEX and isinstance(v, str) and v in entries
                for k, v in kernels.items()):
            raise ConfigError(f"{where}: `scopes.kernels` must map 64-hex kernel keys to ids of `scopes.entries`")
        return cls({i: Scope.from_list(s, f"{where} scope {i!r}") for i, s in entries.items()}, dict(kernels))


NONE = Scopes({}, {})
