"""`fa4-aot build --family tirx`, for real: TIRx FA4 kernels compiled on this CPU host (TVM's TIRx pipeline, nvcc)
for two sm_100a SKUs that differ only in SM count, into the store; kernel keys share exactly what the bytes share,
the store verifies, a real server (uvicorn; SQLite and PostgreSQL) serves the kernels to a GPU host's store, the
cubins' machine code differs between the SKUs as their rows do, and a strict load finds them or says what to
build."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from fa4_aot.domain.sku_table import table
from fa4_aot.errors import BuildError, KernelMissing
from fa4_aot.remote import push_pull
from fa4_aot.remote.http import Remote
from fa4_aot.store import Store
from fa4_aot.tirx.kernel_file import KernelFile
from fa4_aot.tirx.loading import find
from fa4_aot.tirx.problem import FAMILY, Problem
from fa4_aot.tirx.producer import build
from fa4_aot.tirx.tensor_maps import launch
from fa4_aot.trust.policy import Trust
from tests.conftest import run_cli
from tests.helpers.servers import Launch

pytestmark = pytest.mark.slow
VARIANTS = Path(__file__).resolve().parents[1] / "data" / "tirx_variants.toml"
SKUS = table(VARIANTS)
SMALL, LARGE = "b1-q256-k256-h4-kv4-d128-full", "b2-q256-k256-h80-kv80-d128-full"  # 4 and 160 tasks


@pytest.fixture(scope="module")
def built(tirx_build: Callable[[Path, str], tuple[Path, list[dict]]]) -> tuple[Path, list[dict]]:
    """One `fa4-aot build --sku b200,gb200 --family tirx --json` of tirx_variants.toml: (store, its documents)."""
    return tirx_build(VARIANTS, "b200,gb200")


def _kernels(store: Store) -> dict[tuple[str, str], object]:
    return {(e.call, e.sku): e for e in store.entries() if not e.is_signpost}


def test_skus_share_a_kernel_exactly_when_its_schedule_agrees(built: tuple[Path, list[dict]]) -> None:
    root, docs = built
    assert [(d["sku"], d["built"], d["present"], d["failed"]) for d in docs] == [("b200", 2, 0, []),
                                                                                 ("gb200", 1, 1, [])]
    kernels = _kernels(Store(root))
    assert set(kernels) == {(LARGE, "b200"), (LARGE, "gb200"), (SMALL, "b200")}  # gb200 found SMALL built
    large_b200, large_gb200 = kernels[(LARGE, "b200")], kernels[(LARGE, "gb200")]
    assert large_b200.hardware_queries == [["persistent_ctas(160)", 148]]  # type: ignore[attr-defined]
    assert large_gb200.hardware_queries == [["persistent_ctas(160)", 152]]  # type: ignore[attr-defined]
    assert large_b200.object_digest != large_gb200.object_digest  # type: ignore[attr-defined]
    assert {e.family for e in kernels.values()} == {FAMILY}  # type: ignore[attr-defined]


def test_the_store_verifies(built: tuple[Path, list[dict]]) -> None:
    done = run_cli("verify", "--json", cache=built[0])
    assert done.returncode == 0, done.stderr[-2000:] + done.stdout[-2000:]


def _cuobjdump() -> str | None:
    """cuobjdump of the CUDA toolkit on PATH, else the one triton ships (the build extra brings triton)."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    import triton

    shipped = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(shipped) if shipped.is_file() else None


def _sass(tool: str, kernel: KernelFile, tmp: Path) -> list[str]:
    """The cubin's instructions (cuobjdump -sass), without addresses and encodings."""
    path = tmp / f"{kernel.grid[0]}.cubin"
    path.write_bytes(kernel.cubin)
    out = subprocess.run([tool, "-sass", str(path)], capture_output=True, text=True, check=True).stdout
    return [line.split("*/", 1)[1].split(";")[0].strip() for line in out.splitlines() if ";" in line and "*/" in line]


