"""The known-bad registry: (FA4 and CuTe DSL version, arch, signature) combinations whose kernels must not run.

The project's file, known_bad.toml beside this module, lists what upstream reports and what was measured here;
a store adds the entries its own certification measured (`fa4-aot certify`: Store.known_bad, JSON of the same
form, each entry naming its SKU and kernel keys). An entry is

    [[bad]]
    id = "sm90-bwd-dq-hd72-80"                 # unique, lowercase
    symptom = "wrong dq (rel. error 1.3)"      # what goes wrong, for people
    source = "Dao-AILab/flash-attention#2896"  # an upstream issue, or the certification run that measured it
    flash_attn = ["4.0.0b36"]                  # flash-attn-4 versions it holds for ("*": any)
    cutlass_dsl = ["*"]                        # nvidia-cutlass-dsl versions it holds for
    arch = ["sm_90a"]                          # arch targets ("*": any)
    parts = ["bwd"]                            # which kernels of a matching call: fwd (forward, combine), bwd
    sku = ["h200"]                             # optional: only these SKUs (measured entries)
    kernel_keys = ["<64 hex>", ...]            # optional: only these kernels (measured entries)
    [bad.when]                                 # the signature predicate: every field given must hold
    head_dim = [72, 80]                        # a value, a list of values, or {min = ..., max = ...}
    pass_ = ["bwd", "bwd_det"]

The planner and the builders treat a call that matches as FA4 refusing it (never built, never published); both
runtimes refuse to launch a matching kernel (trust/certified.py). Pure: reading the file is the only I/O.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .calls import DTYPES, LAYOUTS, MASKS, PASSES
from .signature import Signature
from .skus import ARCH_RE, ARCHS

FORMAT = 1
PARTS = ("fwd", "bwd")
FIELDS = tuple(f.name for f in fields(Signature))
_ID = re.compile(r"[a-z0-9][a-z0-9._-]{0,99}")
_HEX = re.compile(r"[0-9a-f]{64}")
_VERSION = re.compile(r"[0-9][0-9A-Za-z.+!_-]*")  # a version as a distribution's metadata gives it
_SKU = re.compile(r"[a-z0-9][a-z0-9-]*")  # a SKU name, as the SKU table allows them
# What the matcher compares each list field with, as (the rule a value must follow, whether it does)
_LISTS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "flash_attn": ("expected '*' or a flash-attn-4 version as installed, e.g. 4.0.0b36",
                   lambda v: v == "*" or _VERSION.fullmatch(v)),
    "cutlass_dsl": ("expected '*' or an nvidia-cutlass-dsl version as installed, e.g. 4.8.1",
                    lambda v: v == "*" or _VERSION.fullmatch(v)),
    "arch": (f"expected '*' or an arch target as the SKU table names it, e.g. {', '.join(ARCHS[:2])}",
             lambda v: v == "*" or ARCH_RE.fullmatch(v)),
    "parts": ("parts must be among fwd, bwd", lambda v: v in PARTS),
    "sku": ("expected a SKU name of the table (lowercase letters, digits and '-')", lambda v: _SKU.fullmatch(v)),
    "kernel_keys": ("kernel_keys must be 64 hex digits each (lowercase)", lambda v: _HEX.fullmatch(v)),
}
# What a call's signature holds in each field (Signature.to_dict), as (what it is, whether a `when` value can equal
# it); a `when` value that cannot is refused, since the entry would never match
_FORMS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    **{name: (f"one of {', '.join(choices)}", frozenset(choices).__contains__)
       for name, choices in (("layout", LAYOUTS), ("pass_", PASSES), ("dtype", DTYPES), ("mask", MASKS))},
    **{name: ("a whole number", lambda v: _whole(v))
       for name in ("head_dim", "head_dim_v", "num_splits", "heads_q", "heads_kv", "page_size")},
    "softcap": ("a finite number", lambda v: _number(v)),
    "sink": ("true or false", lambda v: isinstance(v, bool)),
    "window": ("a [left, right] pair of whole numbers",
               lambda v: isinstance(v, list) and len(v) == 2 and all(_whole(x) for x in v)),
}
_RANGED = ("head_dim", "head_dim_v", "num_splits", "heads_q", "heads_kv", "page_size", "softcap")


def part_of(family: str) -> str:
    """The part a kernel of FA4's compile-cache `family` belongs to: its backward ('bwd', preprocess and
    postprocess included) or its forward ('fwd', the split-KV combine included)."""
    return "bwd" if "bwd" in family else "fwd"


def default_file() -> Path:
    return Path(__file__).with_name("known_bad.toml")


@dataclass(frozen=True)
class Bad:
    """One registry entry (see the module)."""

    id: str
    symptom: str
    source: str
    when: dict[str, Any]
    flash_attn: tuple[str, ...] = ("*",)
    cutlass_dsl: tuple[str, ...] = ("*",)
    arch: tuple[str, ...] = ("*",)
    parts: tuple[str, ...] = PARTS
    sku: tuple[str, ...] = ()
    kernel_keys: tuple[str, ...] = ()

    def describe(self) -> str:
        """What a refusal says: the symptom and where it is known from."""
        return f"known bad ({self.id}): {self.symptom} (source: {self.source})"

    def holds(self, sig: Signature | Mapping[str, Any], *, arch: str, versions: Mapping[str, str],
              part: str | None = None, sku: str | None = None, kernel_key: str | None = None) -> bool:
        """Whether this entry names a kernel of `part` (None: any part) of a call of signature `sig` on `arch`,
        built by a toolchain of `versions` ({distribution: version}, as Entry.toolchain and fa4.toolchain()
        give them). A predicate on sku or kernel keys holds only when the caller gives that value and it matches."""
        values = sig.to_dict() if isinstance(sig, Signature) else sig
        checks = (
            _any_of(self.flash_attn, versions.get("flash-attn-4", "")),
            _any_of(self.cutlass_dsl, versions.get("nvidia-cutlass-dsl", "")),
            _any_of(self.arch, arch),
            part is None or part in self.parts,
            not self.sku or sku in self.sku,
            not self.kernel_keys or kernel_key in self.kernel_keys,
        )
        return all(checks) and all(_value_holds(want, values.get(name)) for name, want in self.when.items())

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        return {k: list(v) if isinstance(v, tuple) else v for k, v in data.items() if v != ()}


@dataclass(frozen=True)
class Registry:
    """The entries in force: the project's file, then what a store measured."""

    revision: int
    entries: tuple[Bad, ...] = field(default_factory=tuple)

    def find(self, sig: Signature | Mapping[str, Any], *, arch: str, versions: Mapping[str, str],
             part: str | None = None, sku: str | None = None, kernel_key: str | None = None) -> Bad | None:
        """The first entry that names this kernel or call (Bad.holds), or None."""
        for bad in self.entries:
            if bad.holds(sig, arch=arch, versions=versions, part=part, sku=sku, kernel_key=kernel_key):
                return bad
        return None

    def plus(self, more: list[Bad]) -> Registry:
        known = {b.id for b in self.entries}
        return Registry(self.revision, self.entries + tuple(b for b in more if b.id not in known))


