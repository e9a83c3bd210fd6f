"""Run in a fresh process configured for one SKU: print the recorded recipe regions of (signature, sizes) pairs.

argv: SKU, JSON list of [signature dict, sizes dict]. Prints a JSON list of recipe documents.
"""

from __future__ import annotations

import json
import sys
import warnings


def main() -> None:
    warnings.filterwarnings("ignore")
    from fa4_aot import config, fa4
    from fa4_aot.matrix import variants

    sku = variants.load(config.default_variants_file()).skus[sys.argv[1]]
    fa4.configure(sku)
    from fa4_aot.domain.signature import Signature

    pairs = json.loads(sys.argv[2])
    print(json.dumps([fa4.record_recipe(Signature.from_dict(sig), sizes, sku).to_json() for sig, sizes in pairs]))


if __name__ == "__main__":
    main()
