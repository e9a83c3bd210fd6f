"""The `fa4-aot` commands that involve a server: serve, token (create/rotate/revoke/list), push, pull."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..errors import Fa4AotError
from ..store import Store
from .common import check_sku, emit, json_option, load_matrix, pass_store, remote_for, server_skus, state
from .progress import Progress, quiet_option

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from ..remote.http import Remote


def _remote(server: str, token: str | None) -> Remote:
    """The server of --server (or FA4_AOT_SERVER), refused at once under FA4_AOT_OFFLINE=1 or without a scheme."""
    return remote_for(server, token)


def _progress(bar: Progress) -> Callable[[int, int, str, int], None]:
    """push's and pull's progress: kernels done of all, and the bytes moved so far with their rate."""
    started = time.monotonic()

    def report(done: int, total: int, status: str, moved: int) -> None:
        if bar.mode != "lines" or status != "ok" or done == total or done % 25 == 0:  # lines: a few, for logs
            rate = moved / max(time.monotonic() - started, 1e-3) / 1e6
            line = f"{bar.verb} ok, {moved / 1e6:.1f} MB at {rate:.1f} MB/s" if status == "ok" else ""
            bar.update(done, total, status, line, bytes=moved, mb_per_s=round(rate, 2))

    return report


def _logged_in(ctx: click.Context, param: click.Parameter, value: str | None) -> str:
    """push's and pull's --server, else the server of the last `fa4-aot login`; missing when there is neither."""
    from ..remote.credentials import default_server

    found = value or default_server()
    if not found:
        raise click.MissingParameter(ctx=ctx, param=param, message="give --server URL, set FA4_AOT_SERVER, or "
                                     "run `fa4-aot login --server URL` once")
    return found


_server = click.option("--server", envvar="FA4_AOT_SERVER", callback=_logged_in,
                       help="Server URL ($FA4_AOT_SERVER; default: the server of the last `fa4-aot login`).")
_token = click.option("--token", envvar="FA4_AOT_TOKEN", help="Bearer token ($FA4_AOT_TOKEN).")
_jobs = click.option("--jobs", "-j", default=8, show_default=True, type=click.IntRange(1, 64),
                     help="Parallel transfers.")
_db = click.option("--db", "db_url", envvar="FA4_AOT_DB_URL", help="Server database URL (default: the cache dir's).")


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on (0.0.0.0 for all).")
@click.option("--port", default=8700, show_default=True, type=click.IntRange(0, 65535),
              help="TCP port to listen on; pick another free one if it is taken.")
@click.option("--db", "db_url", envvar="FA4_AOT_DB_URL",
              help="SQLAlchemy URL (default: SQLite inside the cache dir); e.g. postgresql+psycopg://u@host/db.")
@click.option("--require-read-token", is_flag=True, help="Reads need a token too (default: reads are open).")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1, 64),
              help="Server processes (about one per core for a busy cluster).")
@click.option("--store-poll", default=10.0, show_default=True, type=click.FloatRange(0), envvar="FA4_AOT_STORE_POLL",
              help="Seconds between checks for changes of the store (a build, `sign`, a pull into it), which are "
                   "then served; 0: import the store only at start.")
@click.option("--wheels", "wheels_dir", type=click.Path(file_okay=False, exists=True, path_type=Path),
              envvar="FA4_AOT_WHEELS_DIR", help="Serve the wheels in this folder as a PEP 503 index at /simple/, so "
              "GPU hosts run `pip install --index-url http://SERVER:PORT/simple fa4-aot` (default: wheels/ in the "
              "store, when it exists).")
def serve(host: str, port: int, db_url: str | None, require_read_token: bool, workers: int,
          store_poll: float, wheels_dir: Path | None) -> None:
    """Serve the store to a cluster over HTTP (FastAPI + uvicorn); the OpenAPI page is at /docs.

    Kernels, recipe files and signed manifests already in the store are indexed at start, and what is
    written into it later (`fa4-aot build`, `fa4-aot sign`) within --store-poll seconds, so
    `fa4-aot build --sku h200 && fa4-aot serve` is a working server. Publishing needs a token from
    `fa4-aot token create --scope publish`. GPU hosts install the client from /simple/ (--wheels).
    """
    from service.config import Settings
    from service.main import serve as run

    _check_port(host, port)
    settings = Settings(cache_dir=state().cache_dir, db_url=db_url, host=host, port=port,
                        require_read_token=require_read_token, workers=workers, store_poll=store_poll,
                        wheels_dir=wheels_dir)
    _check_database(settings.database_url)
    run(settings)


def _check_database(url: str) -> None:
    """Fail before uvicorn does (a traceback of a few hundred lines out of its startup) when the database cannot
    be reached: one line naming the database, what it answered and what to check."""
    from sqlalchemy import text
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import SQLAlchemyError

    from service import db

    shown = make_url(url).render_as_string(hide_password=True)
    try:
        engine = db.make_engine(url)
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
        engine.dispose()
    except (SQLAlchemyError, OSError) as e:
        why = str(getattr(e, "orig", None) or e).strip().splitlines()[0]
        raise Fa4AotError(f"cannot reach the database {shown}: {why}; check --db (or FA4_AOT_DB_URL): its host, "
                          "port, user and database name, and that the database server runs and accepts this host "
                          "(without --db, the SQLite file in --cache-dir is used)") from e


def _check_port(host: str, port: int) -> None:
    """Fail before uvicorn does (its message is a bare `[Errno 98]`, exit 3) when host:port is taken."""
    import errno
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT is no conflict
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise Fa4AotError(f"cannot listen on {host}:{port}: {e.strerror}; check --host") from e
            free = _free_port_after(host, port)
            pick = f"`fa4-aot serve --port {free}` (free now)" if free else "another --port"
            raise Fa4AotError(f"port {port} on {host} is already in use (another `fa4-aot serve`?): pick {pick}, "
                              "or stop what listens there") from e


def _free_port_after(host: str, port: int, tries: int = 100) -> int | None:
    """The first port after `port` that `host` can listen on now, among the next `tries`; None if none is."""
    import socket

    for candidate in range(port + 1, min(port + 1 + tries, 65536)):
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, candidate))
            except OSError:
                continue
            return candidate
    return None


@click.group()
def token() -> None:
    """Create and revoke the server's bearer tokens (run where the server's database is)."""


def _session(db_url: str | None, create: bool = False) -> AbstractContextManager[Session]:
    """A session on the server's database (migrated first): --db, else the one in --cache-dir."""
    from service import db

    url = token_db(db_url, create=create)
    db.migrate(url)
    return db.session_for(url)


