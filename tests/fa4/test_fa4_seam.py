"""The seam's API stays what its docstring lists, even after its modules are loaded: a submodule named like an
API function would replace that function on the package when first imported."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

from fa4_aot import fa4


def test_api_functions_survive_loading_every_seam_module() -> None:
    for module in pkgutil.iter_modules(fa4.__path__):
        importlib.import_module(f"fa4_aot.fa4.{module.name}")
        assert module.name not in fa4.__all__, f"module fa4_aot/fa4/{module.name}.py shadows fa4.{module.name}()"
    assert fa4.current() is None
    for name in fa4.__all__:
        assert inspect.isfunction(getattr(fa4, name)), name
        assert f"    {name}(" in (fa4.__doc__ or ""), f"fa4.{name} is not documented in the seam's docstring"


def test_toolchain_names_every_kernel_generating_package() -> None:
    tools = fa4.toolchain()
    assert set(tools) == {"flash-attn-4", "nvidia-cutlass-dsl", "apache-tvm-ffi", "quack-kernels", "cutlass-dsl-cuda",
                          "source:flash_attn.cute", "source:cutlass", "source:quack", "source:fa4-aot",
                          *(name for name in tools if name.startswith("nvidia-cutlass-dsl-"))}
    assert tools["cutlass-dsl-cuda"] in ("cu12", "cu13")
