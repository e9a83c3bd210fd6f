"""The Store API that the service, signing and maintenance use instead of building paths themselves: the
streamed put (service uploads), the no-follow open for serving, manifests, and entries(skipped=)."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

from fa4_aot.errors import IntegrityError, StoreError
from fa4_aot.store import Store

DATA = b"kernel bytes " * 1000
DIGEST = hashlib.sha256(DATA).hexdigest()


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_streamed_put_is_owner_only_whatever_the_umask(tmp_path: Path) -> None:
    """service/transfer.py wrote uploads with open(tmp, "xb") and mkdir(parents=True): umask modes."""
    store = Store(tmp_path / "s")
    old = os.umask(0)
    try:
        with store.receive(DIGEST, source="test") as upload:
            for i in range(0, len(DATA), 4096):
                upload.write(DATA[i:i + 4096])
            upload.commit(len(DATA))
    finally:
        os.umask(old)
    path = store.object_path(DIGEST)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert store.read_object(DIGEST) == DATA and upload.size == len(DATA)


@pytest.mark.parametrize("sent, size", [(DATA[:-1], None), (DATA, len(DATA) + 1)], ids=["bytes", "size"])
def test_streamed_put_that_does_not_match_stores_nothing(tmp_path: Path, sent: bytes, size: int | None) -> None:
    store = Store(tmp_path / "s")
    with pytest.raises(IntegrityError, match="nothing was stored"), store.receive(DIGEST, source="test") as up:
        up.write(sent)
        up.commit(size)
    assert _files(store.root) == []


def test_streamed_put_left_without_commit_leaves_no_temp_file(tmp_path: Path) -> None:
    store = Store(tmp_path / "s")
    with pytest.raises(RuntimeError), store.receive(DIGEST, source="test") as up:
        up.write(DATA[:10])
        raise RuntimeError("client went away")
    assert _files(store.root) == []


def test_serving_open_refuses_a_symlinked_object(tmp_path: Path) -> None:
    """service/routes/objects.py served with a plain open(), which follows links."""
    store = Store(tmp_path / "s")
    store.put_object(DATA)
    (tmp_path / "foreign").write_bytes(b"foreign")
    path = store.object_path(DIGEST)
    path.unlink()
    path.symlink_to(tmp_path / "foreign")
    with pytest.raises(StoreError, match="refusing symlink"):
        store.open_object(DIGEST)
    with pytest.raises(StoreError, match="refusing symlink"):
        store.object_size(DIGEST)


def test_serving_open_and_size_of_a_present_and_an_absent_object(tmp_path: Path) -> None:
    store = Store(tmp_path / "s")
    assert store.object_size(DIGEST) is None
    store.put_object(DATA)
    with store.open_object(DIGEST) as f:
        assert f.read() == DATA
    assert store.object_size(DIGEST) == len(DATA)
    with pytest.raises(FileNotFoundError):
        store.open_object("0" * 64)


def test_manifests_round_trip_and_pass_over_symlinks(tmp_path: Path) -> None:
    store = Store(tmp_path / "s")
    ident = "ab" * 32
    path = store.put_manifest("h200", ident, b"{}")
    assert store.put_manifest("h200", ident, b"{}") == path and stat.S_IMODE(path.stat().st_mode) == 0o600
    (path.parent / f"{'cd' * 32}.json").symlink_to(path)
    assert store.manifests("h200") == [b"{}"] and store.manifests("b200") == []
    with pytest.raises(StoreError, match="invalid SKU name"):
        store.put_manifest("../x", ident, b"{}")


def test_entries_with_skipped_names_a_bad_entry_and_goes_on(tmp_path: Path) -> None:
    store = Store(tmp_path / "s")
    bad = store.entry_path("ef" * 32)
    bad.parent.mkdir(parents=True, mode=0o700)
    bad.write_text("not json")
    with pytest.raises(StoreError, match="unreadable index entry"):
        list(store.entries())
    skipped: list[str] = []
    assert list(store.entries(skipped=skipped)) == [] and len(skipped) == 1 and str(bad) in skipped[0]