def parse_entry(data: Any, where: str) -> Bad:
    """One entry from its TOML or JSON table; ConfigError naming `where`, the field and what is allowed."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: a known-bad entry must be a table")
    allowed = {f.name for f in fields(Bad)}
    unknown = sorted(set(data) - allowed)
    missing = [n for n in ("id", "symptom", "source", "when") if n not in data]
    if unknown or missing:
        raise ConfigError(f"{where}: known-bad entry {data.get('id')!r}: missing {missing or 'nothing'}, unknown "
                          f"{unknown or 'nothing'} (allowed: {', '.join(sorted(allowed))})")
    if not isinstance(data["id"], str) or not _ID.fullmatch(data["id"]):
        raise ConfigError(f"{where}: known-bad id {data['id']!r}: lowercase letters, digits, '.', '_', '-'")
    for name in ("symptom", "source"):
        if not isinstance(data[name], str) or not data[name].strip():
            raise ConfigError(f"{where}: known-bad entry {data['id']}: {name} must be a non-empty string")
    when = data["when"]
    if not isinstance(when, dict) or not when:
        raise ConfigError(f"{where}: known-bad entry {data['id']}: `when` must be a non-empty table of "
                          f"signature fields ({', '.join(FIELDS)})")
    _check_when(when, f"{where}: known-bad entry {data['id']}")
    lists = {name: _listed(name, data.get(name), f"{where}: known-bad entry {data['id']}")
             for name in _LISTS if name in data}
    return Bad(id=data["id"], symptom=data["symptom"].strip(), source=data["source"].strip(), when=dict(when),
               **lists)


def parse(data: Any, where: str) -> Registry:
    """A registry document ({format, revision, bad: [...]}) from TOML or JSON; ConfigError when malformed."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ConfigError(f"{where}: not a known-bad registry of format {FORMAT} (a `format = {FORMAT}` line)")
    revision = data.get("revision")
    if not isinstance(revision, int) or isinstance(revision, bool) or revision < 0:
        raise ConfigError(f"{where}: `revision` must be a whole number, raised on every change")
    entries = data.get("bad", [])
    if not isinstance(entries, list):
        raise ConfigError(f"{where}: `bad` must be a list of [[bad]] tables")
    parsed = [parse_entry(e, f"{where} [[bad]] #{i + 1}") for i, e in enumerate(entries)]
    ids = [b.id for b in parsed]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"{where}: known-bad ids repeat: {sorted({i for i in ids if ids.count(i) > 1})}")
    return Registry(revision, tuple(parsed))


