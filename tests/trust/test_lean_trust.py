"""Signed manifests cover the lean runtime: `fa4-aot sign` lists each kernel's libraries per host arch and the
recipe files' sha256; a client with trusted keys refuses a library or recipe file that a (compromised) server
swapped, and manifests signed before the lean runtime still serve install() but make the lean path ask for a
re-sign."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import pytest

from fa4_aot.errors import KernelMissing, TrustError
from fa4_aot.remote import push_pull
from fa4_aot.remote.http import Remote
from fa4_aot.runtime.fetch import Fetcher
from fa4_aot.runtime.libraries import Libraries
from fa4_aot.store import Store
from fa4_aot.trust import signing, signing_keys
from fa4_aot.trust.policy import Trust
from service import db, models
from tests.helpers.servers import Launch
from tests.remote.test_lean_entries import SKU, lean_store, recipe_file


def _signed(store: Store, key_dir: Path) -> tuple[dict, Trust]:
    private, public = signing_keys.generate(key_dir, "build")
    envelope = signing.sign(signing.manifest_of(store, SKU), signing_keys.load_private(private))
    signing.save(store, envelope)
    return envelope, Trust(SKU, Store(key_dir / "unused"), None, {public.key_id: public})


def test_sign_lists_libraries_per_arch_and_recipe_digests(tmp_path: Path) -> None:
    store, entries, recipes = lean_store(tmp_path / "build")
    envelope, _ = _signed(store, tmp_path / "keys")
    manifest = envelope["manifest"]
    assert manifest["libraries"] == {e.kernel_key: {"x86_64": signing.library_listing(e.shared_libs["x86_64"])}
                                     for e in entries}
    assert set(manifest["recipes"]) == set(recipes)


def test_client_with_trusted_keys_refuses_a_swapped_library_or_recipe(launch: Launch, tmp_path: Path) -> None:
    build, entries, recipes = lean_store(tmp_path / "build")
    _envelope, keys = _signed(build, tmp_path / "keys")
    server = launch()
    publisher = Remote(server.url, token=server.tokens["publish"])
    assert push_pull.push(build, publisher, "h200").manifests == 1
    # the server (or whoever holds a publish token) replaces a recipe file: newest wins on the server...
    key = next(iter(recipes))
    publisher.push_recipe("h200", key, recipe_file(Store(tmp_path / "evil"), 0, extra="planted")[1])
    # ...and swaps a kernel's library for other bytes behind the API's back
    evil = os.urandom(1000)
    publisher.put_object(hashlib.sha256(evil).hexdigest(), lambda: evil)
    victim = entries[0]
    swapped = {"x86_64": {**victim.shared_libs["x86_64"], "digest": hashlib.sha256(evil).hexdigest(),
                          "size": len(evil)}}
    with db.session_for(server.db_url) as session:
        session.get(models.Kernel, victim.kernel_key).shared_libs = json.dumps(swapped)
        session.commit()
    Store(server.cache_dir).put_entry(dataclasses.replace(victim, shared_libs=swapped))

    gpu = Store(tmp_path / "gpu")
    remote = Remote(server.url)
    trust = Trust(SKU, gpu, remote, keys.trusted)
    fetcher = Fetcher(remote, trust, gpu)
    assert not fetcher.recipe("h200", key) and "recipe file" in fetcher.error and gpu.recipes(key) is None
    libraries = Libraries(gpu, "h200", None, trust, fetcher)
    with pytest.raises(KernelMissing, match="is listed as"):
        libraries.function(victim.kernel_key, victim.family)
    assert not gpu.has_object(swapped["x86_64"]["digest"])
    # the untouched kernel and recipe still come through the same client
    assert fetcher.recipe("h200", next(k for k in recipes if k != key))
    assert fetcher.kernels([entries[1].kernel_key]) == 1


def test_manifests_signed_before_the_lean_runtime_serve_install_but_the_lean_path_asks_to_resign(
        tmp_path: Path) -> None:
    store, [entry], recipes = lean_store(tmp_path / "build", kernels=1)
    private, public = signing_keys.generate(tmp_path / "keys", "old")
    manifest = signing.manifest_of(store, SKU)
    del manifest["libraries"], manifest["recipes"]  # what `fa4-aot sign` wrote before the lean runtime
    signing.save(store, signing.sign(manifest, signing_keys.load_private(private)))
    trust = Trust(SKU, store, None, {public.key_id: public})
    trust.check(entry)  # the FA4 path (install()) keeps working
    with pytest.raises(TrustError, match="re-sign with `fa4-aot sign --sku h200`"):
        trust.check_library(entry, "x86_64")
    key, data = next(iter(recipes.items()))
    with pytest.raises(TrustError, match="re-sign"):
        trust.check_recipe(key, data)
