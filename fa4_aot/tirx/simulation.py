"""Simulating a stored TIRx FA4 kernel on the CPU: the simulation environment, one run of simulator.py in it, and
the check of its output against the float32 reference (numerics.py).

tirx-harness (NumSim) needs Python 3.12 and its own apache-tvm-ffi (0.1.14.post0, which its TVM frontend library
links), so it lives in `.venv-numsim` of the checkout or `$FA4_AOT_PYTHON_NUMSIM`, apart from `.venv-tirx` (3.11,
the project's apache-tvm-ffi) as the compiler lives apart from the build environment. test.sh makes it.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import config
from ..errors import BuildError
from ..store import Entry
from .numerics import Check, check
from .problem import ARCHS, Problem, Schedule

ENV_VAR = "FA4_AOT_PYTHON_NUMSIM"
PINS = ("tirx-harness==0.1.2.post2 apache-tvm==0.27.0.post1 apache-tvm-ffi==0.1.14.post0 tirx-kernels==0.1.2.post1 "
        "'numpy>=2.5.3' 'threadpoolctl>=3.6,<4' pytest")
MAKE_ENV = ("python3.12 -m venv .venv-numsim && .venv-numsim/bin/pip install --no-deps tirx-harness==0.1.2.post2 "
            f"&& .venv-numsim/bin/pip install {PINS}")
TIMEOUT_S = 3600


@dataclass(frozen=True)
class Simulation:
    """One NumSim run of a stored kernel: what ran, how long each stage took, and the check if it computed."""

    problem: Problem
    rebuilt_digest: str | None  # the kernel file the simulated TIR compiles to, when asked
    seconds: dict[str, float]
    blocked: dict[str, str] | None  # {"stage", "error"} when NumSim could not build or run the kernel
    harness: str
    check: Check | None = None
    output: np.ndarray | None = field(default=None, repr=False)


def python() -> str:
    """The simulation environment's interpreter: $FA4_AOT_PYTHON_NUMSIM, else the checkout's .venv-numsim.
    Raises BuildError with the command that makes one."""
    env = os.environ.get(ENV_VAR)
    local = config.CHECKOUT_DIR / ".venv-numsim" / "bin" / "python"
    found = Path(env) if env else local
    if not found.is_file():
        raise BuildError(f"no NumSim environment at {found}; make it in the checkout with `{MAKE_ENV}` (./test.sh "
                         f"does) or set {ENV_VAR} to the python of one")
    return str(found)


def inputs(problem: Problem, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded fp16 q, k, v of `problem`'s shapes, (batch, seqlen, heads, head_dim)."""
    rng = np.random.default_rng(seed)
    p = problem
    shapes = {"q": (p.batch, p.seqlen_q, p.heads_q, p.head_dim), "k": (p.batch, p.seqlen_kv, p.heads_kv, p.head_dim),
              "v": (p.batch, p.seqlen_kv, p.heads_kv, p.head_dim)}
    return {name: rng.standard_normal(shape).astype(np.float16) for name, shape in shapes.items()}


def run(entry: Entry, sched: Schedule, tensors: dict[str, np.ndarray], *, rebuild: bool = True,
        timeout: float = TIMEOUT_S) -> Simulation:
    """Simulate the kernel of `entry` (its problem, on `sched`: the schedule its key names, loading.find's) on q, k,
    v of `tensors`, and check its output against the float32 reference when it ran. Raises BuildError when the
    simulator itself fails (a crash, not NumSim refusing the kernel: that is `blocked`)."""
    problem = Problem.parse(entry.call)
    if entry.arch not in ARCHS:
        raise BuildError(f"{entry.kernel_key[:16]} is an {entry.arch} kernel; NumSim runs the sm_100a TIRx kernel")
    with tempfile.TemporaryDirectory(prefix="fa4-aot-numsim-") as tmp:
        inputs_path, output_path = Path(tmp) / "inputs.npz", Path(tmp) / "out.npy"
        np.savez(inputs_path, q=tensors["q"], k=tensors["k"], v=tensors["v"])
        request = {"problem": str(problem), "grid": sched.grid, "l2_swizzle": sched.l2_swizzle, "arch": entry.arch,
                   "inputs": str(inputs_path), "output": str(output_path), "rebuild": rebuild}
        doc = _simulator(request, timeout)
        out = np.load(output_path) if doc["blocked"] is None else None
    result = check(out, tensors["q"], tensors["k"], tensors["v"], problem.causal) if out is not None else None
    return Simulation(problem, doc["rebuilt_digest"], doc["seconds"], doc["blocked"], doc["harness"], result, out)


def _simulator(request: dict[str, Any], timeout: float) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(config.CHECKOUT_DIR), os.environ.get("PYTHONPATH", "")])}
    try:
        done = subprocess.run([python(), "-m", "fa4_aot.tirx.simulator"], input=json.dumps(request),
                              capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise BuildError(f"simulating TIRx {request['problem']} took over {timeout} s") from e
    if done.returncode != 0:
        raise BuildError(f"the NumSim simulator failed on {request['problem']}: {done.stderr.strip()[-2000:]}")
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer
