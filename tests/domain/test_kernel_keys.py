"""Kernel keys: canonical() is an exact, type-tagged image of a compile key; kernel_key() hashes every input
that changes a binary (arch, CUDA major, family, compile key, toolchain, the SKU constants the compile
consumed) and nothing else (not the SKU's name, nor figures the compile did not read)."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import re
import shutil
from pathlib import Path

import pytest

from fa4_aot import fa4
from fa4_aot.domain import kernel_keys
from fa4_aot.domain.skus import Sku
from fa4_aot.store import Store, maintenance, migrate
from tests.conftest import run_cli


class Mask(enum.Enum):
    CAUSAL = "c"
    FULL = "f"


class Level(enum.IntEnum):
    ONE = 1


class Outer:
    class Inner:
        pass


TOOLS = {"flash-attn-4": "4.0.0b36", "nvidia-cutlass-dsl": "4.8.1", "cutlass-dsl-cuda": "cu13"}
H200 = Sku(name="h200", arch="sm_90a", sm_count=132, l2_bytes=62914560, cuda_major=13, description="H200")
COMPILE_KEY = ("fwd", 128, 128, True, None, 0.125, Mask.CAUSAL, int)
# sha256 of (written out by hand, checked against hashlib when set):
# {"compile_key":["fwd",128,128,true,null,{"float":"0x1.0000000000000p-3"},{"enum":"test_kernel_keys.Mask.CAUSAL"},
#  {"type":"builtins.int"}],"consumed":{},"family":"FlashAttentionForwardSm90","target":{"arch":"sm_90a",
#  "cuda_major":13,"host":"x86-64-v3"},"toolchain":{"cutlass-dsl-cuda":"cu13","flash-attn-4":"4.0.0b36",
#  "nvidia-cutlass-dsl":"4.8.1"}}
GOLDEN = "15b2dcdf44952bcb729ff4a1b8b7d26d6679a0063e7dfabacd62562779f6bd55"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        (True, True),
        (False, False),
        (0, 0),
        (1, 1),
        (-7, -7),
        ("bf16", "bf16"),
        ("", ""),
        (1.5, {"float": "0x1.8000000000000p+0"}),
        (0.1, {"float": (0.1).hex()}),
        (-0.0, {"float": "-0x0.0p+0"}),
        (float("inf"), {"float": "inf"}),
        ((), []),
        ((1, "a"), [1, "a"]),
        ([1, "a"], [1, "a"]),
        (Mask.CAUSAL, {"enum": f"{__name__}.Mask.CAUSAL"}),
        (int, {"type": "builtins.int"}),
        (Outer.Inner, {"type": f"{__name__}.Outer.Inner"}),
        ((1, (None, 2.0), [Mask.FULL, (str,)]),
         [1, [None, {"float": "0x1.0000000000000p+1"}],
          [{"enum": f"{__name__}.Mask.FULL"}, [{"type": "builtins.str"}]]]),
    ],
    ids=repr,
)
def test_canonical(value: object, expected: object) -> None:
    assert kernel_keys.canonical(value) == expected


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (True, 1),
        (False, 0),
        (1, 1.0),
        (0.0, -0.0),
        (0.1, math.nextafter(0.1, 1.0)),
        ("1", 1),
        ("0x1.0000000000000p+0", 1.0),
        ("None", None),
        ((1,), 1),
        ((1, 2), (2, 1)),
        (Mask.CAUSAL, Mask.FULL),
        (Mask.CAUSAL, "c"),
        (int, "int"),
        (int, float),
    ],
    ids=repr,
)
def test_canonical_keeps_distinct_values_distinct(a: object, b: object) -> None:
    assert kernel_keys.dumps(kernel_keys.canonical(a)) != kernel_keys.dumps(kernel_keys.canonical(b))


def test_canonical_tags_int_enums() -> None:
    assert kernel_keys.dumps(kernel_keys.canonical(Level.ONE)) != kernel_keys.dumps(kernel_keys.canonical(1))


@pytest.mark.parametrize(
    "value",
    [{"a": 1}, object(), {1, 2}, b"bytes", 1 + 2j, (1, {"nested": "dict"}), [object()], Outer()],
    ids=lambda v: type(v).__name__,
)
def test_canonical_refuses_what_it_cannot_write_down(value: object) -> None:
    with pytest.raises(TypeError, match="cannot canonicalise"):
        kernel_keys.canonical(value)


def test_dumps_is_compact_and_sorted() -> None:
    assert kernel_keys.dumps({"b": 1, "a": [1, 2]}) == '{"a":[1,2],"b":1}'


def _key(family: str = "FlashAttentionForwardSm90", compile_key: object = COMPILE_KEY, sku: Sku = H200,
         tools: dict[str, str] | None = None) -> str:
    return kernel_keys.kernel_key(family, compile_key, sku, tools=TOOLS if tools is None else tools)


def test_kernel_key_is_sha256_hex_and_stable() -> None:
    first = _key()
    assert re.fullmatch(r"[0-9a-f]{64}", first)
    # Equal but freshly built inputs (new tuple, new Sku, reordered tools dict) give the same key.
    same_sku = Sku(name="h200", arch="sm_90a", sm_count=132, l2_bytes=62914560, cuda_major=13)
    assert _key(compile_key=tuple(list(COMPILE_KEY)), sku=same_sku, tools=dict(reversed(TOOLS.items()))) == first


@pytest.mark.parametrize("change", [{"arch": "sm_100a"}, {"cuda_major": 12}], ids=lambda c: next(iter(c)))
def test_kernel_key_changes_with_arch_and_cuda_major(change: dict[str, object]) -> None:
    assert _key(sku=dataclasses.replace(H200, **change)) != _key()


@pytest.mark.parametrize("change", [{"sm_count": 114}, {"l2_bytes": 52428800}, {"l2_budget": True}],
                         ids=lambda c: next(iter(c)))
def test_base_key_ignores_figures_no_compile_consumed(change: dict[str, object]) -> None:
    """h100-sxm, h100-pcie and h200 share every kernel that consumed no SKU constant (issue 13)."""
    assert _key(sku=dataclasses.replace(H200, **change)) == _key()


def test_consumed_constants_are_keyed_by_value_and_name() -> None:
    sm132 = kernel_keys.kernel_key("F", COMPILE_KEY, H200, TOOLS, consumed={"sm_count": 132})
    assert sm132 != _key(family="F")
    assert sm132 != kernel_keys.kernel_key("F", COMPILE_KEY, H200, TOOLS, consumed={"sm_count": 148})
    assert sm132 != kernel_keys.kernel_key("F", COMPILE_KEY, H200, TOOLS, consumed={"l2_bytes": 132})
    assert kernel_keys.kernel_key("F", COMPILE_KEY, H200, TOOLS, consumed={}) == _key(family="F")


def test_golden_key() -> None:
    """Changes only deliberately (it invalidates every store: `fa4-aot migrate` converts them). Issue 13 made
    the key hold arch + CUDA major and the consumed constants instead of all four SKU figures; issue 19 added
    the host target (domain/hosts.py)."""
    assert _key() == GOLDEN


@pytest.mark.parametrize(
    "kwargs",
    [
        {"family": "FlashAttentionBackwardSm90"},
        {"compile_key": COMPILE_KEY[:-1] + (float,)},
        {"compile_key": ("fwd", 128, 128, 1, None, 0.125, Mask.CAUSAL, int)},  # True -> 1
        {"compile_key": ("fwd", 128, 128, True, None, 0.25, Mask.CAUSAL, int)},
        {"tools": {**TOOLS, "flash-attn-4": "4.0.0b37"}},
        {"sku": Sku(name="h200", arch="sm_90a", sm_count=132, l2_bytes=62914560, cuda_major=13, host="x86-64-v4")},
        {"sku": Sku(name="gh200", arch="sm_90a", sm_count=132, l2_bytes=62914560, cuda_major=13, host="neoverse-v2")},
        {"tools": {**TOOLS, "cutlass-dsl-cuda": "cu12"}},
        {"tools": {**TOOLS, "quack-kernels": "0.6.5"}},
    ],
    ids=["family", "compile-key-type", "compile-key-bool-vs-int", "compile-key-float", "fa4-version",
         "host-isa", "host-arch", "cuda-flavour", "extra-package"],
)
def test_kernel_key_changes_with_family_compile_key_and_toolchain(kwargs: dict[str, object]) -> None:
    assert _key(**kwargs) != _key()  # type: ignore[arg-type]


def test_kernel_key_ignores_sku_name_and_description() -> None:
    twin = dataclasses.replace(H200, name="h200-nvl", description="another board, same figures")
    assert _key(sku=twin) == _key()


def test_kernel_key_refuses_uncanonical_compile_key() -> None:
    with pytest.raises(TypeError):
        _key(compile_key=("fwd", {"not": "canonical"}))


def test_malformed_hardware_queries_make_no_valid_key() -> None:
    """Found by the OpenAPI fuzz: POST /v1/kernels with hardware_queries [{}] was a 500 (unpacking a dict)."""
    from types import SimpleNamespace

    from fa4_aot.domain import kernel_keys

    entry = SimpleNamespace(kernel_key="0" * 64, family="f", compile_key=[1], arch="sm_90a", cuda_major=13,
                            toolchain={}, hardware_queries=[{}], host="x86-64-v3")
    assert kernel_keys.has_valid_key(entry) is False  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="hardware_queries"):
        kernel_keys.entry_keys(entry)  # type: ignore[arg-type]


# -- stores built before keys named the toolchain's source (issue 20, point 5) ------------------------------
DATA = Path(__file__).resolve().parent.parent / "data"


def _copy(name: str, to: Path) -> Store:
    shutil.copytree(DATA / name, to, ignore=shutil.ignore_patterns("README.md"))
    for path in [to, *to.rglob("*")]:  # as fa4-aot writes them; git keeps neither mode
        path.chmod(0o700 if path.is_dir() else 0o600)
    return Store(to)


@pytest.mark.parametrize("name", ["store_v1", "store_h200_xeon"])
def test_an_old_store_loads_but_no_key_of_todays_toolchain_finds_it(tmp_path: Path, name: str) -> None:
    """Its entries keep proving their keys (verify, sign, serve take them), but a build or client computing keys
    with this installation's toolchain finds none of them, and says why and what to do."""
    store = _copy(name, tmp_path / name)
    tools = fa4.toolchain()
    kernels = [e for e in store.entries() if not e.is_signpost]
    assert kernels
    for entry in kernels:
        assert store.get_entry(entry.kernel_key) == entry  # it proves its key (get_entry refuses one that does not)
        today = kernel_keys.key_of(entry.family, entry.compile_key, arch=entry.arch, cuda_major=entry.cuda_major,
                                   toolchain=tools, consumed=kernel_keys.consumed_of(entry.hardware_queries),
                                   host=entry.host)
        assert today != entry.kernel_key and not store.has_entry(today)
    counts, drift = migrate.foreign(store.entries(), tools)
    assert counts == {"h200": len(kernels)}
    assert {"source:flash_attn.cute", "source:cutlass", "source:quack", "source:fa4-aot"} <= set(drift)


def test_migrate_and_doctor_say_to_rebuild_an_old_store(tmp_path: Path) -> None:
    store = _copy("store_v1", tmp_path / "store")
    done = run_cli("migrate", cache=store.root)
    assert done.returncode == 0, done.stderr
    assert "5 h200 kernel(s) built by another toolchain (" in done.stdout
    assert ("rebuild with `fa4-aot build --sku h200`, then remove them with `fa4-aot prune --toolchain old`"
            in done.stdout)
    doctor = run_cli("doctor", "--json", cache=store.root, env={"FA4_AOT_SKU": "h200", "FA4_AOT_SERVER": ""})
    (check,) = [c for c in json.loads(doctor.stdout) if c["check"] == "store"]
    assert check["status"] == "warn" and "5 h200 kernel(s) built by another toolchain" in check["next"]
    pruned = run_cli("prune", "--toolchain", "old", "--json", cache=store.root)
    assert pruned.returncode == 0 and json.loads(pruned.stdout)["removed"] == 5
    assert maintenance.verify(store).ok and list(store.entries()) == []
