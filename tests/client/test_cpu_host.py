"""Issue 10.7: on a host without CUDA, argument errors come first and FA4_AOT_SKU lets install()/prepare() plan
and check the store (KernelMissing names the SKU and the call) instead of failing with "no CUDA device".
Each case runs in a fresh interpreter: install() points FA4 at the SKU before FA4 is imported."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import torch,sys; sys.exit(torch.cuda.is_available())"]).returncode,
    reason="these check the behaviour of a host without CUDA")


def run(code: str, tmp_path: Path, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FA4_AOT_")}
    prelude = "import fa4_aot, fa4_aot.client, pathlib\n"
    done = subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, cwd=ROOT,
                          timeout=600, env={**clean, "FA4_AOT_CACHE": str(tmp_path), **env})
    return done.stdout + done.stderr


@pytest.mark.parametrize("args, message", [
    ("(1, 512, 16)", "q_shape and k_shape are (batch, seqlen, heads, head_dim)"),
    ("(1, 512, 16, 128), layout='weird'", "layout must be one of"),
])
def test_argument_errors_come_before_the_gpu_check(tmp_path: Path, args: str, message: str) -> None:
    out = run(f"fa4_aot.client.prepare({args})", tmp_path)
    assert "ValueError" in out and message in out and "CUDA" not in out


def test_forced_sku_plans_and_checks_the_store_without_a_gpu(tmp_path: Path) -> None:
    out = run("fa4_aot.client.prepare((1, 512, 16, 128), causal=True)", tmp_path, FA4_AOT_SKU="h200")
    assert "KernelMissing" in out and "for SKU h200 is not in" in out and "causal b=1 sq=512" in out


def test_install_with_a_forced_sku_needs_no_gpu(tmp_path: Path) -> None:
    out = run("print(fa4_aot.install().sku.name)", tmp_path, FA4_AOT_SKU="h200")
    assert out.strip().splitlines()[-1] == "h200"
    assert "FA4_AOT_SKU" in run("fa4_aot.install()", tmp_path)  # without it: the error says what to set
