"""Kernel keys: sha256 over canonical JSON of everything that changes a compiled binary.

FA4's compile keys are tuples of bools, ints, floats, strings, None, CuTe dtype classes and enums.
`canonical()` turns one into plain JSON values, injectively; anything else raises, because a value
we cannot write down exactly must not be cached. The Python version is deliberately absent: an
object exported under 3.11 loads under 3.12. Pure: the toolchain versions come in as an argument
(fa4_aot.fa4.toolchain() reads them), so nothing here imports FA4 or CuTe.
"""

from __future__ import annotations

import enum
import hashlib
import json
from typing import Any, Protocol

from .skus import Constants, Sku


class Entry(Protocol):
    """The fields of an index entry (fa4_aot.store.Entry) that its key is computed from. A protocol, not the
    class: the store proves every entry's key as it reads it, so it imports this module, not the reverse. Read-only
    members, so that a frozen dataclass satisfies it."""

    @property
    def kernel_key(self) -> str: ...
    @property
    def family(self) -> str: ...
    @property
    def compile_key(self) -> Any: ...
    @property
    def arch(self) -> str: ...
    @property
    def sm_count(self) -> int: ...
    @property
    def l2_bytes(self) -> int: ...
    @property
    def cuda_major(self) -> int: ...
    @property
    def toolchain(self) -> dict[str, str]: ...
    @property
    def hardware_queries(self) -> list[Any]: ...
    @property
    def host(self) -> str: ...


def canonical(value: Any) -> Any:
    """A JSON-ready, type-tagged image of an FA4 compile-key value. Raises TypeError for what it cannot encode."""
    if isinstance(value, enum.Enum):  # before int/str: IntEnum and StrEnum members must stay distinguishable
        return {"enum": f"{type(value).__module__}.{type(value).__qualname__}.{value.name}"}
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return {"float": value.hex()}
    if isinstance(value, tuple | list):
        return [canonical(v) for v in value]
    if isinstance(value, type):
        return {"type": f"{value.__module__}.{value.__qualname__}"}
    raise TypeError(f"cannot canonicalise compile-key value {value!r} of type {type(value).__name__}")


def dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def key_of(family: str, compile_key: Any, *, arch: str, cuda_major: int, toolchain: dict[str, str],
           consumed: dict[str, int] | None = None, host: str = "") -> str:
    """THE kernel key: sha256 hex of the canonical JSON of what determines the bytes. `compile_key` is already
    canonical (as index entries store it); `consumed` maps each SKU constant the compile read (the names of
    hardware_queries: sm_count, max_active_clusters(N), l2_bytes, l2_budget, prepare_l2_budget) to its value.
    With `consumed` empty this is the kernel's base key, shared by every SKU of the arch, CUDA major and host.
    `host` is the host target its host code was generated for (hosts.py); "" only in entries built before host
    targets existed (for the build machine's own CPU), whose keys stay what they were.
    Every other key function, and the service, goes through this one."""
    doc = {
        "family": family,
        "compile_key": compile_key,
        "target": {"arch": arch, "cuda_major": cuda_major, **({"host": host} if host else {})},
        "toolchain": toolchain,
        "consumed": dict(sorted((consumed or {}).items())),
    }
    return hashlib.sha256(dumps(doc).encode()).hexdigest()


def kernel_key(family: str, compile_key: Any, sku: Sku, tools: dict[str, str],
               consumed: dict[str, int] | None = None) -> str:
    """The key of FA4 kernel (family, raw compile key) built for `sku`'s arch and CUDA major by `tools` (the
    toolchain, `fa4_aot.fa4.toolchain()`), having consumed `consumed` (default: nothing, i.e. the base key)."""
    return key_of(family, canonical(compile_key), arch=sku.arch, cuda_major=sku.cuda_major, toolchain=tools,
                  consumed=consumed, host=sku.host)


def consumed_of(hardware_queries: list[Any]) -> dict[str, int]:
    """{constant: value} of what a compile asked the stand-in HardwareInfo (an entry's hardware_queries).
    Raises ValueError for anything but [name, integer] pairs (an entry from outside may hold anything)."""
    try:
        return {str(name): int(value) for name, value in hardware_queries}
    except (TypeError, ValueError):
        raise ValueError(f"hardware_queries {hardware_queries!r:.200} is not a list of [name, integer] pairs") from None


def entry_keys(entry: Entry) -> tuple[str, str]:
    """(base key, full key) recomputed from an index entry's own fields. An entry is filed under its full key;
    an entry that consumed constants is also filed under its base key, where a client looking the kernel up
    learns which constants it depends on. A valid entry's kernel_key is one of the two."""
    consumed = consumed_of(entry.hardware_queries)
    base = _entry_key(entry, {})
    return base, (_entry_key(entry, consumed) if consumed else base)  # one hash where it consumed nothing


def _entry_key(entry: Entry, consumed: dict[str, int]) -> str:
    return key_of(entry.family, entry.compile_key, arch=entry.arch, cuda_major=entry.cuda_major,
                  toolchain=entry.toolchain, consumed=consumed, host=entry.host)


