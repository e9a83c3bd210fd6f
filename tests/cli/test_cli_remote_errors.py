"""Issue 10 against a real server: the CLI's remote errors keep the server's reason, give the scope the
command needs, stop at the first auth or connection failure with one message, and advise only what applies."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from fa4_aot.cli import main
from fa4_aot.domain import kernel_keys
from fa4_aot.store import Entry, Store
from tests.helpers.servers import Launch, Server, free_port


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FA4_AOT_SERVER", "FA4_AOT_TOKEN", "FA4_AOT_OFFLINE", "FA4_AOT_CACHE"):
        monkeypatch.delenv(name, raising=False)


def cli(cache: Path, *args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, ["--cache-dir", str(cache), *args], env=env)


def filled_store(root: Path, n: int) -> Store:
    store = Store(root)
    for i in range(n):
        data = f"operator-{root}-{i}".encode()
        entry = Entry(
            kernel_key="", object_digest=store.put_object(data),
            size=len(data), family="FlashAttentionForwardSm90", compile_key=["fwd", i], sku="h200", arch="sm_90a",
            sm_count=132, l2_bytes=62914560, cuda_major=13, toolchain={"flash-attn-4": "4.0.0b36"},
            variant="train", call=f"fwd {i}", compile_seconds=0.1)
        store.put_entry(replace(entry, kernel_key=kernel_keys.entry_key(entry)))  # the server checks the key
    return store


def error_lines(result: Result) -> list[str]:
    return [line for line in result.output.splitlines() if line.startswith("Error:")]


def test_wrong_token_on_pull_keeps_the_servers_reason_and_asks_for_read(launch: Launch, tmp_path: Path) -> None:
    server = launch(require_read_token="true")
    result = cli(tmp_path / "c", "pull", "--server", server.url, "--sku", "h200", "--token", "not-a-token")
    assert result.exit_code == 1
    (line,) = error_lines(result)
    assert "unknown or revoked token" in line and "needs a read token" in line and "publish" not in line


def test_revoke_with_a_publish_token_says_admin(server: Server, tmp_path: Path) -> None:
    result = cli(tmp_path / "c", "revoke", "--server", server.url, "--token", server.tokens["publish"],
                 "--key-id", "0" * 16)
    (line,) = error_lines(result)
    assert "needs a admin token" in line or "needs an admin token" in line
    assert "scope 'publish'" in line  # the server's own reason


def test_push_without_token_stops_at_once_with_one_message(server: Server, tmp_path: Path) -> None:
    filled_store(tmp_path / "c", 30)
    result = cli(tmp_path / "c", "push", "--server", server.url, "--sku", "h200", "-j", "2")
    assert result.exit_code == 1
    assert len(error_lines(result)) == 1 and "needs a publish token" in error_lines(result)[0]
    assert "missing bearer token" in error_lines(result)[0]
    assert result.output.count("(401:") == 1, result.output  # one refusal reported ("401" alone may be in a digest)


def test_push_to_a_dead_server_stops_at_once_with_advice_on_the_option(tmp_path: Path) -> None:
    filled_store(tmp_path / "c", 30)
    result = cli(tmp_path / "c", "push", "--server", f"http://127.0.0.1:{free_port()}", "--token", "t", "-j", "2")
    assert result.exit_code == 1
    (line,) = error_lines(result)
    assert "cannot reach" in line and "--server" in line
    assert "FA4_AOT_OFFLINE" not in line and "FA4_AOT_SERVER" not in line
    assert result.output.count("cannot reach") == 1


def test_server_from_the_environment_gets_advice_on_the_variables(tmp_path: Path) -> None:
    result = cli(tmp_path / "c", "pull", "--sku", "h200", env={"FA4_AOT_SERVER": f"http://127.0.0.1:{free_port()}"})
    (line,) = error_lines(result)
    assert "FA4_AOT_SERVER" in line


def test_url_without_scheme_is_refused_at_once(tmp_path: Path) -> None:
    result = cli(tmp_path / "c", "pull", "--server", "127.0.0.1:9", "--sku", "h200")
    (line,) = error_lines(result)
    assert "needs a scheme" in line and "http://127.0.0.1:9" in line


def test_offline_pull_is_refused(server: Server, tmp_path: Path) -> None:
    result = cli(tmp_path / "c", "pull", "--server", server.url, "--sku", "h200", env={"FA4_AOT_OFFLINE": "1"})
    (line,) = error_lines(result)
    assert "FA4_AOT_OFFLINE=1" in line and not (tmp_path / "c").exists()


def test_token_names_its_database_and_a_server_elsewhere_refuses_it_with_the_fix(launch: Launch,
                                                                                tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    made = cli(other, "token", "create", "--scope", "publish", "--name", "elsewhere")
    assert made.exit_code == 0, made.output
    assert f"stored in sqlite:///{other}/fa4-aot.db" in made.stderr
    token = made.stdout.strip()
    server = launch()
    filled_store(tmp_path / "c", 1)
    result = cli(tmp_path / "c", "push", "--server", server.url, "--token", token)
    (line,) = error_lines(result)
    assert "unknown or revoked token" in line and "--cache-dir or --db as `fa4-aot serve`" in line


def test_head_on_json_routes_is_not_405(server: Server) -> None:
    with server.client() as http:
        for path in ("/healthz", "/v1/skus", "/openapi.json"):
            got, head = http.get(path), http.head(path)
            assert head.status_code == got.status_code == 200, (path, head.status_code)
            assert head.content == b"" and head.headers["content-type"] == got.headers["content-type"]
        assert http.head("/v1/skus/nosuch/manifest").status_code == 404
        assert http.head(f"/v1/objects/{'0' * 64}").status_code == 404  # its own HEAD route, unchanged


def test_docs_are_served_from_the_package(server: Server) -> None:
    with server.client() as http:
        page = http.get("/docs")
        assert page.status_code == 200 and "/docs/assets/swagger-ui-bundle.js" in page.text
        assert "cdn" not in page.text.lower() and "https://" not in page.text.replace("https://fastapi", "")
        js = http.get("/docs/assets/swagger-ui-bundle.js")
        assert js.status_code == 200 and len(js.content) > 100_000
        assert http.get("/docs/assets/swagger-ui.css").status_code == 200


def test_push_and_pull_progress_json_lines_quiet_and_plain(server: Server, tmp_path: Path) -> None:
    import json

    store = filled_store(tmp_path / "c", 5)
    sku = "h200"
    pushed = CliRunner().invoke(main, ["--cache-dir", str(store.root), "push", "--server", server.url, "--token",
                                       server.tokens["publish"], "--sku", sku, "--json"])
    assert pushed.exit_code == 0, pushed.output
    events = [json.loads(line) for line in pushed.stderr.splitlines()]
    assert [e["event"] for e in events] == ["push"] * 5 and events[-1]["done"] == events[-1]["total"] == 5
    assert json.loads(pushed.stdout)["kernels"] == 5
    quiet = cli(tmp_path / "d", "pull", "--server", server.url, "--sku", sku, "--quiet",
                env={"FA4_AOT_INSECURE": "1"})  # unsigned: pull takes them only when told to
    assert quiet.exit_code == 0 and quiet.stderr == "" and "pulled" in quiet.stdout
    plain = cli(tmp_path / "c", "push", "--server", server.url, "--token", server.tokens["publish"], "--sku", sku)
    assert "[5/5] push ok" in plain.stderr


@pytest.mark.parametrize("who, expected", [("admin", "OK   token      accepted, scope admin"),
                                           ("publish", "OK   token      accepted, scope publish"),
                                           ("revoked", "FAIL token      refused: unknown or revoked token"),
                                           (None, "WARN token      no token")])
def test_doctor_reports_the_server_and_the_tokens_scope(server: Server, tmp_path: Path, who: str | None,
                                                        expected: str) -> None:
    args = ["doctor", "--server", server.url] + (["--token", server.tokens[who]] if who else [])
    result = cli(tmp_path / "c", *args, env={"FA4_AOT_SKU": "h200", "FA4_AOT_CONFIG_DIR": str(tmp_path / "cfg")})
    assert f"OK   server     {server.url} answers" in result.output
    assert expected in result.output, result.output
