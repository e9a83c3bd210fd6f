"""fa4_aot's public face (issue 20, point 7): the entry points are the real functions, with their real signatures
(for IDEs, mypy and inspect), loaded on first use so that `import fa4_aot` stays light: no torch, no FA4."""

from __future__ import annotations

import importlib
import inspect
import json
import subprocess
import sys

import pytest

import fa4_aot
from tests.conftest import ROOT

ENTRY_POINTS = {
    "install": "fa4_aot.client.installation",
    "prefetch": "fa4_aot.client.prefetch",
    "load": "fa4_aot.runtime.api",
    "flash_attn_func": "fa4_aot.runtime.api",
    "flash_attn_varlen_func": "fa4_aot.runtime.api",
}


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_an_entry_point_is_the_real_function_with_its_signature(name: str) -> None:
    real = getattr(importlib.import_module(ENTRY_POINTS[name]), name)
    assert getattr(fa4_aot, name) is real
    assert inspect.signature(getattr(fa4_aot, name)) == inspect.signature(real)
    assert "args" not in inspect.signature(real).parameters  # not a (*args, **kwargs) wrapper
    assert name in fa4_aot.__all__ and name in dir(fa4_aot)


def test_flash_attn_func_shows_its_arguments() -> None:
    params = inspect.signature(fa4_aot.flash_attn_func).parameters
    assert list(params)[:5] == ["q", "k", "v", "softmax_scale", "causal"]


def test_an_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'flash_attn'"):
        fa4_aot.flash_attn  # noqa: B018


def test_import_fa4_aot_loads_neither_torch_nor_fa4() -> None:
    code = "import fa4_aot, json, sys; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = {m.split(".")[0] for m in json.loads(out.stdout)}
    assert loaded & {"torch", "flash_attn", "cutlass", "quack", "tvm_ffi", "numpy"} == set()
    assert not any(m.startswith(("fa4_aot.runtime", "fa4_aot.client")) for m in json.loads(out.stdout))


def test_every_error_a_call_can_raise_is_exported_from_the_package() -> None:
    """Issue 30: `Unsupported` (an FA4 argument the lean runtime has no recipe for) lived in runtime/runner.py, so
    catching it meant importing the runtime's internals; it and KernelRefused (certification) are errors.py's."""
    from fa4_aot import errors
    from fa4_aot.runtime import runner

    for name in ("Fa4AotError", "KernelMissing", "KernelRefused", "Unsupported", "UnknownSku", "ConfigError"):
        assert getattr(fa4_aot, name) is getattr(errors, name) and name in fa4_aot.__all__
    assert runner.Unsupported is fa4_aot.Unsupported and issubclass(fa4_aot.Unsupported, NotImplementedError)
