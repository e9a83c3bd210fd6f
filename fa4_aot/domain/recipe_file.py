"""A recipe file's bytes: the compact encoding builds write, and the JSON document of builds before
it, which still reads. store/recipes.py owns what a file means (its key, its regions); this module only turns
{"key": key, "regions": [region documents]} into bytes and back. Pure; no torch.

Why compact (measured by bench/recipe_bytes.py on a model build's store, 320 regions in 11 files): a signature's
regions repeat a few distinct steps, guards, tensor metas and kernels (7,136 steps of which 118 are distinct;
3,266 guards, 46 distinct; 7,328 metas, 152 distinct), and every region repeats its signature and toolchain, so
recipe bytes grew with regions while object bytes grew with kernels. A compact file stores each distinct value
once, in a table, and each region as indices into the tables; the whole is canonical JSON compressed with zlib
behind MAGIC. Decoding gives back the document a JSON file holds, identical values shared as one Python object,
so recipe_format checks each distinct value once per file (check_region's memo).

A file comes from another host: decoding bounds what it may expand to (MAX_DECODED bytes of JSON), how deep it
nests (MAX_DEPTH: a file nested 50,000 deep raised RecursionError), and refuses an index outside
its table, each with ValueError; what the regions hold is recipe_format's to check. `read` is decode for a reader
of one region (the lean runtime): the file's bounds at once, of each region only what its guards' check reads
(`Packed.head`), the rest unpacked when the region is first used (`Packed.document`).
"""

from __future__ import annotations

import json
import re
import zlib
from typing import Any

from . import kernel_keys

MAGIC = b"FA4R\x01"  # a compact file; a JSON file starts with "{"
MAX_DECODED = 64 << 20  # JSON bytes a compact file may inflate to (a server takes 8 MB files: no real one nears it)
MAX_DEPTH = 128  # nesting of a whole document: a region's deepest value (an expression in an argument) is < 90
LISTED = {"guards": "guards", "meta": "meta", "fwd": "steps", "bwd": "steps", "kernels": "kernels"}  # field: table
WHOLE = ("signature", "inputs", "outputs", "toolchain", "recorded_at")  # fields stored whole, in table "values"
TABLES = ("guards", "meta", "steps", "kernels", "values", "lists")
_INT = {int}  # the one type of every index in a list of them (list_of)


def encode(key: str, regions: list[dict[str, Any]]) -> bytes:
    """The compact file holding `regions` (region documents, as Region.to_json writes them) under `key`; the same
    regions always give the same bytes."""
    tables: dict[str, list[Any]] = {name: [] for name in TABLES}
    index: dict[tuple[str, str], int] = {}

    def intern(table: str, value: Any) -> int:
        canonical = (table, kernel_keys.dumps(value))
        found = index.get(canonical)
        if found is None:
            found = index[canonical] = len(tables[table])
            tables[table].append(value)
        return found

    packed = []
    for region in regions:
        doc = dict(region)
        for field, table in LISTED.items():  # a list of entries, itself an entry of "lists" (regions share them)
            doc[field] = intern("lists", [intern(table, v) for v in region[field]])
        for field in WHOLE:
            if field in region:
                doc[field] = intern("values", region[field])
        packed.append(doc)
    return MAGIC + zlib.compress(kernel_keys.dumps({"key": key, "tables": tables, "regions": packed}).encode(), 9)


class Unreadable(ValueError):
    """A compact file's region naming an index outside its tables, found when it is unpacked: what decode
    refuses the whole file for (Packed.document raises it at the region's first use)."""


def decode(data: bytes) -> dict[str, Any]:
    """The document {"key": ..., "regions": [...]} `data` holds, compact or JSON; ValueError naming what is wrong
    for bytes that are neither, inflate past MAX_DECODED, nest past MAX_DEPTH or index past a table. Regions of a
    compact file share one object for each value (and list of values) the file stores once."""
    if not data.startswith(MAGIC):
        return _bounded_json(data)
    packed, unpack = _tables(data)
    return {"key": packed.get("key"), "regions": [unpack(r, i) for i, r in enumerate(packed["regions"])]}


