"""What the certification gate costs a call after a kernel's first, served and refused, side by side in one run.

FA4 over install() asks Gate.check_call before every forward and backward (a scoped refusal is judged per call);
the lean runtime asks Gate.admit when it binds a call's sizes (once per distinct sizes). Measured over a real
store holding one scoped finding (the store of tests/trust/test_certified.py: a backward wrong at seqlen_k 2,
right at 1024): a call of a signature with no scoped finding, a served call of the scoped signature, a refused
one (raising KernelRefused, caught), and admit's decided path. CPU only.

    python bench/gate_per_call.py [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import timeit
from pathlib import Path

from fa4_aot.errors import KernelRefused
from fa4_aot.store import Store
from tests.trust.test_certified import SIG_64, SIG_72, _certified_at_degenerate_sizes

ROUNDS, NUMBER = 7, 20000


def _median_us(fn) -> float:  # type: ignore[no-untyped-def]
    return statistics.median(timeit.repeat(fn, repeat=ROUNDS, number=NUMBER)) / NUMBER * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "store")
        entry, gate = _certified_at_degenerate_sizes(store)
        inside = {"batch": 4, "seqlen_q": 1, "seqlen_k": 2}
        outside = {"batch": 4, "seqlen_q": 2048, "seqlen_k": 2048}
        gate.admit(entry.kernel_key, SIG_64, lambda _key: entry, outside)  # decided: scoped
        _empty, plain = _certified_at_degenerate_sizes(Store(Path(tmp) / "plain"))

        refused_call = SIG_64.call(4, 1, 2)

        def refused() -> None:
            try:
                gate.check_call(refused_call, "bwd")
            except KernelRefused:
                pass

        def admit_refused() -> None:
            try:
                gate.admit(entry.kernel_key, SIG_64, lambda _key: entry, inside)
            except KernelRefused:
                pass

        served_call, other_call = SIG_64.call(4, 2048, 2048), SIG_72.call(4, 2048, 2048)
        figures = {
            "check_call, nothing scoped in this process (us)":
                _median_us(lambda: plain.check_call(served_call, "bwd")),
            "check_call, another signature (us)": _median_us(lambda: gate.check_call(other_call, "bwd")),
            "check_call, served outside the scope (us)": _median_us(lambda: gate.check_call(served_call, "bwd")),
            "check_call, refused inside the scope (us)": _median_us(refused),
            "admit decided, served outside the scope (us)": _median_us(
                lambda: gate.admit(entry.kernel_key, SIG_64, lambda _key: entry, outside)),
            "admit decided, refused inside the scope (us)": _median_us(admit_refused),
        }
    machine = f"{platform.processor() or platform.machine()}, Python {platform.python_version()}"
    doc = {"date": "2026-12-06", "machine": machine,
           "rounds": ROUNDS, "calls_per_round": NUMBER, "figures": {k: round(v, 3) for k, v in figures.items()}}
    print(json.dumps(doc, indent=1))
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
