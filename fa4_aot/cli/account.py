"""`fa4-aot login` and `logout`: a server's token kept in a 0600 file (see fa4_aot/remote/credentials.py)."""

from __future__ import annotations

import click

from ..errors import Fa4AotError
from ..remote import credentials


@click.command()
@click.option("--server", required=True, envvar="FA4_AOT_SERVER", help="Server URL ($FA4_AOT_SERVER).")
@click.option("--token", help="The token (default: prompted for, hidden); from `fa4-aot token create`.")
def login(server: str, token: str | None) -> None:
    """Store a token for SERVER; push, pull, revoke and build --from-misses use it when no --token is given, and
    SERVER becomes push's and pull's default --server."""
    from ..remote.http import Remote

    Remote(server)  # a malformed URL is refused before anything is stored
    token = token or click.prompt("token", hide_input=True)
    if not token.strip():
        raise Fa4AotError("empty token: make one with `fa4-aot token create --scope read|publish|admin`")
    # the server says whether it knows the token (RemoteAuthError if not): nothing unknown is stored
    me = Remote(server, token=token.strip(), retries=0,
                advice="check SERVER, or that `fa4-aot serve` runs there").whoami()
    where = credentials.save(server, token.strip())
    held = ("unchecked: the server predates GET /v1/token" if me is None else
            f"{me.get('scope')} token {me.get('name')!r}" + (f" for SKUs {', '.join(me['skus'])}" if me.get("skus")
                                                           else ""))
    click.echo(f"{held} for {server.rstrip('/')} stored in {where} (mode 0600); push and pull now default to this "
               "server")


@click.command()
@click.option("--server", envvar="FA4_AOT_SERVER", help="Forget this server's token ($FA4_AOT_SERVER).")
@click.option("--all", "everything", is_flag=True, help="Forget every stored token.")
def logout(server: str | None, everything: bool) -> None:
    """Forget a stored token."""
    if bool(server) == everything:
        raise click.UsageError("give --server URL or --all")
    gone = credentials.forget(None if everything else server)
    click.echo(f"removed {gone} stored token(s) from {credentials.path()}")