def test_the_cubins_carry_each_skus_grid(built: tuple[Path, list[dict]], tmp_path: Path) -> None:
    tool = _cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump: neither the CUDA toolkit's on PATH nor triton's")
    store = Store(built[0])
    kernels = _kernels(store)
    b200, gb200 = (KernelFile.parse(store.read_object(kernels[(LARGE, s)].object_digest), s)  # type: ignore[attr-defined]
                   for s in ("b200", "gb200"))
    assert (b200.grid, gb200.grid, b200.block, b200.params) == ((148, 1, 1), (152, 1, 1), (512, 1, 1), gb200.params)
    one, other = _sass(tool, b200, tmp_path), _sass(tool, gb200, tmp_path)
    assert len(one) == len(other) > 1000
    differ = [(a, b) for a, b in zip(one, other, strict=True) if a != b]
    hexes = re.compile(r"0x[0-9a-f]+")
    assert all(hexes.sub("#", a) == hexes.sub("#", b) for a, b in differ)  # the same instructions, other immediates
    changed = {(tuple(sorted(set(hexes.findall(a)) - set(hexes.findall(b)))),
                tuple(sorted(set(hexes.findall(b)) - set(hexes.findall(a))))) for a, b in differ}
    # the persistent scheduler's CTA count (148 against 152) and the 160 tasks left past it (12 against 8), no more
    assert changed == {(("0x94",), ("0x98",)), (("0xc",), ("0x8",))}, differ


def test_a_server_serves_them_to_a_gpu_hosts_store(built: tuple[Path, list[dict]], launch: Launch,
                                                   tmp_path: Path) -> None:
    server = launch()
    build_store = Store(built[0])
    for sku in ("b200", "gb200"):
        pushed = push_pull.push(build_store, Remote(server.url, token=server.tokens["publish"]), sku)
        assert pushed.failures == []
    gpu = Store(tmp_path / "gpu")
    remote = Remote(server.url)
    for sku in ("b200", "gb200"):  # the server lists a shared kernel under the SKU that built it (docs/limits.md)
        pulled = push_pull.pull(gpu, remote, sku, trust=Trust(SKUS[sku], gpu, remote, {}, insecure=True))
        assert pulled.failures == []
    gb200 = SKUS["gb200"]
    for text in (SMALL, LARGE):
        entry = find(gpu, Problem.parse(text), gb200, gb200.constants())
        assert gpu.read_object(entry.object_digest) == build_store.read_object(entry.object_digest)
        kernel = KernelFile.parse(gpu.read_object(entry.object_digest), entry.object_digest)
        assert launch_of(kernel, text).grid == (min(152, Problem.parse(text).tasks), 1, 1)


def launch_of(kernel: KernelFile, text: str):  # type: ignore[no-untyped-def]
    return launch(kernel, Problem.parse(text))


def test_strict_load_names_the_build_of_a_problem_not_built(built: tuple[Path, list[dict]]) -> None:
    with pytest.raises(KernelMissing, match=r"fa4-aot build --sku b200 --family tirx") as missing:
        find(Store(built[0]), Problem.parse("b1-q512-k512-h4-kv4-d128-full"), SKUS["b200"], SKUS["b200"].constants())
    assert missing.value.family == FAMILY
    # a device whose SM count no row has built for: the large kernel's constant differs, the small one's agrees
    from fa4_aot.domain.skus import Constants

    other = Constants(sm_count=150, l2_bytes=SKUS["b200"].l2_bytes)
    find(Store(built[0]), Problem.parse(SMALL), SKUS["b200"], other)
    with pytest.raises(KernelMissing):
        find(Store(built[0]), Problem.parse(LARGE), SKUS["b200"], other)


def test_a_sku_of_another_arch_is_refused_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="sm_100a SKU"):
        build(Store(tmp_path), SKUS["h200"], [(Problem.parse(SMALL), "x")])
