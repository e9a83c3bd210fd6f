"""The one seam that imports TVM and tirx-kernels: trace one problem for one schedule, compile it with
`tvm.compile(..., tir_pipeline="tirx")` to CUDA source, and make the sm_100a cubin with nvcc exactly as TVM's own
nvcc path does (tvm.support.nvcc.compile_cuda, TVM's flags and ptxas register level). PyPI TVM has no CUDA
runtime module, so what launching needs is read from TVM's own lowering: the kernel's parameter order from the
CUDA source, and grid, block and dynamic shared memory from the host code TVM generated to launch it.

Run in the TIRx environment (toolenv.py) as `python -m fa4_aot.tirx.compiler`: one JSON request on stdin
({"problem": str, "grid": int, "l2_swizzle": int, "arch": str}), one JSON answer on stdout ({"cubin": base64,
"launch": {...}, "toolchain": {...}}). Nothing here is imported by the rest of fa4-aot.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import subprocess
import sys
import types
from importlib import metadata
from typing import Any

from .problem import KERNEL, Problem, l2_size_for

_MODULE = "tirx_kernels.ported.flashattention.flash_attention4"
_L2_LINE = "    L2_SIZE = 50 * 1024 * 1024\n"
_OUR_L2_LINE = "    L2_SIZE = _FA4_AOT_L2_SIZE\n"


def toolchain() -> dict[str, str]:
    """The versions this environment compiles with, in toolenv.TOOLCHAIN's names."""
    import importlib.util

    spec = importlib.util.find_spec(_MODULE)
    assert spec is not None and spec.origin
    with open(spec.origin, "rb") as f:
        source_digest = hashlib.sha256(f.read()).hexdigest()
    try:
        nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, check=True).stdout
    except FileNotFoundError as e:
        raise RuntimeError("nvcc is not on PATH: TIRx cubins are made by nvcc 13.0 (the CUDA 13.0 toolkit's); "
                           "install it and put its bin folder on PATH") from e
    release = re.search(r"release (\d+\.\d+)", nvcc)
    return {"tirx-kernels": metadata.version("tirx-kernels"), "apache-tvm": metadata.version("apache-tvm"),
            "nvcc": release.group(1) if release else nvcc.strip(), "kernel-source": source_digest}


def kernel_module(max_ctas: int, l2_size: int) -> types.ModuleType:
    """flash_attention4.py with its two B200 choices replaced: MAX_CTAS (a module constant) and L2_SIZE (a local
    of make_kernel, so its one source line is substituted). A source without exactly that line is refused."""
    import importlib.util

    spec = importlib.util.find_spec(_MODULE)
    assert spec is not None and spec.origin
    with open(spec.origin) as f:
        source = f.read()
    if source.count(_L2_LINE) != 1 or "\nMAX_CTAS = 148\n" not in source:
        raise RuntimeError(f"{spec.origin} no longer has `MAX_CTAS = 148` and one `{_L2_LINE.strip()}`: the "
                           "kernel's scheduler constants moved; update fa4_aot/tirx/compiler.py before building")
    module = types.ModuleType(_MODULE)
    module.__file__ = spec.origin
    module.__dict__["_FA4_AOT_L2_SIZE"] = l2_size
    # dont_inherit: this module's `from __future__ import annotations` would stringify the kernel's annotations
    exec(compile(source.replace(_L2_LINE, _OUR_L2_LINE), spec.origin, "exec", dont_inherit=True), module.__dict__)
    module.__dict__["MAX_CTAS"] = max_ctas
    return module


def launch_of(cuda_source: str, host_ir: str) -> dict[str, Any]:
    """The kernel's name and parameter order (from its __global__ declaration) and its launch (the three i64
    launch arguments TVM's host code passes after the tensor maps: grid x, block x, dynamic shared memory)."""
    decl = re.search(r'extern "C" __global__ void __launch_bounds__\([^)]*\) (\w+)\(([^)]*)\)', cuda_source)
    if not decl:
        raise RuntimeError("no __global__ kernel in the CUDA source TVM generated")
    params = [p.split()[-1] for p in decl.group(2).split(",")]
    launch = [int(v) for v in re.findall(r"store i64 (\d+), ptr", host_ir)]
    if len(launch) < 3:
        raise RuntimeError(f"TVM's host code for {decl.group(1)} does not show its launch arguments")
    grid, block, smem = launch[-3:]
    return {"function": decl.group(1), "params": params, "grid": [grid, 1, 1], "block": [block, 1, 1],
            "shared_bytes": smem, "cluster": [1, 1, 1]}


def compile_problem(problem: Problem, grid: int, l2_swizzle: int, arch: str) -> dict[str, Any]:
    """Trace, lower and compile one kernel; the answer document (see the module)."""
    os.environ["TIRX_PREPARE_CUDA_ARCH"] = arch  # make_kernel's IS_THOR test and the runner's target read it
    import tvm
    from tvm.support import nvcc

    module = kernel_module(grid, l2_size_for(problem, l2_swizzle))
    func = module.get_flash_attention4_kernel(problem.batch, problem.seqlen_q, problem.seqlen_kv,
                                              problem.heads_q, problem.heads_kv, problem.head_dim,
                                              is_causal=problem.causal)
    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    with target:
        executable = tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")
        source = executable.mod.imports[0].inspect_source()
        cubin = bytes(nvcc.compile_cuda(source, target_format="cubin", compiler="nvcc"))
    launch = launch_of(source, executable.mod.inspect_source("ll"))
    if launch["grid"][0] != grid:
        raise RuntimeError(f"{KERNEL} {problem} was traced for grid {launch['grid'][0]}, fa4-aot's schedule says "
                           f"{grid}: problem.py no longer matches the kernel's scheduler; update it")
    return {"cubin": base64.b64encode(cubin).decode(), "launch": launch, "toolchain": toolchain(),
            "reg_level": os.environ.get("TVM_CUDA_PTXAS_REG_LEVEL", "")}


def main() -> None:
    request = json.load(sys.stdin)
    with contextlib.redirect_stdout(sys.stderr):  # TVM and ptxas -v talk on stdout: only the answer goes there
        answer = compile_problem(Problem.parse(request["problem"]), int(request["grid"]),
                                 int(request["l2_swizzle"]), request["arch"])
    json.dump(answer, sys.stdout)


if __name__ == "__main__":
    main()
