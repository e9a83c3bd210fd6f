"""Stored server tokens (`fa4-aot login`): one JSON file, mode 0600, under the user's config folder
($FA4_AOT_CONFIG_DIR, else $XDG_CONFIG_HOME/fa4-aot, else ~/.config/fa4-aot). push, pull, revoke and
`build --from-misses` use the token stored for their --server when no --token or FA4_AOT_TOKEN is given; the server
of the last login is the default --server of push and pull (a file beside the tokens)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import Fa4AotError
from ..store.atomic import atomic_write


def path() -> Path:
    env = os.environ.get("FA4_AOT_CONFIG_DIR")
    base = Path(env) if env else Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "fa4-aot"
    return base.expanduser() / "credentials.json"


def _read() -> dict[str, str]:
    try:
        doc = json.loads(path().read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise Fa4AotError(f"cannot read stored tokens {path()}: {e}; remove it and run `fa4-aot login` again") from e
    return {str(k): str(v) for k, v in doc.items()} if isinstance(doc, dict) else {}


def _write(tokens: dict[str, str]) -> None:
    folder = path().parent
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    atomic_write(path(), json.dumps(tokens, indent=1, sort_keys=True).encode(), mode=0o600)


def _key(server: str) -> str:
    return server.rstrip("/")


def token_for(server: str) -> str | None:
    """The token stored for `server`, or None."""
    return _read().get(_key(server))


def save(server: str, token: str) -> Path:
    """Store `token` for `server`, which becomes the default server (default_server)."""
    tokens = _read()
    tokens[_key(server)] = token
    _write(tokens)
    atomic_write(_default_path(), (_key(server) + "\n").encode(), mode=0o600)
    return path()


def default_server() -> str | None:
    """The server of the last `fa4-aot login` (push and pull use it without --server), or None."""
    try:
        return _default_path().read_text().strip() or None
    except FileNotFoundError:
        return None
    except OSError as e:
        raise Fa4AotError(f"cannot read the default server {_default_path()}: {e}; remove it and run `fa4-aot "
                          "login` again") from e


def forget(server: str | None) -> int:
    """Remove the token of `server` (every stored one when None), and the default server when it is that one;
    returns how many tokens went."""
    tokens = _read()
    gone = len(tokens) if server is None else int(tokens.pop(_key(server), None) is not None)
    _write({} if server is None else tokens)
    if server is None or default_server() == _key(server):
        _default_path().unlink(missing_ok=True)
    return gone


def _default_path() -> Path:
    return path().parent / "default-server"
