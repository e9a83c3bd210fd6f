"""NumSim (tirx-harness's numerical GPU model, on the CPU) of one TIRx FA4 kernel as fa4-aot builds it for a SKU,
against an fp32 reference, with the tensor maps fa4-aot's launcher would encode (fa4_aot/tirx/tensor_maps.py).

tirx-harness needs Python 3.12 (Requires-Python >=3.12,<3.14), the project's environments are 3.11, so this runs
in its own environment:
    /root/.pyenv/versions/3.12.1/bin/python -m venv .venv-tirx-harness
    .venv-tirx-harness/bin/pip install tirx-harness pytest   # tvm.testing imports pytest
    PYTHONPATH=. .venv-tirx-harness/bin/python bench/tirx_numsim.py b1-q128-k128-h1-kv1-d128-full [SKU]
Prints one JSON line: problem, SKU, grid, max abs error against fp32, seconds of transpile and run.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import types
from collections.abc import Iterator

import numpy as np

os.environ["TIRX_PREPARE_CUDA_ARCH"] = "sm_100a"
from fa4_aot.domain.sku_table import table  # noqa: E402
from fa4_aot.tirx.compiler import kernel_module  # noqa: E402
from fa4_aot.tirx.problem import Problem, l2_size_for, schedule  # noqa: E402
from fa4_aot.tirx.tensor_maps import tensor_map  # noqa: E402

MAPS = {"Q_tensor_map": "q", "Q_tensor_map_1": "q", "K_tensor_map": "k", "K_tensor_map_1": "k",
        "V_tensor_map": "v", "V_tensor_map_1": "v", "O_tensor_map": "o"}


@contextlib.contextmanager
def torch_for_the_kernel_module() -> Iterator[None]:
    """The kernel module imports torch for its GPU helpers (prepare_data, run_gpu), which NumSim never calls, and no
    CPU torch for Python 3.12 was reachable here: without torch, an empty module stands in while the kernel module
    is imported and traced, and is removed after (tvm_ffi inspects a torch it finds in sys.modules)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        sys.modules["torch"] = types.ModuleType("torch")
        try:
            yield
        finally:
            del sys.modules["torch"]
        return
    yield


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool) -> np.ndarray:
    group = q.shape[2] // k.shape[2]
    qf = q.astype(np.float32).transpose(0, 2, 1, 3)
    kf = np.repeat(k, group, axis=2).astype(np.float32).transpose(0, 2, 1, 3)
    vf = np.repeat(v, group, axis=2).astype(np.float32).transpose(0, 2, 1, 3)
    s = qf @ kf.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    if causal:
        sq, sk = s.shape[-2:]
        s = np.where(np.triu(np.ones((sq, sk), bool), sk - sq + 1), -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    return ((p / p.sum(-1, keepdims=True)) @ vf).transpose(0, 2, 1, 3)


def main() -> None:
    from tirx_harness.numsim import Engine, TensorMap, transpile

    problem = Problem.parse(sys.argv[1])
    sku = table(__import__("pathlib").Path("variants.toml"))[sys.argv[2] if len(sys.argv) > 2 else "b200"]
    sched = schedule(problem, sku.constants())
    p = problem
    with torch_for_the_kernel_module():
        module = kernel_module(sched.grid, l2_size_for(problem, sched.l2_swizzle))
        func = module.get_flash_attention4_kernel(p.batch, p.seqlen_q, p.seqlen_kv, p.heads_q, p.heads_kv,
                                                  p.head_dim, is_causal=p.causal)
    rng = np.random.default_rng(0)
    bases = {"q": rng.standard_normal((p.batch, p.seqlen_q, p.heads_q, 128)).astype(np.float16),
             "k": rng.standard_normal((p.batch, p.seqlen_kv, p.heads_kv, 128)).astype(np.float16),
             "v": rng.standard_normal((p.batch, p.seqlen_kv, p.heads_kv, 128)).astype(np.float16),
             "o": np.zeros((p.batch, p.seqlen_q, p.heads_q, 128), np.float16)}
    inputs = {}
    for name, tensor in MAPS.items():
        spec = tensor_map(p, tensor)
        inputs[name] = TensorMap(base=bases[tensor], global_shape=spec.dims, global_strides=spec.strides,
                                 box_shape=spec.box, element_strides=spec.element_strides, dtype="float16",
                                 swizzle="128B").numpy()
    start = time.monotonic()
    compiled = transpile(func)
    built = time.monotonic()
    result = Engine().run(compiled, inputs, outputs=["O_tensor_map"])
    ran = time.monotonic()
    out = np.asarray(result.outputs["O_tensor_map"]).reshape(bases["o"].shape).astype(np.float32)
    ref = reference(bases["q"], bases["k"], bases["v"], p.causal)
    print(json.dumps({"problem": str(p), "sku": sku.name, "grid": sched.grid, "l2_swizzle": sched.l2_swizzle,
                      "max_abs_error": float(np.abs(out - ref).max()), "finite": bool(np.isfinite(out).all()),
                      "transpile_s": round(built - start, 1), "run_s": round(ran - built, 1)}))


if __name__ == "__main__":
    main()