def read(data: bytes) -> dict[str, Any]:
    """decode's document with a compact file's regions left packed: each a `Packed` whose head (what
    recipe_format.check_guards reads) is unpacked now and whose document is unpacked at its first use. ValueError
    as decode raises it for the file, and for a region's fields, format, signature or guards that name an index
    outside a table (Unreadable); the other fields' indices are checked by Packed.document. A JSON file's
    document is decode's: its regions are whole already."""
    if not data.startswith(MAGIC):
        return _bounded_json(data)
    packed, unpack = _tables(data)
    return {"key": packed.get("key"), "regions": [Packed(unpack.head(r, i), unpack, r, i)
                                                  for i, r in enumerate(packed["regions"])]}


class Packed:
    """A region of a file as `read` gives it: `head`, its fields with its signature and guards unpacked (the rest
    of a compact file's still table indices), and `document()`, the whole region document, unpacked once."""

    __slots__ = ("head", "_unpack", "_packed", "_index", "_document")

    def __init__(self, head: Any, unpack: _Unpack | None = None, packed: Any = None, index: int = 0) -> None:
        self.head, self._unpack, self._packed, self._index = head, unpack, packed, index
        self._document: dict[str, Any] | None = None

    def document(self) -> Any:
        """The region document (the same object every time); Unreadable naming the region and the field, as
        decode names them, each time a field names an index outside its table."""
        if self._unpack is None:  # a JSON file's region: whole already
            return self.head
        found = self._document
        if found is None:
            found = self._document = self._unpack(self._packed, self._index)
        return found


def _tables(data: bytes) -> tuple[dict[str, Any], _Unpack]:
    """A compact file's packed document, bounded and with its tables and list of regions, and its unpacker."""
    inflate = zlib.decompressobj()
    try:
        text = inflate.decompress(data[len(MAGIC):], MAX_DECODED)
    except zlib.error as e:
        raise ValueError(f"compact recipe file does not inflate ({e})") from None
    if inflate.unconsumed_tail or not inflate.eof:
        raise ValueError(f"compact recipe file is truncated or inflates past {MAX_DECODED} bytes")
    packed = _bounded_json(text)
    tables = packed.get("tables")
    if not isinstance(tables, dict) or not all(isinstance(tables.get(t), list) for t in TABLES):
        raise ValueError(f"compact recipe file has no tables {', '.join(TABLES)}")
    regions = packed.get("regions")
    if not isinstance(regions, list) or not all(isinstance(r, dict) for r in regions):
        raise ValueError("compact recipe file has no list of regions")
    return packed, _Unpack(tables)


def is_compact(data: bytes) -> bool:
    """Whether `data` is in the compact encoding (else a JSON file of a build before it, or not a recipe file)."""
    return data.startswith(MAGIC)


class _Unpack:
    """Regions from table indices; each list of entries is built once and shared by the regions naming it."""

    def __init__(self, tables: dict[str, list[Any]]) -> None:
        self.tables = tables
        self.lists: dict[tuple[str, int], list[Any]] = {}

    def __call__(self, region: dict[str, Any], i: int) -> dict[str, Any]:
        """Region `i` with every field unpacked, in the order decode refuses them (Unreadable)."""
        return self.fields(region, i, LISTED, WHOLE)

    def head(self, region: dict[str, Any], i: int) -> dict[str, Any]:
        """Region `i` with its guards and signature unpacked (what recipe_format.check_guards reads)."""
        return self.fields(region, i, {"guards": "guards"}, ("signature",))

    def fields(self, region: dict[str, Any], i: int, listed: dict[str, str], whole: tuple[str, ...]
               ) -> dict[str, Any]:
        doc = dict(region)
        for field, table in listed.items():
            if field in region:
                doc[field] = self.list_of(table, self.entry("lists", region[field], i, field), i, field)
        for field in whole:
            if field in region:
                doc[field] = self.entry("values", region[field], i, field)
        return doc

    def list_of(self, table: str, xs: Any, i: int, field: str) -> list[Any]:
        key = (table, id(xs))  # xs: an entry of "lists", alive as long as the tables
        found = self.lists.get(key)
        if found is None:
            entries = self.tables[table]
            if not isinstance(xs, list) or (xs and set(map(type, xs)) != _INT):  # by exact type: bool is no index
                raise Unreadable(f"region {i}: {field} is not a list of indices into table {table}")
            if xs and (min(xs) < 0 or max(xs) >= len(entries)):
                raise Unreadable(f"region {i}: {field} names an entry past table {table} ({len(entries)} entries)")
            found = self.lists[key] = list(map(entries.__getitem__, xs))
        return found

    def entry(self, table: str, x: Any, i: int, field: str) -> Any:
        if type(x) is not int or not 0 <= x < len(self.tables[table]):
            raise Unreadable(f"region {i}: {field} names {str(x)[:20]}, not an entry of table {table} "
                             f"({len(self.tables[table])} entries)")
        return self.tables[table][x]


