"""A store written before a change loads after it: tests/data/store_v1 was built (real FA4 compiles, real
signing) by main at 79950f1, before the store took ownership of its layout. Its bytes must keep loading."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from fa4_aot.compile import orchestrator
from fa4_aot.domain import kernel_keys
from fa4_aot.domain.skus import Sku
from fa4_aot.store import Store, maintenance, migrate
from fa4_aot.trust import signing, signing_keys
from fa4_aot.trust.signing import Revocations

DATA = Path(__file__).resolve().parent.parent / "data"
# The SKU as the old store knew it: before host targets (issue 19), kernels were built for the build CPU
H200 = Sku(name="h200", arch="sm_90a", sm_count=132, l2_bytes=62914560, cuda_major=13, host="")


@pytest.fixture
def store(tmp_path: Path) -> Store:
    root = tmp_path / "store"
    shutil.copytree(DATA / "store_v1", root, ignore=shutil.ignore_patterns("README.md"))
    for path in [root, *root.rglob("*")]:  # as fa4-aot writes them; git keeps neither mode
        path.chmod(0o700 if path.is_dir() else 0o600)
    return Store(root)


def test_old_store_verifies_and_every_object_reads(store: Store) -> None:
    report = maintenance.verify(store)
    assert report.ok and report.objects_checked == 5 and report.entries_checked == 5 and not report.unexpected
    entries = list(store.entries())
    assert len(entries) == 5
    for entry in entries:
        data = store.read_object(entry.object_digest)
        assert len(data) == entry.size and hashlib.sha256(data).hexdigest() == entry.object_digest
        assert store.get_entry(entry.kernel_key) == entry


def test_old_entries_recompute_their_kernel_keys(store: Store) -> None:
    """The key is sha256 of the canonical dump of family, compile key (stored canonical), target facts and
    toolchain: recomputed from the entry's own fields it must name the entry."""
    for entry in store.entries("h200"):
        target = {"arch": entry.arch, "sm_count": entry.sm_count, "l2_bytes": entry.l2_bytes,
                  "cuda_major": entry.cuda_major}  # the target facts of the time (no host target yet)
        doc = {"family": entry.family, "compile_key": entry.compile_key, "target": target,
               "toolchain": entry.toolchain}
        assert hashlib.sha256(kernel_keys.dumps(doc).encode()).hexdigest() == entry.kernel_key


def test_old_signed_manifest_still_verifies(store: Store) -> None:
    public = signing_keys.parse_public((DATA / "store_v1.pub").read_text().strip())
    (envelope,) = signing.local(store, "h200")
    manifest = signing.verify(envelope, {public.key_id: public}, H200, Revocations())
    assert manifest["kernels"] == {e.kernel_key: e.object_digest for e in store.entries()}


def test_migrate_refiles_the_old_store_under_todays_keys(store: Store) -> None:
    """Issue 13: `fa4-aot migrate` converts a store built by the old code; a build and a client find its
    kernels, the objects are untouched, and a second run changes nothing."""
    old = {e.kernel_key: e for e in store.entries()}
    assert all(k == migrate.legacy_key(e) for k, e in old.items())
    dry = migrate.migrate(store, dry_run=True)
    assert dry.migrated == 5 and [e.kernel_key for e in store.entries()] == sorted(old)
    result = migrate.migrate(store)
    assert (result.entries, result.migrated, result.current, result.skus) == (5, 5, 0, ["h200"])
    new = list(store.entries())
    assert len(new) == 5 and not set(old) & {e.kernel_key for e in new}
    assert {e.object_digest for e in new} == {e.object_digest for e in old.values()}
    assert maintenance.verify(store).ok
    for entry in new:
        base, full = kernel_keys.entry_keys(entry)
        assert entry.kernel_key == base == full  # these kernels consumed no constant
        assert orchestrator.stored_key(store, base, H200) == base
        twin = Sku(name="h100-sxm", arch="sm_90a", sm_count=132, l2_bytes=52428800, cuda_major=13, host="")
        assert orchestrator.stored_key(store, base, twin) == base  # shared now
    again = migrate.migrate(store)
    assert (again.migrated, again.current) == (0, 5)
