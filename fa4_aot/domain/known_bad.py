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
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .signature import Signature

FORMAT = 1
PARTS = ("fwd", "bwd")
FIELDS = tuple(f.name for f in fields(Signature))
_ID = re.compile(r"[a-z0-9][a-z0-9._-]{0,99}")
_HEX = re.compile(r"[0-9a-f]{64}")


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
    for name, want in when.items():
        if name not in FIELDS:
            raise ConfigError(f"{where}: known-bad entry {data['id']}: `when.{name}` is not a signature field "
                              f"({', '.join(FIELDS)})")
        _check_value(want, f"{where}: known-bad entry {data['id']}: when.{name}")
    lists = {name: _strings(data.get(name), f"{where}: known-bad entry {data['id']}: {name}")
             for name in ("flash_attn", "cutlass_dsl", "arch", "parts", "sku", "kernel_keys") if name in data}
    if any(p not in PARTS for p in lists.get("parts", ())):
        raise ConfigError(f"{where}: known-bad entry {data['id']}: parts must be among {', '.join(PARTS)}")
    if any(not _HEX.fullmatch(k) for k in lists.get("kernel_keys", ())):
        raise ConfigError(f"{where}: known-bad entry {data['id']}: kernel_keys must be 64 hex digits each")
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


def _check_value(want: Any, where: str) -> None:
    if isinstance(want, dict):
        if not want or set(want) - {"min", "max"} or not all(
                isinstance(v, int | float) and not isinstance(v, bool) for v in want.values()):
            raise ConfigError(f"{where}: a range is {{min = N, max = N}} (either may be left out)")
    elif isinstance(want, list):
        for w in want:
            if isinstance(w, list) and all(isinstance(x, int) for x in w):
                continue  # a window, [left, right]
            _check_value(w, where)
    elif not isinstance(want, str | int | float | bool):
        raise ConfigError(f"{where}: expected a value, a list of values or a {{min, max}} range")


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{where}: expected a list of strings")
    return tuple(value)
