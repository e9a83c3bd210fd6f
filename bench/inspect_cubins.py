"""Pull the CUDA cubins out of stored kernel objects and report their target arch.

Exported objects are host ELF files that embed the device code. This finds every embedded CUDA ELF
(e_machine 190), reads its SM target from e_flags, and with --cuobjdump also disassembles each cubin
(on a machine that has cuobjdump) and counts Blackwell tcgen05 / Hopper wgmma instructions, which is
how sm_100a artifacts are checked without a Blackwell GPU.

    python bench/inspect_cubins.py --sku b200 [--limit 5] [--cuobjdump] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import re
import struct
import subprocess
from pathlib import Path

from fa4_aot import config
from fa4_aot.store import Store

EM_CUDA = 190


def embedded_cubins(data: bytes) -> list[bytes]:
    found = []
    for match in re.finditer(rb"\x7fELF\x02\x01", data):
        start = match.start()
        if start == 0:
            continue  # the host object itself
        (e_machine,) = struct.unpack_from("<H", data, start + 18)
        if e_machine != EM_CUDA:
            continue
        e_phoff, e_shoff = struct.unpack_from("<QQ", data, start + 32)
        e_phentsize, e_phnum, e_shentsize, e_shnum = struct.unpack_from("<HHHH", data, start + 54)
        size = max(e_phoff + e_phentsize * e_phnum, e_shoff + e_shentsize * e_shnum)  # headers may sit last
        found.append(data[start:start + size])
    return found


def sm_of(cubin: bytes) -> str:
    (e_flags,) = struct.unpack_from("<I", cubin, 48)
    # CUDA ELF e_flags: low byte holds the SM number (ABI v1); newer toolchains put it in bits 8-15
    low, high = e_flags & 0xFF, (e_flags >> 8) & 0xFF
    return f"sm_{high if high >= 50 else low}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sku", required=True)
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--cuobjdump", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    store = Store(config.default_cache_dir())
    rows = []
    entries = list(store.entries(args.sku))[: args.limit or None]
    for entry in entries:
        cubins = embedded_cubins(store.read_object(entry.object_digest))
        row = {"kernel_key": entry.kernel_key[:16], "family": entry.family, "call": entry.call,
               "cubins": len(cubins), "sm": sorted({sm_of(c) for c in cubins})}
        if args.cuobjdump and cubins and args.out:
            path = args.out / f"{entry.kernel_key[:16]}.cubin"
            args.out.mkdir(parents=True, exist_ok=True)
            path.write_bytes(cubins[0])
            sass = subprocess.run(["cuobjdump", "-sass", str(path)], capture_output=True, text=True).stdout
            row["sass_arch"] = sorted(set(re.findall(r"arch = (sm_\w+)", sass)))
            row["tcgen05"] = len(re.findall(r"UTC\w+|TCGEN05", sass))
            row["wgmma"] = len(re.findall(r"HGMMA", sass))
            row["sass_lines"] = sass.count("\n")
        rows.append(row)
        print(json.dumps(row))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"cubins-{args.sku}.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
