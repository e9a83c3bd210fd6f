"""Issue 13, on real FA4 cross-compiles: SKUs of one arch share every kernel that consumed no SKU constant,
and differ exactly in those that did (tests/data/tiny_variants.toml: h200/h100-sxm differ only in L2,
b200/gb200 only in SM count)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fa4_aot.domain import kernel_keys
from fa4_aot.store import Entry, Store
from tests.conftest import TINY_VARIANTS, build_json

pytestmark = pytest.mark.slow
ROOT = TINY_VARIANTS.parent.parent.parent


def build(store: Path, sku: str, *only: str) -> dict:
    return build_json(store, sku, *only, jobs=2)


def kernels(store: Path) -> dict[str, Entry]:
    """Entries filed under their full key (signposts under base keys left out), by key."""
    return {e.kernel_key: e for e in Store(store).entries() if e.kernel_key == kernel_keys.entry_keys(e)[1]}


def test_building_h100_sxm_after_h200_compiles_nothing(tmp_path: Path) -> None:
    h200 = build(tmp_path, "h200", "det-bwd")
    assert h200["failed"] == 0 and h200["built"] == h200["kernels"] >= 3
    h100 = build(tmp_path, "h100-sxm", "det-bwd")
    assert h100["failed"] == 0 and h100["built"] == 0 and h100["present"] == h200["kernels"]
    assert h100["kernel_keys"] == h200["kernel_keys"]
    # why they are shared: what they consumed is FA4's own L2 budget (l2_budget off), the same for both SKUs
    consumed = {q[0] for e in kernels(tmp_path).values() for q in e.hardware_queries}
    assert consumed <= {"l2_budget", "prepare_l2_budget"}


def test_fa4_budget_patch_leaves_the_bytes_unchanged(tmp_path: Path) -> None:
    """With l2_budget off the patched schedulers (fa4_aot/fa4/l2.py) compile the bytes FA4 compiles: the
    deterministic backward, whose LPT scheduler reads the budget, equals the same kernels compiled in a process
    where FA4's schedulers are left as FA4 ships them (tests/compile/unpatched_build.py). Until issue 19 this
    compared with a store committed from another machine, and failed on build hosts whose CPU differed from it:
    the host code followed the build CPU (AVX-512 here), not the SKU's host target."""
    build(tmp_path / "new", "h200", "det-bwd")
    new = {e.family + kernel_keys.dumps(e.compile_key): e for e in kernels(tmp_path / "new").values()}
    done = subprocess.run([sys.executable, str(Path(__file__).parent / "unpatched_build.py"), str(TINY_VARIANTS),
                           "h200", "det-bwd"], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    unpatched = json.loads(done.stdout.strip().splitlines()[-1])
    det = [k for k, e in new.items() if e.call.startswith("bwd_det")]
    assert det and any(["l2_budget", 50 << 20] in new[k].hardware_queries for k in det)
    assert set(unpatched) == set(new)
    for key, entry in new.items():
        assert unpatched[key] == entry.object_digest, f"{entry.call}: the budget patch changed the bytes"


def test_b200_and_gb200_keys_differ_exactly_where_the_sm_count_was_consumed(tmp_path: Path) -> None:
    b200 = build(tmp_path, "b200")
    gb200 = build(tmp_path, "gb200")
    assert b200["failed"] == gb200["failed"] == 0
    ours, theirs = set(b200["kernel_keys"]), set(gb200["kernel_keys"])
    held = kernels(tmp_path)
    consumed = {k for k in ours if any(q[0] == "sm_count" for q in held[k].hardware_queries)}
    assert consumed and ours - consumed  # the tiny matrix has both kinds, or this proves nothing
    assert ours - theirs == consumed
    assert gb200["built"] == len(theirs - ours) == len(consumed)
    assert all(["sm_count", 152] in held[k].hardware_queries for k in theirs - ours)
    # each SM-count kernel's base entry tells a client which constant to look up
    for key in consumed:
        base = Store(tmp_path).get_entry(kernel_keys.entry_keys(held[key])[0])
        assert base is not None and "sm_count" in kernel_keys.consumed_of(base.hardware_queries)
