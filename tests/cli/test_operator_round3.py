"""Issue 30 (operator experience, round 3): a newcomer's defects, each as a test that failed before its fix."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from fa4_aot.cli import main


@pytest.fixture(autouse=True)
def _defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FA4_AOT_CACHE", "FA4_AOT_VARIANTS", "FA4_AOT_SKU", "FA4_AOT_SERVER", "FA4_AOT_TOKEN",
                 "FA4_AOT_DB_URL"):
        monkeypatch.delenv(name, raising=False)


def _commands(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The path of every command and subcommand under `group` (groups included)."""
    for name, command in group.commands.items():
        yield (*path, name)
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))


def test_i30_5_cache_dir_is_accepted_after_every_command(tmp_path: Path) -> None:
    """`fa4-aot serve --cache-dir X`, `token create --cache-dir X`, `doctor --cache-dir X` were "No such option"
    while list, verify, build and pull took it: every command (and subcommand) takes it after its name."""
    paths = list(_commands(main))
    assert {("serve",), ("doctor",), ("token", "create"), ("list",)} <= set(paths)
    refused = []
    for path in paths:
        result = CliRunner().invoke(main, [*path, "--cache-dir", str(tmp_path), "--help"])
        if result.exit_code != 0:
            refused.append(f"{' '.join(path)}: {result.output.strip().splitlines()[-1:]}")
    assert not refused, refused


def test_i30_5_cache_dir_after_doctor_is_the_store_it_checks(tmp_path: Path) -> None:
    store = tmp_path / "elsewhere"
    result = CliRunner().invoke(main, ["doctor", "--json", "--cache-dir", str(store)])
    checks = {c["check"]: c for c in json.loads(result.output)}
    assert str(store) in checks["store"]["detail"], checks["store"]


def test_i30_5_token_create_on_a_store_not_yet_served_creates_its_database(tmp_path: Path) -> None:
    """`token create` before the first `serve` said "no token database": it makes the database serve would."""
    store = tmp_path / "new-store"
    result = CliRunner().invoke(main, ["token", "create", "--scope", "publish", "--name", "ci",
                                       "--cache-dir", str(store)])
    assert result.exit_code == 0, result.output
    assert (store / "fa4-aot.db").is_file()
    listed = CliRunner().invoke(main, ["--cache-dir", str(store), "token", "list", "--json"])
    assert [t["name"] for t in json.loads(listed.output)] == ["ci"], listed.output


@pytest.mark.parametrize("command", [["build", "--sku", "h200", "--dry-run"], ["coverage", "--sku", "h200"]])
def test_i30_6_a_tp_the_model_refuses_is_an_error_naming_the_valid_ones(tmp_path: Path, command: list[str]) -> None:
    """`build --model llama-3.1-8b --tp 3` printed a note, planned nothing and exited 0."""
    result = CliRunner().invoke(main, ["--cache-dir", str(tmp_path), *command, "--model", "llama-3.1-8b",
                                       "--tp", "3"])
    assert result.exit_code == 1, result.output
    message = result.output.strip().splitlines()[-1]
    assert "tp 3 does not divide 32 query heads" in message and "--tp 1, 2, 4, 8, 16 or 32" in message, message
