"""NumSim (tirx-harness's numerical model of the GPU, run on the CPU) of one TIRx FA4 kernel, in the simulation
environment (simulation.py finds it): `python -m fa4_aot.tirx.simulator`, one JSON request on stdin, one JSON
answer on stdout. Nothing here is imported by the rest of fa4-aot.

NumSim runs TIR, not cubins: the kernel is traced again for the stored entry's schedule (the grid and L2 swizzle
its key names), compiled as a build compiles it (compiler.compile_problem, TVM and nvcc), and the digest of that
kernel file is answered so the caller can hold it to the stored object's: the TIR simulated is the one whose bytes
the store holds. Then NumSim transpiles the TIR to Rust, builds it against its engine (cargo and rustc: the engine
and pyo3 are Rust crates from crates.io, which the wheel does not ship) and runs it on the request's q, k, v with
the tensor maps fa4-aot's launcher encodes (tensor_maps.py).

Request: {"problem", "grid", "l2_swizzle", "arch", "inputs": .npz of q, k, v, "output": .npy path, "rebuild":
bool}. Answer: {"rebuilt_digest": str | None, "seconds": {stage: s}, "blocked": None | {"stage", "error"},
"harness": version}; the output (fp16, (batch, seqlen_q, heads_q, 128)) is written to "output" when it ran.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import sys
import time
import types
from collections.abc import Iterator
from importlib import metadata
from typing import Any

import numpy as np

from .kernel_file import KernelFile
from .problem import Problem, l2_size_for
from .tensor_maps import _TENSORS, tensor_map

OUTPUT = "O_tensor_map"


@contextlib.contextmanager
def _no_torch() -> Iterator[None]:
    """flash_attention4.py imports torch for its GPU helpers, which neither tracing nor NumSim calls; the
    simulation environment has none (no CPU torch for Python 3.12 is installed), so an empty module stands in
    while the kernel module runs. tvm_ffi is imported first: it inspects any torch it finds in sys.modules."""
    import tvm_ffi  # noqa: F401

    if "torch" in sys.modules:
        yield
        return
    sys.modules["torch"] = types.ModuleType("torch")
    try:
        yield
    finally:
        del sys.modules["torch"]


def trace(problem: Problem, grid: int, l2_swizzle: int) -> Any:
    """The kernel's PrimFunc for `problem` under the schedule its key names."""
    from .compiler import kernel_module

    with _no_torch():
        module = kernel_module(grid, l2_size_for(problem, l2_swizzle))
        return module.get_flash_attention4_kernel(problem.batch, problem.seqlen_q, problem.seqlen_kv,
                                                  problem.heads_q, problem.heads_kv, problem.head_dim,
                                                  is_causal=problem.causal)


def rebuilt_digest(problem: Problem, grid: int, l2_swizzle: int, arch: str) -> str:
    """sha256 of the kernel file a build makes of this TIR here (what the store's object digest is)."""
    from .compiler import compile_problem

    with _no_torch(), contextlib.redirect_stdout(sys.stderr):
        answer = compile_problem(problem, grid, l2_swizzle, arch)
    kernel = KernelFile.from_launch(base64.b64decode(answer["cubin"]), answer["launch"])
    return hashlib.sha256(kernel.to_bytes()).hexdigest()


def tensor_maps(problem: Problem, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """NumSim's 128-byte descriptor of every tensor map parameter, over `tensors` (q, k, v, o)."""
    from tirx_harness.numsim import TensorMap

    maps = {}
    for name, tensor in _TENSORS.items():
        spec = tensor_map(problem, tensor)
        maps[name] = TensorMap(base=tensors[tensor], global_shape=spec.dims, global_strides=spec.strides,
                               box_shape=spec.box, element_strides=spec.element_strides, dtype="float16",
                               swizzle="128B").numpy()
    return maps


def simulate(problem: Problem, func: Any, tensors: dict[str, np.ndarray], seconds: dict[str, float]) -> np.ndarray:
    """The kernel's output on `tensors`; NumSimError when NumSim cannot build or run it."""
    from tirx_harness.numsim import Engine, transpile

    start = time.monotonic()
    compiled = transpile(func)
    seconds["transpile"] = round(time.monotonic() - start, 1)
    start = time.monotonic()
    result = Engine(max_workers="auto").run(compiled, tensor_maps(problem, tensors), outputs=[OUTPUT])
    seconds["run"] = round(time.monotonic() - start, 1)
    return np.asarray(result.outputs[OUTPUT]).reshape(tensors["o"].shape).astype(np.float16)


def answer(request: dict[str, Any]) -> dict[str, Any]:
    from tirx_harness.numsim import NumSimError

    problem, grid, swizzle = Problem.parse(request["problem"]), int(request["grid"]), int(request["l2_swizzle"])
    os.environ["TIRX_PREPARE_CUDA_ARCH"] = request["arch"]
    seconds: dict[str, float] = {}
    doc: dict[str, Any] = {"rebuilt_digest": None, "seconds": seconds, "blocked": None,
                           "harness": metadata.version("tirx-harness")}
    if request.get("rebuild"):
        start = time.monotonic()
        doc["rebuilt_digest"] = rebuilt_digest(problem, grid, swizzle, request["arch"])
        seconds["rebuild"] = round(time.monotonic() - start, 1)
    start = time.monotonic()
    func = trace(problem, grid, swizzle)
    seconds["trace"] = round(time.monotonic() - start, 1)
    with np.load(request["inputs"]) as data:
        tensors = {name: np.ascontiguousarray(data[name], dtype=np.float16) for name in ("q", "k", "v")}
    tensors["o"] = np.zeros(tensors["q"].shape, np.float16)
    try:
        np.save(request["output"], simulate(problem, func, tensors, seconds))
    except (NumSimError, FileNotFoundError) as e:  # FileNotFoundError: no cargo or rustc for NumSim's engine
        if isinstance(e, FileNotFoundError) and "NumSim Rust tool" not in str(e):
            raise
        doc["blocked"] = {"stage": _stage(e, seconds), "error": f"{type(e).__name__}: {e}"[-4000:]}
    return doc


def _stage(error: Exception, seconds: dict[str, float]) -> str:
    """Where NumSim stopped: "frontend" (the TIR has a form NumSim does not model), "engine" (cargo building
    NumSim's Rust engine and pyo3, which transpile does after the frontend emitted the kernel's Rust), "artifact"
    (building or loading the kernel's own Rust) or "run"."""
    from tirx_harness.numsim import NumSimBuildError, UnmodeledTIRxFormError, UnsupportedTIRxError

    if "transpile" in seconds:
        return "run"
    if isinstance(error, (UnsupportedTIRxError, UnmodeledTIRxFormError)):
        return "frontend"
    if isinstance(error, FileNotFoundError) or (isinstance(error, NumSimBuildError) and
                                                str(error).startswith("NumSim Rust dependency build failed")):
        return "engine"
    return "artifact"


def main() -> None:
    request = json.load(sys.stdin)
    with contextlib.redirect_stdout(sys.stderr):  # TVM, ptxas -v and NumSim talk on stdout: only the answer goes
        doc = answer(request)
    json.dump(doc, sys.stdout)


if __name__ == "__main__":
    main()
