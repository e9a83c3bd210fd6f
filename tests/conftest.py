"""Shared fixtures. GPU tests (marker `gpu`) skip cleanly where torch sees no CUDA device."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ["tests.helpers.server_fixtures", "tests.helpers.fault_suites", "tests.helpers.interrupts",
                  "tests.helpers.temp_cleanup"]
_BAD_INPUT = pytest.StashKey[dict[str, set[str]]]()
ROOT = Path(__file__).resolve().parent.parent
TINY_VARIANTS = ROOT / "tests" / "data" / "tiny_variants.toml"


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "bad_input(category): a case of the bad-input suite (issue: Trust)")
    config.stash[_BAD_INPUT] = {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    counts: dict[str, set[str]] = config.stash[_BAD_INPUT]
    for item in items:
        marker = item.get_closest_marker("bad_input")
        if marker:  # a case is one test id; a parametrized test run against two databases counts once
            counts.setdefault(marker.args[0], set()).add(item.nodeid.split("[")[0] + _case_id(item))
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the H200 device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _case_id(item: pytest.Item) -> str:
    """The test's parameter id without the database it runs against."""
    callspec = getattr(item, "callspec", None)
    parts = callspec.id.split("-") if callspec else []
    return "[" + "-".join(p for p in parts if p not in ("sqlite", "postgresql")) + "]"


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    counts: dict[str, set[str]] = config.stash.get(_BAD_INPUT, {})
    if counts:
        parts = ", ".join(f"{name}: {len(cases)}" for name, cases in sorted(counts.items()))
        total = sum(len(c) for c in counts.values())
        terminalreporter.write_line(f"bad-input suite: {total} named cases collected ({parts})")


def assert_located(error: BaseException, path: Path, line: int, parts: list[str]) -> None:
    """A config error starts with `path:line: ` and mentions every one of `parts` (field, allowed values...)."""
    message = str(error)
    assert message.startswith(f"{path}:{line}: "), message
    for part in parts:
        assert part in message, message


def run_cli(*args: str, cache: Path | None = None, env: dict[str, str] | None = None,
            timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """Run `fa4-aot ARGS` in a fresh interpreter, as a user would."""
    full_env = {**os.environ, **(env or {})}
    if cache is not None:
        full_env["FA4_AOT_CACHE"] = str(cache)
    return subprocess.run([sys.executable, "-m", "fa4_aot", *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=ROOT)


def build_json(store: Path, sku: str, *only: str, variants: Path = TINY_VARIANTS, jobs: int = 1) -> dict:
    """`fa4-aot build --json` of the `only` variants (all when none) into `store`: its document; asserts exit 0."""
    args = ["build", "--sku", sku, "--variants", str(variants), "--json", "-j", str(jobs)]
    for name in only:
        args += ["--only", name]
    result = run_cli(*args, cache=store)
    assert result.returncode == 0, result.stderr[-2000:] + result.stdout[-2000:]
    return json.loads(result.stdout)



@pytest.fixture(scope="session")
def tiny_h200_full_fwd(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store holding `build --sku h200 --variants tiny_variants.toml --only full-fwd` (one kernel and its
    recipe regions), built once per session: several tests only need such a store to read, serve or add to. Never
    write to it: take a copy with `copy_store`."""
    store = tmp_path_factory.mktemp("tiny-h200-full-fwd") / "store"
    build_json(store, "h200", "full-fwd")
    return store


def copy_store(store: Path, to: Path) -> Path:
    """A copy of `store` at `to` (which must not exist) to write to; `to`."""
    shutil.copytree(store, to, symlinks=True)
    return to


def proven(entry: Any) -> Any:
    """`entry` filed under the key its own fields hash to (its full key): a client uses no entry that does not
    prove its key (issue 18, D17), so test fixtures must make real ones."""
    from fa4_aot.domain import kernel_keys

    return dataclasses.replace(entry, kernel_key=kernel_keys.entry_key(entry))
