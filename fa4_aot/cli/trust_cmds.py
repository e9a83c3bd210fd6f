"""The `fa4-aot` commands for signing: keys generate, sign, revoke."""

from __future__ import annotations

from pathlib import Path

import click

from ..store import Store, kernels
from .common import emit, json_option, load_matrix, pass_store, remote_for, variants_option


@click.group()
def keys() -> None:
    """Ed25519 signing keys for SKU manifests."""


@keys.command("generate")
@click.option("--out", "folder", type=click.Path(file_okay=False, path_type=Path), default=Path("."),
              show_default=True, help="Folder for NAME.key (private, mode 0600) and NAME.pub.")
@click.option("--name", default="fa4-aot-signing", show_default=True)
def keys_generate(folder: Path, name: str) -> None:
    """Make a key pair. Keep NAME.key on the build host; give NAME.pub's line to clients as
    FA4_AOT_TRUSTED_KEYS (the line itself, or the file's path)."""
    from ..trust import signing_keys

    private, public = signing_keys.generate(folder, name)
    click.echo(f"private key: {private} (keep it secret)\npublic key:  {folder / (name + '.pub')} "
               f"(key id {public.key_id})\n{public.line()}")


@click.command()
@click.option("--sku", required=True, help="SKU whose kernels the manifest lists.")
@click.option("--key", "key_path", required=True, type=click.Path(dir_okay=False, path_type=Path),
              envvar="FA4_AOT_SIGNING_KEY", help="Private key from `fa4-aot keys generate` ($FA4_AOT_SIGNING_KEY).")
@click.option("--expires-days", default=365.0, show_default=True, type=click.FloatRange(min=0, min_open=True))
@variants_option("Variants file holding the SKU table (default: variants.toml).")
@json_option()
@pass_store
def sign(store: Store, sku: str, key_path: Path, expires_days: float, variants_file: Path | None,
         as_json: bool) -> None:
    """Sign a manifest of every kernel the store holds for SKU (kernel keys -> object digests, toolchain,
    created, expiry) and keep it in the store; `fa4-aot push` uploads it. A manifest over the 8 MiB a server
    takes (verdicts of many device classes) is signed as several parts, each listing every kernel and the
    verdicts of some device classes."""
    from ..trust import manifest_parts, signing, signing_keys

    target = load_matrix(variants_file).sku(sku)
    key = signing_keys.load_private(key_path)
    envelopes = [signing.sign(part, key, key_path.stem)
                 for part in manifest_parts.parts(signing.manifest_of(store, target, expires_days))]
    paths = [signing.save(store, envelope) for envelope in envelopes]
    listed = envelopes[0]["manifest"]["kernels"]  # index entries: kernels and their signposts
    ids = [signing.manifest_id(envelope) for envelope in envelopes]
    doc = {"manifest_id": ids[0], "manifest_ids": ids, "key_id": envelopes[0]["key_id"], "path": str(paths[0]),
           "kernels": len(kernels(e for e in store.entries() if e.kernel_key in listed)),
           "index_entries": len(listed), "expires": envelopes[0]["manifest"]["expires"]}
    where = f"manifest {ids[0]}" if len(ids) == 1 else f"{len(ids)} manifests (one per group of device classes)"
    emit(as_json, doc, f"signed {doc['kernels']} {sku} kernel(s) ({doc['index_entries']} index entries) with key "
                       f"{doc['key_id']}: {where} (expires {doc['expires']}) in "
                       f"{paths[0] if len(paths) == 1 else paths[0].parent}")


@click.command()
@click.option("--server", required=True, envvar="FA4_AOT_SERVER")
@click.option("--token", envvar="FA4_AOT_TOKEN", help="An admin token.")
@click.option("--key-id", help="Revoke every manifest signed by this key (16 hex, from `keys generate`).")
@click.option("--manifest", "manifest_id", help="Revoke one manifest (64 hex, from `fa4-aot sign`).")
@click.option("--reason", default="", help="Why, for the audit log.")
def revoke(server: str, token: str | None, key_id: str | None, manifest_id: str | None, reason: str) -> None:
    """Publish a revocation: clients stop trusting the key or manifest at their next start."""
    if bool(key_id) == bool(manifest_id):
        raise click.UsageError("give exactly one of --key-id and --manifest")
    kind, ident = ("key", key_id) if key_id else ("manifest", manifest_id)
    remote_for(server, token).revoke(kind, ident or "", reason)
    click.echo(f"revoked {kind} {ident} on {server}")
