"""A newcomer's fourth round on a fresh clone: each defect as a test that failed before its fix."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click
import httpx
import pytest
from click.testing import CliRunner

from fa4_aot.cli import main
from tests.conftest import ROOT, TINY_VARIANTS, _has_cuda, run_cli
from tests.helpers.servers import free_port


@pytest.fixture(autouse=True)
def _defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FA4_AOT_CACHE", "FA4_AOT_VARIANTS", "FA4_AOT_SKU", "FA4_AOT_SERVER", "FA4_AOT_TOKEN",
                 "FA4_AOT_DB_URL", "FA4_AOT_RECORD"):
        monkeypatch.delenv(name, raising=False)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_build_from_misses_dry_run_writes_nothing_and_counts_as_misses_does(tmp_path: Path) -> None:
    """`build --from-misses --dry-run` compiled into the store, and counted 2 "missed calls" (a lean miss's call
    and its whole signature) where `fa4-aot misses` listed 1: a dry run plans only, and both count misses."""
    from tests.e2e.test_lean_miss_loop import CALLS, lean_misses

    cache = tmp_path / "store"
    assert len(lean_misses(cache)) == len(CALLS)
    listed = run_cli("misses", "--json", cache=cache)
    assert listed.returncode == 0, listed.stderr
    before = _files(cache)
    planned = run_cli("build", "--from-misses", "--dry-run", "--variants", str(TINY_VARIANTS), "--json",
                      cache=cache)
    assert planned.returncode == 0, planned.stderr[-3000:] + planned.stdout[-3000:]
    assert _files(cache) == before, "a dry run wrote to the store"
    [report] = json.loads(planned.stdout)
    assert report["built"] == 0 and report["planned"] >= 1, report
    assert report["misses"] == len(json.loads(listed.stdout)) == len(CALLS)
    text = run_cli("build", "--from-misses", "--dry-run", "--variants", str(TINY_VARIANTS), cache=cache)
    assert f"{len(CALLS)} misses" in text.stdout, text.stdout + text.stderr[-2000:]  # the summary is on stdout
    assert _files(cache) == before


def _default(command: click.Command, name: str) -> Any:
    param = next(p for p in command.params if p.name == name)
    return param.get_default(click.Context(command), call=True)


def test_model_commands_share_one_tp_default_and_build_uses_every_cpu() -> None:
    """Right after `build --model M` (TP 1), `coverage --model M` judged TP 1,2,4,8 and exited 1; builds ran one
    compiler on a many-core host."""
    tps = {name: _default(main.commands[name], "tp_arg") for name in ("build", "pull", "certify", "coverage")}
    assert set(tps.values()) == {"1"}, tps
    assert _default(main.commands["build"], "jobs") == min(256, len(os.sched_getaffinity(0)))


LEAN_COVERAGE = ["coverage", "--sku", "h200", "--model", "smollm2-135m", "--tp", "1", "--runtime", "lean"]


@pytest.mark.parametrize("args", [["list"], ["doctor"], LEAN_COVERAGE])
def test_a_folder_that_holds_no_store_is_named_so(args: list[str]) -> None:
    """`coverage --cache-dir TYPO` said "0 of 11 served", `doctor` "does not exist" and exit 0, `list --cache-dir
    docs/` "0 kernel(s)" and exit 0: each says there is no store there, with the next step, and exits non-zero."""
    for folder in (ROOT / "docs", ROOT / "no-such-folder"):
        result = CliRunner().invoke(main, [*args, "--cache-dir", str(folder)])
        assert result.exit_code != 0, result.output
        assert f"no store at {folder}" in result.output and "fa4-aot build" in result.output, result.output


def test_load_takes_dtype_names_and_shows_what_it_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    """fa4_aot.load(..., dtype="bf16") said "dtype bf16 is not supported: FA4 kernels here are bf16 or fp16", and
    what load() returned printed as <...Loaded object at 0x...>."""
    from fa4_aot.runtime import api, runner

    class Attention:
        def __init__(self, sig: Any) -> None:
            self.sig, self.regions = sig, ["region", "region"]
            self.rt = SimpleNamespace(sku=SimpleNamespace(name="h200"), store=SimpleNamespace(root=Path("/store")))

        def preload(self, _sizes: Any) -> None:
            pass

    monkeypatch.setattr(runner, "runtime", lambda _cache_dir=None: SimpleNamespace(attention=Attention))
    for name, want in [("bf16", "bf16"), ("bfloat16", "bf16"), ("fp16", "fp16"), ("float16", "fp16")]:
        loaded = api.load((2, 256, 4, 64), causal=True, dtype=name)
        assert loaded.attention.sig.dtype == want, name
    assert repr(loaded) == ("<fa4_aot.Loaded dense fwd fp16 heads=4/4 head_dim=64/64 causal on SKU h200: 2 recipe "
                            "region(s) from /store>")
    with pytest.raises(ValueError, match="pass torch.bfloat16 or torch.float16"):
        api.load((2, 256, 4, 64), dtype="int8")


def test_serve_with_an_unreachable_database_says_one_line(tmp_path: Path) -> None:
    """`serve --db URL` of a database that is not there printed a 209-line traceback."""
    url = "postgresql+psycopg://fa4@127.0.0.1:9/fa4"  # port 9: nothing listens, the connection is refused
    result = run_cli("serve", "--db", url, "--port", str(free_port()), cache=tmp_path, timeout=120)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr[-3000:]
    assert "cannot reach the database postgresql+psycopg://fa4@127.0.0.1:9/fa4" in result.stderr
    assert "--db" in result.stderr


def test_json_errors_are_json_on_stdout(tmp_path: Path) -> None:
    """With --json, errors went as plain text to stderr and stdout was empty."""
    listed = CliRunner().invoke(main, ["list", "--json", "--cache-dir", str(ROOT / "docs")])
    assert listed.exit_code == 1
    doc = json.loads(listed.stdout)
    assert doc["exit_code"] == 1 and doc["error"].startswith(f"no store at {ROOT / 'docs'}"), doc
    usage = CliRunner().invoke(main, ["build", "--json", "--cache-dir", str(tmp_path)])
    assert usage.exit_code == 2 and "--sku is required" in json.loads(usage.stdout)["error"], usage.output


@pytest.mark.skipif(_has_cuda(), reason="this host has a GPU: certify would run")
def test_certify_without_a_gpu_exits_2_as_certifier_does(tmp_path: Path) -> None:
    """With no GPU, `certify` exited 1 (the code for "a kernel failed") while `certifier` exits 2."""
    result = CliRunner().invoke(main, ["certify", "--sku", "h200", "--cache-dir", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "no CUDA device" in result.output
    as_json = CliRunner().invoke(main, ["certify", "--sku", "h200", "--json", "--cache-dir", str(tmp_path)])
    assert as_json.exit_code == 2 and "no CUDA device" in json.loads(as_json.stdout)["error"]


def test_dir_shows_the_public_face_only() -> None:
    import fa4_aot

    shown = set(dir(fa4_aot))
    assert not shown & {"Any", "TYPE_CHECKING", "annotations", "importlib"}, shown
    assert set(fa4_aot.__all__) | {"__version__"} <= shown


@pytest.mark.parametrize(("n", "word", "many", "said"), [(1, "entry", "entries", "1 entry"),
                                                         (3, "entry", "entries", "3 entries"),
                                                         (0, "miss", "misses", "0 misses"),
                                                         (2, "kernel", None, "2 kernels")])
def test_plural(n: int, word: str, many: str | None, said: str) -> None:
    from fa4_aot.cli.common import plural

    assert plural(n, word, many) == said


def test_no_command_prints_a_plural_in_brackets() -> None:
    """Plurals printed as "entr(ies)"."""
    found = [f"{p.relative_to(ROOT)}:{i}" for folder in ("fa4_aot/cli", "service")
             for p in (ROOT / folder).rglob("*.py")
             for i, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"[a-z]\(ies\)", line)]
    assert not found, found


def test_an_o_typed_for_a_zero_gets_a_suggestion() -> None:
    """The SKU typo `h2oo` got no suggestion."""
    from fa4_aot.domain.sku_table import unknown

    assert "did you mean 'h200'?" in str(unknown("h2oo", ["h100", "h200", "b200"]))
    assert "did you mean 'h200'?" in str(unknown("H2OO", ["h100", "h200", "b200"]))


def test_root_redirects_to_docs_and_login_gives_push_its_server(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """GET / was a 404; `login` gave pull and push no default --server."""
    from tests.helpers.servers import Server, prepare_database

    db_url = f"sqlite:///{tmp_path / 'fa4-aot.db'}"
    server = Server(cache_dir=tmp_path / "served", db_url=db_url, log=tmp_path / "server.log",
                    tokens=prepare_database(db_url)).start()
    try:
        root = httpx.get(f"{server.url}/")
        assert root.status_code in (302, 307) and root.headers["location"] == "/docs", root
        monkeypatch.setenv("FA4_AOT_CONFIG_DIR", str(tmp_path / "config"))
        login = CliRunner().invoke(main, ["login", "--server", server.url, "--token", server.tokens["publish"]])
        assert login.exit_code == 0, login.output
        (tmp_path / "store").mkdir()
        pushed = CliRunner().invoke(main, ["push", "--cache-dir", str(tmp_path / "store")])
        assert pushed.exit_code == 0 and server.url in pushed.output, pushed.output
        logout = CliRunner().invoke(main, ["logout", "--all"])
        assert logout.exit_code == 0, logout.output
        forgotten = CliRunner().invoke(main, ["push", "--cache-dir", str(tmp_path / "store")])
        assert forgotten.exit_code == 2 and "--server" in forgotten.output, forgotten.output
    finally:
        server.kill()


def test_a_busy_port_suggests_a_free_one(tmp_path: Path) -> None:
    """A busy port suggested the next port, itself busy."""
    import socket

    with socket.socket() as first, socket.socket() as second:
        first.bind(("127.0.0.1", 0))
        port = first.getsockname()[1]
        try:
            second.bind(("127.0.0.1", port + 1))
        except OSError:
            pytest.skip(f"port {port + 1} is taken already")
        first.listen()
        second.listen()
        result = CliRunner().invoke(main, ["serve", "--port", str(port), "--cache-dir", str(tmp_path)])
        assert result.exit_code == 1 and f"port {port} on 127.0.0.1 is already in use" in result.output
        suggested = int(re.search(r"fa4-aot serve --port (\d+)", result.output).group(1))  # type: ignore[union-attr]
        assert suggested not in (port, port + 1), result.output
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", suggested))


def test_builds_name_their_call_and_pull_model_names_the_next_step(tmp_path: Path) -> None:
    """`fa4-aot builds` listed jobs by key only, and `pull --model` of a model the server has not built gave no
    next step."""
    from fa4_aot.domain.misses import Miss
    from tests.helpers.builders import hold_sku, tiny
    from tests.helpers.servers import Server, prepare_database

    db_url = f"sqlite:///{tmp_path / 'fa4-aot.db'}"
    server = Server(cache_dir=tmp_path / "served", db_url=db_url, log=tmp_path / "server.log",
                    tokens=prepare_database(db_url)).start()
    try:
        hold_sku(server)
        call = tiny(batch=7)
        with server.client() as c:
            assert c.post("/v1/misses", json=Miss.lean(call, "h200").to_dict()).status_code in (200, 201, 202)
        listed = CliRunner().invoke(main, ["builds", "--server", server.url])
        assert listed.exit_code == 0 and call.describe() in listed.output, listed.output
        pulled = run_cli("pull", "--server", server.url, "--sku", "h200", "--model", "smollm2-135m",
                         cache=tmp_path / "node", env={"FA4_AOT_INSECURE": "1", "FA4_AOT_TRUSTED_KEYS": ""})
        assert pulled.returncode == 1, pulled.stderr[-2000:]
        assert "fa4-aot build --sku h200 --model smollm2-135m --tp 1" in pulled.stdout, pulled.stdout + pulled.stderr
        assert f"fa4-aot push --server {server.url} --sku h200" in pulled.stdout
    finally:
        server.kill()


def test_a_stopped_dry_run_says_its_plan_is_partial_and_estimates_its_table(tmp_path: Path) -> None:
    """The whole-matrix dry run's first line said "building"; stopped, its table summed to 2,525 kernels to build,
    then it printed "estimated build time: 0.0 min for 0 kernel(s)" and "run the same command again to build the
    rest"."""
    from fa4_aot.cli import reporting
    from fa4_aot.compile.orchestrator import Report
    from fa4_aot.matrix.variants import load
    from fa4_aot.store import Store

    target = load(TINY_VARIANTS).skus["h200"]
    first = reporting.banner([target], tmp_path, "local", None, 2, dry_run=True)
    assert first.startswith("planning h200") and "nothing is built" in first, first
    report = Report(sku="h200", calls=3, interrupted=True,
                    by_variant={"a": {"1" * 64, "2" * 64}, "b": {"2" * 64, "3" * 64}})
    docs, lines = reporting.documents([report], Store(tmp_path / "store"), [target], 2, dry_run=True)
    text = "\n".join(lines)
    assert "for 3 kernels" in text and docs[0]["estimate"]["kernels"] == 3, text
    assert "to build the rest" not in text and "the plan above is partial" in text, text


