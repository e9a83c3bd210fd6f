"""The README's walk-through works in the order it is written: a node's `pull` (and a runtime's fetch from a
server) refuses remote kernels without trusted keys, so the key is made, the build signed and the key trusted
before the first command that fetches. Regression: keys appeared only in step 5, and step 3's pull failed with
"remote kernels are refused without trusted keys". Also: the extras table names every base dependency."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _commands(section: str) -> list[list[str]]:
    """The shell commands of the bash blocks of README.md's `section` ("## " heading), in order, each as words
    (commands split at && ; || and lines; comments dropped)."""
    text = (ROOT / "README.md").read_text()
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    found = []
    for block in re.findall(r"```bash\n(.*?)```", body, flags=re.S):
        for command in re.split(r"&&|;|\|\||\n", block.replace("\\\n", " ")):
            words = shlex.split(command, comments=True)
            found += [words] if words else []
    return found


def _fetches(words: list[str]) -> bool:
    """Whether a command takes kernels from a server: `fa4-aot pull`, or a program run with FA4_AOT_SERVER."""
    return words[:2] == ["fa4-aot", "pull"] or any(w.startswith("FA4_AOT_SERVER=") for w in words)


def test_keys_are_made_signed_and_trusted_before_the_first_fetch() -> None:
    commands = _commands("Five things you will do")
    first = next(i for i, words in enumerate(commands) if _fetches(words))
    before = commands[:first]
    assert any(w[:3] == ["fa4-aot", "keys", "generate"] for w in before), "make the key before the first pull"
    signed = [i for i, w in enumerate(before) if w[:2] == ["fa4-aot", "sign"]]
    pushed = [i for i, w in enumerate(before) if w[:2] == ["fa4-aot", "push"]]
    assert signed and pushed and signed[0] < pushed[-1], "sign the build before pushing it to the server"
    trusted = [w for w in commands[:first + 1] if any(a.startswith("FA4_AOT_TRUSTED_KEYS=") for a in w)]
    assert trusted, "trust the key on the node (FA4_AOT_TRUSTED_KEYS) by the first pull"


def test_the_extras_table_names_every_base_dependency() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!~\[ ;]", d, maxsplit=1)[0] for d in deps}
    text = (ROOT / "README.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| (none) or `[runtime]`"))
    assert not [n for n in names if n not in row], row
