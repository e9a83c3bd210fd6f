"""The SKU table of a variants file: its `[skus.NAME]` tables read and checked, where each row's figures come
from, and the "did you mean" refusal of a SKU name that no table holds."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import UnknownSku
from . import hosts
from .skus import ARCH_RE, ARCHS, Sku
from .tomlsrc import TomlSource

SKU_FIELDS = {"arch": str, "sm_count": int, "l2_bytes": int, "cuda_major": int, "description": str,
              "l2_budget": bool, "host": str}
_OPTIONAL = {"description": "", "l2_budget": False, "host": hosts.DEFAULT}
CUDA_MAJORS = (12, 13)


def table(path: Path) -> dict[str, Sku]:
    """The SKU table of a variants file (its `[skus.NAME]` tables; its variants are not read): what a client
    needs to match its device. Raises ConfigError naming file, line and field."""
    return parse_skus(TomlSource(path))


def parse_skus(src: TomlSource) -> dict[str, Sku]:
    """The `[skus.NAME]` tables of a variants file. Raises ConfigError naming file, line and field.

    `cuda_major = [13, 12]` makes one table several SKUs: the first CUDA major keeps NAME, each further one is
    NAME-cu<major> (h200 and h200-cu12), since FA4 and the CuTe compiler differ per CUDA major."""
    skus: dict[str, Sku] = {}
    for name, table in src.data.get("skus", {}).items():
        majors = _check_table(src, name, table)
        for i, major in enumerate(majors):
            full = name if i == 0 else f"{name}-cu{major}"
            if full in skus or (i and full in src.data.get("skus", {})):
                raise src.fail(f"[skus.{name}]", "cuda_major", f"SKU {full!r} is defined twice")
            skus[full] = Sku(name=full, arch=table["arch"], sm_count=table["sm_count"], l2_bytes=table["l2_bytes"],
                             cuda_major=major, description=table.get("description", ""),
                             l2_budget=table.get("l2_budget", False), host=table.get("host", hosts.DEFAULT))
    return skus


def _check_table(src: TomlSource, name: str, table: dict[str, Any]) -> list[int]:
    """Validate one [skus.NAME] table; return its CUDA majors, first one first."""
    header = f"[skus.{name}]"
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", name):
        raise src.fail(header, None, "SKU names are lowercase letters, digits and '-'")
    _check_fields(src, header, table)
    _check_values(src, header, table)
    return _cuda_majors(src, header, table)


def _check_fields(src: TomlSource, header: str, table: dict[str, Any]) -> None:
    """Every field known, every required one present, each of its type (cuda_major is checked apart)."""
    for key in table:
        if key not in SKU_FIELDS:
            raise src.fail(header, key, f"unknown field; allowed: {', '.join(SKU_FIELDS)}")
    for key, typ in SKU_FIELDS.items():
        if key not in table:
            if key in _OPTIONAL:
                continue
            raise src.fail(header, None, f"missing field {key!r}")
        wrong = not isinstance(table[key], typ) or (typ is not bool and isinstance(table[key], bool))
        if key != "cuda_major" and wrong:
            raise src.fail(header, key, f"expected {typ.__name__}, got {table[key]!r}")


def _check_values(src: TomlSource, header: str, table: dict[str, Any]) -> None:
    """An arch target FA4 has kernels for, a known host target, positive figures."""
    if not ARCH_RE.fullmatch(table["arch"]):
        raise src.fail(header, "arch", f"{table['arch']!r} is not an arch target like 'sm_90a' or 'sm_100a'")
    if table["arch"] not in ARCHS:
        raise src.fail(header, "arch", f"{table['arch']!r}: FA4 targets {', '.join(ARCHS)}")
    if table.get("host", hosts.DEFAULT) not in hosts.TARGETS:
        raise src.fail(header, "host", f"{table['host']!r} is not a host target; known: {', '.join(hosts.TARGETS)}")
    for key in ("sm_count", "l2_bytes"):
        if table[key] <= 0:
            raise src.fail(header, key, "must be positive")


def _cuda_majors(src: TomlSource, header: str, table: dict[str, Any]) -> list[int]:
    """The table's CUDA majors (an int or a list of distinct ones), first one first."""
    majors = table["cuda_major"] if isinstance(table["cuda_major"], list) else [table["cuda_major"]]
    if any(not isinstance(m, int) or isinstance(m, bool) for m in majors):
        raise src.fail(header, "cuda_major", f"expected int or a list of ints, got {table['cuda_major']!r}")
    if not majors or any(m not in CUDA_MAJORS for m in majors) or len(set(majors)) < len(majors):
        raise src.fail(header, "cuda_major", f"got {table['cuda_major']!r}; allowed values: 12, 13, or a list of "
                       "them such as [13, 12] (the first keeps the name, the others are NAME-cu12...)")
    return majors


def sources(lines: list[str]) -> dict[str, str]:
    """Where each SKU's figures come from: the comment lines just above or just below its `[skus.NAME]`
    header in variants.toml, joined (pure: takes the file's lines)."""
    found: dict[str, str] = {}
    for i, line in enumerate(lines):
        m = re.fullmatch(r"\s*\[skus\.([A-Za-z0-9-]+)\]\s*(#.*)?", line)
        if m:
            found[m.group(1)] = " ".join(c.strip().lstrip("#").strip() for c in _comments_around(lines, i))
    return found


def _comments_around(lines: list[str], i: int) -> list[str]:
    """The comment lines just above line `i` (up to a `# ---` rule) and just below it, in file order."""
    above: list[str] = []
    for prev in reversed(lines[:i]):
        if not prev.lstrip().startswith("#") or prev.lstrip().startswith("# ---"):
            break
        above.insert(0, prev)
    below = []
    for nxt in lines[i + 1:]:
        if not nxt.lstrip().startswith("#"):
            break
        below.append(nxt)
    return above + below


def unknown(name: str, known: Iterable[str], what: str = "SKU") -> UnknownSku:
    """UnknownSku for `name`, listing `known` with a "did you mean" (case-insensitive, close spellings)."""
    names = sorted(set(known))
    folded = {n.lower(): n for n in names}
    low = name.lower()
    close = ([folded[low]] if low in folded else [n for n in names if n.lower().startswith(low)][:2]
             or _close(low, folded))
    hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
    return UnknownSku(f"unknown {what} {name!r}; {hint}known: {', '.join(names) or 'none'} "
                      "(`fa4-aot skus` lists them; names are lowercase)")


def _close(low: str, folded: dict[str, str]) -> list[str]:
    """The closest of `folded`'s names to `low`, also read with the letter o typed for the digit 0 (h2oo: h200),
    which a plain spelling distance finds too far."""
    for guess in dict.fromkeys([low, low.replace("o", "0"), low.replace("0", "o")]):
        if guess in folded:
            return [folded[guess]]
        found = difflib.get_close_matches(guess, list(folded), n=1, cutoff=0.6)
        if found:
            return [folded[found[0]]]
    return []


def check_name(name: str, *known: Iterable[str]) -> None:
    """Refuse a SKU name found in none of `known` (the SKU table's names, a store's, a server's) with unknown()'s
    "did you mean" over all of them: a typo must not select nothing and exit 0."""
    names = {n for group in known for n in group}
    if name not in names:
        raise unknown(name, names)