def token_db(db_url: str | None, *, create: bool) -> str:
    """The server's database URL: --db, else the SQLite file in --cache-dir. Without `create`, a missing SQLite
    file is an error (listing tokens must not make an empty database where no server runs); with it, the file
    and a missing store folder are made as `serve` makes them, so a token can be created before the first serve."""
    from sqlalchemy.engine import make_url

    from service.config import Settings

    url = Settings(cache_dir=state().cache_dir, db_url=db_url).database_url
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database and not create:
        path = Path(parsed.database)  # with `create`, service.db makes the file and its folder, as `serve` does
        if not path.is_file():
            raise Fa4AotError(f"no token database at {path}: a server's database lives in its --cache-dir (or "
                              "--db URL); pass the same --cache-dir/--db as `fa4-aot serve`, or create the store "
                              "first (`fa4-aot build` or `fa4-aot pull`)")
    return url


def _where(db_url: str | None) -> str:
    from sqlalchemy.engine import make_url

    return make_url(token_db(db_url, create=True)).render_as_string(hide_password=True)


@token.command("create")
@click.option("--scope", type=click.Choice(["read", "publish", "admin"]), required=True)
@click.option("--name", default="", help="A label for whoever gets the token (unique among active tokens).")
@click.option("--sku", "skus", multiple=True, help="Limit a publish token to these SKUs (repeatable).")
@_db
def token_create(scope: str, name: str, skus: tuple[str, ...], db_url: str | None) -> None:
    """Print a new token once; the database keeps only its hash."""
    from service import crud
    from service.crud import tokens as crud_tokens

    with _session(db_url, create=True) as session:
        for sku in skus:  # a token limited to a mistyped SKU could publish nothing
            check_sku(sku, {s.name for s in crud.list_skus(session)})
        click.echo(crud_tokens.create_token(session, name=name, scope=scope, skus=list(skus) or None))
    click.echo(f"{scope} token {name or '(unnamed)'} stored in {_where(db_url)}: servers using this database "
               "(`fa4-aot serve` with the same --cache-dir or --db) accept it", err=True)


