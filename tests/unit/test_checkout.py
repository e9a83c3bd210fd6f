"""The repository as CI checks it out: nothing local is tracked. Regression: a `.venv-cu12` symlink to one
developer's environment was committed (`.venv-cu12/` in .gitignore does not match a symlink), and CI's
`docker/flavour-venv.sh 12 .venv-cu12` then failed: "Unable to create directory '.venv-cu12'"."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tracked() -> list[tuple[str, str]]:
    """(git mode, path) of every tracked file."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "ls-files", "-s", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [(line.split(b" ", 1)[0].decode(), line.split(b"\t", 1)[1].decode()) for line in out.split(b"\0") if line]


def test_ci_venv_cu12_symlink_was_tracked_no_venv_or_outward_link_is() -> None:
    tracked = _tracked()
    assert not [path for _mode, path in tracked if path.split("/")[0].startswith(".venv")]
    links = {path: (ROOT / path).parent / (ROOT / path).readlink()
             for mode, path in tracked if mode == "120000"}  # e.g. fa4_aot/variants.toml -> ../variants.toml
    outward = [p for p, target in links.items() if not target.resolve().is_relative_to(ROOT)]
    assert not outward, f"tracked symlinks pointing out of the checkout: {outward}"


def test_gitignore_ignores_every_venv_whether_folder_or_link() -> None:
    _tracked()
    names = [".venv", ".venv-cu12", ".venv-cu13"]
    ignored = subprocess.run(["git", "check-ignore", "--no-index", *names], cwd=ROOT, capture_output=True,
                             text=True).stdout.split()
    assert ignored == names
