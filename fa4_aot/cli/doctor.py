"""`fa4-aot doctor`: what this host is, which SKU it matches and why, the toolchain, the store's health, its
certification, the server and the token, each with what to do next."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

import click

from .. import __version__
from ..errors import Fa4AotError
from ..store import Store, kernels
from .common import emit, existing, load_matrix, plural, state

if TYPE_CHECKING:
    from ..trust.standing import SkuStanding

Check = dict[str, str]  # {"check", "status": ok|warn|fail, "detail", "next"}


def _check(name: str, status: str, detail: str, next_step: str = "") -> Check:
    return {"check": name, "status": status, "detail": detail, "next": next_step}


def _device() -> tuple[list[Check], str | None]:
    from ..domain import devices

    probe = devices.probe()
    try:
        here = devices.resolve(load_matrix(None).skus, probe, os.environ.get("FA4_AOT_SKU"))
    except Fa4AotError as e:
        step = "a build host needs no GPU: `fa4-aot build --sku NAME`" if probe.device is None else ""
        return [_check("device", "warn" if probe.device is None else "fail", str(e), step)], None
    if probe.device is None:
        return [_check("device", "ok", f"no CUDA device; FA4_AOT_SKU={here.sku.name} ({here.sku.arch})",
                       "this host can build and check kernels for it; load them on a GPU host")], here.sku.name
    return [_check("device", "ok", f"{probe.device.name} matches SKU {here.sku.name} ({'; '.join(here.trace)})")
            ], here.sku.name


def _toolchain() -> Check:
    from ..fa4 import toolchain

    tools = toolchain()
    absent = [k for k, v in tools.items() if v == "absent"]
    detail = ", ".join(f"{k} {v}" for k, v in tools.items())
    return _check("toolchain", "warn" if absent else "ok", detail,
                  "install the build extra: pip install 'fa4-aot[build]'" if absent else "")


def _store(sku: str | None) -> Check:
    store = state().store
    try:
        existing(store)
    except Fa4AotError as missing:  # a mistyped --cache-dir must not pass as a store that is merely empty
        return _check("store", "fail", str(missing), f"build into it: `fa4-aot build --sku {sku or 'NAME'}`, or "
                                                     f"`fa4-aot pull --server URL --sku {sku or 'NAME'}`")
    store.check_root()
    counts: dict[str, int] = {}
    for e in kernels(store.entries()):  # one kernel, one count (list, build, sign and push count alike)
        counts[e.sku] = counts.get(e.sku, 0) + 1
    detail = f"{store.root}: " + (", ".join(f"{n} {k} kernel(s)" for k, n in sorted(counts.items())) or "empty")
    if not counts or (sku and not counts.get(sku)):
        return _check("store", "warn", detail,
                      f"`fa4-aot build --sku {sku or 'NAME'}` (or pull it) before running jobs")
    stale = _built_by_another_toolchain(store)
    if stale:
        return _check("store", "warn", detail, "; ".join(stale))
    return _check("store", "ok", detail, "`fa4-aot verify` re-hashes every object")


def _built_by_another_toolchain(store: Store) -> list[str]:
    """What to do about kernels no key of this installation finds (migrate.foreign)."""
    from ..fa4 import toolchain
    from ..store.migrate import foreign, rebuild_advice

    return rebuild_advice(*foreign(store.entries(), toolchain()))


def _certification(sku: str | None) -> Check:
    """The policy in force (FA4_AOT_CERTIFIED), the known-bad registry (its revision, the store's measured entries
    for the SKU) and the SKU's verdicts by status; failed kernels by name, with the fix."""
    from ..domain import known_bad
    from ..trust import certified, standing

    store = state().store
    try:
        policy = certified.policy_from_env()
        registry = certified.registry_for(store, sku) if sku and store.root.is_dir() else known_bad.load()
    except Fa4AotError as e:
        return _check("certified", "fail", str(e), "")
    ours = {b.id for b in known_bad.load().entries}
    measured = [b.id for b in registry.entries if b.id not in ours]
    entries = plural(len(registry.entries), "entry", "entries")
    detail = (f"{certified.ENV}={policy}; known-bad registry revision {registry.revision}, {entries}, "
              f"{len(measured)} measured in this store" + (f" for {sku}" if sku else "")
              + (f" ({', '.join(measured)})" if measured else ""))
    if not sku or not store.root.is_dir():
        return _check("certified", "ok", detail, "`fa4-aot known-bad` lists the registry")
    found = standing.of_sku(store, sku)
    counts = ", ".join(f"{n} {status}" for status, n in found.statuses.items())
    detail += f"; {sku}: {found.kernels} kernel(s), verdicts: {counts or 'none'}, {found.unchecked} unchecked"
    if found.failed:
        return _failed(detail, found, sku)
    if policy == "require" and found.unchecked:
        return _check("certified", "warn", detail, f"{certified.ENV}=require refuses the {found.unchecked} "
                      f"unchecked kernel(s): run `fa4-aot certify --sku {sku}` on a GPU of the SKU")
    return _check("certified", "ok", detail, "`fa4-aot known-bad` lists the registry")