def load(path: Path | None = None) -> Registry:
    """The project's registry (known_bad.toml beside this module) or the file at `path`."""
    import tomllib

    path = path or default_file()
    try:
        data = tomllib.loads(path.read_text())
    except OSError as e:
        raise ConfigError(f"cannot read the known-bad registry {path}: {e.strerror}") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from e
    return parse(data, str(path))


def measured_document(entries: list[Bad]) -> bytes:
    """What a store keeps of the entries its certification measured (Store.put_known_bad): canonical JSON."""
    doc = {"format": FORMAT, "revision": len(entries), "bad": [b.to_dict() for b in entries]}
    return json.dumps(doc, sort_keys=True, indent=1).encode()


def repros(doc: Any, where: str) -> dict[str, str]:
    """The `repros` map of a measured document ({entry id: a one-file repro's Python source}; none: {}).
    ConfigError when it is not a map of strings."""
    data = doc.get("repros", {}) if isinstance(doc, dict) else {}
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise ConfigError(f"{where}: `repros` must map known-bad ids to Python source")
    return dict(data)


def _any_of(allowed: tuple[str, ...], value: str) -> bool:
    return "*" in allowed or value in allowed


def _value_holds(want: Any, value: Any) -> bool:
    if isinstance(value, tuple | list):  # a window: `want` is one [left, right], or a list of them
        if isinstance(want, list) and want and all(isinstance(w, list) for w in want):
            return any(list(value) == w for w in want)
        return bool(list(value) == want)
    if isinstance(want, dict):
        return isinstance(value, int | float) and not isinstance(value, bool) \
            and bool(want.get("min", value) <= value <= want.get("max", value))
    if isinstance(want, list):
        return any(_value_holds(w, value) for w in want)
    return bool(value == want)


def _check_when(when: dict[str, Any], where: str) -> None:
    """ConfigError unless every value of `when` can equal what a call's signature holds in its field (_FORMS): an
    entry that can never match is a refusal that silently never happens."""
    for name, want in when.items():
        if name not in FIELDS:
            raise ConfigError(f"{where}: `when.{name}` is not a signature field ({', '.join(FIELDS)})")
        for one in _alternatives(name, want, f"{where}: when.{name}"):
            _check_value(name, one, f"{where}: when.{name}")
    windows = _alternatives("window", when["window"], where) if "window" in when else []
    masks = _alternatives("mask", when["mask"], where) if "mask" in when else []
    if masks and "local" not in masks and any(w != [0, 0] for w in windows):
        raise ConfigError(f"{where}: when.window {when['window']} never matches with when.mask {when['mask']}: "
                          "only a call of mask \"local\" has a window; add \"local\" to mask or drop the window")


def _alternatives(name: str, want: Any, where: str) -> list[Any]:
    """The values of which `want` (a value, a range, or a list of them; a window is itself a list) names any."""
    one_window = name == "window" and isinstance(want, list) and not any(isinstance(w, list) for w in want)
    if not isinstance(want, list) or one_window:
        return [want]
    if not want:
        raise ConfigError(f"{where}: an empty list never matches: list at least one value, or leave the field out "
                          "(any value)")
    return want


def _check_value(name: str, value: Any, where: str) -> None:
    kind, fits = _FORMS[name]
    if isinstance(value, dict):
        _check_range(name, value, where)
    elif not fits(value):
        raise ConfigError(f"{where}: expected a value, a list of values or a {{min, max}} range, where a call's "
                          f"{name} is {kind}: {str(value)[:60]!r} never matches")


def _check_range(name: str, bounds: dict[str, Any], where: str) -> None:
    if not bounds or set(bounds) - {"min", "max"} or not all(_number(v) for v in bounds.values()):
        raise ConfigError(f"{where}: a range is {{min = N, max = N}} (either may be left out) of finite numbers")
    if name not in _RANGED:
        raise ConfigError(f"{where}: a range never matches a call's {name}, which is {_FORMS[name][0]}: list the "
                          "values instead")
    if bounds.get("min", -math.inf) > bounds.get("max", math.inf):
        raise ConfigError(f"{where}: the range {bounds} is empty (min > max) and never matches; swap the bounds")


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _listed(name: str, value: Any, where: str) -> tuple[str, ...]:
    """The strings of list field `name` (a string alone is a list of one); ConfigError naming the field unless
    each can equal what the matcher compares it with (_LISTS), and the list is not empty."""
    found = _strings(value, f"{where}: {name}")
    if not found:
        raise ConfigError(f"{where}: {name} is empty, so the entry never matches: list at least one value, or "
                          f"leave {name} out (any)")
    rule, fits = _LISTS[name]
    for item in found:
        if not fits(item):
            raise ConfigError(f"{where}: {name} {item[:80]!r} never matches: {rule}")
    return found


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{where}: expected a list of strings")
    return tuple(value)
