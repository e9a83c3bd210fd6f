"""Side data: what the store keeps beside kernels. Misses (misses/<key>.json: kernels a client needed and
lacked), lean-runtime recipe files (recipes/ab/<key>.json; store/recipes.py owns their content), signed manifests
(manifests/<sku>/<id>.json; trust/signing.py owns their content), certification verdicts (verdicts/ab/<kernel
key>.json: domain/verdicts.py's values, one per device class) and the known-bad entries a certification measured
(known-bad/<sku>.json: domain/known_bad.py's form), and the marks a server polls to see that anything changed."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ..domain.misses import Miss
from ..domain.verdicts import Verdict, by_device
from ..errors import StoreError
from .beneath import lstat_beneath
from .root import HEX64, Root, _check_sku, _listdir_beneath, check_hex


def _miss(data: bytes, path: Path) -> Miss:
    try:
        return Miss.from_dict(json.loads(data))
    except (ValueError, RecursionError) as e:
        raise StoreError(f"{path} is not a miss ({str(e)[:200]}); delete it (`fa4-aot misses` lists the others) "
                         "or record the miss again") from None


class SideData(Root):
    """The Store's side data (see the module)."""

    def record_miss(self, miss: Miss) -> None:
        path = self.root / "misses" / f"{check_hex(miss.kernel_key, 'kernel key')}.json"
        self._write(path, json.dumps(miss.to_dict(), sort_keys=True, indent=1).encode())

    def misses(self) -> list[Miss]:
        """The misses recorded in misses/, in key order; StoreError naming the file for one that is not a miss."""
        folder = self.root / "misses"
        if not self.ready() or lstat_beneath(self.root, ("misses",)) is None:
            return []
        found = []
        for name in sorted(os.listdir(folder)):
            if HEX64.fullmatch(name.removesuffix(".json")) and name.endswith(".json"):
                with self._open(folder / name) as f:
                    found.append(_miss(f.read(), folder / name))
        return found

    def put_recipes(self, key: str, data: bytes) -> None:
        """Replace recipes/<ab>/<key>.json (a signature's recorded regions on one SKU) atomically."""
        self._write(self._recipes_path(key), data)

    def recipes(self, key: str) -> bytes | None:
        """The bytes of recipes/<ab>/<key>.json, or None when there is none; StoreError for a symlink."""
        try:
            with self._open(self._recipes_path(key)) as f:
                return f.read()
        except FileNotFoundError:
            return None

    def _recipes_path(self, key: str) -> Path:
        check_hex(key, "recipe key")
        return self.root / "recipes" / key[:2] / f"{key}.json"

    def put_manifest(self, sku: str, manifest_id: str, data: bytes) -> Path:
        """Keep a signed manifest's bytes as manifests/<sku>/<manifest id>.json; idempotent (same bytes kept)."""
        path = self.root / "manifests" / _check_sku(sku) / f"{check_hex(manifest_id, 'manifest id')}.json"
        try:
            with self._open(path) as f:
                if f.read() == data:
                    return path
        except FileNotFoundError:
            pass
        self._write(path, data)
        return path

    def manifests(self, sku: str) -> list[bytes]:
        """The bytes of every manifest kept for `sku`, in name order; symlinks and other names are passed over."""
        parts = ("manifests", _check_sku(sku))
        if not self.ready() or lstat_beneath(self.root, parts) is None:
            return []
        found = []
        for name in sorted(_listdir_beneath(self.root, parts)):
            if name.endswith(".json") and HEX64.fullmatch(name.removesuffix(".json")):
                try:
                    with self._open(self.root.joinpath(*parts, name)) as f:
                        found.append(f.read())
                except StoreError:  # a symlink or a folder: never followed, not a manifest
                    continue
        return found

    def put_verdicts(self, verdicts: list[Verdict]) -> None:
        """Keep `verdicts`, each replacing the verdict its kernel had for its device class whatever its `when` (the
        newest of `verdicts` for a class if several): a write is the later fact, and a `when` is its publisher's
        word, so one dated ahead must not outlive what is written after it. A kernel's file is rewritten under a
        lock, so certifiers and a server may add verdicts at once."""
        for kernel_key in sorted({v.kernel_key for v in verdicts}):
            lock_name = hashlib.sha256(f"verdicts:{kernel_key}".encode()).hexdigest()
            with self.lock(lock_name):
                new = by_device([v for v in verdicts if v.kernel_key == kernel_key])
                mine = {**by_device(self.verdicts(kernel_key)), **new}
                doc = {"kernel_key": kernel_key, "verdicts": [v.to_dict() for _, v in sorted(mine.items())]}
                self._write(self._verdicts_path(kernel_key), json.dumps(doc, sort_keys=True, indent=1).encode())

    def verdicts(self, kernel_key: str) -> list[Verdict]:
        """Every verdict kept for `kernel_key` (one per device class), [] when none. StoreError for a file that is
        not a verdict document (a store is data from another host)."""
        try:
            with self._open(self._verdicts_path(kernel_key)) as f:
                data = f.read()
        except FileNotFoundError:
            return []
        try:
            doc = json.loads(data)
            found = [Verdict.from_dict(v) for v in doc["verdicts"]]
        except (ValueError, KeyError, TypeError, RecursionError) as e:
            raise StoreError(f"verdicts of {kernel_key} in {self.root} are malformed ({str(e)[:120]}); run "
                             "`fa4-aot certify` again to rewrite them") from None
        if any(v.kernel_key != kernel_key for v in found):
            raise StoreError(f"verdicts of {kernel_key} in {self.root} name another kernel")
        return found

    def verdict_keys(self) -> list[str]:
        """The kernel keys that have verdicts, in key order."""
        return [f.name for f in self._scan("verdicts") if f.kind == "file"]

    def _verdicts_path(self, kernel_key: str) -> Path:
        check_hex(kernel_key, "kernel key")
        return self.root / "verdicts" / kernel_key[:2] / f"{kernel_key}.json"

    def put_known_bad(self, sku: str, data: bytes) -> None:
        """Replace known-bad/<sku>.json: the registry entries certification measured for `sku`."""
        self._write(self.root / "known-bad" / f"{_check_sku(sku)}.json", data)

    def known_bad(self, sku: str) -> bytes | None:
        """The bytes of known-bad/<sku>.json, or None when certification measured nothing bad for `sku`."""
        try:
            with self._open(self.root / "known-bad" / f"{_check_sku(sku)}.json") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def change_marks(self) -> tuple[tuple[str, int], ...]:
        """(folder, mtime_ns) of index/, recipes/, manifests/ and their direct subfolders, links not followed:
        every write into the store is an atomic rename into one of them, which changes that folder's time, so
        two equal results mean nothing was added, replaced or removed in between (a server polls this)."""
        found = []
        for top in ("index", "recipes", "manifests", "verdicts"):
            try:
                found.append((top, os.lstat(self.root / top).st_mtime_ns))
                with os.scandir(self.root / top) as it:
                    found += [(f"{top}/{e.name}", e.stat(follow_symlinks=False).st_mtime_ns)
                              for e in it if e.is_dir(follow_symlinks=False)]
            except FileNotFoundError:
                continue
        return tuple(sorted(found))

