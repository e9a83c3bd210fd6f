"""`import fa4_aot` and everything the lean runtime imports, up to a call, never load cutlass, flash_attn or
quack (fresh interpreters; sys.modules checked)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import ROOT

COMPILER = ("cutlass", "flash_attn", "quack")
PROBE = r"""
import json, sys
{body}
print(json.dumps(sorted({{m.split(".")[0] for m in sys.modules}} & {{"cutlass", "flash_attn", "quack"}})))
"""


def _imported(body: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", PROBE.format(body=body)], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_fa4_aot_loads_no_compiler() -> None:
    assert _imported("import fa4_aot") == []


def test_lean_modules_load_no_compiler() -> None:
    body = ("import torch, tvm_ffi, fa4_aot\n"
            "from fa4_aot.runtime import api, libraries, replay, runner\n"
            "from fa4_aot.store import recipes\n"
            "from fa4_aot.domain import recipe_format, symexpr")
    assert _imported(body) == []


def test_a_lean_call_without_a_gpu_fails_cleanly_and_loads_no_compiler() -> None:
    body = """
import torch, fa4_aot
q = torch.zeros(1, 128, 8, 128, dtype=torch.bfloat16)
try:
    fa4_aot.flash_attn_func(q, q, q, causal=True)
except fa4_aot.Fa4AotError as e:
    assert "CUDA" in str(e), e
else:
    raise SystemExit("expected an error without a GPU")
"""
    assert _imported(body) == []
