"""What a certification run's journal says, judged on a CPU host: `python bench/judge_journal.py JOURNAL STORE SKU
DEVICE OUT_JSON`.

`fa4-aot certify` appends every check's outcome to a journal as it comes (certify/driver.py), so a run that a lease
stops before its end still leaves its GPU's evidence. This script reads that journal (each check's last outcome, as
a resumed run would) and applies certify's own judging to it, with the store the checks ran over, read only:
verdicts per kernel (blame.verdicts), the measured known-bad entries and the sizes they are scoped to
(driver.judge). No oracle has run, so every finding counts as `unknown` origin, which certify treats as FA4's.
It prints a summary and writes it, with every verdict that is not pass and every marginal miss, to OUT_JSON.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from fa4_aot import config
from fa4_aot.certify import blame, driver
from fa4_aot.matrix import variants
from fa4_aot.store import Store


def main() -> None:
    journal, root, sku_name, device, out = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4], \
        Path(sys.argv[5])
    store, sku = Store(root), variants.load(config.default_variants_file()).sku(sku_name)
    outcomes = list(driver.read_journal(journal).values())
    judged = driver.judge(store, sku, device, outcomes)
    verdicts, made, found, repros = judged.verdicts, judged.measured, judged.scopes, judged.repros
    failing = [o for o in outcomes if blame.failing_parts(o)]
    classes = Counter()
    for o in failing:
        s = o.check.sig
        tensors = sorted({str(f.get("output") or f.get("tensor")) for f in o.failures}) or [o.detail[:40]]
        classes[f"{s.pass_} {s.layout} {s.dtype} d={s.head_dim}/{s.head_dim_v} {s.mask}"
                f"{' softcap' if s.softcap else ''}{f' page {s.page_size}' if s.page_size else ''}: {o.status} "
                f"{','.join(tensors)}"] += 1
    doc = {
        "checks": len(outcomes),
        "outcomes": dict(Counter(o.status for o in outcomes)),
        "out_of_memory_at_last": sum(blame.out_of_memory(o.detail) for o in outcomes),
        "verdicts": dict(Counter(v.status for v in verdicts)),
        "failing_checks": len(failing),
        "failing_by_class": dict(classes.most_common()),
        "marginal": [{"check": o.check.describe(), **m} for o in outcomes for m in o.marginal],
        "measured": [{"id": b.id, "part": b.parts, "symptom": b.symptom[:240],
                      "scope": found.entries[b.id].describe() if b.id in found.entries else "every size",
                      "kernels": sum(i == b.id for i in found.kernels.values()), "repro": b.id in repros}
                     for b in made],
        "not_pass": [v.to_dict() for v in verdicts if v.status != "pass"],
    }
    out.write_text(json.dumps(doc, indent=1))
    print(json.dumps({k: v for k, v in doc.items() if k not in ("not_pass", "marginal")}, indent=1))
    print(f"marginal misses (no verdict): {len(doc['marginal'])}")


if __name__ == "__main__":
    main()