@token.command("rotate")
@click.option("--name", required=True)
@_db
def token_rotate(name: str, db_url: str | None) -> None:
    """Print a new token for NAME (same scope and SKUs) and revoke the old one."""
    from service.crud import tokens as crud_tokens

    with _session(db_url, create=True) as session:
        click.echo(crud_tokens.rotate_token(session, name=name))
    click.echo(f"rotated {name!r} in {_where(db_url)}", err=True)


@token.command("revoke")
@click.option("--name", required=True)
@_db
def token_revoke(name: str, db_url: str | None) -> None:
    """Revoke every active token called NAME."""
    from service.crud import tokens as crud_tokens

    with _session(db_url, create=True) as session:
        count = crud_tokens.revoke_token(session, name=name)
        click.echo(f"revoked {count} token(s) named {name!r} in {_where(db_url)}")


@token.command("list")
@_db
@json_option()
def token_list(db_url: str | None, as_json: bool) -> None:
    """Every token's name, scope, SKUs and state (never the token itself)."""
    from service.crud import tokens as crud_tokens

    with _session(db_url) as session:
        rows = crud_tokens.list_tokens(session)
    lines = [f"{r['name']:<24} {r['scope']:<8} {','.join(r['skus'] or ['*']):<20} "
             f"{'revoked' if r['revoked'] else 'active':<8} {r['created']}" for r in rows]
    emit(as_json, rows, "\n".join([*lines, f"{len(rows)} token(s) in {_where(db_url)}"]))


@click.command()
@_server
@_token
@click.option("--sku", help="Only this SKU's kernels (default: all).")
@_jobs
@json_option("Print the summary as JSON on stdout; one JSON line per kernel on stderr.")
@quiet_option
@pass_store
def push(store: Store, server: str, token: str | None, sku: str | None, jobs: int, as_json: bool, quiet: bool) -> None:
    """Publish local kernels to a server, uploading only the objects it lacks (HEAD first)."""
    from ..remote.push_pull import push as run

    if sku is not None:  # a typo must not push nothing and exit 0
        check_sku(sku, {e.sku for e in store.entries()})
    remote = _remote(server, token)
    with Progress("push", quiet=quiet, as_json=as_json) as bar:
        result = run(store, remote, sku, jobs, _progress(bar))
    emit(as_json, result.to_dict(), f"pushed {result.kernels} kernel(s) to {server}: {result.objects_sent} "
         f"object(s) uploaded ({result.bytes} bytes), {result.recipes} recipe file(s), {result.verdicts} "
         f"verdict(s), {result.manifests} signed manifest(s), {len(result.failures)} failed")
    if result.failures:
        sys.exit(1)


@click.command()
@_server
@_token
@click.option("--sku", required=True, help="SKU to mirror (`fa4-aot skus`; an unknown name is an error, with a "
              "suggestion from the SKU table and the server's SKUs).")
@click.option("--model", "model_arg", metavar="NAME_OR_CONFIG_JSON",
              help="Only this model's kernel set (a catalog name, `fa4-aot models`, or a Hugging Face config.json): "
                   "its recipe files, kernels and this host's libraries, the kernels in one bundle; what the server "
                   "lacks is reported to it as misses (build jobs where a builder runs), and the exit status is 1.")
@click.option("--tp", "tp_arg", default="1", show_default=True, help="TP degrees for --model, e.g. 1,2,4,8.")
@click.option("--workload", "workload_arg", default="train,prefill,decode", show_default=True,
              help="Workloads for --model: train, prefill, decode.")
