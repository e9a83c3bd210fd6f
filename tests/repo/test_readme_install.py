"""The README's quick-start install sends only torch to the PyTorch CPU index (issue 30, item 1). A `pip install
--extra-index-url CPU_INDEX torch -e ".[build,server]"` applies the extra index to every package: where that
index was slow, pip retried it 315 times, 11.8 of a new user's 12 install minutes. test.sh already installs torch
alone from it; the README must say the same."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INDEX_OPTIONS = ("--extra-index-url", "--index-url", "-i", "--find-links", "-f")


def _quick_start_blocks() -> list[str]:
    """The bash blocks of README.md's "Quick start" section (up to the next "## " heading)."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)```", section, flags=re.S)


def _pip_installs(block: str) -> list[list[str]]:
    """The arguments after `pip install` of every pip command in `block` (commands split at && ; | and lines)."""
    installs = []
    for command in re.split(r"&&|;|\|\||\n", block.replace("\\\n", " ")):
        words = shlex.split(command, comments=True)
        for i, word in enumerate(words[:-1]):
            if word.endswith("pip") and words[i + 1] == "install":
                installs.append(words[i + 2:])
    return installs


def _packages(args: list[str]) -> list[str]:
    """The requirements an install names: its arguments that are neither options nor their values."""
    named, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in INDEX_OPTIONS or arg in ("-c", "-r", "--constraint", "--requirement"):
            skip = True
        elif arg == "-e":
            continue
        elif not arg.startswith("-"):
            named.append(arg)
    return named


def test_i30_quick_start_sends_only_torch_to_the_extra_index() -> None:
    installs = [args for block in _quick_start_blocks() for args in _pip_installs(block)]
    assert installs, "README's quick start has no `pip install`"
    with_index = [args for args in installs if any(a.split("=")[0] in INDEX_OPTIONS for a in args)]
    assert with_index, "the quick start installs torch's CPU build from the PyTorch CPU index"
    for args in with_index:
        packages = _packages(args)
        assert packages and all(re.match(r"torch([=<>!~ ]|$)", p) for p in packages), (
            f"the extra index applies to {packages}: install torch alone from it, then the rest from PyPI")
    assert any(".[" in p for args in installs for p in _packages(args) if args not in with_index), (
        "the quick start installs fa4-aot from PyPI in its own pip install")
