"""The launcher's host side on a CPU host: the tensor maps' fields are those tirx-kernels' own build_tensor_maps
passes to cuTensorMapEncodeTiled (run in the TIRx environment with the encode call recorded), in the order the
cubin declares its parameters, and the ctypes arrays of one encode call hold them."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
from pathlib import Path

import pytest

from fa4_aot.tirx import toolenv
from fa4_aot.tirx.cuda_driver import encode_arguments
from fa4_aot.tirx.kernel_file import KernelFile
from fa4_aot.tirx.problem import Problem
from fa4_aot.tirx.tensor_maps import launch, tensor_map

ROOT = Path(__file__).resolve().parents[2]
PROBLEMS = ["b1-q256-k256-h4-kv4-d128-full", "b2-q1024-k2048-h32-kv8-d128-causal", "b3-q300-k300-h16-kv1-d128-full"]
# Records what build_tensor_maps hands tvm's runtime.cuTensorMapEncodeTiled wrapper, per map, in its order.
UPSTREAM = """
import json, sys, torch
from tirx_kernels.ported.flashattention import flash_attention4 as fa
out = []
for text in json.loads(sys.argv[1]):
    b, q, k, h, kv, d, mask = (int(x[1:].lstrip("v")) if x[0] in "bqkhd" else x for x in text.split("-"))
    seen = []
    fa._encode = lambda t, dims, strides, box: seen.append([list(dims), list(strides), list(box)])
    t = lambda s: torch.empty(s, dtype=torch.float16)
    fa.build_tensor_maps(t((b, q, h, d)), t((b, k, kv, d)), t((b, k, kv, d)), t((b, q, h, d)), batch_size=b,
                         seq_len_q=q, seq_len_kv=k, num_qo_heads=h, num_kv_heads=kv, head_dim=d,
                         is_causal=mask == "causal")
    out.append(seen)
print(json.dumps(out))
"""


def _upstream(problems: list[str]) -> list[list[list[list[int]]]]:
    try:
        python = toolenv.python()
    except Exception as e:  # test.sh makes .venv-tirx; a bare checkout without it skips, saying how to make it
        pytest.skip(str(e))
    env = {**os.environ, "TIRX_PREPARE_CUDA_ARCH": "sm_100a"}
    done = subprocess.run([python, "-c", UPSTREAM, json.dumps(problems)], capture_output=True, text=True, env=env,
                          timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_tensor_maps_are_tirx_kernels_own() -> None:
    for text, seen in zip(PROBLEMS, _upstream(PROBLEMS), strict=True):
        p = Problem.parse(text)
        ours = [tensor_map(p, t) for t in ("q", "q", "k", "k", "v", "v", "o")]
        assert [[list(m.dims), list(m.strides), list(m.box)] for m in ours] == seen, text
        assert all(m.element_strides == (1,) * m.rank and m.swizzle == 3 and m.l2_promotion == 2 for m in ours)


CUBIN_ORDER = ("K_tensor_map", "K_tensor_map_1", "O_tensor_map", "Q_tensor_map", "Q_tensor_map_1", "V_tensor_map",
               "V_tensor_map_1")  # what TVM's CUDA source declares (sorted by name), as a built kernel file records


def _kernel(**overrides: object) -> KernelFile:
    fields = {"cubin": b"\x7fELF", "function": "flash_attention4_kernel", "params": CUBIN_ORDER, "grid": (148, 1, 1),
              "block": (512, 1, 1), "shared_bytes": 231704, "cluster": (1, 1, 1), **overrides}
    return KernelFile(**fields)  # type: ignore[arg-type]


def test_launch_follows_the_cubins_parameter_order_and_launch() -> None:
    p = Problem.parse("b2-q256-k256-h80-kv80-d128-full")
    got = launch(_kernel(), p)
    assert [m.tensor for m in got.maps] == ["k", "k", "o", "q", "q", "v", "v"]
    assert (got.grid, got.block, got.shared_bytes, got.cluster) == ((148, 1, 1), (512, 1, 1), 231704, (1, 1, 1))
    assert KernelFile.parse(_kernel().to_bytes(), "x") == _kernel()  # the store object round-trips


@pytest.mark.parametrize(("overrides", "match"), [({"params": CUBIN_ORDER[:6]}, "not the TIRx FA4 tensor maps"),
                                                  ({"cluster": (2, 1, 1)}, "cluster")])
def test_launch_refuses_what_it_cannot_launch(overrides: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        launch(_kernel(**overrides), Problem.parse("b1-q256-k256-h4-kv4-d128-full"))


def test_encode_arguments_hold_the_fields() -> None:
    spec = tensor_map(Problem.parse("b2-q1024-k2048-h32-kv8-d128-causal"), "q")
    args = encode_arguments(spec, 0x7F0000001000)
    dtype, rank, address, dims, strides, box, elem, interleave, swizzle, promo, oob = args
    assert (dtype.value, rank.value, address.value) == (6, 4, 0x7F0000001000)
    assert (list(dims), list(strides), list(box), list(elem)) == (
        [64, 32, 1024, 4], [256, 8192, 128], [64, 4, 32, 2], [1, 1, 1, 1])
    assert ctypes.sizeof(strides) == 3 * 8 and ctypes.sizeof(box) == 4 * 4  # cuuint64_t strides, cuuint32_t box
    assert (interleave.value, swizzle.value, promo.value, oob.value) == (0, 3, 2, 0)
