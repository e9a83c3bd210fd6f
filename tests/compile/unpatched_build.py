"""Run by test_sku_sharing in a fresh process: compile the calls of one tiny variant for a SKU as a build
worker does, but with FA4's own L2 budgets left in place (fa4_aot/fa4/l2.py's patch skipped), and print
{family + canonical compile key: object digest} as JSON.  python unpatched_build.py VARIANTS SKU VARIANT"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path


def main() -> None:
    from fa4_aot import fa4
    from fa4_aot.domain import kernel_keys
    from fa4_aot.fa4 import l2
    from fa4_aot.matrix import variants

    path, sku_name, name = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    matrix = variants.load(path)
    sku = matrix.sku(sku_name)
    l2.patch = lambda _sku: None  # FA4's schedulers exactly as FA4 ships them
    fa4.configure(sku)
    (variant,) = matrix.select([name])
    digests = {}
    for call in variant.calls(matrix.shapes[variant.shapes]):
        wanted = set(fa4.plan(call))

        def done(family: str, key: object, fn: object, _seconds: float) -> None:
            data = fa4.export(fn, sku.host_target)
            digests[family + kernel_keys.dumps(kernel_keys.canonical(key))] = hashlib.sha256(data).hexdigest()

        fa4.compile_call(call, wanted, done)
    print(json.dumps(digests))


if __name__ == "__main__":
    main()
