"""Shared fixtures. GPU tests (marker `gpu`) skip cleanly where torch sees no CUDA device."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TINY_VARIANTS = ROOT / "tests" / "data" / "tiny_variants.toml"


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the H200 device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def run_cli(*args: str, cache: Path | None = None, env: dict[str, str] | None = None,
            timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """Run `fa4-aot ARGS` in a fresh interpreter, as a user would."""
    full_env = {**os.environ, **(env or {})}
    if cache is not None:
        full_env["FA4_AOT_CACHE"] = str(cache)
    return subprocess.run([sys.executable, "-m", "fa4_aot", *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=ROOT)