def test_verify_and_the_servers_import_count_kernels_as_list_does(tiny_h200_full_fwd: Path, tmp_path: Path) -> None:
    """One store, several numbers: list said 82 kernels, verify "76 entries", serve "imported 76 kernels": verify
    and the server's import count kernels (signposts aside) and name index entries as such."""
    from fa4_aot.store import Store
    from service import db, sync
    from tests.cli.test_cli_operator import _kernel_with_signpost_and_library
    from tests.conftest import copy_store

    store = copy_store(tiny_h200_full_fwd, tmp_path / "store")
    _kernel_with_signpost_and_library(Store(store), "consumed-the-sm-count", b"runtime" * 100)
    entries = list(Store(store).entries())
    listed = CliRunner().invoke(main, ["list", "--json", "--cache-dir", str(store)])
    held = len(json.loads(listed.output))
    assert len(entries) > held >= 1, "the test store must hold a kernel with a signpost"
    verified = CliRunner().invoke(main, ["verify", "--json", "--cache-dir", str(store)])
    doc = json.loads(verified.stdout)
    assert (doc["kernels"], doc["entries"]) == (held, len(entries)), doc
    text = CliRunner().invoke(main, ["verify", "--cache-dir", str(store)]).stdout
    assert f"{held} kernels ({len(entries)} index entries" in text, text
    url = f"sqlite:///{tmp_path / 'fa4-aot.db'}"
    db.migrate(url)
    with db.session_for(url) as session:
        report = sync.import_store(session, Store(store))
    assert (report.kernels, report.entries) == (held, len(entries)), report


