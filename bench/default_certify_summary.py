"""What a certification run found, for bench/RESULTS.md: `python bench/default_certify_summary.py CERTIFY_JSON STORE
SKU OUT_DIR` (bench/default_certify.sh's last step).

Prints the run's time, checks and verdicts, its findings split by origin (FA4's: reproduced by FA4's own JIT;
ours: not; unknown: not put to the JIT), its marginal misses, and each measured known-bad entry with its scope;
writes the same as OUT_DIR/summary.json. Then it runs the one-file repro of one measured entry (`fa4-aot known-bad
--repro`, needing only torch and FA4) and records its exit status and output: 1 means FA4 alone fails the check.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path


def summary(doc: dict, store: Path, sku: str) -> dict:
    findings = doc.get("findings", [])
    known = json.loads((store / "known-bad" / f"{sku}.json").read_text()) \
        if (store / "known-bad" / f"{sku}.json").exists() else {}
    return {
        "seconds": doc["seconds"], "phases": doc.get("phases"), "check_steps": doc.get("check_steps"),
        "checks": doc["checks"], "counts": doc["counts"],
        "findings_by_origin": doc["findings_by_origin"],
        "findings_by_tensor": dict(Counter(f.get("tensor") or f.get("output") or "?" for x in findings
                                           for f in x["failures"][:1])),
        "ours": [{k: x[k] for k in ("check", "failures", "oracle")} for x in findings if x["origin"] == "ours"],
        "marginal": len(doc.get("marginal", [])),
        "marginal_examples": doc.get("marginal", [])[:10],
        "errors": len(doc.get("errors", [])), "out_of_memory": doc.get("out_of_memory"),
        "measured": [{"id": b["id"], "when": b["when"], "parts": b.get("parts"), "symptom": b["symptom"][:200],
                      "scope": doc.get("scoped_refusals", {}).get(b["id"], "every size"),
                      "repro": b["id"] in known.get("repros", {})} for b in doc.get("measured_known_bad", [])],
    }


def run_repro(store: Path, sku: str, ident: str, out: Path) -> dict:
    script = out / f"repro-{ident}.py"
    printed = subprocess.run([sys.executable, "-m", "fa4_aot", "--cache-dir", str(store), "known-bad", "--sku", sku,
                              "--repro", ident], capture_output=True, text=True)
    script.write_text(printed.stdout)
    try:
        ran = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
        return {"id": ident, "exit": ran.returncode, "output": (ran.stdout + ran.stderr)[-3000:]}
    except subprocess.TimeoutExpired:
        return {"id": ident, "exit": None, "output": "timed out after 300 s"}


def main() -> None:
    certify, store, sku, out = sys.argv[1], Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
    doc = json.loads(Path(certify).read_text())
    found = summary(doc, store, sku)
    with_repro = [m["id"] for m in found["measured"] if m["repro"]]
    if with_repro:
        found["repro_run"] = run_repro(store, sku, with_repro[0], out)
    (out / "summary.json").write_text(json.dumps(found, indent=1))
    print(json.dumps({k: v for k, v in found.items() if k not in ("marginal_examples",)}, indent=1)[:12000])


if __name__ == "__main__":
    main()