def _bounded_json(text: bytes) -> dict[str, Any]:
    """`text` as a JSON object nested at most MAX_DEPTH deep (_peel's bound; ValueError otherwise; never
    RecursionError). json parses first: its own recursion limit bounds its walk (RecursionError becomes the
    depth's ValueError), and text it parses is then held to the bound (_valid_depth) before anything else walks
    the document: not every later walk bounds its own depth (kernel_keys.dumps of a signature or compile key
    recurses as deep as the value), so json's limit alone would let a value nested hundreds deep reach them.
    Text json refuses is held to the bound before it is called not JSON (_check_depth): a file both malformed and
    too deep is refused for its depth, as when the depth was checked before parsing."""
    try:
        doc = json.loads(text)
    except RecursionError:  # json's own limit is the interpreter's, lower under a deep stack
        raise ValueError(f"recipe file is nested deeper than {MAX_DEPTH}") from None
    except ValueError as e:
        _check_depth(text)
        raise ValueError(f"recipe file is not JSON ({str(e)[:100]})") from None
    _valid_depth(text)
    if not isinstance(doc, dict):
        raise ValueError("recipe file is not a JSON object")
    return doc


_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')  # a JSON string, unrolled (no per-character alternation)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_NOT_SYNTAX = bytes(b for b in range(256) if b not in b'[]{}"')


def _check_depth(text: bytes) -> None:
    """ValueError if `text` (any bytes: what json refused) nests deeper than MAX_DEPTH: its brackets outside
    strings, innermost pairs removed a level at a time (each pass at C speed; a file nests about 15 deep)."""
    _peel(_STRING.sub(b"", text).translate(None, _NOT_BRACKETS))


def _valid_depth(text: bytes) -> None:
    """ValueError if the JSON `text`, which json.loads parsed, nests deeper than MAX_DEPTH: _check_depth's verdict
    on its UTF-8 form, in about a third of the time. In valid JSON a backslash only starts an escape inside a string:
    removing escaped backslashes, then escaped quotes (left to right, as a parser pairs them), leaves a quote
    only where a string starts or ends. Of the brackets and quotes alone, two adjacent quotes flip no bracket's
    side of a string, so removing them keeps every bracket's side: what is left is brackets outside strings,
    unless a string holds a bracket (a lone quote is left; then every other part between quotes is outside)."""
    encoding = json.detect_encoding(text)
    if encoding not in ("utf-8", "utf-8-sig"):  # UTF-16 or -32, which json reads too: ASCII bytes as UTF-8
        text = text.decode(encoding, "surrogatepass").encode("utf-8", "surrogatepass")
    if b"\\" in text:  # else there is no escape to remove (few files hold one), and each replace is a pass
        text = text.replace(b"\\\\", b"").replace(b'\\"', b"")
    syntax = text.translate(None, _NOT_SYNTAX).replace(b'""', b"")
    if b'"' in syntax:
        syntax = b"".join(syntax.split(b'"')[::2])
    _peel(syntax)


def _peel(brackets: bytes) -> None:
    """ValueError if `brackets` still holds brackets after MAX_DEPTH passes removing innermost pairs. A pass removes
    "[]" then "{}", so it may take two levels where the two kinds alternate: the bound is MAX_DEPTH passes, between
    MAX_DEPTH and twice as many levels (far below the interpreter's recursion limit either way)."""
    for _level in range(MAX_DEPTH):
        if not brackets:
            return
        inner = brackets.replace(b"[]", b"").replace(b"{}", b"")
        if inner == brackets:
            return  # unbalanced: not JSON, which json.loads says
        brackets = inner
    if brackets:
        raise ValueError(f"recipe file is nested deeper than {MAX_DEPTH}")
