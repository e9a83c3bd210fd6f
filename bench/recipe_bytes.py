"""What a store's recipe files weigh against its objects, what fills them, and what reading one costs, for the JSON
files of builds before issue 29 and the compact files of domain/recipe_file.py side by side in one run.

    python bench/recipe_bytes.py STORE OUT.json

STORE is any built store (its recipe files in either form are read, re-encoded both ways in memory, never
rewritten). Per file: bytes (JSON as builds wrote it, compact), and the time from bytes to checked regions
(store.recipes' parse: decode, recipe_format's check, typed regions) as this process's CPU time (the host is
shared: wall time there measures the neighbours), best of REPEAT, each form in a fresh parse (the per-process parse
cache is bypassed). Parse times are taken for at most SAMPLE files spread evenly over the store (every file's
bytes are counted): the default h200 store holds hundreds of files of up to a few hundred regions.
"""

from __future__ import annotations

import collections
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

REPEAT = 9
SAMPLE = 80


def main() -> None:
    from fa4_aot.domain import kernel_keys, recipe_file
    from fa4_aot.domain.region import parse_regions

    root, out = Path(sys.argv[1]), Path(sys.argv[2])
    objects = sum(p.stat().st_size for p in (root / "objects").rglob("*") if p.is_file())
    files = sorted(p for p in (root / "recipes").rglob("*.json") if p.is_file())
    fields: collections.Counter[str] = collections.Counter()
    repeats: dict[str, list[int]] = {}
    rows = []
    every = max(1, -(-len(files) // SAMPLE))
    for index, path in enumerate(files):
        doc = recipe_file.decode(path.read_bytes())
        regions = doc["regions"]
        legacy = json.dumps(doc, sort_keys=True).encode()  # what merge() wrote before issue 29
        compact = recipe_file.encode(doc["key"], regions)
        _count(regions, fields, repeats, kernel_keys.dumps)
        row = {"file": path.name, "regions": len(regions), "json_bytes": len(legacy), "compact_bytes": len(compact)}
        if index % every == 0:
            row |= {"json_parse_ms": _best(lambda d=legacy: parse_regions(recipe_file.decode(d)["regions"])),
                    "compact_parse_ms": _best(lambda d=compact: parse_regions(recipe_file.decode(d)["regions"]))}
        rows.append(row)
    total = {k: sum(r[k] for r in rows) for k in ("regions", "json_bytes", "compact_bytes")}
    result = {
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "store": str(root), "files": len(rows), "object_bytes": objects, **total,
        "json_over_objects": total["json_bytes"] / objects, "compact_over_objects": total["compact_bytes"] / objects,
        "json_bytes_by_field": dict(fields.most_common()),
        "repeats": {k: {"all": v[0], "distinct": len(set(v[1:]))} for k, v in repeats.items()},
        "parse_ms_per_file": {form: _stats([r[f"{form}_parse_ms"] for r in rows if f"{form}_parse_ms" in r])
                              for form in ("json", "compact")},
        "parse_sampled_files": sum("compact_parse_ms" in r for r in rows),
        "rows": rows,
    }
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=1))


def _count(regions: list[dict[str, Any]], fields: collections.Counter[str], repeats: dict[str, list[int]],
           dumps: Any) -> None:
    """Bytes of compact JSON per region field; how many steps, guards, metas there are and how many distinct."""
    for region in regions:
        for name, value in region.items():
            fields[name] += len(dumps(value))
        for name, values in (("steps", region["fwd"] + region["bwd"]), ("guards", region["guards"]),
                             ("meta", region["meta"])):
            seen = repeats.setdefault(name, [0])
            seen[0] += len(values)
            seen.extend(hash(dumps(v)) for v in values)


def _best(fn: Any) -> float:
    times = []
    for _ in range(REPEAT):
        started = time.process_time()
        fn()
        times.append(time.process_time() - started)
    return round(min(times) * 1e3, 3)


def _stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"median": ordered[len(ordered) // 2], "max": ordered[-1], "sum": round(sum(ordered), 3)}


if __name__ == "__main__":
    main()