def _failed(detail: str, found: SkuStanding, sku: str) -> Check:
    names = "; ".join(f"{e.kernel_key[:16]}… {e.family} ({v.device}: {v.describe()})" for e, v in found.failed[:5])
    more = f" and {len(found.failed) - 5} more" if len(found.failed) > 5 else ""
    return _check("certified", "warn", f"{detail}; FAILED {names}{more}",
                  f"both runtimes refuse them on that GPU: rebuild with a FA4 release that fixes them, then "
                  f"`fa4-aot certify --sku {sku}` again (`fa4-aot list --sku {sku} --json` has every verdict)")


def _server(url: str | None, token: str | None) -> list[Check]:
    from ..remote.credentials import token_for
    from ..remote.http import Remote

    if not url:
        return [_check("server", "ok", "none configured (local store only)",
                       "to serve this store: `fa4-aot serve`; clients then set FA4_AOT_SERVER")]
    token = token or token_for(url)
    try:
        remote = Remote(url, token=token, retries=0, advice="check --server and that `fa4-aot serve` runs there")
        skus = remote.skus()
    except Fa4AotError as e:
        return [_check("server", "fail", str(e), "")]
    names = ", ".join(s.get("sku", s.get("name", "?")) for s in skus) or "no SKUs yet"
    found = [_check("server", "ok", f"{url} answers; it serves {names}")]
    scope = remote.token_scope()
    if scope in ("admin", "publish", "read"):
        found.append(_check("token", "ok", f"accepted, scope {scope}",
                            "" if scope != "read" else "publishing needs `fa4-aot token create --scope publish`"))
    else:
        found.append(_check("token", "warn" if scope == "none" else "fail",
                            "no token: reads only, if the server allows them" if scope == "none" else scope,
                            f"`fa4-aot login --server {url}` with a token from `fa4-aot token create` run where "
                            "the server's database is"))
    return found


@click.command()
@click.option("--server", envvar="FA4_AOT_SERVER", help="Server to check ($FA4_AOT_SERVER).")
@click.option("--token", envvar="FA4_AOT_TOKEN", help="Token to check (default: the one `fa4-aot login` stored).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def doctor(server: str | None, token: str | None, as_json: bool) -> None:
    """Check this host: device and the SKU it matches (or why not), toolchain, store, certification (the policy,
    the known-bad registry, the SKU's verdicts), server and token; each line says what to do next. Exits 1 when
    a check fails."""
    device, sku = _device()
    checks = [_check("fa4-aot", "ok", f"{__version__} on Python {sys.version.split()[0]}"), *device,
              _toolchain(), _store(sku), _certification(sku), *_server(server, token)]
    lines = [f"{c['status'].upper():<5}{c['check']:<10} {c['detail']}" + (f"\n{'':15}next: {c['next']}"
             if c["next"] else "") for c in checks]
    emit(as_json, checks, "\n".join(lines))
    if any(c["status"] == "fail" for c in checks):
        sys.exit(1)