def test_push_and_pull_progress_count_kernels_and_bytes(tiny_h200_full_fwd: Path, tmp_path: Path) -> None:
    """Push's progress counted index entries ("144", then "pushed 82 kernel(s)") and neither it nor pull's said
    bytes or MB/s: both count kernels, as their summaries do, with the bytes moved and their rate."""
    from fa4_aot.store import Store
    from tests.cli.test_cli_operator import _kernel_with_signpost_and_library
    from tests.conftest import copy_store
    from tests.helpers.servers import Server, prepare_database

    store = copy_store(tiny_h200_full_fwd, tmp_path / "store")
    _kernel_with_signpost_and_library(Store(store), "consumed-the-sm-count", b"runtime" * 100)
    held = len(json.loads(CliRunner().invoke(main, ["list", "--json", "--cache-dir", str(store)]).output))
    assert len(list(Store(store).entries())) > held
    db_url = f"sqlite:///{tmp_path / 'fa4-aot.db'}"
    server = Server(cache_dir=tmp_path / "served", db_url=db_url, log=tmp_path / "server.log",
                    tokens=prepare_database(db_url)).start()
    try:
        pushed = run_cli("push", "--server", server.url, "--token", server.tokens["publish"], "--json", cache=store)
        pulled = run_cli("pull", "--server", server.url, "--sku", "h200", "--json", cache=tmp_path / "node",
                         env={"FA4_AOT_INSECURE": "1", "FA4_AOT_TRUSTED_KEYS": ""})
    finally:
        server.kill()
    for result, summary in ((pushed, "kernels"), (pulled, "fetched")):
        assert result.returncode == 0, result.stderr[-3000:]
        events = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
        assert events[-1]["done"] == events[-1]["total"] == held == json.loads(result.stdout)[summary], events
        assert events[-1]["bytes"] == json.loads(result.stdout)["bytes"] > 0 and "mb_per_s" in events[-1], events


