"""SKU table: select() over the real variants.toml (exact rows told apart by every figure, other devices of a
known arch matched by need with their own constants), Constants' derivation, and [skus.X] parse errors that
name file:line, the field and the allowed values."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from fa4_aot.domain import hosts
from fa4_aot.domain.matching import DeviceInfo, select
from fa4_aot.domain.skus import MIB, Constants, Sku, l2_budgets
from fa4_aot.errors import ConfigError, HostMismatch, UnknownSku
from fa4_aot.matrix import variants
from tests.conftest import assert_located

ROOT = Path(__file__).resolve().parents[2]
SKUS = variants.load(ROOT / "variants.toml").skus
KNOWN = ("h100-sxm", "h100-pcie", "h200", "b200", "gb200", "b300", "rtx-pro-6000",
         "h100-sxm-cu12", "h200-cu12", "b200-cu12")


def device_like(name: str, **change: object) -> DeviceInfo:
    """The DeviceInfo a GPU of SKU `name` reports, with `change` applied."""
    s = SKUS[name]
    dev = DeviceInfo(name=f"NVIDIA {name}", capability=s.capability, sm_count=s.sm_count, l2_bytes=s.l2_bytes,
                     cuda_major=s.cuda_major)
    return dataclasses.replace(dev, **change)


def test_real_table_has_the_known_skus() -> None:
    assert set(KNOWN) <= set(SKUS)
    assert SKUS["h200"].target_facts() == {"arch": "sm_90a", "sm_count": 132, "l2_bytes": 62914560, "cuda_major": 13,
                                           "host": "x86-64-v3"}
    assert SKUS["gb200"].host == "neoverse-v2"  # Grace hosts: AArch64 host code (issue 19)


@pytest.mark.parametrize("name", KNOWN)
def test_each_sku_selects_itself(name: str) -> None:
    sku, constants, trace = select(SKUS, device_like(name))
    assert sku.name == name and constants == sku.constants()
    assert f"{name}: match" in trace
    assert len(trace) == len(SKUS)


@pytest.mark.parametrize(
    ("device", "expected", "neighbour", "told_apart_by"),
    [
        # h100-sxm and h200: same arch and SM count, different L2.
        (DeviceInfo("H100 80GB HBM3", (9, 0), 132, 52428800, 13), "h100-sxm", "h200", "L2"),
        (DeviceInfo("H200", (9, 0), 132, 62914560, 13), "h200", "h100-sxm", "L2"),
        # h100-pcie: same arch and L2 as h100-sxm, fewer SMs.
        (DeviceInfo("H100 PCIe", (9, 0), 114, 52428800, 13), "h100-pcie", "h100-sxm", "SMs"),
        # b200 and gb200: same arch and L2, different SM count.
        (DeviceInfo("B200", (10, 0), 148, 132644864, 13), "b200", "gb200", "SMs"),
        (DeviceInfo("GB200", (10, 0), 152, 132644864, 13), "gb200", "b200", "SMs"),
        # b300: same SMs and L2 as b200, arch sm_103a.
        (DeviceInfo("B300", (10, 3), 148, 132644864, 13), "b300", "b200", "arch"),
    ],
    ids=lambda v: v.name if isinstance(v, DeviceInfo) else None,
)
def test_select_tells_neighbours_apart(device: DeviceInfo, expected: str, neighbour: str, told_apart_by: str) -> None:
    sku, _, trace = select(SKUS, device)
    assert sku.name == expected
    (line,) = [t for t in trace if t.startswith(f"{neighbour}: ")]
    assert told_apart_by in line


@pytest.mark.bad_input("SKU detection")
@pytest.mark.parametrize(
    ("device", "in_message"),
    [
        (DeviceInfo("NVIDIA A100-SXM4-80GB", (8, 0), 108, 41943040, 12), "sm_80"),
        (DeviceInfo("NVIDIA GH100-next", (9, 1), 132, 62914560, 13), "sm_91"),
    ],
    ids=["a100", "unknown-arch"],
)
def test_device_of_no_known_arch_says_what_it_saw_and_how_to_add_it(device: DeviceInfo, in_message: str) -> None:
    with pytest.raises(UnknownSku) as e:
        select(SKUS, device)
    message = str(e.value)
    assert in_message in message and device.name in message
    assert all(name in message for name in KNOWN)
    assert "[skus.NAME]" in message and "variants.toml" in message
    assert "fa4-aot build --sku NAME" in message and "FA4_AOT_SKU" in message


@pytest.mark.parametrize(("cuda_major", "expected"), [(13, "h200"), (12, "h200-cu12")])
def test_torch_cuda_major_picks_the_flavour(cuda_major: int, expected: str) -> None:
    sku, _constants, trace = select(SKUS, device_like("h200", cuda_major=cuda_major))
    assert sku.name == expected and sku.cuda_major == cuda_major
    other = "h200" if expected == "h200-cu12" else "h200-cu12"
    assert f"{other}: CUDA {SKUS[other].cuda_major} != {cuda_major}" in trace


@pytest.mark.bad_input("SKU detection")
@pytest.mark.parametrize("name", ["b300", "rtx-pro-6000"])  # no CUDA 12 row of their arch
def test_cuda12_torch_on_a_cuda13_only_sku_says_which_flavour_to_add(name: str) -> None:
    with pytest.raises(UnknownSku) as e:
        select(SKUS, device_like(name, cuda_major=12))
    message = str(e.value)
    assert f"matches {name} (CUDA 13)" in message and "built for CUDA 12 (torch.version.cuda)" in message
    assert f"[skus.{name}]" in message and f"fa4-aot build --sku {name}-cu12" in message


@pytest.mark.parametrize(
    ("device", "row"),
    [
        # figures the table does not hold, arch it does: served by a row of the arch, with the device's constants
        (device_like("h100-sxm", sm_count=120), "h100-pcie"),  # no row with 120 SMs: first sm_90a row by name
        (device_like("h200", l2_bytes=40 * MIB), "h100-sxm"),  # a row with its SM count wins
        (device_like("b200", l2_bytes=126 * MIB), "b200"),  # a driver reporting another L2 figure
        (DeviceInfo("NVIDIA H200 MIG 3g.71gb", (9, 0), 60, 31457280, 13), "h100-pcie"),
        (DeviceInfo("RTX 5090", (12, 0), 170, 100663296, 13), "rtx-pro-6000"),
        (device_like("gb200", cuda_major=12), "b200-cu12"),  # the CUDA 12 row of its arch serves it
    ],
    ids=["odd-sm-count", "odd-l2", "b200-other-l2", "mig-slice", "rtx-5090", "gb200-cuda12"],
)
def test_device_of_known_arch_is_matched_by_need(device: DeviceInfo, row: str) -> None:
    """Issue 13: such a device gets every kernel that consumed no constant, and those whose constants equal its
    own (Constants carries the device's figures, not the row's)."""
    sku, constants, trace = select(SKUS, device)
    assert sku.name == row
    assert constants == Constants(device.sm_count, device.l2_bytes, SKUS[row].l2_budget)
    assert f"{row}: serves this device by arch and CUDA major" in trace[-1]


@pytest.mark.parametrize(
    ("name", "on", "expected"),
    [
        ("sm_count", False, 148), ("max_active_clusters(1)", False, 148), ("max_active_clusters(2)", False, 74),
        ("l2_bytes", False, 132644864), ("l2_budget", False, 50 * MIB), ("prepare_l2_budget", False, 32 * MIB),
        ("l2_budget", True, 126 * MIB), ("prepare_l2_budget", True, 80 * MIB),
    ],
)
def test_constants(name: str, on: bool, expected: int) -> None:
    assert Constants(148, 132644864, on).value(name) == expected


def test_l2_budgets_follow_l2() -> None:
    assert l2_budgets(62914560) == (60 * MIB, 38 * MIB)  # H200
    assert l2_budgets(52428800) == (50 * MIB, 32 * MIB)  # H100: FA4's own figures


def test_unknown_constant_says_to_upgrade() -> None:
    with pytest.raises(ValueError, match="upgrade fa4-aot"):
        Constants(1, 1).value("tmem_columns")


@pytest.mark.parametrize(
    "device",
    [device_like("h200"), DeviceInfo("NVIDIA A100-SXM4-80GB", (8, 0), 108, 41943040, 12)],
    ids=["matching-device", "unknown-device"],
)
def test_forced_name_wins(device: DeviceInfo) -> None:
    sku, constants, trace = select(SKUS, device, forced="b200")
    assert sku is SKUS["b200"] and constants == SKUS["b200"].constants()
    assert trace == ["b200: forced by FA4_AOT_SKU"]


@pytest.mark.bad_input("SKU detection")
def test_unknown_forced_name_lists_known_skus() -> None:
    with pytest.raises(UnknownSku) as e:
        select(SKUS, device_like("h200"), forced="h300")
    assert "FA4_AOT_SKU='h300'" in str(e.value)
    assert all(name in str(e.value) for name in KNOWN)


def test_two_skus_with_equal_figures_are_ambiguous() -> None:
    table = {**SKUS, "h200-nvl": dataclasses.replace(SKUS["h200"], name="h200-nvl")}
    with pytest.raises(UnknownSku) as e:
        select(table, device_like("h200"))
    assert "h200, h200-nvl" in str(e.value) and "FA4_AOT_SKU" in str(e.value)
    assert select(table, device_like("h200"), forced="h200-nvl")[0].name == "h200-nvl"


@pytest.mark.parametrize(
    ("arch", "capability", "fa4_arch"),
    [("sm_90a", (9, 0), "sm_90"), ("sm_100a", (10, 0), "sm_100"), ("sm_103a", (10, 3), "sm_103"),
     ("sm_110a", (11, 0), "sm_110"), ("sm_120a", (12, 0), "sm_120")],
)
def test_arch_properties(arch: str, capability: tuple[int, int], fa4_arch: str) -> None:
    sku = Sku(name="x", arch=arch, sm_count=1, l2_bytes=1, cuda_major=13)
    assert (sku.capability, sku.fa4_arch) == (capability, fa4_arch)


# -- [skus.X] parse errors --------------------------------------------------------------------------
# Each case replaces the body of the second table; the line marked `# HERE` is the one the error must name.
GOOD = 'arch = "sm_90a"\nsm_count = 132\nl2_bytes = 62914560\ncuda_major = 13\n'


def _case(case: str, body: str | None, in_message: list[str], **kw: object) -> object:
    return pytest.param(body, in_message, id=case, **kw)


PARSE_ERRORS = [
    _case("unknown-field", GOOD + "memory_gb = 141  # HERE\n",
     ["'memory_gb'", "unknown field", "arch, sm_count, l2_bytes, cuda_major, description"]),
    _case("missing-field", None, ["missing field 'sm_count'"]),
    _case("wrong-type", GOOD.replace("sm_count = 132", 'sm_count = "132"  # HERE'),
     ["'sm_count'", "expected int", "'132'"]),
    _case("bool-for-int", GOOD.replace("cuda_major = 13", "cuda_major = true  # HERE"),
          ["'cuda_major'", "expected int"]),
    _case("float-for-int", GOOD.replace("l2_bytes = 62914560", "l2_bytes = 6.0e7  # HERE"),
          ["'l2_bytes'", "expected int"]),
    _case("arch-not-a-target", GOOD.replace('arch = "sm_90a"', 'arch = "sm_90"  # HERE'),
     ["'arch'", "'sm_90'", "'sm_90a'", "'sm_100a'"]),
    _case("arch-not-fa4", GOOD.replace('arch = "sm_90a"', 'arch = "sm_80a"  # HERE'),
     ["'arch'", "'sm_80a'", "sm_90a, sm_100a, sm_103a, sm_110a, sm_120a"]),
    _case("cuda-major-11", GOOD.replace("cuda_major = 13", "cuda_major = 11  # HERE"),
     ["'cuda_major'", "allowed values: 12, 13"]),
    _case("cuda-major-list-11", GOOD.replace("cuda_major = 13", "cuda_major = [13, 11]  # HERE"),
     ["'cuda_major'", "allowed values: 12, 13", "[13, 12]"]),
    _case("cuda-major-twice", GOOD.replace("cuda_major = 13", "cuda_major = [12, 12]  # HERE"),
     ["'cuda_major'", "allowed values"]),
    _case("cuda-major-empty", GOOD.replace("cuda_major = 13", "cuda_major = []  # HERE"),
     ["'cuda_major'", "allowed values"]),
    _case("cuda-major-str", GOOD.replace("cuda_major = 13", 'cuda_major = ["12"]  # HERE'),
     ["'cuda_major'", "expected int or a list of ints"]),
    _case("zero-sms", GOOD.replace("sm_count = 132", "sm_count = 0  # HERE"), ["'sm_count'", "must be positive"]),
    _case("description-type", GOOD + "description = 141  # HERE\n", ["'description'", "expected str"]),
]


def _sku_file(tmp_path: Path, body: str | None) -> tuple[Path, int]:
    if body is None:  # a table missing sm_count: the error points at its header
        head, body = "[skus.bad]  # HERE\n", GOOD.replace("sm_count = 132\n", "")
    else:
        head = "[skus.bad]\n"
    text = f"# SKUs\n\n[skus.good]\n{GOOD}description = \"fine\"\n\n{head}{body}"
    path = tmp_path / "skus.toml"
    path.write_text(text)
    line = next(i for i, s in enumerate(text.splitlines(), 1) if s.endswith("# HERE"))
    return path, line


@pytest.mark.bad_input("variants.toml")
@pytest.mark.parametrize(("body", "in_message"), PARSE_ERRORS)
def test_sku_table_errors_name_file_line_field_and_allowed_values(
    tmp_path: Path, body: str | None, in_message: list[str]
) -> None:
    path, line = _sku_file(tmp_path, body)
    with pytest.raises(ConfigError) as e:
        variants.load(path)
    assert_located(e.value, path, line, in_message)


def test_sku_name_must_be_lowercase(tmp_path: Path) -> None:
    path = tmp_path / "skus.toml"
    path.write_text(f"\n[skus.H200]\n{GOOD}")
    with pytest.raises(ConfigError, match="lowercase") as e:
        variants.load(path)
    assert str(e.value).startswith(f"{path}:2: [skus.H200]")


def test_good_sku_file_loads(tmp_path: Path) -> None:
    path, _ = _sku_file(tmp_path, GOOD + "# HERE\n")
    loaded = variants.load(path).skus
    assert list(loaded) == ["good", "bad"]
    assert loaded["good"] == Sku("good", "sm_90a", 132, 62914560, 13, "fine")


def test_cuda_major_list_makes_one_sku_per_flavour(tmp_path: Path) -> None:
    path = tmp_path / "skus.toml"
    path.write_text(f"[skus.h200]\n{GOOD.replace('cuda_major = 13', 'cuda_major = [13, 12]')}")
    loaded = variants.load(path).skus
    assert list(loaded) == ["h200", "h200-cu12"]
    assert (loaded["h200"].cuda_major, loaded["h200-cu12"].cuda_major) == (13, 12)
    assert dataclasses.replace(loaded["h200-cu12"], name="h200", cuda_major=13) == loaded["h200"]


def test_derived_flavour_name_may_not_shadow_a_table(tmp_path: Path) -> None:
    path = tmp_path / "skus.toml"
    path.write_text(f"[skus.h200]\n{GOOD.replace('cuda_major = 13', 'cuda_major = [13, 12]  # HERE')}\n"
                    f"[skus.h200-cu12]\n{GOOD.replace('cuda_major = 13', 'cuda_major = 12')}")
    with pytest.raises(ConfigError) as e:
        variants.load(path)
    assert_located(e.value, path, 5, ["'cuda_major'", "'h200-cu12' is defined twice"])


# Issue 19: a host that loads kernels must run their host code. The CPUs below are what /proc/cpuinfo says.
ZEN3 = hosts.HostCpu("x86_64", frozenset(("cx16 popcnt sse4_1 sse4_2 ssse3 avx avx2 bmi1 bmi2 f16c fma movbe").split()))
SANDY = hosts.HostCpu("x86_64", frozenset("cx16 popcnt sse4_1 sse4_2 ssse3 avx".split()))
GRACE = hosts.HostCpu("aarch64", frozenset("fp asimd atomics asimddp sve sve2 bf16 i8mm".split()))
GH = dataclasses.replace(SKUS["h200"], name="gh200", host="neoverse-v2")


@pytest.mark.parametrize(
    ("table", "cpu", "expected"),
    [
        ({"h200": SKUS["h200"], "gh200": GH}, ZEN3, "h200"),  # same GPU figures, told apart by the host CPU
        ({"h200": SKUS["h200"], "gh200": GH}, GRACE, "gh200"),
        ({"h200": SKUS["h200"]}, ZEN3, "h200"),
    ],
)
def test_select_takes_the_row_whose_host_target_the_cpu_runs(table: dict, cpu: hosts.HostCpu, expected: str) -> None:
    sku, _, _ = select(table, DeviceInfo("H200", (9, 0), 132, 62914560, 13), cpu=cpu)
    assert sku.name == expected


@pytest.mark.parametrize(
    ("cpu", "named"),
    [(SANDY, "avx2, bmi1, bmi2, f16c, fma, movbe"), (GRACE, "architecture x86_64 (this CPU is aarch64)")],
)
def test_a_cpu_that_cannot_run_the_host_code_gets_host_mismatch_naming_the_target(cpu: hosts.HostCpu,
                                                                                   named: str) -> None:
    with pytest.raises(HostMismatch, match="x86-64-v3") as info:
        select({"h200": SKUS["h200"]}, DeviceInfo("H200", (9, 0), 132, 62914560, 13), cpu=cpu)
    assert named in str(info.value) and "host =" in str(info.value)
    with pytest.raises(HostMismatch):  # forcing the SKU does not make its code run
        select({"h200": SKUS["h200"]}, None, forced="h200", cpu=cpu)


def test_unknown_host_target_in_variants_names_the_known_ones(tmp_path: Path) -> None:
    path = tmp_path / "v.toml"
    path.write_text('[skus.x]\narch = "sm_90a"\nsm_count = 1\nl2_bytes = 1\ncuda_major = 13\nhost = "avx9"\n')
    with pytest.raises(ConfigError, match="'avx9' is not a host target; known: x86-64-v2"):
        variants.load(path)
