"""Issue 10 through click's runner: mistakes that used to look healthy are errors, token commands name their
database and never create one by listing, prune and the list filters work on a real store in tmp_path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from fa4_aot.cli import main
from fa4_aot.store import Entry, Store
from tests.conftest import proven


@pytest.fixture(autouse=True)
def _defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FA4_AOT_CACHE", "FA4_AOT_VARIANTS", "FA4_AOT_SKU", "FA4_AOT_SERVER", "FA4_AOT_TOKEN"):
        monkeypatch.delenv(name, raising=False)


def cli(cache: Path, *args: str) -> Result:
    return CliRunner().invoke(main, ["--cache-dir", str(cache), *args])


def put(store: Store, tag: str, *, sku: str = "h200", variant: str = "train", fa: str = "4.0.0b36",
        created: str = "2026-11-30T00:00:00Z", family: str = "FlashAttentionForwardSm90") -> Entry:
    data = f"{tag}-{sku}-{variant}-{fa}".encode() * 10
    entry = proven(Entry(
        kernel_key="", object_digest=store.put_object(data), size=len(data),
        family=family, compile_key=[tag, sku, variant], sku=sku, arch="sm_90a", sm_count=132, l2_bytes=62914560,
        cuda_major=13, toolchain={"flash-attn-4": fa}, variant=variant, call=f"fwd {tag}", compile_seconds=0.1,
        created=created))
    store.put_entry(entry)
    return entry


@pytest.mark.parametrize("command", [["list"], ["list", "--summary"], ["misses"], ["gc", "--dry-run"], ["verify"]])
def test_cache_dir_after_the_command_name_and_a_missing_store_is_an_error(tmp_path: Path, command: list[str]) -> None:
    """Issue 22, point 5: `fa4-aot list --cache-dir X` was "No such option", and `--cache-dir /typo list` printed
    "0 kernel(s)" with exit 0."""
    store = Store(tmp_path / "real")
    entry = put(store, "one")
    after = CliRunner().invoke(main, [*command, "--cache-dir", str(tmp_path / "real")])
    assert after.exit_code == 0, after.output
    if command == ["list"]:
        assert entry.kernel_key[:16] in after.output
    for args in ([*command, "--cache-dir", str(tmp_path / "typo")], ["--cache-dir", str(tmp_path / "typo"), *command]):
        missing = CliRunner().invoke(main, args)
        assert missing.exit_code == 1 and "no store at" in missing.output, missing.output
    assert not (tmp_path / "typo").exists()


def test_verify_on_a_missing_cache_dir_is_an_error(tmp_path: Path) -> None:
    result = cli(tmp_path / "mistyped", "verify")
    assert result.exit_code == 1 and "no store at" in result.output and "--cache-dir" in result.output
    assert not (tmp_path / "mistyped").exists()


@pytest.mark.parametrize("name, suggestion", [("B200", "'b200'"), ("H200", "'h200'"), ("h20", "'h200' or 'h200-cu12'"),
                                              ("h100", "'h100-pcie' or 'h100-sxm'")])
def test_list_unknown_sku_is_an_error_with_did_you_mean(tmp_path: Path, name: str, suggestion: str) -> None:
    put(Store(tmp_path), "a")
    result = cli(tmp_path, "list", "--sku", name)
    assert result.exit_code == 1, result.output
    assert f"unknown SKU {name!r}; did you mean {suggestion}?" in result.output


def test_list_known_sku_without_kernels_is_empty_not_an_error(tmp_path: Path) -> None:
    put(Store(tmp_path), "a")
    result = cli(tmp_path, "list", "--sku", "b200")
    assert result.exit_code == 0 and "0 kernel(s)" in result.output


def test_list_filters_and_per_sku_summary(tmp_path: Path) -> None:
    store = Store(tmp_path)
    put(store, "a"), put(store, "b", variant="serve", family="FlashAttentionBackwardSm90"), put(store, "c", sku="b200")
    assert len(json.loads(cli(tmp_path, "list", "--variant", "serve", "--json").output)) == 1
    assert len(json.loads(cli(tmp_path, "list", "--family", "Forward", "--json").output)) == 2
    rows = json.loads(cli(tmp_path, "list", "--summary", "--json").output)
    assert [(r["sku"], r["kernels"], r["variants"]) for r in rows] == [("b200", 1, ["train"]),
                                                                      ("h200", 2, ["serve", "train"])]
    text = cli(tmp_path, "list").output
    assert "b200" in text.splitlines()[-3] and "h200" in text.splitlines()[-2] and "3 kernel(s)" in text


def test_token_list_on_a_missing_directory_creates_nothing(tmp_path: Path) -> None:
    result = cli(tmp_path / "nowhere", "token", "list")
    assert result.exit_code == 1 and "no token database at" in result.output
    assert not (tmp_path / "nowhere").exists()


def test_token_create_says_which_database(tmp_path: Path) -> None:
    made = cli(tmp_path, "token", "create", "--scope", "read", "--name", "ci")
    assert made.exit_code == 0, made.output
    assert len(made.stdout.strip().splitlines()) == 1  # stdout is the token alone, for $(...)
    assert f"stored in sqlite:///{tmp_path}/fa4-aot.db" in made.stderr
    listed = cli(tmp_path, "token", "list")
    assert "ci" in listed.output and f"1 token(s) in sqlite:///{tmp_path}/fa4-aot.db" in listed.output


def test_prune_by_sku_toolchain_age_and_size(tmp_path: Path) -> None:
    store = Store(tmp_path)
    old = put(store, "old", fa="4.0.0b30", created="2026-01-01T00:00:00Z")
    b200 = put(store, "b", sku="b200")
    keep = put(store, "k")
    dry = json.loads(cli(tmp_path, "prune", "--toolchain", "4.0.0b30", "--dry-run", "--json").output)
    assert dry["entries"] == [old.kernel_key] and store.has_entry(old.kernel_key)
    assert json.loads(cli(tmp_path, "prune", "--older-than", "30d", "--json").output)["entries"] == [old.kernel_key]
    assert not store.has_entry(old.kernel_key) and not store.has_object(old.object_digest)
    assert json.loads(cli(tmp_path, "prune", "--sku", "b200", "--json").output)["objects"] == [b200.object_digest]
    assert cli(tmp_path, "prune", "--max-size", "1G").exit_code == 0 and store.has_entry(keep.kernel_key)
    assert json.loads(cli(tmp_path, "prune", "--max-size", "0", "--json").output)["entries"] == [keep.kernel_key]
    assert cli(tmp_path, "prune").exit_code == 1  # no rule: refuses rather than removing everything
    assert "invalid age" in cli(tmp_path, "prune", "--older-than", "soon").output


def test_doctor_says_what_this_host_is_and_what_to_do_next(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FA4_AOT_SKU", "h200")
    result = cli(tmp_path / "store", "doctor", "--json")
    checks = {c["check"]: c for c in json.loads(result.output)}
    assert set(checks) == {"fa4-aot", "device", "toolchain", "store", "certified", "server"}
    assert "h200" in checks["device"]["detail"]
    assert "flash-attn-4" in checks["toolchain"]["detail"]
    # no store there: a failed check naming the folder (a mistyped --cache-dir must not pass), and the next step
    assert checks["store"]["status"] == "fail" and "fa4-aot build --sku h200" in checks["store"]["next"]
    assert f"no store at {tmp_path / 'store'}" in checks["store"]["detail"]
    down = cli(tmp_path / "store", "doctor", "--server", "http://127.0.0.1:9")
    assert down.exit_code == 1 and "FAIL server" in down.output and "cannot reach" in down.output


def test_login_refuses_a_bad_url_and_an_unreachable_server_and_stores_nothing(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FA4_AOT_CONFIG_DIR", str(tmp_path / "cfg"))
    assert "needs a scheme" in cli(tmp_path, "login", "--server", "h:1", "--token", "x").output
    down = cli(tmp_path, "login", "--server", "http://127.0.0.1:9", "--token", "secret")
    assert down.exit_code == 1 and "cannot reach" in down.output
    assert not (tmp_path / "cfg" / "credentials.json").exists()
    assert "removed 0" in cli(tmp_path, "logout", "--server", "http://127.0.0.1:9").output


def test_busy_port_names_it_and_how_to_pick_another(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        result = cli(tmp_path, "serve", "--port", str(port))
    assert result.exit_code == 1 and f"port {port} on 127.0.0.1 is already in use" in result.output
    assert f"--port {port + 1}" in result.output


def test_docs_command_table_matches_the_cli() -> None:
    from fa4_aot.cli import main as group

    readme = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    table = readme.split("# Command line", 1)[1].split("\n\n", 2)[1]
    listed = {" ".join(cell.split("`")[1].split()[1:3]).split(" [")[0].split(" -")[0]
              for row in table.splitlines()[2:] for cell in [row.split("|")[1]]}
    expected = set()
    for name, command in group.commands.items():
        subs = getattr(command, "commands", None)
        expected |= {f"{name} {sub}" for sub in subs} if subs else {name}
    listed = {e if e.split()[0] in ("token", "keys") else e.split()[0] for e in listed}
    assert listed == expected


def test_progress_bar_on_a_terminal_shows_count_elapsed_and_eta(capsys: pytest.CaptureFixture[str]) -> None:
    from fa4_aot.cli.progress import Progress

    with Progress("build", quiet=False, as_json=False, tty=True) as bar:
        for i in range(1, 4):
            bar.update(i, 3, "built" if i < 3 else "failed", "FAIL some kernel")
    err = capsys.readouterr().err
    assert "3/3" in err and "ETA" in err and "0:00:0" in err and "build failed: FAIL some kernel" in err


@pytest.mark.parametrize("tty", [False, True], ids=["lines", "bar"])
def test_a_failure_said_many_times_is_said_once_with_its_count(capsys: pytest.CaptureFixture[str],
                                                              tty: bool) -> None:
    """Issue 22, point 2: a pull with trusted keys printed 76 identical TrustError lines."""
    from fa4_aot.cli.progress import Progress

    refused = "FAILED TrustError: no valid signed manifest for h200 lists this kernel"
    with Progress("pull", quiet=False, as_json=False, tty=tty) as bar:
        for i in range(1, 77):
            bar.update(i, 78, refused)
        bar.update(77, 78, "FAILED RemoteError: server down")
        bar.update(78, 78, "ok")
    err = capsys.readouterr().err
    assert err.count("no valid signed manifest") == 2  # said once as it happened, once with its count
    assert "76 items failed alike: " + refused in err and err.count("server down") == 1


def test_skus_show_where_each_figure_comes_from(tmp_path: Path) -> None:
    doc = json.loads(cli(tmp_path, "skus", "--json").output)
    assert all(s["source"] for s in doc), [s["name"] for s in doc if not s["source"]]
    text = cli(tmp_path, "skus").output
    assert text.count("source: ") == len(doc) and "pytorch/ao/pull/4002" in text


@pytest.mark.parametrize("lines, expected", [
    (["# above", "[skus.a]", "# below", "arch = 1"], {"a": "above below"}),
    (["# --- SKUs.", "[skus.a]", "arch = 1", "[skus.b] # inline", "x = 1"], {"a": "", "b": ""}),
])
def test_sku_sources_table(lines: list[str], expected: dict[str, str]) -> None:
    from fa4_aot.domain.sku_table import sources

    assert sources(lines) == expected


def test_verify_streams_json_events_and_is_silent_with_quiet(tmp_path: Path) -> None:
    store = Store(tmp_path)
    put(store, "a"), put(store, "b")
    result = cli(tmp_path, "verify", "--json")
    events = [json.loads(line) for line in result.stderr.splitlines()]
    assert [(e["event"], e["done"], e["total"], e["status"]) for e in events] == [("verify", 1, 2, "ok"),
                                                                                 ("verify", 2, 2, "ok")]
    assert json.loads(result.stdout)["ok"] is True
    quiet = cli(tmp_path, "verify", "--quiet")
    assert quiet.exit_code == 0 and quiet.stderr == "" and quiet.stdout.strip().endswith("ok")


@pytest.mark.parametrize(("args", "said"), [
    (["prune", "--sku", "h20", "--dry-run"], "did you mean 'h200'"),
    (["build", "--sku", "h200", "--model", "llama-3.1-8x", "--dry-run"], "did you mean 'llama-3.1-8b'"),
    (["coverage", "--sku", "h200", "--model", "llama-3.1-8b", "--tp", "3"], "pass --tp 1, 2, 4, 8"),
])
def test_typos_and_empty_requests_are_errors_with_a_suggestion(tmp_path: Path, args: list[str], said: str) -> None:
    """Issue 22, point 7: these removed nothing, listed 66 names, or said "0 of 0 served", and exited 0."""
    put(Store(tmp_path), "one")
    result = cli(tmp_path, *args)
    assert result.exit_code == 1 and said in result.output, result.output


def _kernel_with_signpost_and_library(store: Store, tag: str, runtime: bytes) -> Entry:
    """A kernel that consumed the SM count, filed as a build files it (its full key, and its base key's
    signpost naming the same object), with a linked library that needs the shared runtime library."""
    import dataclasses

    from fa4_aot.domain import kernel_keys

    lib = f"library {tag}".encode() * 100
    needs = {"libtvm_ffi.so": "", "libcute_dsl_runtime.so": store.put_object(runtime)}
    data = f"object {tag}".encode() * 100
    full = proven(Entry(
        kernel_key="", object_digest=store.put_object(data), size=len(data), family="f", compile_key=[tag],
        sku="h200", arch="sm_90a", sm_count=132, l2_bytes=62914560, cuda_major=13, toolchain={}, variant="v",
        call=f"fwd {tag}", compile_seconds=0.1, hardware_queries=[["sm_count", 132]], host="x86-64-v3",
        shared_libs={"x86_64": {"digest": store.put_object(lib), "size": len(lib), "needs": needs}}))
    store.put_entry(full)
    store.put_entry(dataclasses.replace(full, kernel_key=kernel_keys.entry_keys(full)[0]))
    return full


def test_counts_and_bytes_mean_kernels_and_every_object_they_need(tmp_path: Path) -> None:
    """Issue 22, point 3: the build reported 44 kernels where list, doctor and push reported 76 (signposts
    counted), and prune --max-size ignored the 43 MB runtime library."""
    store = Store(tmp_path)
    runtime = b"R" * 50_000
    kernels = [_kernel_with_signpost_and_library(store, t, runtime) for t in ("a", "b")]
    assert len(list(store.entries())) == 4 and sum(not e.is_signpost for e in store.entries()) == 2
    listed = cli(tmp_path, "list", "--summary", "--json")
    (row,) = json.loads(listed.output)
    every = {d for e in kernels for d in e.digests()}
    assert row["kernels"] == 2 and row["bytes"] == sum(store.object_size(d) for d in every) > 50_000
    assert "2 kernel(s)" in cli(tmp_path, "list").output
    # a budget below one kernel and the runtime it needs keeps nothing, and frees the runtime library too
    pruned = json.loads(cli(tmp_path, "prune", "--max-size", "40K", "--json").output)
    assert pruned["removed"] == 2 and pruned["kept"] == 0 and pruned["bytes"] == row["bytes"]
    assert list(store.entries()) == []


@pytest.mark.parametrize("args", [
    ["build", "--sku", "h20", "--model", "llama-3.1-8b", "--dry-run"],
    ["build", "--sku", "h200,h20", "--model", "llama-3.1-8b", "--dry-run"],
    ["coverage", "--sku", "h20", "--model", "llama-3.1-8b"],
    ["sign", "--sku", "h20", "--key", "no-such.key"],
    ["list", "--sku", "h20"],
    ["prune", "--sku", "h20"],
    ["push", "--server", "http://127.0.0.1:9", "--sku", "h20"],
    ["token", "create", "--scope", "publish", "--sku", "h20"],
], ids=lambda args: " ".join(args[:2]))
def test_every_command_taking_sku_refuses_an_unknown_name_with_did_you_mean(tmp_path: Path, args: list[str]) -> None:
    """Issue 22, point 7: `pull --sku h20` said to build SKU "h20" and `prune --sku h20` removed nothing with exit
    0. Every --sku is judged by the SKU table (and the names the store or server holds): one error, a suggestion,
    exit 1, nothing done (pull's test, with a server, is in tests/client/test_prefetch.py)."""
    put(Store(tmp_path / "store"), "one")
    result = CliRunner().invoke(main, ["--cache-dir", str(tmp_path / "store"), *args],
                                env={"FA4_AOT_DB_URL": f"sqlite:///{tmp_path / 'tokens.db'}"})
    assert result.exit_code == 1, result.output
    assert "unknown SKU 'h20'; did you mean 'h200' or 'h200-cu12'?" in result.output, result.output
    assert "Traceback" not in result.output
    assert len(list(Store(tmp_path / "store").entries())) == 1


def test_a_sku_only_the_store_holds_is_known_to_list_prune_and_push(tmp_path: Path) -> None:
    """A store may hold a SKU of another variants file: it is no typo (prune said it was one, before)."""
    store = Store(tmp_path / "store")
    put(store, "one", sku="lab-gpu")
    result = cli(tmp_path / "store", "prune", "--sku", "lab-gpu", "--dry-run")
    assert result.exit_code == 0 and "would remove 1 kernel(s)" in result.output, result.output
    typo = cli(tmp_path / "store", "prune", "--sku", "lab-gpo", "--dry-run")
    assert typo.exit_code == 1 and "did you mean 'lab-gpu'" in typo.output, typo.output