def test_pull_of_a_sku_the_server_lacks_names_commands_and_a_refused_connection_no_deadline(tmp_path: Path) -> None:
    """Pulling a SKU the server lacks named raw routes (PUT /v1/objects, POST /v1/kernels) instead of `fa4-aot
    push`; a refused connection said to raise the fetch deadline, which cannot help."""
    from tests.helpers.servers import Server, prepare_database

    db_url = f"sqlite:///{tmp_path / 'fa4-aot.db'}"
    server = Server(cache_dir=tmp_path / "served", db_url=db_url, log=tmp_path / "server.log",
                    tokens=prepare_database(db_url)).start()
    try:
        lacking = CliRunner().invoke(main, ["pull", "--server", server.url, "--sku", "h200", "--cache-dir",
                                            str(tmp_path / "node")], env={"FA4_AOT_INSECURE": "1"})
    finally:
        server.kill()
    assert lacking.exit_code == 1 and f"fa4-aot push --server {server.url} --sku h200" in lacking.output
    assert "/v1/" not in lacking.output, lacking.output
    refused = CliRunner().invoke(main, ["pull", "--server", f"http://127.0.0.1:{free_port()}", "--sku", "h200",
                                        "--cache-dir", str(tmp_path / "node")], env={"FA4_AOT_INSECURE": "1"})
    assert refused.exit_code == 1 and "Connection refused" in refused.output, refused.output
    assert "FA4_AOT_FETCH_DEADLINE" not in refused.output, refused.output


