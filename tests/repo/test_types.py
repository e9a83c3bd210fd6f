"""mypy --strict passes on fa4_aot (pyproject.toml's [tool.mypy]: strict, with three modules of the FA4 seam each
exempt from one check, the reason beside it), and sees the public face's real signatures (issue 20, points 3, 7)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT


def _mypy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mypy", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)


def test_mypy_strict_passes_on_the_package() -> None:
    out = _mypy()  # the files and flags of pyproject.toml
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert "Success" in out.stdout


def test_mypy_sees_the_real_signatures_of_the_public_face(tmp_path: Path) -> None:
    use = tmp_path / "use.py"
    use.write_text("import fa4_aot\nfa4_aot.flash_attn_func(1)\nfa4_aot.install(mode=3)\n")
    out = _mypy("--strict", str(use))
    assert out.returncode == 1, out.stdout
    assert 'Missing positional arguments "k", "v" in call to "flash_attn_func"' in out.stdout
    assert 'Argument "mode" to "install" has incompatible type "int"; expected "str"' in out.stdout
