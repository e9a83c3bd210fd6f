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


# Issue 22, point 10: the README said its test command was what .ci/run does, but the two differed (.ci/run
# installed torch without the PyTorch CPU index). Both now run one script, test.sh.
def _commands(text: str) -> list[str]:
    """Shell lines less their comments (a URL's '#' aside, none of these lines holds one), blanks dropped."""
    return [line.split("#")[0].strip() for line in text.splitlines() if line.split("#")[0].strip()]


def test_readme_and_ci_differed_both_run_test_sh_which_alone_installs_and_runs_pytest() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("Install and run the tests", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    assert _commands(section) == ["./test.sh"]
    ci = _commands((ROOT / ".ci" / "run").read_text())
    assert ci[-1] == "./test.sh"
    # neither installs Python packages nor runs pytest on its own
    for text in ("\n".join(_commands(section)), "\n".join(ci)):
        assert "pip " not in text and "pytest" not in text and "flavour-venv" not in text
    script = (ROOT / "test.sh").read_text()
    assert 'exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"' in script
    assert '--extra-index-url "$cpu_index"' in script and 'cpu_index="https://download.pytorch.org/whl/cpu"' in script
    assert '-e ".[dev,server,farm]"' in script and "docker/flavour-venv.sh 12 .venv-cu12" in script
    modes = dict((path, mode) for mode, path in _tracked())
    assert modes.get("test.sh", "100755") == "100755", "test.sh must be executable: .ci/run calls ./test.sh"


def test_test_sh_reuses_current_environments_and_passes_its_arguments_to_pytest() -> None:
    """With the environments installed by this very script (as after .ci/run), a second run installs nothing and
    goes straight to pytest with the arguments given."""
    stamp = (ROOT / ".venv" / ".fa4-aot-installed", ROOT / ".venv-cu12" / ".fa4-aot-installed")
    if not all(p.is_file() for p in stamp):
        pytest.skip("the environments were not installed by test.sh (run ./test.sh once)")
    done = subprocess.run(["./test.sh", "--collect-only", "-q", "tests/compile/test_commit.py"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "tests/compile/test_commit.py" in done.stdout and "pip" not in done.stdout + done.stderr
