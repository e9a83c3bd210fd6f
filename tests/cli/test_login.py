"""Issue 22, point 8: `fa4-aot login` checks the token against the server (GET /v1/token) and says what it holds;
it stored any token, `bogus` included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.helpers.servers import Server


def test_login_checks_the_token_and_says_its_scope(server: Server, tmp_path: Path) -> None:
    env = {"FA4_AOT_CONFIG_DIR": str(tmp_path / "cfg")}
    bogus = run_cli("login", "--server", server.url, "--token", "bogus", env=env, cache=tmp_path)
    assert bogus.returncode == 1 and "unknown or revoked token" in bogus.stderr, bogus.stderr
    assert not (tmp_path / "cfg" / "credentials.json").exists()
    good = run_cli("login", "--server", server.url, "--token", server.tokens["publish"], env=env, cache=tmp_path)
    assert good.returncode == 0 and "publish token" in good.stdout, good.stderr
    stored = tmp_path / "cfg" / "credentials.json"
    assert stored.stat().st_mode & 0o777 == 0o600
    assert json.loads(stored.read_text()) == {server.url.rstrip("/"): server.tokens["publish"]}
    assert "removed 1" in run_cli("logout", "--server", server.url, env=env, cache=tmp_path).stdout


@pytest.mark.parametrize("scope", ["read", "admin"])
def test_token_route_names_the_requests_own_token(server: Server, scope: str) -> None:
    with server.client(scope) as c:
        me = c.get("/v1/token").json()
    assert me["scope"] == scope and set(me) == {"name", "scope", "skus"}
    with server.client() as c:
        assert c.get("/v1/token").status_code == 401