def test_one_store_one_count_across_build_list_verify_serve_push_and_pull(tiny_h200_full_fwd: Path,
                                                                          tmp_path: Path) -> None:
    """One store, one number of kernels in every command that reports one: build (built + present), list,
    verify, the server's import of the store, push and pull (which counted 44, 76, 76, 144/82 and 46 for one
    store when each used its own unit: index entries, objects, kernels)."""
    from fa4_aot.store import Store
    from service import db, sync
    from tests.conftest import build_json, copy_store
    from tests.helpers.servers import Server, prepare_database

    store = copy_store(tiny_h200_full_fwd, tmp_path / "store")
    built = build_json(store, "h200", "full-fwd")
    listed = json.loads(run_cli("list", "--json", cache=store).stdout)
    verified = json.loads(run_cli("verify", "--json", cache=store).stdout)
    served = copy_store(store, tmp_path / "served")
    db_url = f"sqlite:///{tmp_path / 'fa4-aot.db'}"
    tokens = prepare_database(db_url)
    with db.session_for(db_url) as session:
        imported = sync.import_store(session, Store(served))
    server = Server(cache_dir=served, db_url=db_url, log=tmp_path / "server.log", tokens=tokens).start()
    empty_db = f"sqlite:///{tmp_path / 'empty.db'}"
    empty = Server(cache_dir=tmp_path / "empty", db_url=empty_db, log=tmp_path / "empty.log",
                   tokens=prepare_database(empty_db)).start()
    try:
        pushed = run_cli("push", "--server", empty.url, "--token", empty.tokens["publish"], "--json", cache=store)
        pulled = run_cli("pull", "--server", server.url, "--sku", "h200", "--json", cache=tmp_path / "node",
                         env={"FA4_AOT_INSECURE": "1", "FA4_AOT_TRUSTED_KEYS": ""})
    finally:
        server.kill()
        empty.kill()
    assert pushed.returncode == 0 and pulled.returncode == 0, pushed.stderr[-2000:] + pulled.stderr[-2000:]
    counts = {"build": built["built"] + built["present"], "list": len(listed), "verify": verified["kernels"],
              "serve's import": imported.kernels, "push": json.loads(pushed.stdout)["kernels"],
              "pull": json.loads(pulled.stdout)["fetched"]}
    assert len(set(counts.values())) == 1 and counts["list"] > 0, counts