@_jobs
@json_option("Print the summary as JSON on stdout; one JSON line per kernel on stderr.")
@quiet_option
@pass_store
def pull(store: Store, server: str, token: str | None, sku: str, model_arg: str | None, tp_arg: str,
         workload_arg: str, jobs: int, as_json: bool, quiet: bool) -> None:
    """Mirror a SKU's kernels from a server into the local store (verified), e.g. for an air-gapped copy; with
    --model, only what that model runs, so a node starts warm (as fa4_aot.prefetch does in Python)."""
    from ..remote.push_pull import pull as run

    remote = _remote(server, token)
    held = server_skus(remote)
    check_sku(sku, held)
    if sku not in held:  # the server's own 404 names its routes; a person wants the commands (and --model's
        # misses would be refused too: the server records misses only of SKUs it holds)
        build = f"--model {model_arg} --tp {tp_arg}" if model_arg is not None else "(or --model NAME)"
        raise Fa4AotError(f"{server} holds no kernel of SKU {sku} yet: build it (`fa4-aot build --sku {sku} {build}`) "
                          f"and push it there (`fa4-aot push --server {server} --sku {sku}`)")
    if model_arg is not None:  # an empty --model is an error (models.resolve), never "the whole SKU"
        _pull_model(store, remote, sku, model_arg, tp_arg, workload_arg, as_json)
        return
    with Progress("pull", quiet=quiet, as_json=as_json) as bar:
        result = run(store, remote, sku, jobs, _progress(bar))
    emit(as_json, result.to_dict(), f"pulled {result.fetched} of {result.kernels} missing kernel(s) of {sku} "
         f"({result.bytes} bytes), {result.recipes} recipe file(s) and {result.verdicts} verdict(s) into "
         f"{Path(store.root)}, {len(result.failures)} failed")
    for refused in result.lean_refused[:5]:  # install() can use these kernels; the lean runtime cannot
        click.echo(f"warning: {refused}", err=True)
    if result.failures:
        sys.exit(1)


def _pull_model(store: Store, remote: Remote, sku: str, model_arg: str, tp_arg: str, workload_arg: str,
                as_json: bool) -> None:
    """`pull --model`: the model's kernel set (client/prefetch.py); exit 1 unless the store then holds all of it."""
    from ..client import prefetch
    from ..matrix import models, modelwork
    from .model_cmds import parse_tps, parse_workloads

    model, tps = models.resolve(model_arg), parse_tps(tp_arg)
    modelwork.check_tps(model, tps)
    target = load_matrix(None).skus.get(sku)
    if target is None:  # a SKU only the server knows
        raise Fa4AotError(f"SKU {sku!r} is not in this host's SKU table (`fa4-aot skus`): --model needs its facts "
                          "to name its recipe files")
    r = prefetch.run(store, remote, target, model, tps, parse_workloads(workload_arg))
    if not r.signatures:
        raise Fa4AotError(f"{model.name} has no signature at TP {tp_arg}: nothing to pull")
    lines = [f"unbuilt on the server: {label}" for label in r.unbuilt]
    lines += [f"missing on the server: kernel {key[:16]}" for key in r.missing]
    lines += [f"unsigned on the server: recipe file {key}" for key in r.unsigned] + ([r.refusal] if r.refusal else [])
    lines += [f"FAILED {f}" for f in dict.fromkeys(r.failures)]
    lines.append(f"{model.name} on {sku} at TP {','.join(map(str, tps))}: {r.signatures} signature(s), {r.kernels} "
                 f"kernel(s); fetched {r.fetched} kernel(s) in {r.bundles} bundle(s) ({r.bytes} bytes), "
                 f"{r.recipes} recipe file(s) and {r.verdicts} certification verdict(s) into {Path(store.root)}"
                 + (f"; {len(r.unbuilt)} signature(s) and {len(r.missing)} kernel(s) the server lacks, "
                    f"{r.reported} reported to it as misses" if r.unbuilt or r.missing else ""))
    if r.unbuilt or r.missing:
        lines.append(f"next: on a build host, `fa4-aot build --sku {sku} --model {model_arg} --tp {tp_arg}` then "
                     f"`fa4-aot push --server {remote.url} --sku {sku}`; where `fa4-aot builder` serves "
                     f"{remote.url}, pull again once it built the misses reported now (`fa4-aot builds`)")
    emit(as_json, r.to_dict(), "\n".join(lines))
    if not r.complete:
        sys.exit(1)