def entry_key(entry: Entry) -> str:
    """The full key an index entry's own fields hash to (its base key when it consumed nothing)."""
    return entry_keys(entry)[1]


def has_valid_key(entry: Entry) -> bool:
    """Whether an entry's kernel_key is what its own fields hash to (full key, or base key for the entry a client
    reads first): what a server checks before it accepts an entry, so no entry can claim another's key."""
    try:
        return entry.kernel_key in entry_keys(entry)
    except ValueError:  # malformed hardware_queries: no key can be recomputed, so none is valid
        return False


def legacy_key(entry: Entry) -> str:
    """The key an entry had before SKU constants were keyed by need: sha256 of family, compile key, all four SKU
    figures, toolchain. Kept to recognise old entries (`fa4-aot migrate` converts them; key_of is the key)."""
    target = {"arch": entry.arch, "sm_count": entry.sm_count, "l2_bytes": entry.l2_bytes,
              "cuda_major": entry.cuda_major}
    doc = {"family": entry.family, "compile_key": entry.compile_key, "target": target, "toolchain": entry.toolchain}
    return hashlib.sha256(dumps(doc).encode()).hexdigest()


def key_problem(entry: Entry, asked: str) -> str | None:
    """Why `entry` may not be used as kernel `asked`, or None: it must be filed under `asked` and its own fields
    must hash to that key (its full or base key, or an old store's legacy_key). A client checks this for every
    entry, read from its store or fetched, before it uses any field: otherwise an entry that keeps kernel A's key
    and object but carries B's compile key and constants would make the lookup derive, and run, kernel B."""
    if entry.kernel_key != asked:
        return f"it is the entry of kernel {entry.kernel_key}, not of {asked}"
    try:
        consumed = consumed_of(entry.hardware_queries)
    except ValueError as e:
        return str(e)
    full = _entry_key(entry, consumed)  # the full key first: most reads, and the only hash where nothing was consumed
    if asked == full or (consumed and asked == _entry_key(entry, {})) or asked == legacy_key(entry):
        return None
    return f"its fields hash to {full}, not to its key {asked}: it was altered"


def toolchain_drift(built: dict[str, str], tools: dict[str, str]) -> list[str]:
    """The names whose values differ between the toolchain an entry was `built` with and `tools` (this process's,
    fa4.toolchain()), a name either lacks included, sorted. Non-empty: no key computed with `tools` finds the
    entry, and no migration can re-file it honestly (an entry from before source digests names no source: nothing
    says which FA4 or CuTe code made its bytes), so its kernels must be built again."""
    return sorted(name for name in built.keys() | tools.keys() if built.get(name) != tools.get(name))


def variant_key(base: Entry, constants: Constants) -> str:
    """The full key of the kernel whose base entry is `base`, for a device or SKU with `constants`: the base
    entry names the constants its kernel consumed, the values come from `constants`. Raises ValueError for a
    constant this version does not know."""
    names = consumed_of(base.hardware_queries)
    return key_of(base.family, base.compile_key, arch=base.arch, cuda_major=base.cuda_major,
                  toolchain=base.toolchain, consumed=constants.values(names), host=base.host)


def device_key(base_key: str, base: Entry | None, constants: Constants | None) -> str:
    """THE rule from a kernel's base key to the key of the build a device loads (the runtimes, install(),
    prefetch and certification's plan all ask it), in this order: `base_key` itself when there is no base entry
    (nothing says more: it is the key to fetch), when the kernel consumed no SKU constant, or when no device
    constants are given; else the full key of the build with the device's `constants` (variant_key; `base`'s own
    build when they equal the values it consumed). Raises ValueError for a constant this version cannot compute:
    then no build serves the device. Costs one hash at most, none for a kernel that consumed nothing."""
    if base is None or not base.hardware_queries or constants is None:
        return base_key
    return variant_key(base, constants)


def build_key(entry: Entry) -> str:
    """The key the build an index entry points at is kept under, its verdicts too: its full key, also for the
    base-key signpost of a kernel that consumed constants (the gate and install()'s wait for certification ask
    it); the entry's own key when this version cannot compute its constants."""
    try:
        return entry_keys(entry)[1]
    except ValueError:
        return entry.kernel_key


def differing(entry: Entry, constants: Constants) -> dict[str, tuple[int, int]]:
    """{constant: (value the entry's kernel consumed, value in `constants`)} for every constant that differs."""
    return {name: (value, constants.value(name)) for name, value in consumed_of(entry.hardware_queries).items()
            if constants.value(name) != value}


def serves(entry: Entry, sku: Sku) -> bool:
    """Whether a client of `sku` may need `entry`: same arch, CUDA major and host target, and either its full key with
    constants equal to the SKU's, or the base entry a client reads to learn which constants matter."""
    if (entry.arch, entry.cuda_major, entry.host) != (sku.arch, sku.cuda_major, sku.host):
        return False
    return entry.kernel_key == entry_keys(entry)[0] or not differing(entry, sku.constants())
