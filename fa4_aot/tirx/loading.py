"""fa4_aot.load(q_shape, causal=..., family="tirx"): the TIRx FA4 kernel of one static problem, found in the store
for this GPU and launched by the project's own launcher (tensor_maps.py, cuda_driver.py), never compiled.

Strict: a problem the store does not hold raises KernelMissing naming the build that makes it. A kernel found
passes the caller's check before a byte of it is read (fa4_aot.load gives the lean runtime's: the trust policy and
the certification gate, runtime/runner.py Runtime.admit). `find()` is the pure part (a store, a problem, a SKU row
and the device's constants), so it is tested on a CPU host.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..domain.skus import Constants, Sku
from ..errors import KernelMissing
from ..store import Entry, Store
from .kernel_file import KernelFile
from .problem import FAMILY, Problem, keys, schedule


def problem_of(q_shape: tuple[int, ...], k_shape: tuple[int, ...] | None, causal: bool) -> Problem:
    """The Problem of q (batch, seqlen_q, heads, head_dim) and k (batch, seqlen_kv, heads_kv, head_dim)."""
    k_shape = k_shape or q_shape
    if len(q_shape) != 4 or len(k_shape) != 4 or q_shape[0] != k_shape[0] or q_shape[3] != k_shape[3]:
        raise ValueError(f"q {tuple(q_shape)} and k {tuple(k_shape)} are not (batch, seqlen, heads, head_dim) of "
                         "one batch and head dim")
    return Problem(q_shape[0], q_shape[1], k_shape[1], q_shape[2], k_shape[2], q_shape[3], causal)


def find(store: Store, problem: Problem, sku: Sku, constants: Constants) -> Entry:
    """The index entry of `problem`'s kernel for a device of `sku`'s arch, CUDA major and host whose constants are
    `constants`. KernelMissing (with the command that builds it) when the store holds none."""
    _base, full = keys(problem, sku, schedule(problem, constants))
    entry = store.get_entry(full)
    if entry is None:
        raise KernelMissing(f"no TIRx FA4 kernel for {problem} on {sku.name} (kernel {full[:16]}) in {store.root}; "
                            f"add \"{problem}\" to a [[tirx]] entry's problems in variants.toml and run `fa4-aot "
                            f"build --sku {sku.name} --family tirx`, or pull it from a server that has it",
                            sku=sku.name, family=FAMILY, kernel_key=full,
                            compile_key=json.dumps(problem.compile_key(), sort_keys=True))
    return entry


class TirxAttention:
    """One loaded kernel: call it with fp16 CUDA tensors q, k, v (and optionally out) of its problem's shapes."""

    def __init__(self, problem: Problem, kernel: KernelFile) -> None:
        from . import tensor_maps
        from .cuda_driver import Driver

        self.problem, self.kernel = problem, kernel
        self.launch = tensor_maps.launch(kernel, problem)
        self.driver = Driver()
        self.func = self.driver.function(kernel.cubin, kernel.function, kernel.shared_bytes)

    def __call__(self, q: Any, k: Any, v: Any, out: Any = None) -> Any:
        import torch

        p = self.problem
        want = {"q": (p.batch, p.seqlen_q, p.heads_q, p.head_dim), "k": (p.batch, p.seqlen_kv, p.heads_kv, p.head_dim)}
        want["v"], want["o"] = want["k"], want["q"]
        out = torch.empty(want["o"], dtype=torch.float16, device=q.device) if out is None else out
        tensors = {"q": q, "k": k, "v": v, "o": out}
        for name, t in tensors.items():
            if tuple(t.shape) != want[name] or t.dtype != torch.float16 or not t.is_cuda or not t.is_contiguous():
                raise ValueError(f"{name} must be a contiguous fp16 CUDA tensor of shape {want[name]} for this "
                                 f"kernel ({p}); got {tuple(t.shape)} {t.dtype} on {t.device}")
        addresses = [tensors[spec.tensor].data_ptr() for spec in self.launch.maps]
        self.driver.launch(self.func, self.launch, addresses, torch.cuda.current_stream().cuda_stream)
        return out


def load(q_shape: tuple[int, ...], k_shape: tuple[int, ...] | None = None, *, causal: bool = False, store: Store,
         sku: Sku, constants: Constants, admit: Callable[[Entry], None]) -> TirxAttention:
    """The TIRx kernel of these shapes for a device of `sku` with `constants`, loaded from `store` (see the module).
    KernelMissing before returning when the store lacks it. `admit(entry)` runs before a byte of the kernel is read
    and refuses it by raising: the caller's trust policy and certification gate (runtime/runner.py: Runtime.admit,
    the check every kernel the runtimes load passes)."""
    problem = problem_of(tuple(q_shape), tuple(k_shape) if k_shape else None, causal)
    entry = find(store, problem, sku, constants)
    admit(entry)
    return TirxAttention(problem, KernelFile.parse(store.read_object(entry.object_digest), entry.object_digest))
