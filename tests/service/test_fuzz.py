"""Property-based fuzzing of the live server from its own OpenAPI document (schemathesis): no 5xx, every
status, content type, header and body documented. Bounded (a fixed seed, 30 cases per operation) to run in
seconds. Publishing with a random digest is rightly refused (422), so positive_data_acceptance is off."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers.servers import Server


def test_openapi_fuzz(server: Server, tmp_path: Path) -> None:
    cli = shutil.which("schemathesis", path=str(Path(sys.executable).parent)) or "schemathesis"
    cmd = [cli, "run", f"{server.url}/openapi.json", "--checks", "all",
           "--exclude-checks", "positive_data_acceptance", "--max-examples", "30", "--seed", "20261130",
           "--request-timeout", "10", "--generation-database", "none", "--no-color",
           "--header", f"Authorization: Bearer {server.tokens['publish']}"]
    run = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert "Server error" not in run.stdout
